//! Requests answered whole (`stream` false): the router sees no first token for them, only the
//! whole answer after its decode ([`crate::strategies::cache_aware::whole`]).

use super::*;

/// A long prompt nothing else shares.
fn long(doc: u64) -> Chain {
    Chain::of_chars(None, &text(500 + doc, 100_000), SPEC)
}

/// One instance, and the strategy's state to read.
struct One {
    ca: Arc<super::super::CacheAware>,
    strategy: Arc<dyn Strategy>,
    fleet: Fleet,
}

impl One {
    fn new() -> Self {
        let ca = Arc::new(cache_aware(&[]));
        let strategy: Arc<dyn Strategy> = ca.clone();
        Self {
            ca,
            strategy,
            fleet: fleet(1),
        }
    }

    /// Sends `chain` to the instance at `now`, as a whole answer or streamed.
    fn send(&self, chain: &Chain, now: f64, whole: bool) -> Ticket {
        let inst = Arc::clone(&self.fleet.snapshot().instances()[0]);
        crate::dispatch::dispatch_to(
            &self.strategy,
            &request(chain, now, whole),
            inst,
            Reason::Cold,
        )
    }

    /// Queued units, requests waiting, requests decoding, pending starts.
    fn counts(&self) -> (u64, u32, u32, usize) {
        let st = self.ca.lock();
        let l = &st.loads[0];
        (l.queued_units, l.waiting, l.decoding, st.pending[0].len())
    }
}

/// The home of a served document, then a long request sent there (`whole` or streamed, its
/// answer still to come), then the document again 10 s later: where it goes.
fn revisit_beside_a_long_request(whole: bool) -> (usize, usize) {
    let strategy = strategy(UNBOUND);
    let fleet = fleet(2);
    let doc = prompt("", 1, 0);
    let served = dispatch_on(&strategy, &fleet, &doc, 1.0);
    let home = served.index;
    let mut t = served.ticket;
    t.first_token(1.01);
    t.finish(End::Finished { usage: None }, 1.02);
    let inst = Arc::clone(&fleet.snapshot().instances()[home]);
    let chain = long(1);
    let batch =
        crate::dispatch::dispatch_to(&strategy, &request(&chain, 3.0, whole), inst, Reason::Cold);
    let again = dispatch_on(&strategy, &fleet, &doc, 13.0);
    drop(batch);
    (home, again.index)
}

/// A 100,000-character request answered whole, sent to a document's home: once its first
/// token was due, the document's revisit goes home again (a cache hit). Counted as queued
/// until its whole answer, it sent the revisit to the other instance to recompute it there.
#[test]
fn a_whole_answers_request_stops_counting_as_queued_when_its_first_token_was_due() {
    let (home, again) = revisit_beside_a_long_request(true);
    assert_eq!(again, home, "the revisit went home");
    // The contrast: a streamed request with no first token 10 s on is really queued there.
    let (home, again) = revisit_beside_a_long_request(false);
    assert_ne!(again, home, "a request still queued keeps the revisit away");
}

/// What a whole answer's request leaves on its instance's counts, told once: it moves from
/// the queue to decoding when its first token is due, and its answer then ends its decoding
/// only (a second count-out took a later request's place in the queue).
#[test]
fn a_whole_answer_is_counted_out_of_the_queue_once() {
    let one = One::new();
    let (a, b) = (long(1), long(2));
    let mut whole = one.send(&a, 1.0, true);
    assert_eq!(one.counts(), (u64::from(a.units), 1, 0, 1));
    // 1,000 s on, far past the prior's estimate: a decision retires it.
    let streamed = one.send(&b, 1_000.0, false);
    // It stays pending (its blocks may still be computing) until its answer.
    assert_eq!(one.counts(), (u64::from(b.units), 1, 1, 2));
    // Its whole answer: a first token and an end, as the server tells them.
    whole.unstreamed();
    whole.finish(End::Finished { usage: None }, 1_001.0);
    assert_eq!(
        one.counts(),
        (u64::from(b.units), 1, 0, 1),
        "the streamed request is still queued"
    );
    drop(streamed);
    assert_eq!(one.counts(), (0, 0, 0, 0));
}

/// A whole answer that comes before its first token was due (a short answer, or an engine that
/// streams anyway) leaves the queue then, as any other, and nothing is retired later.
#[test]
fn a_whole_answer_that_comes_early_leaves_the_queue_as_any_other() {
    let one = One::new();
    let (a, b) = (long(1), long(2));
    let mut whole = one.send(&a, 1.0, true);
    whole.first_token(1.001);
    assert!(one.ca.lock().loads[0].whole().is_empty());
    let streamed = one.send(&b, 1_000.0, false);
    assert_eq!(one.counts(), (u64::from(b.units), 1, 1, 1));
    whole.finish(End::Failed, 1_001.0);
    drop(streamed);
    assert_eq!(one.counts(), (0, 0, 0, 0));
}

/// Cancelled after it left the queue (the client went away mid-decode): it ends its decoding,
/// not another request's wait.
#[test]
fn a_whole_answer_cancelled_after_its_first_token_was_due_ends_its_decoding() {
    let one = One::new();
    let (a, b) = (long(1), long(2));
    let whole = one.send(&a, 1.0, true);
    let streamed = one.send(&b, 1_000.0, false);
    drop(whole);
    // Its own pending start is gone, the other's is not.
    assert_eq!(one.counts(), (u64::from(b.units), 1, 0, 1));
    drop(streamed);
}
