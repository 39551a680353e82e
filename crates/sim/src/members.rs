//! The simulated fleet: one engine per instance, the router's fleet view, and scaling.
//!
//! Instances are numbered in creation order (`sim-0`, `sim-1`, ...) and never renumbered, so
//! per-instance results line up across strategies and scale events. A removed instance first
//! drains (state `Draining`: the strategies skip it) and leaves the router's member list once
//! its last in-flight request finishes.

use std::sync::Arc;

use prefix_router_core::{
    Fleet, FleetSnapshot, Instance, InstanceSpec, InstanceState, MembershipChange,
};
use prefix_router_engine_model::{Engine, EngineConfig};

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Life {
    /// Receives new requests.
    Serving,
    /// Finishes its in-flight requests, receives nothing new.
    Draining,
    /// Gone from the fleet.
    Removed,
}

/// One simulated instance: its engine and the router's view of it.
#[derive(Debug)]
pub struct SimInstance {
    /// The engine model.
    pub engine: Engine,
    /// The router's instance (in-flight count, state); shared with the fleet's snapshots.
    pub view: Arc<Instance>,
    /// Where it is in its life.
    pub life: Life,
    /// Requests dispatched to it.
    pub dispatched: u64,
    /// Time of its pending engine-step event, if one is scheduled.
    pub scheduled: Option<f64>,
    /// Bumped whenever the pending engine-step event is replaced; stale queue entries carry an
    /// older value and are ignored.
    pub generation: u64,
}

/// Instance id of the `index`-th instance ever created.
pub fn instance_id(index: usize) -> String {
    format!("sim-{index}")
}

fn spec(index: usize) -> InstanceSpec {
    InstanceSpec {
        id: instance_id(index),
        url: format!("sim://{}", instance_id(index)),
        weight: 1,
        models: Vec::new(),
    }
}

/// Every instance ever created plus the router's fleet built from the live ones.
#[derive(Debug)]
pub struct SimFleet {
    engine_config: EngineConfig,
    fleet: Fleet,
    snapshot: Arc<FleetSnapshot>,
    /// Snapshot position -> instance index.
    snapshot_to_instance: Vec<usize>,
    /// Every instance ever created, by index.
    pub instances: Vec<SimInstance>,
    /// Membership changes not yet told to the strategy: (instance index, change).
    pub changes: Vec<(usize, MembershipChange)>,
}

impl SimFleet {
    /// `n` serving instances with empty caches.
    pub fn new(engine_config: EngineConfig, n: usize) -> Self {
        let fleet = Fleet::new((0..n).map(spec).collect());
        let mut me = Self {
            engine_config,
            snapshot: fleet.snapshot(),
            fleet,
            snapshot_to_instance: Vec::new(),
            instances: Vec::with_capacity(n),
            changes: Vec::new(),
        };
        me.refresh();
        me
    }

    /// The snapshot strategies route with (refreshed on every membership change).
    pub fn snapshot(&self) -> &FleetSnapshot {
        &self.snapshot
    }

    /// Instance index of a snapshot position.
    pub fn instance_at(&self, snapshot_index: usize) -> Option<usize> {
        self.snapshot_to_instance
            .get(snapshot_index)
            .copied()
            .filter(|&i| i < self.instances.len())
    }

    /// Adds `k` new serving instances with empty caches.
    pub fn add(&mut self, k: usize) {
        let first = self.instances.len();
        let mut specs = self.member_specs();
        specs.extend((first..first + k).map(spec));
        self.changes
            .extend((first..first + k).map(|i| (i, MembershipChange::Added)));
        self.fleet.set_members(specs);
        self.refresh();
    }

    /// Starts draining the `k` most recently created serving instances (as a scale-down of an
    /// ordered set removes its highest ordinals); those with nothing in flight leave at once.
    pub fn drain(&mut self, k: usize) {
        let mut left = k;
        for (i, inst) in self.instances.iter_mut().enumerate().rev() {
            if left == 0 {
                break;
            }
            if inst.life == Life::Serving {
                inst.life = Life::Draining;
                inst.view.set_state(InstanceState::Draining);
                self.changes.push((i, MembershipChange::Draining));
                left -= 1;
            }
        }
        self.remove_drained();
    }

    /// Removes draining instances whose in-flight count reached zero; true when any left.
    pub fn remove_drained(&mut self) -> bool {
        let mut changed = false;
        for (i, inst) in self.instances.iter_mut().enumerate() {
            if inst.life == Life::Draining && inst.view.in_flight() == 0 {
                inst.life = Life::Removed;
                self.changes.push((i, MembershipChange::Removed));
                changed = true;
            }
        }
        if changed {
            self.fleet.set_members(self.member_specs());
            self.refresh();
        }
        changed
    }

    /// Specs of the instances still in the router's member list, in creation order.
    fn member_specs(&self) -> Vec<InstanceSpec> {
        (0..self.instances.len())
            .filter(|&i| self.instances[i].life != Life::Removed)
            .map(spec)
            .collect()
    }

    /// Re-reads the snapshot after a membership change, creating engines for new members.
    fn refresh(&mut self) {
        self.snapshot = self.fleet.snapshot();
        self.snapshot_to_instance.clear();
        for view in self.snapshot.instances() {
            let index = match parse_index(&view.id().0) {
                Some(i) if i < self.instances.len() => {
                    self.instances[i].view = Arc::clone(view);
                    i
                }
                Some(i) if i == self.instances.len() => {
                    self.instances.push(SimInstance {
                        engine: Engine::new(self.engine_config.clone()),
                        view: Arc::clone(view),
                        life: Life::Serving,
                        dispatched: 0,
                        scheduled: None,
                        generation: 0,
                    });
                    i
                }
                // Not an id this simulator created: never routable (`instance_at` says None).
                _ => usize::MAX,
            };
            self.snapshot_to_instance.push(index);
        }
    }
}

/// Inverse of [`instance_id`].
fn parse_index(id: &str) -> Option<usize> {
    id.strip_prefix("sim-")?.parse().ok()
}
