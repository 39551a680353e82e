//! The in-flight guard: owns a dispatched request's [`Ticket`] (its in-flight slot and its
//! feedback channel to the strategy) and records the request's metrics once, when the request
//! is finished however it finishes (answered, failed, cancelled by the client).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prefix_router_core::{Instance, Ticket, Usage};

use crate::access_log::Entry;
use crate::opening::OpeningEvents;
use crate::outcome::Outcome;
use crate::pick::Api;
use crate::responses::IdScanner;
use crate::state::AppState;
use crate::stats::InstanceStats;

/// Holds one dispatched request's ticket. Moved into the response body stream once the answer
/// starts, so the slot is held until the last byte went out or the client went away.
#[derive(Debug)]
pub struct InFlightGuard {
    state: Arc<AppState>,
    /// `None` only once finished (in `drop`).
    ticket: Option<Ticket>,
    instance: Arc<Instance>,
    /// The instance's counters and health record, looked up once per request.
    stats: Arc<InstanceStats>,
    api: Api,
    received: Instant,
    outcome: Outcome,
    completed: bool,
    usage: Option<Usage>,
    first_byte_seen: bool,
    /// A Responses API answer's opening events, read until its first token comes (boxed: only
    /// those answers have it).
    opening: Option<Box<OpeningEvents>>,
    /// A Responses API answer's id, looked for until found ([`crate::responses`]).
    response_id: Option<Box<IdScanner>>,
    /// Whether the strategy learns from the engine's usage report (not for a request whose
    /// prompt the router did not see whole: [`Self::teach_usage`]).
    teach: bool,
    /// The access log's line, when the log is on: filled in as the request goes, sent on drop.
    log: Option<Box<Entry>>,
}

impl InFlightGuard {
    /// Takes over the ticket [`prefix_router_core::dispatch`] returned.
    pub fn new(state: Arc<AppState>, ticket: Ticket, api: Api, received: Instant) -> Self {
        let instance = Arc::clone(ticket.instance());
        let stats = state.stats.get(&instance);
        Self {
            state,
            ticket: Some(ticket),
            instance,
            stats,
            api,
            received,
            // Until told otherwise, a guard dropped early was cancelled.
            outcome: Outcome::Cancelled,
            completed: false,
            usage: None,
            first_byte_seen: false,
            opening: (api == Api::Responses).then(Box::default),
            response_id: None,
            teach: true,
            log: None,
        }
    }

    /// The engine stores this answer (a Responses request without `store: false`): its id is
    /// looked for, and remembered against this instance ([`crate::responses`]).
    pub fn remember_response_id(&mut self) {
        self.response_id = Some(Box::default());
    }

    /// Whether the strategy hears the engine's usage. A request that continues a stored
    /// response has a prompt the router never saw whole (the stored conversation, then its
    /// text): its cached tokens compared with its text would teach cache-aware a wrong
    /// characters-per-token ratio and cache size. The dashboard and the access log still count
    /// them.
    pub fn teach_usage(&mut self, on: bool) {
        self.teach = on;
    }

    /// Writes `entry` to the access log when the request ends (with its status, times and
    /// usage filled in then).
    pub fn log_as(&mut self, entry: Entry) {
        self.log = Some(Box::new(entry));
    }

    /// This attempt is retried elsewhere: the next one writes the request's line. The entry
    /// comes back, marked retried, for the caller to write if no next attempt starts.
    pub fn take_log(&mut self) -> Option<Box<Entry>> {
        let mut e = self.log.take()?;
        e.outcome = Outcome::Retried.label();
        Some(e)
    }

    /// The instance's status code (for the access log).
    pub fn set_status(&mut self, status: u16) {
        if let Some(e) = self.log.as_mut() {
            e.status = status;
        }
    }

    /// The engine's `usage.completion_tokens` (for the access log).
    pub fn output_tokens(&mut self, n: u32) {
        if let Some(e) = self.log.as_mut() {
            e.output_tokens = Some(n);
        }
    }

