//! What the router knows of each instance's queue, and the costs it learns online.
//!
//! Queue: the prefill units (characters or bytes) of requests sent to the instance that have
//! not produced their first token, each counted as the units the router expected the instance
//! not to have cached. Decoding: requests past their first token and not finished.
//!
//! What of the queue is still ahead of a new request ([`InstanceLoad::queued_at`]): its units
//! less each queued request's progress, its units times the time since it was sent over the
//! time to first token expected for it then, and never less than a floor (`progress-floor`) of
//! the whole queue's units. The floor is on the instance's queue, not on each request: a
//! request past its expected time keeps counting as progress and eats into the others' share
//! until the floor stops it (kept per request, in a list, it read within a millisecond of this
//! on rag; see BENCHMARKS.md). One sent a moment ago will share the engine's next prefill steps with a
//! new request; one sent nearly its expected time ago is finishing, and the new request reaches
//! the engine after it. Counting both in full made every instance with one request in flight
//! look alike, so a new request often went to the one whose request had just left: on `rag` at
//! 0.8 of capacity (the simulator, seed 1), 288 of 5,000 requests went to an instance that had
//! been sent one less than 10 ms before, and 202 of those were slower than the P90. The floor
//! keeps an instance whose first tokens are later than expected (a long queue, a slow step)
//! from looking idle. Kept as two sums (O(1) per decision, whatever the queue's length).
//!
//! Cost: time to first token ≈ `base + per_unit × prefill + per_decoding × decoding`, where
//! `prefill` is the units the request waits behind plus its own uncached units and `decoding`
//! the requests decoding on the instance when it was sent (each slows every engine step). The
//! three terms are fitted per instance by exponentially weighted least squares over observed
//! first tokens. A slope keeps its configured prior until the samples spread enough in that
//! variable to show one (their spread, at the prior's slope, must explain 3% of the mean
//! time: cache hits alone say nothing about a prefill's cost, and fitting their noise would make
//! an instance look free, so that it draws every new prefix). Slopes are clamped to a tenth and
//! ten times their prior; the base is what is left of the mean time.
//!
//! Each instance's fit is blended with the fleet's ([`Pool`]: every instance's samples), its own
//! weight fading while others are observed and it is not. An instance that drew a few slow
//! first tokens early would otherwise keep that estimate forever: it would never be chosen, so
//! never observed again, and its share of new prefixes would go to the others. Fading, it is
//! tried again; if it really is slower, its fresh samples say so.

/// Weight of each new sample in the fit (about the last 50 requests of an instance count).
const DECAY: f64 = 0.02;

/// Samples' worth of weight the fleet's fit has in an instance's estimate.
const POOL_WEIGHT: f64 = 8.0;

/// The fleet's fit: every instance's first tokens.
#[derive(Debug, Clone)]
pub struct Pool {
    fit: CostFit,
    samples: u64,
    /// `fit.cost()` as of the last sample: decisions read it for every candidate, samples
    /// change it.
    cost: Cost,
}

impl Pool {
    /// An empty pool starting at the prior.
    pub fn new(prior: Cost) -> Self {
        Self {
            fit: CostFit::new(prior),
            samples: 0,
            cost: prior,
        }
    }
    /// The fleet's cost, for an instance with no samples of its own.
    pub fn cost(&self) -> Cost {
        self.cost
    }
    /// Whether the fleet's cost is learned yet (not still the prior).
    pub fn learned(&self) -> bool {
        self.fit.n >= MIN_SAMPLES
    }
}

/// One instance's load and learned cost.
#[derive(Debug, Clone)]
pub struct InstanceLoad {
    /// Prefill units queued (sent, no first token yet).
    pub queued_units: u64,
    /// Requests waiting for their first token.
    pub waiting: u32,
    /// Requests past their first token, not finished.
    pub decoding: u32,
    /// Σ units / expected seconds over the queued requests: how fast their progress grows.
    progress_rate: f64,
    /// Σ units × sent-at / expected seconds over them: progress at `now` is
    /// `now × progress_rate − progress_offset`.
    progress_offset: f64,
    fit: CostFit,
    /// `fit.cost()` as of its last sample (see [`Pool::cost`]).
    own: Cost,
    /// The pool's sample count at this instance's last sample.
    seen_at: u64,
    /// When this load started (the instance was removed and its load reset then): feedback
    /// on requests sent before belongs to the load that was dropped.
    pub since: f64,
    /// Its queued requests that will be answered whole ([`super::whole`]).
    pub(super) whole: super::whole::WholeAnswers,
}

