//! Prewarming in the simulator, as the server does it ([`prefix_router_core::prewarm`]): the
//! router tracks the hottest recent prefixes; when an instance joins it is held out of routing
//! (warming), the hottest prefixes the strategy would send to it are replayed to its engine as
//! one-token requests (a few at a time, each through a ticket, so a learning strategy records
//! what the new engine now holds), and once they are done, or the time budget is spent, it takes
//! its share.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use prefix_router_core::prewarm::{plan, HotPrefixes, PrewarmConfig};
use prefix_router_core::{
    dispatch_to, Chain, End, FleetSnapshot, Instance, InstanceId, KeyHash, Reason, RouteRequest,
    RouteRng, Strategy, Ticket, Usage,
};
use prefix_router_engine_model::EngineRequest;
use prefix_router_workload::Request;

/// Engine request ids of replays start here (workload requests are numbered from 0).
pub const REPLAY_IDS: u64 = 1 << 48;

/// One instance being warmed.
#[derive(Debug)]
struct Warming {
    /// Replays not yet sent: workload request indices, with their chains (a learning strategy
    /// must see what a replay's prefill covered, or it learns that nothing took that long).
    waiting: VecDeque<(usize, Chain)>,
    /// Replays in flight.
    in_flight: usize,
}

/// A replay that went out.
#[derive(Debug)]
struct Replay {
    instance: usize,
    ticket: Ticket,
    prompt_tokens: u32,
    cached_tokens: u32,
}

/// The simulated router's prewarming.
#[derive(Debug)]
pub struct Warmer {
    config: PrewarmConfig,
    hot: HotPrefixes<(usize, Chain)>,
    warming: HashMap<usize, Warming>,
    replays: HashMap<u64, Replay>,
    next_id: u64,
    /// Replays sent, over the run.
    pub sent: u64,
}

/// A replay to hand to an engine.
pub struct Send {
    /// The instance.
    pub instance: usize,
    /// What its engine gets.
    pub request: EngineRequest,
}

impl Warmer {
    /// A warmer with `config`.
    pub fn new(config: PrewarmConfig) -> Self {
        Self {
            config,
            hot: HotPrefixes::new(config.tracked, config.half_life_s, config.max_bytes),
            warming: HashMap::new(),
            replays: HashMap::new(),
            next_id: REPLAY_IDS,
            sent: 0,
        }
    }

    /// Seconds an instance may warm before it takes its share regardless.
    pub fn budget_s(&self) -> f64 {
        self.config.budget_s
    }

    /// Counts request `request` (routing `key`, `chain` when the strategy reads one).
    pub fn record(&mut self, key: KeyHash, now: f64, request: usize, chain: &Chain) {
        // No body is kept here: nothing counts against the byte budget.
        self.hot.record(key, now, (request, chain.clone()), 0);
    }

    /// Whether `instance` is warming.
    pub fn is_warming(&self, instance: usize) -> bool {
        self.warming.contains_key(&instance)
    }

    /// `instance` (id `joining`, in `fleet`, held out of routing) starts warming: what to send
    /// its engine now. Empty when nothing would move to it (it may take its share at once).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &mut self,
        now: f64,
        instance: usize,
        joining: &InstanceId,
        fleet: &FleetSnapshot,
        strategy: &Arc<dyn Strategy>,
        keys: &[KeyHash],
        requests: &[Request],
        rng: &mut RouteRng,
    ) -> Vec<usize> {
        let hottest = self.hot.hottest(now).into_iter().map(|(_, e)| e);
        let picked: Vec<(usize, Chain)> = plan(
            hottest,
            self.config.max_prefixes,
            strategy,
            fleet,
            joining,
            rng,
            |(i, chain)| {
                let req = requests.get(*i)?;
                Some(RouteRequest {
                    key: keys.get(*i).copied(),
                    chain: &chain.blocks,
                    prompt_units: chain.units,
                    model: req.model.as_deref(),
                    now,
                    tokens: None,
                    whole_answer: false,
                })
            },
        )
        .into_iter()
        .cloned()
        .collect();
        let indices = picked.iter().map(|(i, _)| *i).collect();
        self.warming.insert(
            instance,
            Warming {
                waiting: picked.into_iter().collect(),
                in_flight: 0,
            },
        );
        indices
    }

    /// The replays `instance` can take now (up to the concurrency), each with its ticket taken
    /// on `target` (the instance's router view) through `strategy`.
    #[allow(clippy::too_many_arguments)]
    pub fn next_sends(
        &mut self,
        now: f64,
        instance: usize,
        target: &Arc<Instance>,
        strategy: &Arc<dyn Strategy>,
        keys: &[KeyHash],
        requests: &[Request],
        block_tokens: u32,
    ) -> Vec<Send> {
        let mut out = Vec::new();
        let Some(w) = self.warming.get_mut(&instance) else {
            return out;
        };
        while w.in_flight < self.config.concurrency.max(1) {
            let Some((i, chain)) = w.waiting.pop_front() else {
                break;
            };
            let Some(req) = requests.get(i) else {
                continue;
            };
            let route = RouteRequest {
                key: keys.get(i).copied(),
                chain: &chain.blocks,
                prompt_units: chain.units,
                model: req.model.as_deref(),
                now,
                tokens: None,
                whole_answer: false,
            };
            let ticket = dispatch_to(strategy, &route, Arc::clone(target), Reason::Prewarm);
            let id = self.next_id;
            self.next_id += 1;
            w.in_flight += 1;
            self.sent += 1;
            self.replays.insert(
                id,
                Replay {
                    instance,
                    ticket,
                    prompt_tokens: req.prompt_tokens(),
                    cached_tokens: 0,
                },
            );
            out.push(Send {
                instance,
                request: EngineRequest {
                    id,
                    block_hashes: req.block_hashes(block_tokens),
                    prompt_tokens: req.prompt_tokens(),
                    output_tokens: 1,
                },
            });
        }
        out
    }

    /// A replay's first token.
    pub fn first_token(&mut self, id: u64, at: f64, cached_tokens: u32) {
        if let Some(r) = self.replays.get_mut(&id) {
            r.cached_tokens = cached_tokens;
            r.ticket.first_token(at);
        }
    }

    /// A replay finished: its instance, and whether that instance has nothing left to replay
    /// (it takes its share now).
    pub fn finished(&mut self, id: u64, at: f64) -> Option<(usize, bool)> {
        let r = self.replays.remove(&id)?;
        r.ticket.finish(
            End::Finished {
                usage: Some(Usage {
                    prompt_tokens: r.prompt_tokens,
                    cached_tokens: Some(r.cached_tokens),
                }),
            },
            at,
        );
        let w = self.warming.get_mut(&r.instance)?;
        w.in_flight = w.in_flight.saturating_sub(1);
        Some((r.instance, w.waiting.is_empty() && w.in_flight == 0))
    }

    /// `instance` stops warming (done, or out of time): replays not yet sent are dropped.
    pub fn stop(&mut self, instance: usize) -> bool {
        self.warming.remove(&instance).is_some()
    }
}
