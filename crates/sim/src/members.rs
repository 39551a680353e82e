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

/// One simulated instance: its engine and each router replica's view of it.
#[derive(Debug)]
pub struct SimInstance {
    /// The engine model.
    pub engine: Engine,
    /// Each replica's instance (its own in-flight count, state and scraped report); shared
    /// with that replica's fleet snapshots.
    pub views: Vec<Arc<Instance>>,
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

impl SimInstance {
    /// Requests in flight on it, from every replica.
    pub fn in_flight(&self) -> u32 {
        self.views.iter().map(|v| v.in_flight()).sum()
    }
}

/// Every instance ever created plus each router replica's fleet built from the live ones (the
/// same members in the same order for every replica).
#[derive(Debug)]
pub struct SimFleet {
    engine_config: EngineConfig,
    fleets: Vec<Fleet>,
    snapshots: Vec<Arc<FleetSnapshot>>,
    /// Snapshot position -> instance index.
    snapshot_to_instance: Vec<usize>,
    /// Every instance ever created, by index.
    pub instances: Vec<SimInstance>,
    /// Membership changes not yet told to the strategy: (instance index, change).
    pub changes: Vec<(usize, MembershipChange)>,
}

impl SimFleet {
    /// `n` serving instances with empty caches, seen by `replicas` (≥ 1) router replicas.
    pub fn new(engine_config: EngineConfig, n: usize, replicas: usize) -> Self {
        let fleets: Vec<Fleet> = (0..replicas.max(1))
            .map(|_| Fleet::new((0..n).map(spec).collect()))
            .collect();
        let mut me = Self {
            engine_config,
            snapshots: Vec::new(),
            fleets,
            snapshot_to_instance: Vec::new(),
            instances: Vec::with_capacity(n),
            changes: Vec::new(),
        };
        me.refresh();
        me
    }

    /// The snapshot replica `replica` routes with (refreshed on every membership change).
    pub fn snapshot(&self, replica: usize) -> &FleetSnapshot {
        &self.snapshots[replica]
    }

    /// Router replicas.
    pub fn replicas(&self) -> usize {
        self.fleets.len()
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
        self.set_members(&specs);
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
                inst.views
                    .iter()
                    .for_each(|v| v.set_state(InstanceState::Draining));
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
            if inst.life == Life::Draining && inst.in_flight() == 0 {
                inst.life = Life::Removed;
                self.changes.push((i, MembershipChange::Removed));
                changed = true;
            }
        }
        if changed {
            self.set_members(&self.member_specs());
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

    /// Every replica's member list becomes `specs`.
    fn set_members(&mut self, specs: &[InstanceSpec]) {
        for f in &self.fleets {
            f.set_members(specs.to_vec());
        }
        self.refresh();
    }

    /// Re-reads the snapshots after a membership change, creating engines for new members.
    fn refresh(&mut self) {
        self.snapshots = self.fleets.iter().map(Fleet::snapshot).collect();
        self.snapshot_to_instance.clear();
        for position in 0..self.snapshots[0].len() {
            let views: Vec<Arc<Instance>> = self
                .snapshots
                .iter()
                .map(|s| Arc::clone(&s.instances()[position]))
                .collect();
            let index = match parse_index(&views[0].id().0) {
                Some(i) if i < self.instances.len() => {
                    self.instances[i].views = views;
                    i
                }
                Some(i) if i == self.instances.len() => {
                    self.instances.push(SimInstance {
                        engine: Engine::new(self.engine_config.clone()),
                        views,
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
