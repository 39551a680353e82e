//! One strategy's run: the event loop over arrivals, engine steps and scale events.

use std::collections::BTreeMap;

use std::sync::Arc;

use prefix_router_core::extract::chat_route;
use prefix_router_core::{
    dispatch, Chain, ChainSpec, End, ExtractError, KeyHash, KeyOptions, PrefixLength, RequestInfo,
    RouteRequest, RouteRng, Strategy, Ticket, TokenRoute, Usage,
};
use prefix_router_engine_model::{EngineConfig, EngineEvent, EngineRequest};
use prefix_router_workload::Request;
use rand::SeedableRng;

use crate::events::SimViews;
use crate::members::{Life, SimFleet};
use crate::prewarm::{Warmer, REPLAY_IDS};
use crate::queue::{Event, EventQueue};
use crate::routers::Scrapes;
use crate::{Driver, SimConfig, SimError};

mod fleet_events;

/// How often (in finished requests) the progress callback is called.
pub const PROGRESS_EVERY: u64 = 4096;

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestRecord {
    /// When the client sent it (its arrival at the router), seconds.
    pub start_s: f64,
    /// When its first output token came (NaN until then).
    pub first_token_s: f64,
    /// When its last output token came (NaN until then).
    pub finish_s: f64,
    /// Prompt tokens served from cache.
    pub cached_tokens: u32,
    /// Instance it was dispatched to (`u32::MAX` until dispatched).
    pub instance: u32,
    /// With `--clairvoyant`, read at its decision from copies of the engines: when its first
    /// token would come on the instance chosen, and on the soonest one (NaN: not read).
    pub chosen_first_token_s: f64,
    /// See `chosen_first_token_s`.
    pub soonest_first_token_s: f64,
}

impl RequestRecord {
    const PENDING: Self = Self {
        start_s: f64::NAN,
        first_token_s: f64::NAN,
        finish_s: f64::NAN,
        cached_tokens: 0,
        instance: u32::MAX,
        chosen_first_token_s: f64::NAN,
        soonest_first_token_s: f64::NAN,
    };
}

/// Raw outcome of one run, before summarizing.
#[derive(Debug)]
pub struct RunOutcome {
    /// One record per request, in workload order.
    pub records: Vec<RequestRecord>,
    /// Requests dispatched to each instance ever created.
    pub dispatched: Vec<u64>,
    /// Decisions by reason label (every replica's).
    pub decisions: BTreeMap<String, u64>,
    /// Decisions that overflowed.
    pub overflows: u64,
    /// What the strategy reports of its learned state at the end (index size, predictions):
    /// the first replica's.
    pub strategy_stats: Option<prefix_router_core::StrategyStats>,
}

/// Inputs shared by every strategy's run.
#[derive(Debug, Clone, Copy)]
pub struct RunInputs<'a> {
    /// The workload's requests, sorted by arrival.
    pub requests: &'a [Request],
    /// Each request's routing key, derived once with the server's extraction code.
    pub keys: &'a [KeyHash],
    /// Engine configuration of every instance.
    pub engine: &'a EngineConfig,
    /// Fleet, driver and scale settings.
    pub config: &'a SimConfig,
    /// Each request's chain, derived once for runs that share a chain spec (a strategy with
    /// another spec derives its own per arrival).
    pub chains: Option<&'a Chains>,
}

/// Every request's block chain under one spec. A strategy that reads chains (`cache-aware`)
/// otherwise renders each prompt up to the chain's bound at every arrival of every run, which
/// on long prompts costs more than the rest of the simulation; a sweep derives them once.
#[derive(Debug, Clone)]
pub struct Chains {
    /// How they were cut.
    pub spec: ChainSpec,
    /// One per request, in order.
    pub chains: Vec<Chain>,
}

