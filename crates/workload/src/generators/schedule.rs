//! The arrival driver shared by every generator (and the ShareGPT file replay): sessions start as
//! a Poisson process, each session is a script of turns, and a turn arrives a gap after the
//! previous one. Requests come out lazily in arrival order, so conversations interleave.

use super::distributions::exponential;
use crate::request::{Message, Request};
use rand_pcg::Pcg64Mcg;
use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};

/// One request of a session: the messages it appends to the session's history, what it asks
/// the model to generate, and how long after the session's previous turn it arrives.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Turn {
    /// Messages appended to the history before this request (e.g. the previous answer and the
    /// new user message).
    pub new_messages: Vec<Message>,
    /// Tokens to generate.
    pub output_tokens: u32,
    /// Seconds after the previous turn's arrival (ignored for the first turn).
    pub gap_s: f64,
}

/// A script of turns sharing one growing history.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Session {
    /// Messages every turn starts with (system prompt, instructions).
    pub prefix: Vec<Message>,
    /// The turns, in order (at least one for the session to produce anything).
    pub turns: VecDeque<Turn>,
    /// Routing group.
    pub group: Option<String>,
}

/// Makes sessions on demand.
pub(crate) trait SessionSource: Send {
    /// The next session; `index` counts sessions from 0. `None` when the source is exhausted.
    fn next_session(&mut self, rng: &mut Pcg64Mcg, index: u64) -> Option<Session>;
    /// Expected turns per session (to turn a request rate into a session start rate).
    fn mean_turns(&self) -> f64;
}

#[derive(Debug)]
struct Pending {
    at_s: f64,
    seq: u64,
    slot: usize,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        self.at_s
            .total_cmp(&other.at_s)
            .then(self.seq.cmp(&other.seq))
    }
}

struct Active {
    history: Vec<Message>,
    turns: VecDeque<Turn>,
    group: Option<String>,
}

/// An iterator of requests in arrival order, ids `0..`, at most `requests` of them.
pub(crate) struct Driver {
    rng: Pcg64Mcg,
    source: Box<dyn SessionSource>,
    remaining: u64,
    next_id: u64,
    sessions: u64,
    source_done: bool,
    next_start_s: f64,
    mean_start_gap_s: f64,
    seq: u64,
    heap: BinaryHeap<Reverse<Pending>>,
    slots: Vec<Option<Active>>,
    free: Vec<usize>,
}

impl Driver {
    /// A driver emitting up to `requests` requests at `rate` requests per second on average
    /// (a non-positive or non-finite rate is treated as 1).
    pub(crate) fn new(
        rng: Pcg64Mcg,
        source: Box<dyn SessionSource>,
        requests: u64,
        rate: f64,
    ) -> Self {
        let rate = if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        };
        let mean_turns = source.mean_turns().max(1.0);
        Driver {
            rng,
            source,
            remaining: requests,
            next_id: 0,
            sessions: 0,
            source_done: false,
            next_start_s: 0.0,
            mean_start_gap_s: mean_turns / rate,
            seq: 0,
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    fn push(&mut self, at_s: f64, slot: usize) {
        self.seq += 1;
        self.heap.push(Reverse(Pending {
            at_s,
            seq: self.seq,
            slot,
        }));
    }

    fn start_session(&mut self) {
        let at = self.next_start_s;
        self.next_start_s += exponential(&mut self.rng, self.mean_start_gap_s);
        let Some(session) = self.source.next_session(&mut self.rng, self.sessions) else {
            self.source_done = true;
            return;
        };
        self.sessions += 1;
        if session.turns.is_empty() {
            return;
        }
        let active = Active {
            history: session.prefix,
            turns: session.turns,
            group: session.group,
        };
        let slot = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(active);
                i
            }
            None => {
                self.slots.push(Some(active));
                self.slots.len() - 1
            }
        };
        self.push(at, slot);
    }
}

impl Iterator for Driver {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        if self.remaining == 0 {
            return None;
        }
        loop {
            let start_first = match self.heap.peek() {
                None => true,
                Some(Reverse(p)) => self.next_start_s <= p.at_s,
            };
            if start_first && !self.source_done {
                self.start_session();
                continue;
            }
            let Reverse(pending) = self.heap.pop()?;
            let slot = pending.slot;
            let Some(active) = self.slots.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let Some(turn) = active.turns.pop_front() else {
                continue;
            };
            active.history.extend(turn.new_messages);
            let request = Request {
                id: self.next_id,
                arrival_s: pending.at_s,
                group: active.group.clone(),
                model: None,
                messages: active.history.clone(),
                output_tokens: turn.output_tokens,
            };
            let next_gap = active.turns.front().map(|t| t.gap_s.max(0.0));
            match next_gap {
                Some(gap) => self.push(pending.at_s + gap, slot),
                None => {
                    self.slots[slot] = None;
                    self.free.push(slot);
                }
            }
            self.next_id += 1;
            self.remaining -= 1;
            return Some(request);
        }
    }
}