impl InstanceLoad {
    /// An idle instance whose cost starts at the prior.
    pub fn new(prior: Cost) -> Self {
        Self {
            queued_units: 0,
            waiting: 0,
            decoding: 0,
            progress_rate: 0.0,
            progress_offset: 0.0,
            fit: CostFit::new(prior),
            own: prior,
            seen_at: 0,
            since: f64::NEG_INFINITY,
            whole: Default::default(),
        }
    }
    /// An idle instance's load that starts at `now`, after the one it replaces was dropped.
    pub fn since(prior: Cost, now: f64) -> Self {
        Self {
            since: now,
            ..Self::new(prior)
        }
    }
    /// A request of `units` sent at `now`, its first token expected `expected_s` later, joins the
    /// queue. Returns the rate its progress is counted at, for [`InstanceLoad::leave_queue`].
    pub fn join_queue(&mut self, units: u64, now: f64, expected_s: f64) -> f64 {
        self.queued_units += units;
        self.waiting += 1;
        // No estimate (zero, negative, not a number): counted in full until its first token.
        if !(expected_s > 0.0 && expected_s.is_finite() && now.is_finite()) {
            return 0.0;
        }
        let rate = units as f64 / expected_s.max(MIN_EXPECTED_S);
        if rate.is_finite() {
            self.progress_rate += rate;
            self.progress_offset += rate * now;
            rate
        } else {
            0.0
        }
    }

    /// The request [`InstanceLoad::join_queue`] took at `sent_at` (returning `rate`) leaves the
    /// queue: its first token came, or it failed first.
    pub fn leave_queue(&mut self, units: u64, sent_at: f64, rate: f64) {
        self.queued_units = self.queued_units.saturating_sub(units);
        self.waiting = self.waiting.saturating_sub(1);
        if self.waiting == 0 {
            // Nothing queued: the sums are exactly zero (no rounding carried on).
            self.progress_rate = 0.0;
            self.progress_offset = 0.0;
        } else if rate.is_finite() && sent_at.is_finite() {
            self.progress_rate -= rate;
            self.progress_offset -= rate * sent_at;
        }
    }

    /// The queued units still ahead of a request sent at `now` (see the module documentation):
    /// never less than `floor` of the whole queue, never more than all of it.
    pub fn queued_at(&self, now: f64, floor: f64) -> f64 {
        let all = self.queued_units as f64;
        let progress = now * self.progress_rate - self.progress_offset;
        let ahead = all - progress;
        if ahead.is_nan() {
            return all;
        }
        ahead.clamp(floor.clamp(0.0, 1.0) * all, all)
    }

    /// The current cost estimate: its own fit blended with the pool's, its own weight fading by
    /// one decay step for every `instances` samples the pool took since its last.
    pub fn cost(&self, pool: &Pool, instances: usize) -> Cost {
        self.cost_with(pool, |gap| fade(gap, instances))
    }

    /// [`InstanceLoad::cost`], its fading factor for the pool's samples since the instance's
    /// last (`gap`) given by `fade` (a [`Fades`] memo; [`fade`] itself).
    pub fn cost_with(&self, pool: &Pool, fade: impl FnOnce(u64) -> f64) -> Cost {
        if self.fit.n < MIN_SAMPLES {
            return pool.cost();
        }
        let own = self.own;
        let n = self.fit.n * fade(pool.samples.saturating_sub(self.seen_at));
        let w = n / (n + POOL_WEIGHT);
        let p = pool.cost();
        let mix = |a: f64, b: f64| w * a + (1.0 - w) * b;
        Cost {
            base_s: mix(own.base_s, p.base_s),
            per_unit_s: mix(own.per_unit_s, p.per_unit_s),
            per_decoding_s: mix(own.per_decoding_s, p.per_decoding_s),
        }
    }
    /// Learns from one first token: it waited behind and computed `prefill` units, with
    /// `decoding` requests decoding beside it, and took `ttft_s` seconds.
    pub fn observe(&mut self, pool: &mut Pool, prefill: f64, decoding: f64, ttft_s: f64) {
        if self.fit.observe(prefill, decoding, ttft_s) {
            pool.fit.observe(prefill, decoding, ttft_s);
            pool.samples += 1;
            pool.cost = pool.fit.cost();
            self.own = self.fit.cost();
            self.seen_at = pool.samples;
        }
    }
}

/// An instance's own weight after `gap` samples of the pool since its last: one decay step
/// for every `instances` of them.
pub fn fade(gap: u64, instances: usize) -> f64 {
    (1.0 - DECAY).powf(gap as f64 / instances.max(1) as f64)
}

