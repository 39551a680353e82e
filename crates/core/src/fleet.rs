//! The fleet view: instances, their state and in-flight counts, read through immutable snapshots.
//!
//! Routing reads one [`FleetSnapshot`] per decision; membership changes build a new snapshot and
//! swap it in ([`arc_swap::ArcSwap`]), so they never block routing. An instance that stays in the
//! fleet across a change keeps its counters: requests in flight on it are still counted and
//! released against the same atomics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::reported::{EngineQueue, Reported};

/// Seed of [`Instance::id_hash`] (xxh3-64 of the id's UTF-8 bytes). Part of the routing
/// contract like [`crate::key::KEY_SEED`]: changing it reshuffles every key's placement.
pub const INSTANCE_SEED: u64 = 0x696e_7374_616e_6365; // "instance"

/// Stable identity of an instance (its URL or a configured name). Rendezvous scores derive from
/// it, so two independently built fleets with the same ids route keys identically.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceId(pub Arc<str>);

impl InstanceId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for InstanceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

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
    /// Not yet checked: a new member gets nothing until its first passed health check, so a
    /// router started before its engines does not route to instances that are not up.
    Unknown = 3,
    /// Joined, and being sent the hottest prefixes that will move to it before it takes its
    /// share ([`crate::prewarm`]); gets no routed request meanwhile.
    Warming = 4,
}

impl InstanceState {
    /// Its name in the admin API and on the live page.
    pub fn label(self) -> &'static str {
        match self {
            InstanceState::Healthy => "healthy",
            InstanceState::Draining => "draining",
            InstanceState::Ejected => "ejected",
            InstanceState::Unknown => "unknown",
            InstanceState::Warming => "warming",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            0 => InstanceState::Healthy,
            1 => InstanceState::Draining,
            3 => InstanceState::Unknown,
            4 => InstanceState::Warming,
            _ => InstanceState::Ejected,
        }
    }
}

/// What configuration or discovery says about an instance.
#[derive(Debug, Clone, PartialEq)]
pub struct InstanceSpec {
    /// Identity (usually the URL).
    pub id: String,
    /// Base URL, e.g. `http://10.0.0.5:8000`.
    pub url: String,
    /// Relative capacity for weighted rendezvous (1 = normal; 0 is treated as 1).
    pub weight: u32,
    /// Models and adapters it serves; empty means "serves any model".
    pub models: Vec<String>,
}

impl InstanceSpec {
    /// A weight-1 spec serving any model, whose id is its URL (the common configuration).
    pub fn from_url(url: impl Into<String>) -> Self {
        let url = url.into();
        Self {
            id: url.clone(),
            url,
            weight: 1,
            models: Vec::new(),
        }
    }
}

/// One instance as routing sees it. Shared (`Arc`) between snapshots so that in-flight counts
/// and state survive membership changes.
#[derive(Debug)]
pub struct Instance {
    id: InstanceId,
    spec: InstanceSpec,
    id_hash: u64,
    // Behind `Arc`s so that an instance whose spec changes (new weight, new models) can be
    // rebuilt while sharing its counters with the old one still held by in-flight requests.
    state: Arc<AtomicU8>,
    in_flight: Arc<AtomicU32>,
    reported: Arc<Reported>,
}

