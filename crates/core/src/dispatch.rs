//! The one dispatch path: select, count in flight, tell the strategy, hand back a ticket.
//!
//! The HTTP server and the simulator both route through [`dispatch`] and report on the
//! [`Ticket`] it returns, so they cannot drift apart in how a request is counted or what the
//! strategy learns. A ticket releases its in-flight slot exactly once: when it is finished, or
//! when it is dropped unfinished (which counts as cancelled), like linkerd's completion on drop.

use std::sync::Arc;

use crate::strategy::{Feedback, TicketInfo, Usage};
use crate::{
    Decision, FleetSnapshot, Instance, Reason, RouteError, RouteRequest, RouteRng, Strategy,
};

/// A routed request: where it goes, why, and the ticket to report on.
#[derive(Debug)]
pub struct Dispatched {
    /// Index of the instance in the snapshot the decision was made on.
    pub index: usize,
    /// Why.
    pub reason: Reason,
    /// The request's ticket (holds its in-flight slot).
    pub ticket: Ticket,
}

/// Routes `req` on `fleet` with `strategy`: the strategy chooses, the chosen instance counts one
/// more request in flight, the strategy learns that it was sent, and the caller gets a ticket.
pub fn dispatch(
    strategy: &Arc<dyn Strategy>,
    req: &RouteRequest<'_>,
    fleet: &FleetSnapshot,
    rng: &mut RouteRng,
) -> Result<Dispatched, RouteError> {
    let decision = strategy.select(req, fleet, rng)?;
    let instance = fleet
        .instances()
        .get(decision.index)
        .cloned()
        .ok_or(RouteError::OutOfRange(strategy.name()))?;
    Ok(commit(strategy, req, decision, instance))
}

/// Sends `req` to `instance` without asking the strategy to choose (a prewarm replay, which
/// goes to the joining instance by definition): it counts in flight and the strategy learns
/// from its ticket as from any other (cache-aware then knows the instance holds the prefix).
pub fn dispatch_to(
    strategy: &Arc<dyn Strategy>,
    req: &RouteRequest<'_>,
    instance: Arc<Instance>,
    reason: Reason,
) -> Ticket {
    let decision = Decision {
        index: 0,
        reason,
        predicted_cached_units: 0,
    };
    commit(strategy, req, decision, instance).ticket
}

fn commit(
    strategy: &Arc<dyn Strategy>,
    req: &RouteRequest<'_>,
    decision: Decision,
    instance: Arc<Instance>,
) -> Dispatched {
    instance.acquire();
    let note = strategy.dispatched(req, &decision, &instance);
    let info = TicketInfo {
        instance: instance.id().clone(),
        instance_hash: instance.id_hash(),
        prompt_units: req.prompt_units,
        predicted_cached_units: decision.predicted_cached_units,
        note,
        sent_at: req.now,
        first_token_at: None,
        streamed: true,
        whole_answer: req.whole_answer,
    };
    Dispatched {
        index: decision.index,
        reason: decision.reason,
        ticket: Ticket {
            strategy: Arc::clone(strategy),
            instance,
            info,
            done: false,
            last_now: req.now,
        },
    }
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Answered completely; `usage` when the engine reported it.
    Finished { usage: Option<Usage> },
    /// The instance failed it.
    Failed,
    /// The client went away.
    Cancelled,
}

/// One dispatched request's slot and feedback channel. Report the first token with
/// [`Ticket::first_token`] and the end with [`Ticket::finish`]; dropping it unfinished reports
/// [`Feedback::Cancelled`] at the last time it was told.
#[derive(Debug)]
pub struct Ticket {
    strategy: Arc<dyn Strategy>,
    instance: Arc<Instance>,
    info: TicketInfo,
    done: bool,
    last_now: f64,
}

impl Ticket {
    /// The instance it holds a slot on.
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// What the strategy remembers about it.
    pub fn info(&self) -> &TicketInfo {
        &self.info
    }

    /// The first token (or response byte) came at `now`. Only the first call counts.
    pub fn first_token(&mut self, now: f64) {
        if self.done || self.info.first_token_at.is_some() {
            return;
        }
        self.last_now = now;
        self.info.first_token_at = Some(now);
        self.strategy
            .feedback(&self.info, &Feedback::FirstToken, now);
    }

    /// The answer is not streamed: its first token, when told (or implied by its end), is when
    /// the whole answer arrived, which is no sample of its time ([`TicketInfo::streamed`]).
    pub fn unstreamed(&mut self) {
        self.info.streamed = false;
    }

    /// The request ended at `now`: releases the slot and tells the strategy.
    pub fn finish(mut self, end: End, now: f64) {
        self.end(end, now);
    }