impl Chains {
    /// Derives the chains of `requests` under `spec` exactly as a run would (a chain does not
    /// depend on the key's prefix length).
    pub fn derive(requests: &[Request], spec: ChainSpec) -> Result<Self, SimError> {
        let chains = requests
            .iter()
            .enumerate()
            .map(|(i, req)| chained_route(req, i, PrefixLength::default(), spec).map(|r| r.chain))
            .collect::<Result<_, _>>()?;
        Ok(Chains { spec, chains })
    }
}

/// The key and chain of request number `request`, as the server's extraction reads them.
fn chained_route(
    req: &Request,
    request: usize,
    prefix_length: PrefixLength,
    spec: ChainSpec,
) -> Result<RequestInfo, SimError> {
    let opts = KeyOptions {
        prefix_length,
        chain: Some(spec),
    };
    route_info(req, &opts).map_err(|e| SimError::InvalidRequest {
        request,
        why: format!("routing key: {e}"),
    })
}

struct Loop<'a> {
    inputs: RunInputs<'a>,
    /// One strategy per router replica; request `i` goes to replica `i mod n`.
    replicas: &'a [Arc<dyn Strategy>],
    /// Each replica's random stream.
    rngs: Vec<RouteRng>,
    /// Engine-queue readings on their way to the replicas.
    scrapes: Scrapes,
    /// Each request's ticket while it is in flight.
    tickets: Vec<Option<Ticket>>,
    /// Reused chain of the request being routed.
    chain: Chain,
    fleet: SimFleet,
    queue: EventQueue,
    records: Vec<RequestRecord>,
    decisions: BTreeMap<&'static str, u64>,
    overflows: u64,
    finished: u64,
    next_unsent: usize,
    scratch: Vec<EngineEvent>,
    /// The engines' KV events as the router sees them, for a strategy that reads tokens.
    views: Option<SimViews>,
    /// Instances whose views exist (the rest are added as the fleet grows).
    tracked: usize,
    /// Prewarming of joining instances, when configured.
    warmer: Option<Warmer>,
    /// The clairvoyant reference: each request goes where its first token would come soonest,
    /// read from a copy of every engine ([`crate::clairvoyant`]), not where a strategy sends it.
    clairvoyant: bool,
}

/// What routing reads from `req`, by the server's own extraction of its chat body: rendered
/// only as far as `opts` reads (the key's prefix, or the chain's bound), which gives the same
/// key and chain as the full body a client sends.
pub fn route_info(req: &Request, opts: &KeyOptions) -> Result<RequestInfo, ExtractError> {
    let reads = opts
        .chain
        .map_or(0, |c| c.max_units as usize)
        .max(opts.prefix_length.get());
    chat_route(req.chat_body(false, Some(reads)).as_bytes(), opts)
}

/// Replays the workload through `strategy` on a fresh fleet behind one router; `progress(finished)`
/// is called every [`PROGRESS_EVERY`] finished requests.
pub fn run_strategy(
    inputs: RunInputs<'_>,
    strategy: &Arc<dyn Strategy>,
    progress: &mut dyn FnMut(u64),
) -> Result<RunOutcome, SimError> {
    run_replicas(inputs, std::slice::from_ref(strategy), progress)
}

/// Replays the workload on a fresh fleet behind one router replica per strategy in `replicas`
/// (each built alike, each learning on its own: see [`crate::routers`]); `progress(finished)`
/// is called every [`PROGRESS_EVERY`] finished requests.
pub fn run_replicas(
    inputs: RunInputs<'_>,
    replicas: &[Arc<dyn Strategy>],
    progress: &mut dyn FnMut(u64),
) -> Result<RunOutcome, SimError> {
    run_loop(inputs, replicas, false, progress)
}