impl Instance {
    /// Whether `other` is this member, whatever its spec since: a changed spec rebuilds the
    /// `Instance` around the same counters ([`Fleet::set_members`]), while an id that left and
    /// came back is a new member with counters of its own.
    pub fn same_member(&self, other: &Instance) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }

    /// Builds a healthy instance with nothing in flight.
    pub fn new(spec: InstanceSpec) -> Self {
        Self::in_state(spec, InstanceState::Healthy)
    }

    /// Builds an instance in `state` with nothing in flight.
    pub fn in_state(spec: InstanceSpec, state: InstanceState) -> Self {
        Self::with_counters(
            spec,
            Arc::new(AtomicU8::new(state as u8)),
            Arc::new(AtomicU32::new(0)),
            Arc::default(),
        )
    }

    /// The id hash an instance with this id has ([`Instance::id_hash`]).
    pub fn hash_of(id: &str) -> u64 {
        xxh3_64_with_seed(id.as_bytes(), INSTANCE_SEED)
    }

    fn with_counters(
        spec: InstanceSpec,
        state: Arc<AtomicU8>,
        in_flight: Arc<AtomicU32>,
        reported: Arc<Reported>,
    ) -> Self {
        let id_hash = Self::hash_of(&spec.id);
        Self {
            id: InstanceId(Arc::from(spec.id.as_str())),
            spec,
            id_hash,
            state,
            in_flight,
            reported,
        }
    }

    /// Identity.
    pub fn id(&self) -> &InstanceId {
        &self.id
    }
    /// Configuration.
    pub fn spec(&self) -> &InstanceSpec {
        &self.spec
    }
    /// Hash of the id used for rendezvous scores (xxh3-64, seed [`INSTANCE_SEED`]).
    pub fn id_hash(&self) -> u64 {
        self.id_hash
    }
    /// Rendezvous weight: the configured weight, at least 1.
    pub fn weight(&self) -> u32 {
        self.spec.weight.max(1)
    }
    /// Current state.
    pub fn state(&self) -> InstanceState {
        InstanceState::from_u8(self.state.load(Ordering::Relaxed))
    }
    /// Changes the state (health checks, drain).
    pub fn set_state(&self, state: InstanceState) {
        self.state.store(state as u8, Ordering::Relaxed)
    }
    /// Moves to `to` if the state is one of `from` (and not already `to`), in one atomic step;
    /// returns whether it moved. Two callers racing to eject the same instance (health checker
    /// and request path) see one success, and an ejection cannot overwrite a drain set meanwhile.
    pub fn transition(&self, from: &[InstanceState], to: InstanceState) -> bool {
        self.state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| {
                let now = InstanceState::from_u8(v);
                (now != to && from.contains(&now)).then_some(to as u8)
            })
            .is_ok()
    }
    /// Whether it may receive new requests.
    pub fn is_healthy(&self) -> bool {
        self.state() == InstanceState::Healthy
    }
    /// Requests sent and not finished, as this router counts them.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
    /// Requests on the engine that this router did not send, as its latest report says, while
    /// that report is fresh at `now` (the caller's clock); `None` when unknown.
    pub fn others(&self, now: f64) -> Option<EngineQueue> {
        self.reported.get(now)
    }
    /// Stores the engine's latest report (see [`EngineQueue::others`]), trusted until
    /// `valid_until` on the caller's clock.
    pub(crate) fn report_others(&self, queue: EngineQueue, valid_until: f64) {
        self.reported.set(queue, valid_until)
    }
    /// Stores what an engine that reports `running` and `waiting` requests holds beyond this
    /// router's own in flight there now, trusted until `valid_until`; returns it. The one path
    /// from a scrape to routing, for the server's scraper and the simulator's.
    pub fn report_engine_queue(&self, running: f64, waiting: f64, valid_until: f64) -> EngineQueue {
        let others = EngineQueue::others(running, waiting, self.in_flight());
        self.report_others(others, valid_until);
        others
    }
    /// Its load as routing counts it at `now`: this router's requests in flight, plus the
    /// others the engine reported while that report is fresh (several router replicas then
    /// see one another's traffic).
    pub fn load(&self, now: f64) -> u32 {
        let others = self.others(now).map_or(0, |q| q.total());
        self.in_flight().saturating_add(others)
    }
    /// Counts one more request in flight; the caller must call [`Instance::release`] exactly once.
    pub fn acquire(&self) {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
    }
    /// Counts one request finished. Never goes below zero: an unmatched release is a caller bug
    /// (caught by a debug assertion) but must not wrap the count to 4 billion in production.
    pub fn release(&self) {
        let prev = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        debug_assert!(
            prev.is_ok(),
            "release() without a matching acquire() on instance {}",
            self.id
        );
    }
    /// Whether it serves `model` (None: any instance is eligible). An empty model list serves
    /// every model; otherwise the name must match exactly.
    pub fn serves(&self, model: Option<&str>) -> bool {
        match model {
            None => true,
            Some(m) => self.spec.models.is_empty() || self.spec.models.iter().any(|s| s == m),
        }
    }
    /// Healthy and serves `model`: may receive this request.
    pub fn is_eligible(&self, model: Option<&str>) -> bool {
        self.is_healthy() && self.serves(model)
    }
}