    fn end(&mut self, end: End, now: f64) {
        if self.done {
            return;
        }
        self.done = true;
        self.instance.release();
        let event = match end {
            End::Finished { usage } => {
                // An answer with no separate first byte (one chunk) had it now.
                if self.info.first_token_at.is_none() {
                    self.info.first_token_at = Some(now);
                    self.strategy
                        .feedback(&self.info, &Feedback::FirstToken, now);
                }
                Feedback::Finished { usage }
            }
            End::Failed => Feedback::Failed,
            End::Cancelled => Feedback::Cancelled,
        };
        self.strategy.feedback(&self.info, &event, now);
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let now = self.last_now;
        self.end(End::Cancelled, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::StrategyKind;
    use crate::{Fleet, InstanceSpec, StrategyConfig};
    use rand::SeedableRng;

    use crate::strategies::recording::{Call, Pick, Recording};

    /// The recorder's calls, rendered the way these tests compare them.
    fn rendered(rec: &Recording) -> Vec<String> {
        rec.take()
            .into_iter()
            .map(|c| match c {
                Call::Dispatched { instance, now, .. } => format!("sent {instance} at {now}"),
                Call::Feedback {
                    instance,
                    event,
                    now,
                    note,
                    ..
                } => format!("{event:?} {instance} at {now} {:?}", note[0]),
                Call::Membership { instance, change } => format!("{instance} {change:?}"),
            })
            .collect()
    }

    fn fleet() -> Fleet {
        Fleet::new(vec![
            InstanceSpec::from_url("a"),
            InstanceSpec::from_url("b"),
        ])
    }

    #[test]
    fn a_ticket_counts_once_and_reports_in_order() {
        let rec = Arc::new(Recording::new(Pick::Last));
        let strategy: Arc<dyn Strategy> = rec.clone();
        let fleet = fleet();
        let snap = fleet.snapshot();
        let mut rng = RouteRng::seed_from_u64(1);
        let mut req = RouteRequest::keyed(None, None);
        req.now = 1.0;
        let d = dispatch(&strategy, &req, &snap, &mut rng).expect("routes");
        assert_eq!(d.index, 1);
        assert_eq!(snap.instances()[1].in_flight(), 1);
        let mut t = d.ticket;
        t.first_token(2.0);
        t.first_token(2.5);
        t.finish(End::Finished { usage: None }, 3.0);
        assert_eq!(snap.instances()[1].in_flight(), 0);
        assert_eq!(
            rendered(&rec),
            vec![
                "sent b at 1".to_string(),
                "FirstToken b at 2 7".into(),
                "Finished { usage: None } b at 3 7".into(),
            ]
        );
    }

    #[test]
    fn dropping_a_ticket_cancels_and_a_one_chunk_answer_still_has_a_first_token() {
        let rec = Arc::new(Recording::new(Pick::Last));
        let strategy: Arc<dyn Strategy> = rec.clone();
        let fleet = fleet();
        let snap = fleet.snapshot();
        let mut rng = RouteRng::seed_from_u64(1);
        let req = RouteRequest::keyed(None, None);
        let d = dispatch(&strategy, &req, &snap, &mut rng).expect("routes");
        drop(d.ticket);
        assert_eq!(snap.instances()[1].in_flight(), 0);
        assert_eq!(rendered(&rec)[1], "Cancelled b at 0 7");
        let d = dispatch(&strategy, &req, &snap, &mut rng).expect("routes");
        d.ticket.finish(End::Finished { usage: None }, 4.0);
        let calls = rendered(&rec);
        assert_eq!(calls[1], "FirstToken b at 4 7");
        assert_eq!(calls.len(), 3);
    }

    #[test]
    fn every_registered_strategy_dispatches_and_releases() {
        let fleet = fleet();
        let snap = fleet.snapshot();
        let mut rng = RouteRng::seed_from_u64(3);
        for kind in StrategyKind::all() {
            let s = StrategyConfig::new(kind).build().expect("builds");
            let chain = [1u64, 2, 3];
            let req = RouteRequest {
                key: Some(crate::KeyHash(9)),
                chain: &chain,
                prompt_units: 400,
                model: None,
                now: 0.5,
                tokens: None,
                whole_answer: false,
            };
            let tickets: Vec<Ticket> = (0..5)
                .map(|_| dispatch(&s, &req, &snap, &mut rng).expect("routes").ticket)
                .collect();
            let total: u32 = snap.instances().iter().map(|i| i.in_flight()).sum();
            assert_eq!(total, 5, "{kind}");
            for t in tickets {
                t.finish(End::Failed, 1.0);
            }
            assert!(
                snap.instances().iter().all(|i| i.in_flight() == 0),
                "{kind}"
            );
        }
    }
}