    /// The router's metrics.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.state.metrics
    }

    /// Counts an upstream error against the instance (admin API's `errors`).
    /// Counts an upstream error of `kind` (the `kind` label of `upstream_errors_total`) in
    /// the instance's stats and metrics.
    pub fn upstream_error(&self, kind: &'static str) {
        InstanceStats::bump(&self.stats.errors);
        self.state
            .metrics
            .upstream_error(&self.stats.series, self.instance.id().as_str(), kind);
    }

    /// The instance's counters and health record.
    pub fn stats(&self) -> &InstanceStats {
        &self.stats
    }

    /// The instance it holds a slot on.
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// The outcome recorded if the response completes (ok, upstream 4xx or 5xx).
    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// The response went out completely; `usage` is what the engine reported in it.
    pub fn complete(&mut self, usage: Option<Usage>) {
        self.completed = true;
        self.usage = usage;
    }

    /// The response failed part way; `outcome` says how.
    pub fn fail(&mut self, outcome: Outcome) {
        self.outcome = outcome;
        self.completed = true;
    }

    /// The answer is not an event stream: its first byte is the whole answer's arrival, after
    /// the decode (told to the strategy as no sample of the time to first token, also when the
    /// body ends without a byte).
    pub fn unstreamed(&mut self) {
        self.opening = None;
        if let Some(t) = self.ticket.as_mut() {
            t.unstreamed();
        }
    }

    /// A piece of the answer's body is about to go to the client. Whether the first token came
    /// with it or before: for most answers that is the first byte ([`Self::first_byte`]); a
    /// Responses API stream opens with events sent before queueing and prefill
    /// ([`crate::opening`]), and its first token is the first event after them.
    pub fn body_data(&mut self, data: &[u8]) -> bool {
        if let Some(s) = self.response_id.as_mut() {
            let found = match self.outcome {
                Outcome::Ok => s.feed(data),
                _ => None,
            };
            if let Some(id) = &found {
                self.state.response_homes.record(id, self.instance.id());
            }
            if found.is_some() || self.outcome != Outcome::Ok || s.is_done() {
                self.response_id = None;
            }
        }
        if let Some(o) = self.opening.as_mut() {
            if !o.feed(data) {
                return false;
            }
            self.opening = None;
        }
        self.first_byte();
        true
    }

    /// The first response body byte is about to go to the client: for a successful answer,
    /// records TTFT once and tells the strategy. An error body's first byte is no first token:
    /// it would teach cache-aware that prefill is free, and make a failing instance's TTFT
    /// the best on the dashboard.
    pub fn first_byte(&mut self) {
        if self.first_byte_seen {
            return;
        }
        self.first_byte_seen = true;
        if self.outcome != Outcome::Ok {
            return;
        }
        let now = Instant::now();
        let ttft = now.saturating_duration_since(self.received).as_secs_f64();
        if let Some(e) = self.log.as_mut() {
            e.ttft_s = Some(ttft);
        }
        self.stats.observe_ttft(ttft);
        self.state
            .metrics
            .observe_ttft(&self.stats.series, &self.instance.id().0, ttft);
        if let Some(t) = self.ticket.as_mut() {
            t.first_token(self.state.secs_at(now));
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let outcome = if self.completed {
            self.outcome
        } else {
            Outcome::Cancelled
        };
        let now = Instant::now();
        // vLLM writes `prompt_tokens_details` only when something was cached: from an engine
        // that has reported `cached_tokens` before, usage without it is 0 cached. Read as
        // unknown, a full miss (the strongest evidence of an eviction) taught the strategy
        // nothing, and left the hit rates of the dashboard without the misses.
        // Chat, completions and responses only: embeddings and other answers never carry the
        // details.
        let generates = matches!(self.api, Api::Chat | Api::Completions | Api::Responses);
        if let Some(u) = self.usage.as_mut().filter(|_| generates) {
            match u.cached_tokens {
                Some(_) => self.stats.reports_cached.store(true, Ordering::Relaxed),
                None if self.stats.reports_cached.load(Ordering::Relaxed) => {
                    u.cached_tokens = Some(0);
                }
                None => {}
            }
        }
        if let Some(ticket) = self.ticket.take() {
            // Finished explicitly rather than by the ticket's own drop, so that the strategy
            // hears the time the request really ended.
            let told = self.usage.filter(|_| self.teach);
            ticket.finish(outcome.end(told), self.state.secs_at(now));
        }
        if let Some(Usage {
            prompt_tokens,
            cached_tokens: Some(cached),
            ..
        }) = self.usage
        {
            InstanceStats::add(&self.stats.usage_prompt_tokens, u64::from(prompt_tokens));
            InstanceStats::add(&self.stats.usage_cached_tokens, u64::from(cached));
        }
        let m = &self.state.metrics;
        m.count_request(&self.stats.series, &self.instance.id().0, self.api, outcome);
        let duration = now.saturating_duration_since(self.received).as_secs_f64();
        m.observe_duration(self.api, duration);
        if let (Some(mut e), Some(log)) = (self.log.take(), &self.state.access_log) {
            e.outcome = outcome.label();
            e.duration_s = duration;
            if let Some(u) = self.usage {
                e.prompt_tokens = Some(u.prompt_tokens);
                e.cached_tokens = u.cached_tokens;
            }
            log.log(*e);
        }
    }
}
