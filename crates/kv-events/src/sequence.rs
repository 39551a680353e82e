//! Which published batches a subscriber has applied, and what a new sequence number means.
//!
//! Batches must be applied in order (a block removed, then stored again, is held; the other way
//! round it is not), so a gap stops the view until the missing batches are replayed: the
//! subscriber asks the replay socket for them, feeds each reply through
//! [`Sequence::observe_replayed`], and then the live message that showed the gap again. If the
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
    /// The live sequence went back to 0: the publisher restarted, and with it the engine's
    /// cache. Clear the view, then apply this batch.
    Restarted,
}

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Sequence {
    next: Option<u64>,
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
        match self.next {
            None => {
                self.next = Some(seq.saturating_add(1));
                Step::First
            }
            Some(n) if seq == n => {
                self.next = Some(n.saturating_add(1));
                Step::Next
            }
            Some(n) if seq > n => Step::Gap { missing: n..seq },
            Some(_) if seq == 0 => {
                self.next = Some(1);
                Step::Restarted
            }
            Some(_) => Step::Old,
        }
    }

    /// A batch from a replay: like [`Sequence::observe`], except that an old sequence number is
    /// only old (a replay from 0 is not a restart).
    pub fn observe_replayed(&mut self, seq: u64) -> Step {
        match self.next {
            Some(n) if seq < n => Step::Old,
            _ => self.observe(seq),
        }
    }

    /// Accepts that the batches before `seq` are lost: `seq` is expected next.
    pub fn resume_at(&mut self, seq: u64) {
        self.next = Some(seq);
    }

    /// Forgets everything (a reconnect to a publisher that may have restarted).
    pub fn reset(&mut self) {
        self.next = None;
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
        assert_eq!(s.observe_replayed(9), Step::Next);
        assert_eq!(s.observe_replayed(10), Step::Next);
        // The live copies of what the replay brought.
        assert_eq!(s.observe(9), Step::Old);
        assert_eq!(s.observe(10), Step::Old);
        assert_eq!(s.observe(11), Step::Next);
        // A replay that starts past what is missing leaves a gap; the loss is accepted.
        assert_eq!(s.observe(14), Step::Gap { missing: 12..14 });
        assert_eq!(s.observe_replayed(13), Step::Gap { missing: 12..13 });
        s.resume_at(14);
        assert_eq!(s.observe(14), Step::Next);
        // Back to 0 live: the publisher restarted. From a replay, 0 is only old.
        assert_eq!(s.observe_replayed(0), Step::Old);
        assert_eq!(s.observe(0), Step::Restarted);
        assert_eq!(s.observe(1), Step::Next);
        s.reset();
        assert_eq!(s.observe(40), Step::First);
    }
}
