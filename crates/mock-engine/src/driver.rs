//! The engine task: owns the engine model and runs it against the wall clock.
//!
//! Engine time is wall time since start divided by `time_scale`. The task sleeps until the
//! engine's next step ends and wakes early when a request arrives; after every advance it tells
//! each request how many tokens it has, so responses stream as the steps produce them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prefix_router_engine_model::{Engine, EngineConfig, EngineEvent, EngineRequest};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::kv_events::Sink;
use crate::metrics::Metrics;

/// How much earlier than a step's end the engine task asks to be woken. Tokio's timer rounds a
/// deadline up to the next millisecond and fires about 1 ms late on average; at fast time scales
/// (0.08: 1 ms wall = 12.5 engine ms) that lateness, added to every token's delivery, would
/// dwarf the engine's own times. Waking this much early and advancing the engine to the step's
/// end (never past it) centres the delivery error on zero instead.
const TIMER_LEAD: Duration = Duration::from_micros(800);

/// What a request learns from the engine, in this order: `Started` once, `Generated` with
/// growing totals, `Finished` once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Progress {
    /// Prefill done; so many prompt tokens came from the prefix cache.
    Started {
        /// Prompt tokens served from the cache; `None` where there is no cache to report on
        /// (instant answers), and `usage` then leaves `prompt_tokens_details` out.
        cached_tokens: Option<u32>,
    },
    /// Output tokens generated so far (cumulative).
    Generated(u32),
    /// All output tokens are generated; the request left the engine.
    Finished,
}

/// A request for the engine task.
#[derive(Debug)]
pub(crate) struct Submission {
    pub request: EngineRequest,
    pub progress: mpsc::UnboundedSender<Progress>,
    /// The tokens of the prompt's full blocks, for the KV events that announce them.
    pub block_tokens: Vec<u32>,
    /// The LoRA adapter the request named (its number among the configured ones, from 1, as
    /// vLLM numbers them, and its name), `None` for the base model.
    pub adapter: Option<Adapter>,
}

/// A LoRA adapter a request named.
#[derive(Debug, Clone)]
pub(crate) struct Adapter {
    /// Its number, from 1 (vLLM's `lora_int_id`).
    pub id: i64,
    /// Its name (vLLM's `lora_name`).
    pub name: std::sync::Arc<str>,
}

/// Engine time ↔ wall time.
#[derive(Debug, Clone, Copy)]
struct Clock {
    start: Instant,
    scale: f64,
}

impl Clock {
    fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() / self.scale
    }

    /// The wall instant of engine time `t` (far in the future if it does not fit).
    fn wall(&self, t: f64) -> Instant {
        let far = self.start + Duration::from_secs(86_400 * 365);
        Duration::try_from_secs_f64(t * self.scale)
            .ok()
            .and_then(|d| self.start.checked_add(d))
            .unwrap_or(far)
    }
}

/// A request inside the engine.
#[derive(Debug)]
struct Tracked {
    progress: mpsc::UnboundedSender<Progress>,
    output_tokens: u32,
    sent: u32,
    submitted_at: f64,
}

/// Runs the engine until `stop` is set or every submitter is gone.
pub(crate) async fn run(
    config: EngineConfig,
    time_scale: f64,
    mut submissions: mpsc::UnboundedReceiver<Submission>,
    metrics: Arc<Mutex<Metrics>>,
    mut kv_events: Option<Sink>,
    mut stop: watch::Receiver<bool>,
) {
    let clock = Clock {
        start: Instant::now(),
        scale: time_scale,
    };
    let mut engine = Engine::new(config);
    if kv_events.is_some() {
        engine.cache_mut().record_changes();
    }
    let mut tracked: HashMap<u64, Tracked> = HashMap::new();
    let mut events = Vec::new();
    // The engine time a timer was set for: after it fires, advance at least that far even if
    // the float round trip through wall time lands a hair earlier.
    let mut woke_for: Option<f64> = None;
    // Engine time never goes back: after an early wake-up (see TIMER_LEAD) the engine may be a
    // hair ahead of the wall clock, and a submission in that window joins at the engine's time.
    let mut engine_now = 0.0_f64;
    loop {
        let now = match woke_for.take() {
            Some(t) => clock.now().max(t),
            None => clock.now(),
        };
        engine_now = engine_now.max(now);
        engine.advance(engine_now, &mut events);
        if let Some(k) = kv_events.as_mut() {
            k.publish(&mut engine);
            let mut m = metrics.lock().unwrap_or_else(|p| p.into_inner());
            m.set_kv_digest(k.digest());
        }
        deliver(&engine, &mut events, &mut tracked, &metrics);
        let next = engine.next_event_at();
        let sleep = async {
            match next {
                Some(t) => {
                    let end = clock.wall(t);
                    tokio::time::sleep_until(end.checked_sub(TIMER_LEAD).unwrap_or(end)).await
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => return,
            s = submissions.recv() => match s {
                Some(s) => {
                    let now = clock.now().max(engine_now);
                    engine_now = now;
                    if let Some(k) = kv_events.as_mut() {
                        k.learn(&s.request.block_hashes, &s.block_tokens, s.adapter.as_ref());
                    }
                    tracked.insert(s.request.id, Tracked {
                        progress: s.progress,
                        output_tokens: s.request.output_tokens.max(1),
                        sent: 0,
                        submitted_at: now,
                    });
                    engine.submit(now, s.request);
                }
                None => return,
            },
            () = sleep => woke_for = next,
        }
    }
}

/// Sends what the last advance produced to the requests and the metrics.
fn deliver(
    engine: &Engine,
    events: &mut Vec<EngineEvent>,
    tracked: &mut HashMap<u64, Tracked>,
    metrics: &Mutex<Metrics>,
) {
    let mut m = match metrics.lock() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    };
    for e in events.drain(..) {
        match e {
            EngineEvent::FirstToken {
                id,
                at,
                cached_tokens,
            } => {
                if let Some(t) = tracked.get(&id) {
                    m.observe_ttft(at - t.submitted_at);
                    // A closed receiver means the client left; the engine still finishes it.
                    let _ = t.progress.send(Progress::Started {
                        cached_tokens: Some(cached_tokens),
                    });
                }
            }
            EngineEvent::Finished { id, .. } => {
                if let Some(t) = tracked.remove(&id) {
                    if t.sent < t.output_tokens {
                        let _ = t.progress.send(Progress::Generated(t.output_tokens));
                    }
                    let _ = t.progress.send(Progress::Finished);
                }
            }
        }
    }
    for (id, generated) in engine.progress() {
        if let Some(t) = tracked.get_mut(&id) {
            if generated > t.sent {
                t.sent = generated;
                let _ = t.progress.send(Progress::Generated(generated));
            }
        }
    }
    m.set_stats(engine.stats());
}
