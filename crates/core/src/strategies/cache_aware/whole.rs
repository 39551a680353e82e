//! Requests whose answer comes whole (`stream` false): the router sees no first token for them.
//!
//! An unstreamed answer arrives after its whole decode, so its request would stay counted as
//! queued prefill on its instance for seconds or minutes after the engine finished the prefill.
//! Batch or evaluation traffic that does not stream then makes its instances look congested:
//! cache-aware sends their own prefixes' revisits elsewhere, recomputing them there. So such a
//! request leaves the queue when its first token was expected (the estimate the decision made
//! when it was sent, on the instance's learned cost, or the prior before one is learned), and
//! from then on counts as decoding, as a streamed one would. If the answer comes first (a short
//! one, or an engine that streams anyway), it leaves the queue then, as any other.
//!
//! An instance slower than expected keeps fewer units queued than it really has while such
//! requests wait past their estimate; they still count as decoding, each adding its
//! `per_decoding` to every new request's estimate there.

use super::load::InstanceLoad;

/// One request expected whole, still counted as queued.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Due {
    /// When its first token is expected (the caller's clock, seconds).
    at: f64,
    /// Its queued units.
    units: u64,
    /// When it was sent.
    sent_at: f64,
    /// The rate its progress is counted at ([`InstanceLoad::join_queue`]).
    rate: f64,
    /// Its start on the instance's insertion counter (the strategy's `pending` entry).
    start: u32,
}

/// An instance's requests expected whole and still queued.
#[derive(Debug, Clone, PartialEq)]
pub struct WholeAnswers {
    due: Vec<Due>,
    /// The earliest `at` among them (infinite when none): one comparison per decision.
    next: f64,
}

impl Default for WholeAnswers {
    fn default() -> Self {
        Self {
            due: Vec::new(),
            next: f64::INFINITY,
        }
    }
}

impl WholeAnswers {
    /// How many are still queued.
    pub fn len(&self) -> usize {
        self.due.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.due.is_empty()
    }

    fn earliest(&self) -> f64 {
        self.due.iter().map(|d| d.at).fold(f64::INFINITY, f64::min)
    }
}

impl InstanceLoad {
    /// A request that joined the queue at `sent_at` (its progress counted at `rate`, its start
    /// on the insertion counter `start`) will be answered whole: it leaves the queue
    /// `expected_s` later unless its answer comes first. An estimate that is not a positive
    /// finite number leaves it queued until its answer, as before this rule.
    pub fn expect_whole(
        &mut self,
        units: u64,
        sent_at: f64,
        rate: f64,
        start: u32,
        expected_s: f64,
    ) {
        let at = sent_at + expected_s;
        if !(expected_s > 0.0 && at.is_finite()) {
            return;
        }
        self.whole.due.push(Due {
            at,
            units,
            sent_at,
            rate,
            start,
        });
        self.whole.next = self.whole.next.min(at);
    }

    /// Those whose first token was expected by `now` leave the queue and count as decoding.
    /// (Their blocks stay pending, in the strategy's sense, until the answer: the engine may
    /// be later than expected, and a miss on blocks it is still computing says nothing about
    /// its cache's size.)
    pub fn retire_whole(&mut self, now: f64) {
        // A NaN `now` retires nothing.
        if now.is_nan() || now < self.whole.next {
            return;
        }
        let mut i = 0;
        while i < self.whole.due.len() {
            let d = self.whole.due[i];
            if d.at <= now {
                self.whole.due.swap_remove(i);
                self.leave_queue(d.units, d.sent_at, d.rate);
                self.decoding += 1;
            } else {
                i += 1;
            }
        }
        self.whole.next = self.whole.earliest();
    }

    /// The request sent at `sent_at` with start `start`, expected whole, has its answer (or
    /// failed, or was cancelled): `true` if it was still queued (it is taken out of this list
    /// and the caller ends its wait as any other's), `false` if it had already left the queue
    /// ([`InstanceLoad::retire_whole`]: it counts as decoding).
    pub fn take_whole(&mut self, sent_at: f64, start: u32) -> bool {
        let found = self
            .whole
            .due
            .iter()
            .position(|d| d.sent_at.to_bits() == sent_at.to_bits() && d.start == start);
        match found {
            Some(i) => {
                self.whole.due.swap_remove(i);
                self.whole.next = self.whole.earliest();
                true
            }
            None => false,
        }
    }

    /// The requests expected whole that are still queued.
    pub fn whole(&self) -> &WholeAnswers {
        &self.whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategies::cache_aware::load::Cost;

    fn load() -> InstanceLoad {
        InstanceLoad::new(Cost {
            base_s: 0.01,
            per_unit_s: 1e-5,
            per_decoding_s: 1e-3,
        })
    }

    #[test]
    fn a_whole_answer_leaves_the_queue_at_its_expected_first_token() {
        let mut l = load();
        let rate = l.join_queue(1_000, 0.0, 0.5);
        l.expect_whole(1_000, 0.0, rate, 3, 0.5);
        l.retire_whole(0.4);
        assert_eq!((l.queued_units, l.waiting, l.decoding), (1_000, 1, 0));
        l.retire_whole(0.5);
        assert_eq!((l.queued_units, l.waiting, l.decoding), (0, 0, 1));
        assert!(l.whole().is_empty());
        // Its answer then finds it gone: the caller does not count it out a second time.
        assert!(!l.take_whole(0.0, 3));
    }

    #[test]
    fn an_answer_before_its_expected_time_takes_it_out() {
        let mut l = load();
        let a = l.join_queue(1_000, 0.0, 0.5);
        l.expect_whole(1_000, 0.0, a, 1, 0.5);
        let b = l.join_queue(2_000, 0.1, 0.9);
        l.expect_whole(2_000, 0.1, b, 2, 0.9);
        assert!(l.take_whole(0.0, 1));
        l.leave_queue(1_000, 0.0, a);
        // The other is due at 1.0 and no sooner.
        l.retire_whole(0.9);
        assert_eq!((l.queued_units, l.whole().len()), (2_000, 1));
        l.retire_whole(1.0);
        assert_eq!((l.queued_units, l.decoding, l.whole().len()), (0, 1, 0));
    }

    #[test]
    fn no_estimate_keeps_it_queued_until_its_answer() {
        let mut l = load();
        l.join_queue(1_000, 0.0, f64::NAN);
        for bad in [f64::NAN, 0.0, -1.0, f64::INFINITY] {
            l.expect_whole(1_000, 0.0, 0.0, 1, bad);
        }
        l.retire_whole(1e9);
        l.retire_whole(f64::NAN);
        assert_eq!((l.queued_units, l.whole().len()), (1_000, 0));
    }
}