pub(crate) fn run_loop(
    inputs: RunInputs<'_>,
    replicas: &[Arc<dyn Strategy>],
    clairvoyant: bool,
    progress: &mut dyn FnMut(u64),
) -> Result<RunOutcome, SimError> {
    let config = inputs.config;
    let n = inputs.requests.len();
    let Some(strategy) = replicas.first() else {
        return Err(SimError::InvalidConfig {
            field: "replicas",
            why: "at least one router replica is needed".into(),
        });
    };
    let mut lp = Loop {
        inputs,
        replicas,
        // Replica 0 draws what a lone router would, so one replica runs as before.
        rngs: (0..replicas.len() as u64)
            .map(|r| RouteRng::seed_from_u64(config.seed ^ r.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect(),
        scrapes: Scrapes::default(),
        tickets: (0..n).map(|_| None).collect(),
        chain: Chain::default(),
        fleet: SimFleet::new(
            inputs.engine.clone(),
            config.instances as usize,
            replicas.len(),
        ),
        queue: EventQueue::new(),
        records: vec![RequestRecord::PENDING; n],
        decisions: BTreeMap::new(),
        overflows: 0,
        finished: 0,
        next_unsent: 0,
        scratch: Vec::with_capacity(64),
        views: strategy
            .reads_tokens()
            .then(|| SimViews::new(config.kv_events, config.seed)),
        tracked: 0,
        warmer: config.prewarm.map(Warmer::new),
        clairvoyant,
    };
    lp.track_new();
    if config.routers.scrape.is_some() {
        lp.queue.push(0.0, Event::Scrape);
    }
    for index in config.scale_order() {
        lp.queue
            .push(config.scale[index].at_s, Event::Scale { index });
    }
    match config.driver {
        Driver::OpenLoop => {
            if let Some(first) = inputs.requests.first() {
                lp.queue
                    .push(first.arrival_s, Event::Arrival { request: 0 });
                lp.next_unsent = 1;
            }
        }
        Driver::ClosedLoop { clients } => {
            let first = (clients as usize).min(n);
            for request in 0..first {
                lp.queue.push(0.0, Event::Arrival { request });
            }
            lp.next_unsent = first;
        }
    }

    while let Some((now, event)) = lp.queue.pop() {
        match event {
            Event::Arrival { request } => lp.arrive(now, request)?,
            Event::EngineStep { engine, generation } => {
                lp.step(now, engine, generation, progress)?
            }
            Event::Scale { index } => lp.scale(now, index)?,
            Event::KvEvents { batch } => {
                if let Some(v) = lp.views.as_mut() {
                    v.deliver(batch);
                }
            }
            Event::Scrape => lp.scrape(now),
            Event::PrewarmBudget { instance } => lp.warmed(now, instance),
            Event::ScrapeArrives { scrape } => lp.scrape_arrives(scrape),
        }
    }

    let unfinished = lp.records.iter().filter(|r| r.finish_s.is_nan()).count();
    if unfinished > 0 {
        return Err(SimError::Stalled {
            strategy: strategy.name().to_string(),
            unfinished,
            total: n,
        });
    }
    progress(lp.finished);
    Ok(RunOutcome {
        records: lp.records,
        dispatched: lp.fleet.instances.iter().map(|i| i.dispatched).collect(),
        decisions: lp
            .decisions
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        overflows: lp.overflows,
        strategy_stats: strategy.stats(),
    })
}

impl Loop<'_> {
    /// Routes request `request` at `now` and hands it to the chosen engine.
    fn arrive(&mut self, now: f64, request: usize) -> Result<(), SimError> {
        let inputs = self.inputs;
        if inputs.config.driver == Driver::OpenLoop {
            if let Some(next) = inputs.requests.get(self.next_unsent) {
                self.queue.push(
                    next.arrival_s,
                    Event::Arrival {
                        request: self.next_unsent,
                    },
                );
                self.next_unsent += 1;
            }
        }
        let req = &inputs.requests[request];
        let mut key = inputs.keys[request];
        if let Some(spec) = self.replicas[0].chain_spec() {
            let prepared = inputs
                .chains
                .filter(|c| c.spec == spec)
                .and_then(|c| c.chains.get(request));
            match prepared {
                Some(chain) => self.chain.clone_from(chain),
                None => {
                    let info = chained_route(req, request, inputs.config.prefix_length, spec)?;
                    key = info.key;
                    self.chain = info.chain;
                }
            }
        }
        if let Some(w) = self.warmer.as_mut() {
            w.record(key, now, request, &self.chain);
        }
        // What the engine is handed (and, under `--clairvoyant`, what every engine is probed
        // with first).
        let sent = EngineRequest {
            id: request as u64,
            block_hashes: req.block_hashes(inputs.engine.block_tokens),
            prompt_tokens: req.prompt_tokens(),
            output_tokens: req.output_tokens,
        };
        let route = RouteRequest {
            key: Some(key),
            chain: &self.chain.blocks,
            prompt_units: self.chain.units,
            model: req.model.as_deref(),
            now,
            // What kv-aware reads: the request's token blocks (the workload's hashes name them
            // as the engine does) and the views the engines' events built.
            tokens: self.views.as_ref().map(|v| TokenRoute {
                chain: &sent.block_hashes,
                block_tokens: inputs.engine.block_tokens,
                prompt_tokens: req.prompt_tokens(),
                adapter: 0,
                residency: v,
            }),
            whole_answer: false,
        };
        let replica = request % self.replicas.len();
        let strategy = &self.replicas[replica];
        // The engines' true first-token times for this request: what the clairvoyant
        // reference chooses by, and what a strategy's choice is read against under it.
        let times = (self.clairvoyant || inputs.config.clairvoyant)
            .then(|| crate::clairvoyant::first_tokens(&self.fleet, now, &sent, route.model));
        let routed = if let (true, Some(times)) = (self.clairvoyant, &times) {
            crate::clairvoyant::soonest(&self.fleet, times, &route, strategy)
        } else {
            dispatch(
                strategy,
                &route,
                self.fleet.snapshot(replica),
                &mut self.rngs[replica],
            )
            .map_err(|source| SimError::Route {
                strategy: strategy.name().to_string(),
                request,
                source,
            })
        }?;
        let instance =
            self.fleet
                .instance_at(routed.index)
                .ok_or_else(|| SimError::InvalidConfig {
                    field: "strategies",
                    why: format!(
                        "strategy '{}' chose position {} outside the fleet",
                        strategy.name(),
                        routed.index
                    ),
                })?;
        if routed.reason.is_overflow() {
            self.overflows += 1;
        }
        let label = if self.clairvoyant {
            crate::clairvoyant::CLAIRVOYANT
        } else {
            routed.reason.label()
        };
        *self.decisions.entry(label).or_insert(0) += 1;
        self.tickets[request] = Some(routed.ticket);

        let record = &mut self.records[request];
        record.start_s = now;
        record.instance = instance as u32;
        if let (false, Some(times)) = (self.clairvoyant, &times) {
            let at = |p: usize| times.iter().find(|t| t.position == p).map(|t| t.at);
            record.chosen_first_token_s = at(routed.index).unwrap_or(f64::NAN);
            record.soonest_first_token_s = times.iter().map(|t| t.at).fold(f64::INFINITY, f64::min);
        }
        let inst = &mut self.fleet.instances[instance];
        inst.dispatched += 1;
        inst.engine.submit(now, sent);
        self.reschedule(instance, now, false)
    }

    /// Runs engine `instance`'s step that ends at `now` and records what it produced.
    fn step(
        &mut self,
        now: f64,
        instance: usize,
        generation: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), SimError> {
        let Some(inst) = self.fleet.instances.get_mut(instance) else {
            return Ok(());
        };
        if inst.generation != generation {
            return Ok(()); // replaced by a later schedule
        }
        inst.scheduled = None;
        let mut events = std::mem::take(&mut self.scratch);
        events.clear();
        inst.engine.advance(now, &mut events);
        if let Some(views) = self.views.as_mut() {
            // What the step stored and evicted: one batch, on its way to the router.
            let mut batch = Vec::new();
            inst.engine.cache_mut().take_changes(&mut batch);
            if let Some(n) = views.send(instance, batch) {
                self.queue
                    .push(now + views.delay_s(), Event::KvEvents { batch: n });
            }
        }
        let mut drained = false;
        for event in &events {
            match *event {
                EngineEvent::FirstToken {
                    id,
                    at,
                    cached_tokens,
                } if id >= REPLAY_IDS => {
                    if let Some(w) = self.warmer.as_mut() {
                        w.first_token(id, at, cached_tokens);
                    }
                }
                EngineEvent::Finished { id, at } if id >= REPLAY_IDS => {
                    let done = self.warmer.as_mut().and_then(|w| w.finished(id, at));
                    match done {
                        Some((warming, true)) => self.warmed(at.max(now), warming),
                        Some((warming, false)) => self.send_replays(at.max(now), warming)?,
                        None => {}
                    }
                    // An instance drained while it warmed ends with its last replay: no
                    // workload request will come to remove it.
                    drained |= self.fleet.instances[instance].in_flight() == 0
                        && self.fleet.instances[instance].life == Life::Draining;
                }
                EngineEvent::FirstToken {
                    id,
                    at,
                    cached_tokens,
                } => {
                    if let Some(r) = self.records.get_mut(id as usize) {
                        r.first_token_s = at;
                        r.cached_tokens = cached_tokens;
                    }
                    if let Some(t) = self.tickets.get_mut(id as usize).and_then(Option::as_mut) {
                        t.first_token(at);
                    }
                }
                EngineEvent::Finished { id, at } => {
                    let Some(r) = self.records.get_mut(id as usize) else {
                        continue;
                    };
                    r.finish_s = at;
                    if r.first_token_s.is_nan() {
                        r.first_token_s = at; // an engine that reports both at once
                    }
                    let usage = Usage {
                        prompt_tokens: self.inputs.requests[id as usize].prompt_tokens(),
                        cached_tokens: Some(r.cached_tokens),
                    };
                    // Finishing the ticket releases the in-flight slot and feeds the strategy.
                    if let Some(t) = self.tickets.get_mut(id as usize).and_then(Option::take) {
                        t.finish(End::Finished { usage: Some(usage) }, at);
                    }
                    drained |= self.fleet.instances[instance].in_flight() == 0
                        && self.fleet.instances[instance].life == Life::Draining;
                    self.finished += 1;
                    if self.finished.is_multiple_of(PROGRESS_EVERY) {
                        progress(self.finished);
                    }
                    if let Driver::ClosedLoop { .. } = self.inputs.config.driver {
                        if self.next_unsent < self.inputs.requests.len() {
                            self.queue.push(
                                at.max(now),
                                Event::Arrival {
                                    request: self.next_unsent,
                                },
                            );
                            self.next_unsent += 1;
                        }
                    }
                }
            }
        }
        self.scratch = events;
        if drained {
            self.fleet.remove_drained();
            self.tell_membership(now);
        }
        self.reschedule(instance, now, true)
    }

    /// Makes sure the queue holds exactly one live entry for the engine's next step.
    /// `after_advance`: the engine has just run every step ending at or before `now`.
    fn reschedule(
        &mut self,
        instance: usize,
        now: f64,
        after_advance: bool,
    ) -> Result<(), SimError> {
        let inst = &mut self.fleet.instances[instance];
        let next = inst.engine.next_event_at();
        if next == inst.scheduled {
            return Ok(());
        }
        if let Some(at) = next {
            // advance(now) ran every step ending at or before `now`; a next step that does not
            // lie in the future would spin forever.
            if at < now || (at == now && after_advance) {
                return Err(SimError::EngineClock {
                    instance,
                    now,
                    next: at,
                });
            }
        }
        inst.generation += 1;
        inst.scheduled = next;
        if let Some(at) = next {
            self.queue.push(
                at,
                Event::EngineStep {
                    engine: instance,
                    generation: inst.generation,
                },
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
