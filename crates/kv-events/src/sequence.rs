//! Which published batches a subscriber has applied, and what a new sequence number means.
//!
//! Batches must be applied in order (a block removed, then stored again, is held; the other way
//! round it is not), so a gap stops the view until the missing batches are replayed: the
//! subscriber asks the replay socket for them, feeds each reply through
//! [`Sequence::observe_replayed`], and then the live message that showed the gap, again through
//! `observe_replayed`. If the
//! publisher no longer buffers them, the loss is accepted with [`Sequence::resume_at`] and the
//! view is incomplete from then on (the caller says so).

use std::ops::Range;

/// What a sequence number means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The first batch this subscriber sees (it joined mid-stream, or the engine just started):
    /// apply it; whatever came before is unknown.
    First,
    /// The next batch: apply it.
    Next,
    /// Batches `missing` were lost: replay them before applying this one.
    Gap { missing: Range<u64> },
    /// Applied already (a replay overlapping the live stream, a duplicate): skip it.
    Old,
    /// The live sequence went back (to 0, or to any number it had passed): the publisher
    /// restarted, and with it the engine's cache. Clear the view; this batch is the new
    /// stream's first.
    Restarted,
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    next: Option<u64>,
    /// The highest sequence number the live stream delivered: a publisher only counts up, so
    /// a live number at or below it means the publisher started again.
    live_max: Option<u64>,
}

impl Sequence {
    /// Nothing seen yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The sequence number expected next (`None` before the first).
    pub fn next(&self) -> Option<u64> {
        self.next
    }

    /// A batch from the live (PUB) stream. Advances unless it is a gap.
    pub fn observe(&mut self, seq: u64) -> Step {
        let step = match (self.next, self.live_max) {
            (None, _) => Step::First,
            // Live numbers only grow: one that does not is a new publisher counting again.
            (_, Some(m)) if seq <= m => Step::Restarted,
            (Some(n), _) if seq == n => Step::Next,
            (Some(n), _) if seq > n => return Step::Gap { missing: n..seq },
            // Between what the live stream delivered and what a replay brought.
            (Some(_), _) => {
                self.live_max = Some(seq);
                return Step::Old;
            }
        };
        self.next = Some(seq.saturating_add(1));
        self.live_max = Some(seq);
        step
    }

    /// A batch from a replay, or the live batch that showed a gap, seen again once the gap is
    /// dealt with: next, old (already applied) or a gap; never a restart.
    pub fn observe_replayed(&mut self, seq: u64) -> Step {
        match self.next {
            Some(n) if seq < n => Step::Old,
            Some(n) if seq > n => Step::Gap { missing: n..seq },
            _ => {
                self.next = Some(seq.saturating_add(1));
                Step::Next
            }
        }
    }

    /// Accepts that the batches before `seq` are lost: `seq` is expected next.
    pub fn resume_at(&mut self, seq: u64) {
        self.next = Some(seq);
    }

    /// Forgets everything (a reconnect to a publisher that may have restarted).
    pub fn reset(&mut self) {
        self.next = None;
        self.live_max = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_gaps_old_and_restarts() {
        let mut s = Sequence::new();
        assert_eq!(s.observe(5), Step::First);
        assert_eq!(s.observe(6), Step::Next);
        // 7 and 8 lost: nothing advances until they are replayed.
        assert_eq!(s.observe(9), Step::Gap { missing: 7..9 });
        assert_eq!(s.next(), Some(7));
        assert_eq!(s.observe_replayed(6), Step::Old);
        assert_eq!(s.observe_replayed(7), Step::Next);
        assert_eq!(s.observe_replayed(8), Step::Next);
        // The live batch that showed the gap, then what the replay brought ahead of the
        // live stream.
        assert_eq!(s.observe_replayed(9), Step::Next);
        assert_eq!(s.observe_replayed(10), Step::Next);
        assert_eq!(s.observe(10), Step::Old);
        assert_eq!(s.observe(11), Step::Next);
        // A replay that starts past what is missing leaves a gap; the loss is accepted.
        assert_eq!(s.observe(14), Step::Gap { missing: 12..14 });
        assert_eq!(s.observe_replayed(13), Step::Gap { missing: 12..13 });
        s.resume_at(14);
        assert_eq!(s.observe_replayed(14), Step::Next);
        assert_eq!(s.observe(15), Step::Next);
        // From a replay, an old number is only old; live, it is a publisher started again,
        // whether it counts from 0 or the subscriber missed its first batches.
        assert_eq!(s.observe_replayed(0), Step::Old);
        assert_eq!(s.observe(3), Step::Restarted);
        assert_eq!(s.observe(4), Step::Next);
        assert_eq!(s.observe(0), Step::Restarted);
        assert_eq!(s.observe(1), Step::Next);
        s.reset();
        assert_eq!(s.observe(40), Step::First);
    }
}
