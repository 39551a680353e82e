//! The fleet view: instances, their state and in-flight counts, read through immutable snapshots.

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;

/// Stable identity of an instance (its URL or a configured name). Rendezvous scores derive from
/// it, so two independently built fleets with the same ids route keys identically.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub Arc<str>);

/// Whether an instance may receive new requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum InstanceState {
    /// Takes new requests.
    Healthy = 0,
    /// Finishes what it has; gets nothing new.
    Draining = 1,
    /// Failing health checks; gets nothing new until it recovers.
    Ejected = 2,
}

/// What configuration or discovery says about an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSpec {
    /// Identity (usually the URL).
    pub id: String,
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Relative capacity for weighted rendezvous (1 = normal).
    pub weight: u32,
    /// Models and adapters it serves; empty means "serves any model".
    pub models: Vec<String>,
}

/// One instance as routing sees it. Shared (`Arc`) between snapshots so that in-flight counts
/// and state survive membership changes.
#[derive(Debug)]
pub struct Instance {
    id: InstanceId,
    spec: InstanceSpec,
    id_hash: u64,
    state: AtomicU8,
    in_flight: AtomicU32,
}

impl Instance {
    /// Builds a healthy instance with nothing in flight.
    pub fn new(spec: InstanceSpec) -> Self {
        todo!("{spec:?}")
    }
    /// Identity.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }
    /// Configuration.
    pub fn spec(&self) -> &InstanceSpec {
        &self.spec
    }
    /// Hash of the id used for rendezvous scores.
    pub fn id_hash(&self) -> u64 {
        self.id_hash
    }
    /// Current state.
    pub fn state(&self) -> InstanceState {
        todo!("{:?}", self.state.load(Ordering::Relaxed))
    }
    /// Changes the state (health checks, drain).
    pub fn set_state(&self, state: InstanceState) {
        self.state.store(state as u8, Ordering::Relaxed)
    }
    /// Requests sent and not finished, as this router counts them.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
    /// Counts one more request in flight; the caller must call [`Instance::release`] exactly once.
    pub fn acquire(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }
    /// Counts one request finished.
    pub fn release(&self) {
        todo!()
    }
    /// Whether it serves `model` (None: any instance is eligible).
    pub fn serves(&self, model: Option<&str>) -> bool {
        todo!("{model:?}")
    }
}

/// An immutable list of instances; strategies read one per decision.
#[derive(Debug, Default, Clone)]
pub struct FleetSnapshot {
    instances: Vec<Arc<Instance>>,
}

impl FleetSnapshot {
    /// Builds a snapshot from instances.
    pub fn new(instances: Vec<Arc<Instance>>) -> Self {
        Self { instances }
    }
    /// All instances, in configuration order.
    pub fn instances(&self) -> &[Arc<Instance>] {
        &self.instances
    }
}

/// The live fleet: a swappable snapshot, so membership changes never block routing.
#[derive(Debug, Default)]
pub struct Fleet {
    current: arc_swap::ArcSwap<FleetSnapshot>,
}

impl Fleet {
    /// Builds a fleet from specs.
    pub fn new(specs: Vec<InstanceSpec>) -> Self {
        todo!("{specs:?}")
    }
    /// The snapshot to route one request with.
    pub fn snapshot(&self) -> Arc<FleetSnapshot> {
        self.current.load_full()
    }
    /// Replaces the member list; instances whose id persists keep their state and in-flight count.
    pub fn set_members(&self, specs: Vec<InstanceSpec>) {
        todo!("{specs:?}")
    }
}