/// An immutable list of instances; strategies read one per decision.
#[derive(Debug, Default, Clone)]
pub struct FleetSnapshot {
    instances: Vec<Arc<Instance>>,
    uniform_weight: bool,
}

impl FleetSnapshot {
    /// Builds a snapshot from instances.
    pub fn new(instances: Vec<Arc<Instance>>) -> Self {
        let uniform_weight = instances.windows(2).all(|w| w[0].weight() == w[1].weight());
        Self {
            instances,
            uniform_weight,
        }
    }
    /// All instances, in configuration order.
    pub fn instances(&self) -> &[Arc<Instance>] {
        &self.instances
    }
    /// Number of instances (any state).
    pub fn len(&self) -> usize {
        self.instances.len()
    }
    /// Whether the snapshot has no instance at all.
    pub fn is_empty(&self) -> bool {
        self.instances.is_empty()
    }
    /// Whether every instance has the same rendezvous weight (lets prefix-aware routing compare
    /// integer scores instead of computing logarithms).
    pub fn uniform_weight(&self) -> bool {
        self.uniform_weight
    }
    /// The instance with this id and its index.
    pub fn get(&self, id: &str) -> Option<(usize, &Arc<Instance>)> {
        self.instances
            .iter()
            .enumerate()
            .find(|(_, i)| i.id().as_str() == id)
    }
    /// Instances that may take a request for `model` (healthy and serving it), with their index.
    pub fn eligible<'s>(
        &'s self,
        model: Option<&'s str>,
    ) -> impl Iterator<Item = (usize, &'s Arc<Instance>)> + 's {
        self.instances
            .iter()
            .enumerate()
            .filter(move |(_, i)| i.is_eligible(model))
    }
}

/// The live fleet: a swappable snapshot, so membership changes never block routing.
#[derive(Debug)]
pub struct Fleet {
    current: arc_swap::ArcSwap<FleetSnapshot>,
    /// The state a new member starts in.
    joins_as: InstanceState,
}

impl Default for Fleet {
    fn default() -> Self {
        Self {
            current: Default::default(),
            joins_as: InstanceState::Healthy,
        }
    }
}

impl Fleet {
    /// Builds a fleet from specs. A repeated id keeps its first spec (ids are identities).
    pub fn new(specs: Vec<InstanceSpec>) -> Self {
        Self::joining_as(specs, InstanceState::Healthy)
    }
    /// A fleet whose members, these and every later one, start in `state` (`Unknown` when
    /// health checks must pass before an instance takes requests).
    pub fn joining_as(specs: Vec<InstanceSpec>, state: InstanceState) -> Self {
        let fleet = Fleet {
            joins_as: state,
            ..Fleet::default()
        };
        fleet.set_members(specs);
        fleet
    }
    /// The snapshot to route one request with.
    pub fn snapshot(&self) -> Arc<FleetSnapshot> {
        self.current.load_full()
    }
    /// Replaces the member list; instances whose id persists keep their state and in-flight count.
    /// An unchanged spec keeps the very same `Arc<Instance>`; a changed one (weight, URL,
    /// models) gets a new `Instance` sharing the old counters. A repeated id keeps its first spec.
    pub fn set_members(&self, specs: Vec<InstanceSpec>) {
        self.set_members_joining(specs, self.joins_as);
    }

