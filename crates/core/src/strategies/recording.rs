//! `Recording`: a strategy that records every call made to it, for the tests of the callers of
//! the strategy contract (the dispatch path, the server, the simulator). It is not in the
//! registry: nothing routes real traffic with it.

use std::sync::Mutex;

use crate::strategy::{Feedback, MembershipChange, Note, TicketInfo};
use crate::{
    Decision, FleetSnapshot, Instance, InstanceId, Reason, RouteError, RouteRequest, RouteRng,
    Strategy,
};

/// Which eligible instance it sends every request to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pick {
    /// The first eligible instance of the snapshot.
    First,
    /// The last eligible instance of the snapshot.
    Last,
}

/// One call the strategy received.
#[derive(Debug, Clone, PartialEq)]
pub enum Call {
    /// [`Strategy::dispatched`], with what the instance's engine reported of other routers'
    /// requests then ([`Instance::others`]).
    Dispatched {
        instance: InstanceId,
        now: f64,
        others: Option<crate::EngineQueue>,
        /// [`RouteRequest::whole_answer`].
        whole_answer: bool,
    },
    /// [`Strategy::feedback`].
    Feedback {
        instance: InstanceId,
        event: Feedback,
        now: f64,
        sent_at: f64,
        note: Note,
        /// [`TicketInfo::streamed`].
        streamed: bool,
    },
    /// [`Strategy::membership`].
    Membership {
        instance: InstanceId,
        change: MembershipChange,
    },
}

/// Records every call; see the module documentation.
#[derive(Debug)]
pub struct Recording {
    pick: Pick,
    calls: Mutex<Vec<Call>>,
}

impl Recording {
    /// The note every dispatch returns, so a test can check that tickets hand it back.
    pub const NOTE: Note = [7, 0, 0, 0];

    /// A recorder that sends everything to the `pick` eligible instance.
    pub fn new(pick: Pick) -> Self {
        Self {
            pick,
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The calls so far, oldest first; forgets them.
    pub fn take(&self) -> Vec<Call> {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *calls)
    }

    /// Takes the calls so far ([`Recording::take`]) and says whether the first first token among
    /// them was streamed ([`TicketInfo::streamed`]); `None` when none was told.
    pub fn first_token_streamed(&self) -> Option<bool> {
        self.take().into_iter().find_map(|c| match c {
            Call::Feedback {
                event: Feedback::FirstToken,
                streamed,
                ..
            } => Some(streamed),
            _ => None,
        })
    }

    fn push(&self, call: Call) {
        self.calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(call);
    }
}

impl Strategy for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }

    fn select(
        &self,
        req: &RouteRequest<'_>,
        fleet: &FleetSnapshot,
        _rng: &mut RouteRng,
    ) -> Result<Decision, RouteError> {
        let mut eligible = fleet.eligible(req.model).map(|(i, _)| i);
        let index = match self.pick {
            Pick::First => eligible.next(),
            Pick::Last => eligible.last(),
        };
        index
            .map(|i| Decision::new(i, Reason::Random))
            .ok_or(RouteError::NoHealthyInstance)
    }

    fn reads_usage(&self) -> bool {
        true
    }

    fn dispatched(&self, req: &RouteRequest<'_>, _d: &Decision, instance: &Instance) -> Note {
        self.push(Call::Dispatched {
            instance: instance.id().clone(),
            now: req.now,
            others: instance.others(req.now),
            whole_answer: req.whole_answer,
        });
        Self::NOTE
    }

    fn feedback(&self, t: &TicketInfo, event: &Feedback, now: f64) {
        self.push(Call::Feedback {
            instance: t.instance.clone(),
            event: *event,
            now,
            sent_at: t.sent_at,
            note: t.note,
            streamed: t.streamed,
        });
    }

    fn membership(&self, instance: &InstanceId, change: MembershipChange, _now: f64) {
        self.push(Call::Membership {
            instance: instance.clone(),
            change,
        });
    }
}
