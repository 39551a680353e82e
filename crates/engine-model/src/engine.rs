//! Continuous batching over a prefix cache.
//!
//! The scheduler follows vLLM's chunked-prefill policy, one step at a time:
//! 1. every running sequence that is decoding takes one token of the step's budget
//!    (`max_batched_tokens`), in admission order;
//! 2. running sequences still prefilling take the rest of the budget, in admission order;
//! 3. waiting requests are admitted first come, first served while budget, `max_num_seqs` and KV
//!    blocks allow; the head of the queue blocks those behind it (no skipping ahead).
//!
//! KV blocks: a request reserves, on admission, the blocks for its whole sequence
//! (`ceil((prompt + output) / block_tokens)`), minus the blocks it finds in the prefix cache. vLLM
//! allocates decode blocks lazily and preempts when it runs out; reserving up front never needs
//! preemption and differs only by the output tokens' blocks (small next to prompts). Unreferenced
//! cached blocks are evicted, least recently released first, to make room. A request that does
//! not fit waits; one that cannot fit even in an empty cache (more blocks than capacity) is
//! admitted when nothing else runs, overcommitting by its excess, instead of deadlocking (vLLM
//! would reject it upfront; a trace replay should not stall on it).
//!
//! Prefix cache: on admission the longest cached run of the request's block hashes is reused;
//! `cached_tokens = min(blocks × block_tokens, prompt_tokens − 1)` because the last prompt token
//! is always recomputed to produce logits. Each full prompt block becomes cached at the end of the
//! step that computes it, so a later request can hit it even while its first owner still runs.
//! Generated tokens are not cached (the model does not know their hashes).
//!
//! Time: a step starts as soon as there is work and ends `CostModel::step_time` later. Requests
//! submitted during a step join the next one. A request becomes visible to the scheduler
//! `cost.request_overhead_s` after `submit` (frontend latency).

use std::collections::VecDeque;

use crate::cache::PrefixCache;
use crate::cost::StepWork;

mod config;
mod request;

pub use config::{ConfigError, EngineConfig};
pub use request::{EngineEvent, EngineRequest, EngineStats, RequestError};

/// A submitted request not yet admitted.
#[derive(Debug, Clone)]
struct Queued {
    /// When the scheduler may first see it (`submit` time plus the frontend overhead).
    ready_at: f64,
    req: EngineRequest,
}

/// A running sequence.
#[derive(Debug, Clone)]
struct Seq {
    id: u64,
    block_hashes: Vec<u64>,
    /// Cached blocks this sequence references, in block order.
    slots: Vec<u32>,
    prompt_tokens: u32,
    output_tokens: u32,
    /// Prompt tokens whose KV exists (cached or prefilled).
    computed: u32,
    generated: u32,
    cached_tokens: u32,
    /// Leading `block_hashes` already taken from or offered to the cache.
    committed_blocks: u32,
    /// Private blocks held (not yet committed, duplicates, partial and output blocks).
    private_blocks: u32,
    /// Tokens scheduled in the current step (0: not in it).
    scheduled: u32,
}

impl Seq {
    fn prefilling(&self) -> bool {
        self.computed < self.prompt_tokens
    }
}

/// One engine: FCFS waiting queue, continuous batching, prefix cache.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    cache: PrefixCache,
    queue: VecDeque<Queued>,
    running: Vec<Seq>,
    /// End of the step in progress.
    step_end: Option<f64>,
    /// Latest time seen by `submit` or `advance`.
    clock: f64,
    /// Emptied slot vectors, reused so admission does not allocate.
    slot_pool: Vec<Vec<u32>>,
    stats: EngineStats,
}

impl Engine {
    /// An idle engine with an empty cache. An invalid configuration is repaired to the nearest
    /// runnable one (zero counts become 1, the budget is raised to `max_num_seqs`, bad cost
    /// coefficients become 0); use [`Engine::try_new`] to reject it instead.
    pub fn new(config: EngineConfig) -> Self {
        let config = config.repaired();
        Self {
            cache: PrefixCache::new(config.kv_capacity_blocks),
            queue: VecDeque::new(),
            running: Vec::with_capacity(config.max_num_seqs.min(4096) as usize),
            step_end: None,
            clock: 0.0,
            slot_pool: Vec::new(),
            stats: EngineStats::default(),
            config,
        }
    }