/// Gaps below this are remembered by [`Fades`] (8 KiB of factors at most).
const FADES: usize = 1024;

/// [`fade`] for the gaps decisions meet, each computed once per fleet size. The same
/// expression, so bit for bit what it gives (decisions, and `simulate`'s output, are
/// unchanged), where a `powf` per candidate was about 130 instructions of each decision.
#[derive(Debug, Clone, Default)]
pub struct Fades {
    instances: usize,
    /// By gap; NaN where not computed yet (a factor never is NaN).
    factors: Vec<f64>,
}

impl Fades {
    /// [`fade`]`(gap, instances)`.
    pub fn factor(&mut self, gap: u64, instances: usize) -> f64 {
        if instances != self.instances {
            self.instances = instances;
            self.factors.clear();
        }
        let i = match usize::try_from(gap) {
            Ok(i) if i < FADES => i,
            _ => return fade(gap, instances),
        };
        if self.factors.len() <= i {
            self.factors.resize(i + 1, f64::NAN);
        }
        let known = self.factors[i];
        if !known.is_nan() {
            return known;
        }
        let f = fade(gap, instances);
        self.factors[i] = f;
        f
    }
}

/// The shortest expected time to first token a queued request's progress is spread over (an
/// absurdly small estimate must not count it done at once).
const MIN_EXPECTED_S: f64 = 1e-3;

/// Samples before a fit replaces its prior.
const MIN_SAMPLES: f64 = 8.0;

/// The learned cost of an instance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Fixed part of the time to first token, seconds.
    pub base_s: f64,
    /// Seconds per prefill unit.
    pub per_unit_s: f64,
    /// Seconds each decoding request adds.
    pub per_decoding_s: f64,
}

impl Cost {
    /// Expected time to first token with `prefill` units ahead and own, `decoding` beside.
    pub fn ttft(&self, prefill: f64, decoding: f64) -> f64 {
        self.base_s + self.per_unit_s * prefill + self.per_decoding_s * decoding
    }
}

/// Exponentially weighted sums for the least squares of `t = base + a x + b y`.
#[derive(Debug, Clone)]
struct CostFit {
    prior: Cost,
    n: f64,
    sx: f64,
    sy: f64,
    st: f64,
    sxx: f64,
    syy: f64,
    sxy: f64,
    sxt: f64,
    syt: f64,
}

impl CostFit {
    fn new(prior: Cost) -> Self {
        Self {
            prior,
            n: 0.0,
            sx: 0.0,
            sy: 0.0,
            st: 0.0,
            sxx: 0.0,
            syy: 0.0,
            sxy: 0.0,
            sxt: 0.0,
            syt: 0.0,
        }
    }

    /// Adds a sample; false (and nothing changes) for nonsense.
    fn observe(&mut self, x: f64, y: f64, t: f64) -> bool {
        let ok = |v: f64| v.is_finite() && v >= 0.0;
        if !(ok(x) && ok(y) && ok(t)) {
            return false;
        }
        let k = 1.0 - DECAY;
        self.n = self.n * k + 1.0;
        self.sx = self.sx * k + x;
        self.sy = self.sy * k + y;
        self.st = self.st * k + t;
        self.sxx = self.sxx * k + x * x;
        self.syy = self.syy * k + y * y;
        self.sxy = self.sxy * k + x * y;
        self.sxt = self.sxt * k + x * t;
        self.syt = self.syt * k + y * t;
        true
    }

