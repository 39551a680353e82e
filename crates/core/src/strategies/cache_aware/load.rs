//! What the router knows of each instance's queue, and the prefill cost it learns online.
//!
//! Queue: the prefill units (characters or bytes) of requests sent to the instance that have
//! not produced their first token, each counted as the units the router expected the instance
//! not to have cached. Decoding: requests past their first token and not finished.
//!
//! Cost: time to first token ≈ `base + per_unit × (queued ahead + own uncached units)`, fitted
//! per instance by exponentially weighted least squares over observed first tokens (each sample
//! is one request: the units it waited behind plus its own uncached units, against its measured
//! time to first token). Until enough spread is seen, the configured prior is used; the fit is
//! clamped to [prior / 100, prior x 100] so a burst of odd samples cannot make an instance look
//! free or unusable.

/// Weight of each new sample in the fit (about the last 50 requests of an instance count).
const DECAY: f64 = 0.02;

/// One instance's load and learned cost.
#[derive(Debug, Clone)]
pub struct InstanceLoad {
    /// Prefill units queued (sent, no first token yet).
    pub queued_units: u64,
    /// Requests waiting for their first token.
    pub waiting: u32,
    /// Requests past their first token, not finished.
    pub decoding: u32,
    fit: CostFit,
}

impl InstanceLoad {
    /// An idle instance whose cost starts at the prior.
    pub fn new(prior: Cost) -> Self {
        Self {
            queued_units: 0,
            waiting: 0,
            decoding: 0,
            fit: CostFit::new(prior),
        }
    }
    /// The current cost estimate.
    pub fn cost(&self) -> Cost {
        self.fit.cost()
    }
    /// Learns from one first token: `work` units (queued ahead plus its own uncached) took
    /// `ttft_s` seconds.
    pub fn observe(&mut self, work: f64, ttft_s: f64) {
        self.fit.observe(work, ttft_s)
    }
}

/// Base seconds and seconds per prefill unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Fixed part of the time to first token, seconds.
    pub base_s: f64,
    /// Seconds per prefill unit.
    pub per_unit_s: f64,
}

/// Exponentially weighted least squares of `t = base + per_unit × w`.
#[derive(Debug, Clone)]
struct CostFit {
    prior: Cost,
    n: f64,
    sw: f64,
    st: f64,
    sww: f64,
    swt: f64,
}

impl CostFit {
    fn new(prior: Cost) -> Self {
        Self {
            prior,
            n: 0.0,
            sw: 0.0,
            st: 0.0,
            sww: 0.0,
            swt: 0.0,
        }
    }

    fn observe(&mut self, w: f64, t: f64) {
        if !(w.is_finite() && t.is_finite() && w >= 0.0 && t >= 0.0) {
            return;
        }
        let keep = 1.0 - DECAY;
        self.n = self.n * keep + 1.0;
        self.sw = self.sw * keep + w;
        self.st = self.st * keep + t;
        self.sww = self.sww * keep + w * w;
        self.swt = self.swt * keep + w * t;
    }

    fn cost(&self) -> Cost {
        if self.n < 8.0 {
            return self.prior;
        }
        let mw = self.sw / self.n;
        let mt = self.st / self.n;
        let var = self.sww / self.n - mw * mw;
        let cov = self.swt / self.n - mw * mt;
        let lo = self.prior.per_unit_s / 100.0;
        let hi = self.prior.per_unit_s * 100.0;
        // Too little spread in work sizes to separate base from slope: scale the prior's slope
        // to the mean instead.
        let per_unit = if var > (0.05 * mw).powi(2) && var > 0.0 {
            cov / var
        } else if mw > 0.0 {
            (mt - self.prior.base_s).max(0.0) / mw
        } else {
            self.prior.per_unit_s
        };
        let per_unit = per_unit.clamp(lo, hi);
        let base = (mt - per_unit * mw).clamp(0.0, 10.0 * mt.max(self.prior.base_s));
        Cost {
            base_s: base,
            per_unit_s: per_unit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRIOR: Cost = Cost {
        base_s: 0.0,
        per_unit_s: 1e-5,
    };

    #[test]
    fn learns_base_and_slope() {
        let mut l = InstanceLoad::new(PRIOR);
        assert_eq!(l.cost(), PRIOR);
        for i in 0..500 {
            let w = 1000.0 + (i % 10) as f64 * 4000.0;
            l.observe(w, 0.05 + 2e-6 * w);
        }
        let c = l.cost();
        assert!((c.per_unit_s - 2e-6).abs() < 1e-8, "{c:?}");
        assert!((c.base_s - 0.05).abs() < 1e-3, "{c:?}");
    }

    #[test]
    fn constant_work_scales_the_prior_and_nonsense_is_ignored() {
        let mut l = InstanceLoad::new(PRIOR);
        for _ in 0..100 {
            l.observe(1000.0, 0.02);
            l.observe(f64::NAN, 1.0);
            l.observe(1000.0, -1.0);
        }
        let c = l.cost();
        assert!((c.per_unit_s - 2e-5).abs() < 1e-9, "{c:?}");
        // Clamped: an instance cannot look free.
        let mut l = InstanceLoad::new(PRIOR);
        for i in 0..100 {
            l.observe(1000.0 * (1 + i % 5) as f64, 0.0);
        }
        assert!(l.cost().per_unit_s >= PRIOR.per_unit_s / 100.0);
    }
}