    /// An idle engine, or why the configuration cannot run.
    pub fn try_new(config: EngineConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self::new(config))
    }

    /// Configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The prefix cache (for inspection).
    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// The prefix cache, to record and take its changes (an engine that publishes KV events).
    pub fn cache_mut(&mut self) -> &mut PrefixCache {
        &mut self.cache
    }

    /// Queues a request arriving at `now` (must not be earlier than the last `advance`).
    ///
    /// Lenient: a zero prompt or output is taken as 1 token, hashes beyond the prompt's full
    /// blocks are ignored, an earlier or non-finite `now` is taken as the engine's clock. Use
    /// [`Engine::try_submit`] to reject such requests instead.
    pub fn submit(&mut self, now: f64, mut req: EngineRequest) {
        req.prompt_tokens = req.prompt_tokens.max(1);
        req.output_tokens = req.output_tokens.max(1);
        let full = (req.prompt_tokens / self.config.block_tokens) as usize;
        req.block_hashes.truncate(full);
        let now = if now.is_finite() {
            now.max(self.clock)
        } else {
            self.clock
        };
        self.clock = now;
        // Keep the queue ordered by readiness even if the overhead were to change.
        let mut ready_at = now + self.config.cost.request_overhead_s;
        if let Some(last) = self.queue.back() {
            ready_at = ready_at.max(last.ready_at);
        }
        self.queue.push_back(Queued { ready_at, req });
    }

    /// Queues a request arriving at `now`, or says why it is malformed.
    pub fn try_submit(&mut self, now: f64, req: EngineRequest) -> Result<(), RequestError> {
        let id = req.id;
        if req.prompt_tokens == 0 {
            return Err(RequestError::EmptyPrompt { id });
        }
        if req.output_tokens == 0 {
            return Err(RequestError::NoOutput { id });
        }
        let full_blocks = req.prompt_tokens / self.config.block_tokens;
        if req.block_hashes.len() > full_blocks as usize {
            return Err(RequestError::TooManyBlocks {
                id,
                hashes: req.block_hashes.len(),
                prompt_tokens: req.prompt_tokens,
                full_blocks,
            });
        }
        if !now.is_finite() || now < self.clock {
            return Err(RequestError::BadTime {
                id,
                now,
                clock: self.clock,
            });
        }
        self.submit(now, req);
        Ok(())
    }

    /// When the engine must next be advanced if nothing else arrives: the end of the current
    /// step, or, while idle with queued requests, the time the next step starts (a wake-up that
    /// itself produces no events). `None` when idle with nothing queued.
    pub fn next_event_at(&self) -> Option<f64> {
        self.step_end
            .or_else(|| self.queue.front().map(|q| q.ready_at))
    }

    /// Runs every step that ends at or before `now`, appending what happened to `out` in time order.
    pub fn advance(&mut self, now: f64, out: &mut Vec<EngineEvent>) {
        loop {
            match self.step_end {
                Some(end) if end <= now => {
                    self.finish_step(end, out);
                    self.start_step(end);
                }
                Some(_) => break,
                None => match self.queue.front() {
                    Some(q) if q.ready_at <= now => {
                        let t = q.ready_at;
                        if !self.start_step(t) {
                            break;
                        }
                    }
                    _ => break,
                },
            }
        }
        if now.is_finite() {
            self.clock = self.clock.max(now);
        }
    }

    /// When `req`'s first token would come if it were submitted at `now` and nothing else
    /// arrived after it: the engine's own future, run on a copy. Requests that arrive later
    /// queue behind it (first come, first served) and take only budget it leaves, so they
    /// could add to at most the step its prefill ends in; a router that knew every engine's
    /// state exactly would price a request this way (the simulator's `clairvoyant` reference).
    /// `None` when `now` is not finite.
    pub fn first_token_if_sent(&self, now: f64, req: &EngineRequest) -> Option<f64> {
        if !now.is_finite() {
            return None;
        }
        let mut ahead = self.clone();
        ahead.submit(now, req.clone());
        let mut out = Vec::new();
        // Every step computes at least one token of some running sequence, and the request
        // is admitted once those ahead of it have left, so this ends; the bound is a guard.
        for _ in 0..10_000_000u64 {
            let at = ahead.next_event_at()?;
            out.clear();
            ahead.advance(at, &mut out);
            if let Some(EngineEvent::FirstToken { at, .. }) = out
                .iter()
                .find(|e| matches!(e, EngineEvent::FirstToken { id, .. } if *id == req.id))
            {
                return Some(*at);
            }
        }
        None
    }

    /// Counters.
    pub fn stats(&self) -> EngineStats {
        EngineStats {
            running: self.running.len() as u32,
            waiting: self.queue.len() as u32,
            used_blocks: self.cache.used_blocks(),
            cached_blocks: self.cache.cached_blocks(),
            evicted_blocks: self.cache.evictions(),
            ..self.stats.clone()
        }
    }

    /// Requests admitted and not finished.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests submitted and not admitted yet.
    pub fn waiting(&self) -> usize {
        self.queue.len()
    }

    /// `(id, output tokens generated so far)` of every running request, in admission order
    /// (a request still prefilling has 0). Finished requests have left: their count is their
    /// `output_tokens`. Lets a real-time driver stream tokens as steps produce them.
    pub fn progress(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.running.iter().map(|s| (s.id, s.generated))
    }

    /// Plans the step starting at `t`; returns false (staying idle) when there is nothing to run.
    fn start_step(&mut self, t: f64) -> bool {
        let mut budget = self.config.max_batched_tokens;
        let mut work = StepWork::default();
        // 1. Decodes first, one token each.
        for s in &mut self.running {
            s.scheduled = 0;
            if !s.prefilling() && budget > 0 {
                s.scheduled = 1;
                budget -= 1;
                work.add_decode(u64::from(s.prompt_tokens) + u64::from(s.generated));
            }
        }
        // 2. Prefills already under way.
        for s in &mut self.running {
            if s.prefilling() && budget > 0 {
                let n = (s.prompt_tokens - s.computed).min(budget);
                s.scheduled = n;
                budget -= n;
                work.add_prefill(u64::from(s.computed), u64::from(n));
            }
        }
        // 3. Admissions, first come first served.
        while budget > 0 && self.running.len() < self.config.max_num_seqs as usize {
            let Some(q) = self.queue.front() else { break };
            if q.ready_at > t {
                break;
            }
            let Some(mut seq) = self.admit_front() else {
                break;
            };
            let n = (seq.prompt_tokens - seq.computed).min(budget);
            seq.scheduled = n;
            budget -= n;
            work.add_prefill(u64::from(seq.computed), u64::from(n));
            self.running.push(seq);
        }
        if work.seqs == 0 {
            self.step_end = None;
            return false;
        }
        self.stats.steps += 1;
        self.step_end = Some(t + self.config.cost.step_time(&work));
        true
    }

    /// Admits the head of the queue if its KV blocks can be found.
    fn admit_front(&mut self) -> Option<Seq> {
        let bt = self.config.block_tokens;
        let q = self.queue.front()?;
        let req = &q.req;
        let total_tokens = u64::from(req.prompt_tokens) + u64::from(req.output_tokens);
        let total_blocks = total_tokens.div_ceil(u64::from(bt));
        let m = self.cache.longest_prefix(&req.block_hashes);
        let need = total_blocks - m.blocks as u64;
        let pinned = u32::try_from(m.unreferenced).unwrap_or(u32::MAX);
        let fits = i64::try_from(need).is_ok_and(|n| n <= self.cache.room(pinned));
        let alone_and_too_big =
            total_blocks > u64::from(self.cache.capacity()) && self.running.is_empty();
        if !fits && !alone_and_too_big {
            return None;
        }
        let q = self.queue.pop_front()?;
        let req = q.req;
        let mut slots = self.slot_pool.pop().unwrap_or_default();
        let hit = self
            .cache
            .acquire_prefix(&req.block_hashes[..m.blocks], &mut slots);
        // Saturates only for absurd requests (over 4 billion blocks), which overcommit anyway.
        let need = u32::try_from(need).unwrap_or(u32::MAX);
        if fits {
            let ok = self.cache.allocate(need);
            debug_assert!(ok, "allocation checked above");
        } else {
            self.cache.allocate_overcommit(need);
        }
        let cached_tokens =
            (hit as u64 * u64::from(bt)).min(u64::from(req.prompt_tokens) - 1) as u32;
        self.stats.requests += 1;
        self.stats.prompt_tokens += u64::from(req.prompt_tokens);
        self.stats.cached_tokens += u64::from(cached_tokens);
        Some(Seq {
            id: req.id,
            block_hashes: req.block_hashes,
            slots,
            prompt_tokens: req.prompt_tokens,
            output_tokens: req.output_tokens,
            computed: cached_tokens,
            generated: 0,
            cached_tokens,
            committed_blocks: hit as u32,
            private_blocks: need,
            scheduled: 0,
        })
    }

    /// Applies the step ending at `t`: progress, newly cached blocks, events, departures.
    fn finish_step(&mut self, t: f64, out: &mut Vec<EngineEvent>) {
        self.step_end = None;
        let bt = self.config.block_tokens;
        let mut any_finished = false;
        for s in &mut self.running {
            if s.scheduled == 0 {
                continue;
            }
            if s.prefilling() {
                s.computed += s.scheduled;
                let full = (s.computed / bt).min(s.block_hashes.len() as u32);
                while s.committed_blocks < full {
                    let h = s.block_hashes[s.committed_blocks as usize];
                    if let Some(slot) = self.cache.commit(h) {
                        s.slots.push(slot);
                        s.private_blocks -= 1;
                    }
                    s.committed_blocks += 1;
                }
                if s.prefilling() {
                    continue;
                }
                out.push(EngineEvent::FirstToken {
                    id: s.id,
                    at: t,
                    cached_tokens: s.cached_tokens,
                });
            }
            s.generated += 1;
            self.stats.generation_tokens += 1;
            if s.generated >= s.output_tokens {
                out.push(EngineEvent::Finished { id: s.id, at: t });
                any_finished = true;
            }
        }
        if any_finished {
            let Self {
                running,
                cache,
                slot_pool,
                stats,
                ..
            } = self;
            running.retain_mut(|s| {
                if s.prefilling() || s.generated < s.output_tokens {
                    return true;
                }
                // Tail first, so a chain's tail is evicted before its head (as vLLM frees blocks).
                for &slot in s.slots.iter().rev() {
                    cache.release(slot);
                }
                cache.free_private(s.private_blocks);
                let mut slots = std::mem::take(&mut s.slots);
                slots.clear();
                slot_pool.push(slots);
                stats.finished += 1;
                false
            });
            cache.trim_to_capacity();
        }
    }
}

#[cfg(test)]
mod tests;
