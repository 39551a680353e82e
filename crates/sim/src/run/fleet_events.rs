//! What changes the fleet during a run: scale events, prewarming a joining instance, telling
//! the strategy about membership, and the routers' scrapes of the engines' queues.

use std::sync::Arc;

use prefix_router_core::{InstanceId, InstanceState, MembershipChange};

use super::Loop;
use crate::members::{instance_id, Life};
use crate::queue::Event;
use crate::SimError;

impl Loop<'_> {
    /// Applies scale event `index`.
    pub(super) fn scale(&mut self, now: f64, index: usize) -> Result<(), SimError> {
        let delta = self.inputs.config.scale[index].delta;
        if delta > 0 {
            let first = self.fleet.instances.len();
            self.fleet.add(delta as usize);
            self.track_new();
            self.tell_membership(now);
            if self.warmer.is_some() {
                for instance in first..self.fleet.instances.len() {
                    self.start_warming(now, instance)?;
                }
            }
        } else {
            self.fleet.drain(delta.unsigned_abs() as usize);
            self.tell_membership(now);
        }
        Ok(())
    }

    /// Holds a joining instance out of routing and sends its engine the first replays.
    pub(super) fn start_warming(&mut self, now: f64, instance: usize) -> Result<(), SimError> {
        let Some(warmer) = self.warmer.as_mut() else {
            return Ok(());
        };
        let inputs = self.inputs;
        let views = self.fleet.instances[instance].views.clone();
        for v in &views {
            v.set_state(InstanceState::Warming);
        }
        self.fleet
            .changes
            .push((instance, MembershipChange::Ejected));
        let joining = views[0].id().clone();
        let picked = warmer.start(
            now,
            instance,
            &joining,
            self.fleet.snapshot(0),
            &self.replicas[0],
            inputs.keys,
            inputs.requests,
            &mut self.rngs[0],
        );
        let budget = warmer.budget_s();
        self.tell_membership(now);
        if picked.is_empty() {
            self.warmed(now, instance);
            return Ok(());
        }
        self.queue
            .push(now + budget, Event::PrewarmBudget { instance });
        self.send_replays(now, instance)
    }

    /// Hands `instance`'s engine the replays it can take now.
    pub(super) fn send_replays(&mut self, now: f64, instance: usize) -> Result<(), SimError> {
        let Some(warmer) = self.warmer.as_mut() else {
            return Ok(());
        };
        let inputs = self.inputs;
        let target = Arc::clone(&self.fleet.instances[instance].views[0]);
        let sends = warmer.next_sends(
            now,
            instance,
            &target,
            &self.replicas[0],
            inputs.keys,
            inputs.requests,
            inputs.engine.block_tokens,
        );
        if sends.is_empty() {
            return Ok(());
        }
        for s in sends {
            self.fleet.instances[s.instance]
                .engine
                .submit(now, s.request);
        }
        self.reschedule(instance, now, false)
    }

    /// `instance` is done warming (or out of time): it takes its share from now.
    pub(super) fn warmed(&mut self, now: f64, instance: usize) {
        if !self.warmer.as_mut().is_some_and(|w| w.stop(instance)) {
            return;
        }
        let inst = &self.fleet.instances[instance];
        if inst.life != Life::Serving {
            return;
        }
        for v in &inst.views {
            v.set_state(InstanceState::Healthy);
        }
        self.fleet
            .changes
            .push((instance, MembershipChange::Healthy));
        self.tell_membership(now);
    }

    /// Starts the KV-event views of instances created since the last call (their engines
    /// record what their caches store and evict from now on).
    pub(super) fn track_new(&mut self) {
        let Some(views) = self.views.as_mut() else {
            return;
        };
        for (i, inst) in self
            .fleet
            .instances
            .iter_mut()
            .enumerate()
            .skip(self.tracked)
        {
            inst.engine.cache_mut().record_changes();
            views.track(i, &inst.views[0]);
        }
        self.tracked = self.fleet.instances.len();
    }

    /// Tells the strategy about the fleet's membership changes since the last call.
    pub(super) fn tell_membership(&mut self, now: f64) {
        for (index, change) in self.fleet.changes.drain(..) {
            let id = InstanceId(Arc::from(instance_id(index).as_str()));
            for s in self.replicas {
                s.membership(&id, change, now);
            }
        }
    }

    /// Reads every live engine's queue and sends the readings on their way; the next scrape
    /// follows while requests remain.
    pub(super) fn scrape(&mut self, now: f64) {
        let Some(model) = self.inputs.config.routers.scrape else {
            return;
        };
        let readings = self
            .fleet
            .instances
            .iter()
            .enumerate()
            .filter(|(_, i)| i.life != Life::Removed)
            .map(|(k, i)| (k, i.engine.running() as u32, i.engine.waiting() as u32))
            .collect();
        let n = self.scrapes.send(now, readings);
        self.queue
            .push(now + model.delay_s, Event::ScrapeArrives { scrape: n });
        // Only while something can still move: a run whose requests stall would otherwise
        // scrape for ever instead of ending as `SimError::Stalled`.
        if self.finished < self.inputs.requests.len() as u64 && !self.queue.only_observing() {
            self.queue.push(now + model.interval_s, Event::Scrape);
        }
    }

    /// A scrape's readings reach the replicas: each stores what the engine holds beyond its
    /// own requests in flight there now, trusted until the reading goes stale.
    pub(super) fn scrape_arrives(&mut self, scrape: u64) {
        let (Some(model), Some((sent_at, readings))) =
            (self.inputs.config.routers.scrape, self.scrapes.take(scrape))
        else {
            return;
        };
        for (k, running, waiting) in readings {
            let Some(inst) = self.fleet.instances.get(k) else {
                continue;
            };
            for view in &inst.views {
                view.report_engine_queue(
                    f64::from(running),
                    f64::from(waiting),
                    sent_at + model.stale_after_s,
                );
            }
        }
    }
}