    /// As [`Fleet::set_members`], new members starting in `joins` (a joining instance to be
    /// prewarmed starts warming, so no request reaches it before).
    pub fn set_members_joining(&self, specs: Vec<InstanceSpec>, joins: InstanceState) {
        // rcu: concurrent set_members calls each see the other's result, never a lost update.
        self.current.rcu(|old| {
            let by_id: HashMap<&str, &Arc<Instance>> =
                old.instances.iter().map(|i| (i.id().as_str(), i)).collect();
            let mut seen = std::collections::HashSet::with_capacity(specs.len());
            let mut instances = Vec::with_capacity(specs.len());
            for spec in &specs {
                if !seen.insert(spec.id.as_str()) {
                    continue;
                }
                let inst = match by_id.get(spec.id.as_str()) {
                    Some(existing) if existing.spec == *spec => Arc::clone(existing),
                    Some(existing) => Arc::new(Instance::with_counters(
                        spec.clone(),
                        Arc::clone(&existing.state),
                        Arc::clone(&existing.in_flight),
                        Arc::clone(&existing.reported),
                    )),
                    None => Arc::new(Instance::in_state(spec.clone(), joins)),
                };
                instances.push(inst);
            }
            FleetSnapshot::new(instances)
        });
    }
    /// Sets the state of the instance with this id; false when no such instance exists.
    pub fn set_state(&self, id: &str, state: InstanceState) -> bool {
        match self.snapshot().get(id) {
            Some((_, inst)) => {
                inst.set_state(state);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(id: &str, models: &[&str]) -> InstanceSpec {
        InstanceSpec {
            id: id.into(),
            url: format!("http://{id}"),
            weight: 1,
            models: models.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn a_fleet_joining_as_unknown_routes_to_no_member_until_it_is_checked() {
        let fleet = Fleet::joining_as(vec![spec("a", &[])], InstanceState::Unknown);
        fleet.set_members(vec![spec("a", &[]), spec("b", &[])]);
        let snap = fleet.snapshot();
        assert!(snap
            .instances()
            .iter()
            .all(|i| i.state() == InstanceState::Unknown));
        assert_eq!(snap.eligible(None).count(), 0);
        assert!(snap.instances()[1].transition(&[InstanceState::Unknown], InstanceState::Healthy));
        assert_eq!(snap.eligible(None).map(|(i, _)| i).collect::<Vec<_>>(), [1]);
        // A member that stays keeps its state; the next newcomer starts unknown again.
        fleet.set_members(vec![spec("b", &[]), spec("c", &[])]);
        let states: Vec<_> = fleet
            .snapshot()
            .instances()
            .iter()
            .map(|i| i.state())
            .collect();
        assert_eq!(states, [InstanceState::Healthy, InstanceState::Unknown]);
    }

    #[test]
    fn new_instance_is_healthy_and_idle() {
        let i = Instance::new(spec("a", &[]));
        assert_eq!(i.state(), InstanceState::Healthy);
        assert_eq!(i.in_flight(), 0);
        assert_eq!(i.id().as_str(), "a");
        assert_eq!(i.id_hash(), xxh3_64_with_seed(b"a", INSTANCE_SEED));
    }

    #[test]
    fn acquire_release_and_state() {
        let i = Instance::new(spec("a", &[]));
        i.acquire();
        i.acquire();
        assert_eq!(i.in_flight(), 2);
        i.release();
        assert_eq!(i.in_flight(), 1);
        for s in [
            InstanceState::Draining,
            InstanceState::Ejected,
            InstanceState::Healthy,
        ] {
            i.set_state(s);
            assert_eq!(i.state(), s);
        }
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn release_saturates_at_zero() {
        let i = Instance::new(spec("a", &[]));
        i.release();
        assert_eq!(i.in_flight(), 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    fn unmatched_release_is_caught_in_debug_and_does_not_wrap() {
        let i = Arc::new(Instance::new(spec("a", &[])));
        let j = Arc::clone(&i);
        let r = std::thread::spawn(move || j.release()).join();
        assert!(r.is_err(), "debug assertion should fire");
        assert_eq!(i.in_flight(), 0);
    }

    #[test]
    fn transitions_are_checked_and_atomic() {
        use InstanceState::*;
        let i = Instance::new(spec("a", &[]));
        assert!(i.transition(&[Healthy], Ejected));
        assert!(!i.transition(&[Healthy], Ejected), "already ejected");
        assert!(i.transition(&[Healthy, Ejected], Draining));
        assert!(!i.transition(&[Healthy], Ejected), "a drain stays");
        assert_eq!(i.state(), Draining);
        let i = Arc::new(i);
        let wins: usize = (0..8)
            .map(|_| {
                let i = Arc::clone(&i);
                std::thread::spawn(move || i.transition(&[Draining], Healthy))
            })
            .map(|h| usize::from(h.join().unwrap_or(false)))
            .sum();
        assert_eq!(wins, 1);
    }

    #[test]
    fn serves_models() {
        let any = Instance::new(spec("a", &[]));
        assert!(any.serves(None) && any.serves(Some("llama")));
        let some = Instance::new(spec("b", &["llama", "lora-1"]));
        assert!(some.serves(None) && some.serves(Some("lora-1")));
        assert!(!some.serves(Some("lora")));
    }

    #[test]
    fn set_members_keeps_persisting_instances() {
        let fleet = Fleet::new(vec![spec("a", &[]), spec("b", &[])]);
        let snap = fleet.snapshot();
        let a = Arc::clone(&snap.instances()[0]);
        let b = Arc::clone(&snap.instances()[1]);
        a.acquire();
        b.acquire();
        b.set_state(InstanceState::Draining);
        let mut b2 = spec("b", &["m"]);
        b2.weight = 3;
        fleet.set_members(vec![
            spec("c", &[]),
            spec("a", &[]),
            b2,
            spec("a", &["dup"]),
        ]);
        let snap2 = fleet.snapshot();
        assert_eq!(snap2.len(), 3);
        let (ai, a_new) = snap2.get("a").expect("a persists");
        assert_eq!(ai, 1);
        assert!(Arc::ptr_eq(a_new, &a));
        assert!(
            a_new.spec().models.is_empty(),
            "first spec of a repeated id wins"
        );
        let (_, b_new) = snap2.get("b").expect("b persists");
        assert_eq!(b_new.weight(), 3);
        assert_eq!(b_new.in_flight(), 1);
        assert_eq!(b_new.state(), InstanceState::Draining);
        b.release();
        assert_eq!(
            b_new.in_flight(),
            0,
            "old and new instance share the counter"
        );
        assert_eq!(snap2.get("c").map(|(_, c)| c.in_flight()), Some(0));
        // The old snapshot is untouched.
        assert_eq!(snap.len(), 2);
    }

    #[test]
    fn eligible_filters_state_and_model() {
        let fleet = Fleet::new(vec![spec("a", &["m"]), spec("b", &[]), spec("c", &["x"])]);
        assert!(fleet.set_state("b", InstanceState::Ejected));
        assert!(!fleet.set_state("zz", InstanceState::Ejected));
        let snap = fleet.snapshot();
        let ids: Vec<usize> = snap.eligible(Some("m")).map(|(i, _)| i).collect();
        assert_eq!(ids, vec![0]);
        let ids: Vec<usize> = snap.eligible(None).map(|(i, _)| i).collect();
        assert_eq!(ids, vec![0, 2]);
        assert!(snap.uniform_weight());
    }
}