    fn cost(&self) -> Cost {
        let p = self.prior;
        if self.n < MIN_SAMPLES {
            return p;
        }
        let n = self.n;
        let (mx, my, mt) = (self.sx / n, self.sy / n, self.st / n);
        let vxx = (self.sxx / n - mx * mx).max(0.0);
        let vyy = (self.syy / n - my * my).max(0.0);
        let vxy = self.sxy / n - mx * my;
        let cxt = self.sxt / n - mx * mt;
        let cyt = self.syt / n - my * mt;
        // A unit of either variable, at its prior slope: the floor for b when its prior is 0.
        let b_scale = p.per_decoding_s.max(p.per_unit_s * 256.0);
        let shows_x = vxx.sqrt() * p.per_unit_s > 0.03 * mt;
        let shows_y = vyy.sqrt() * b_scale > 0.03 * mt;
        let det = vxx * vyy - vxy * vxy;
        let (a, b) = match (shows_x, shows_y) {
            (true, true) if det > 1e-6 * vxx * vyy => {
                ((cxt * vyy - cyt * vxy) / det, (cyt * vxx - cxt * vxy) / det)
            }
            // One variable shows (or both move together): fit it with the other at its prior.
            (true, _) => ((cxt - p.per_decoding_s * vxy) / vxx, p.per_decoding_s),
            (false, true) => (p.per_unit_s, (cyt - p.per_unit_s * vxy) / vyy),
            (false, false) => (p.per_unit_s, p.per_decoding_s),
        };
        let a = a.clamp(p.per_unit_s / 10.0, p.per_unit_s * 10.0);
        let b = b.clamp(p.per_decoding_s / 10.0, b_scale * 10.0);
        Cost {
            base_s: (mt - a * mx - b * my).max(0.0),
            per_unit_s: a,
            per_decoding_s: b,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIOR: Cost = Cost {
        base_s: 0.0,
        per_unit_s: 1e-5,
        per_decoding_s: 1e-3,
    };

    #[test]
    fn queued_work_shrinks_with_time_down_to_the_floor_and_leaves_exactly() {
        let mut l = InstanceLoad::new(PRIOR);
        assert_eq!(l.queued_at(5.0, 0.5), 0.0);
        // 1,000 units sent at t=10 expecting 0.1 s; 3,000 sent at t=10.05 expecting 0.2 s.
        let a = l.join_queue(1000, 10.0, 0.1);
        assert_eq!(l.queued_at(10.0, 0.5), 1000.0);
        assert!((l.queued_at(10.02, 0.0) - 800.0).abs() < 1e-6);
        let b = l.join_queue(3000, 10.05, 0.2);
        // At 10.07: the first is 70% along, the second 10%.
        let want = 300.0 + 2700.0;
        assert!((l.queued_at(10.07, 0.0) - want).abs() < 1e-6);
        // Long after both were expected: the floor, never less.
        assert_eq!(l.queued_at(20.0, 0.5), 2000.0);
        assert_eq!(l.queued_at(20.0, 1.0), 4000.0);
        // A clock before the sends never counts more than the queue.
        assert_eq!(l.queued_at(0.0, 0.5), 4000.0);
        l.leave_queue(1000, 10.0, a);
        assert!((l.queued_at(10.15, 0.0) - 1500.0).abs() < 1e-6);
        l.leave_queue(3000, 10.05, b);
        assert_eq!((l.queued_units, l.waiting), (0, 0));
        assert_eq!(l.queued_at(10.1, 0.0), 0.0);
        // Nonsense expectations neither poison the sums nor count a request done at once.
        let c = l.join_queue(500, 1.0, f64::NAN);
        assert_eq!(l.queued_at(1.0, 0.0), 500.0);
        let d = l.join_queue(500, 1.0, 0.0);
        assert!(l.queued_at(1.0005, 0.0) > 700.0);
        l.leave_queue(500, 1.0, c);
        l.leave_queue(500, 1.0, d);
        assert_eq!(l.queued_at(2.0, 0.0), 0.0);
    }

    proptest::proptest! {
        /// Whatever requests join and leave, and whenever: what is counted ahead stays within
        /// the floor's share of the queue and the whole of it, and an emptied queue counts
        /// nothing.
        #[test]
        fn queued_at_stays_within_the_floor_and_the_queue(
            sends in proptest::collection::vec(
                (1u64..100_000, 0.0f64..10.0, 0.0f64..2.0, proptest::bool::ANY),
                1..40,
            ),
            floor in 0.0f64..=1.0,
        ) {
            let mut l = InstanceLoad::new(PRIOR);
            let mut open = Vec::new();
            let mut now = 0.0;
            for (units, step, expected, leave_one) in sends {
                now += step;
                open.push((units, now, l.join_queue(units, now, expected)));
                if leave_one && open.len() > 1 {
                    let (u, at, rate) = open.remove(open.len() / 2);
                    l.leave_queue(u, at, rate);
                }
                let all = open.iter().map(|o| o.0).sum::<u64>() as f64;
                for t in [now, now + 0.5, now + 100.0] {
                    let q = l.queued_at(t, floor);
                    proptest::prop_assert!(q <= all + 1e-6 && q >= floor * all - 1e-6, "{q} of {all}");
                }
            }
            for (u, at, rate) in open.drain(..) {
                l.leave_queue(u, at, rate);
            }
            proptest::prop_assert_eq!(l.queued_at(now, floor), 0.0);
            proptest::prop_assert_eq!((l.queued_units, l.waiting), (0, 0));
        }
    }

    #[test]
    fn learns_base_and_both_slopes() {
        let (mut l, mut pool) = (InstanceLoad::new(PRIOR), Pool::new(PRIOR));
        assert_eq!(l.cost(&pool, 1), PRIOR);
        for i in 0..500 {
            let x = 1000.0 + (i % 10) as f64 * 4000.0;
            let y = ((i * 7) % 13) as f64;
            l.observe(&mut pool, x, y, 0.05 + 2e-6 * x + 4e-3 * y);
        }
        let c = l.cost(&pool, 1);
        assert!((c.per_unit_s - 2e-6).abs() < 1e-8, "{c:?}");
        assert!((c.per_decoding_s - 4e-3).abs() < 1e-5, "{c:?}");
        assert!((c.base_s - 0.05).abs() < 1e-3, "{c:?}");
    }

    #[test]
    fn similar_work_keeps_the_prior_slope_and_nonsense_is_ignored() {
        let (mut l, mut pool) = (InstanceLoad::new(PRIOR), Pool::new(PRIOR));
        for i in 0..100 {
            // Cache hits only, nothing decoding: small work, time set by the fixed part.
            l.observe(&mut pool, 150.0 + (i % 7) as f64 * 10.0, 0.0, 0.02);
            l.observe(&mut pool, f64::NAN, 0.0, 1.0);
            l.observe(&mut pool, 1000.0, 0.0, -1.0);
        }
        let c = l.cost(&pool, 1);
        assert_eq!(c.per_unit_s, PRIOR.per_unit_s, "{c:?}");
        assert_eq!(c.per_decoding_s, PRIOR.per_decoding_s, "{c:?}");
        assert!((c.base_s - (0.02 - 180.0 * 1e-5)).abs() < 1e-3, "{c:?}");
        // Clamped: an instance cannot look free.
        let (mut l, mut pool) = (InstanceLoad::new(PRIOR), Pool::new(PRIOR));
        for i in 0..100 {
            l.observe(
                &mut pool,
                10_000.0 * (1 + i % 5) as f64,
                0.0,
                0.5 - 1e-6 * (i % 5) as f64,
            );
        }
        assert!(l.cost(&pool, 1).per_unit_s >= PRIOR.per_unit_s / 10.0);
    }

    #[test]
    fn an_instance_not_observed_fades_to_the_fleet_and_its_own_samples_bring_it_back() {
        let mut pool = Pool::new(PRIOR);
        let (mut slow, mut fast) = (InstanceLoad::new(PRIOR), InstanceLoad::new(PRIOR));
        let t = |base: f64, x: f64| base + 1e-5 * x;
        // A few unlucky first tokens early on.
        for i in 0..20 {
            let x = 1000.0 + (i % 10) as f64 * 4000.0;
            slow.observe(&mut pool, x, 0.0, t(0.3, x));
        }
        let early = slow.cost(&pool, 2).base_s;
        assert!(early > 0.25, "{early}");
        // Then only the other instance is observed: the first no longer looks slow forever.
        for i in 0..2000 {
            let x = 1000.0 + (i % 10) as f64 * 4000.0;
            fast.observe(&mut pool, x, 0.0, t(0.02, x));
        }
        let faded = slow.cost(&pool, 2).base_s;
        assert!(faded < 0.05, "{faded}");
        assert!((fast.cost(&pool, 2).base_s - 0.02).abs() < 0.01);
        // Tried again and still slow: its own samples count again.
        for i in 0..50 {
            let x = 1000.0 + (i % 10) as f64 * 4000.0;
            slow.observe(&mut pool, x, 0.0, t(0.3, x));
        }
        assert!(
            slow.cost(&pool, 2).base_s > 0.2,
            "{:?}",
            slow.cost(&pool, 2)
        );
    }

    #[test]
    fn remembered_fades_are_the_computed_ones_bit_for_bit() {
        let mut fades = Fades::default();
        for instances in [1usize, 7, 64, 7] {
            for gap in [0u64, 1, 2, 5, 63, 64, 1023, 1024, 5000, u64::MAX] {
                for _ in 0..2 {
                    let f = fades.factor(gap, instances);
                    assert_eq!(
                        f.to_bits(),
                        fade(gap, instances).to_bits(),
                        "{gap} {instances}"
                    );
                }
            }
        }
        let pool = Pool::new(PRIOR);
        let l = InstanceLoad::new(PRIOR);
        assert_eq!(l.cost_with(&pool, |g| fades.factor(g, 3)), l.cost(&pool, 3));
    }
}
