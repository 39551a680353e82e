//! Small, panic-free samplers for token counts and times. Parameters come from user
//! configuration, so every sampler tolerates bad values (swapped bounds, NaN) by falling back to
//! something sensible; [`super::WorkloadSpec::validate`] reports them as errors beforehand.

use rand::Rng;
use rand_distr::{Distribution, Exp1, StandardNormal, Zipf};
use rand_pcg::Pcg64Mcg;

/// A uniform integer range of tokens, both ends inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TokenRange {
    /// Smallest value.
    pub min: u32,
    /// Largest value.
    pub max: u32,
}

impl TokenRange {
    /// The range `min..=max`.
    pub const fn new(min: u32, max: u32) -> Self {
        TokenRange { min, max }
    }

    /// A uniform draw (bounds swapped if given backwards).
    pub fn sample(&self, rng: &mut Pcg64Mcg) -> u32 {
        let (lo, hi) = (self.min.min(self.max), self.min.max(self.max));
        rng.gen_range(lo..=hi)
    }
}

/// A log-normal token count clamped to `[min, max]`: most draws near `median`, a long right tail
/// whose width is `sigma` (the standard deviation of the log), as chat message lengths are.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TokenDist {
    /// Median of the unclamped distribution, in tokens.
    pub median: f64,
    /// Standard deviation of ln(tokens).
    pub sigma: f64,
    /// Smallest value returned.
    pub min: u32,
    /// Largest value returned.
    pub max: u32,
}

impl TokenDist {
    /// A draw, rounded and clamped to `[min, max]`.
    pub fn sample(&self, rng: &mut Pcg64Mcg) -> u32 {
        let (lo, hi) = (self.min.min(self.max), self.min.max(self.max));
        let z: f64 = StandardNormal.sample(rng);
        let sigma = if self.sigma.is_finite() && self.sigma >= 0.0 {
            self.sigma
        } else {
            0.0
        };
        let median = if self.median.is_finite() && self.median > 0.0 {
            self.median
        } else {
            1.0
        };
        let x = (median.ln() + sigma * z).exp().round();
        // `as` saturates (and maps NaN to 0); the clamp then applies the bounds.
        (x as u32).clamp(lo, hi)
    }
}

/// An exponential draw with the given mean (0 when the mean is not positive and finite).
pub fn exponential(rng: &mut Pcg64Mcg, mean: f64) -> f64 {
    if !(mean.is_finite() && mean > 0.0) {
        return 0.0;
    }
    let e: f64 = Exp1.sample(rng);
    e * mean
}

/// A geometric count on `1..=max` with the untruncated mean `mean` (>= 1), truncated at `max`.
pub fn geometric(rng: &mut Pcg64Mcg, mean: f64, max: u32) -> u32 {
    let p = stop_probability(mean);
    let max = max.max(1);
    let mut n = 1;
    while n < max && !rng.gen_bool(p) {
        n += 1;
    }
    n
}

/// The expected value of [`geometric`]: sum over k of P(count >= k) = (1 - (1-p)^max) / p.
pub fn geometric_mean(mean: f64, max: u32) -> f64 {
    let p = stop_probability(mean);
    (1.0 - (1.0 - p).powi(max.max(1) as i32)) / p
}

fn stop_probability(mean: f64) -> f64 {
    if mean.is_finite() && mean > 1.0 {
        1.0 / mean
    } else {
        1.0
    }
}

/// Zipf-distributed ranks `0..n` (rank 0 the most popular) with exponent `s`; uniform when the
/// parameters are unusable.
#[derive(Debug, Clone)]
pub struct ZipfRanks {
    n: u64,
    zipf: Option<Zipf<f64>>,
}

impl ZipfRanks {
    /// Ranks over `n` items (at least 1) with exponent `s`.
    pub fn new(n: u64, s: f64) -> Self {
        let n = n.max(1);
        let zipf = if s.is_finite() && s >= 0.0 {
            Zipf::new(n, s).ok()
        } else {
            None
        };
        ZipfRanks { n, zipf }
    }

    /// One rank in `0..n`.
    pub fn sample(&self, rng: &mut Pcg64Mcg) -> u64 {
        match &self.zipf {
            Some(z) => (z.sample(rng) as u64).clamp(1, self.n) - 1,
            None => rng.gen_range(0..self.n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn samplers_respect_bounds_even_with_bad_parameters() {
        let mut rng = Pcg64Mcg::seed_from_u64(1);
        for _ in 0..1000 {
            let t = TokenRange::new(9, 3).sample(&mut rng);
            assert!((3..=9).contains(&t));
            let d = TokenDist {
                median: f64::NAN,
                sigma: -1.0,
                min: 5,
                max: 2,
            };
            assert!((2..=5).contains(&d.sample(&mut rng)));
            let d = TokenDist {
                median: 100.0,
                sigma: 3.0,
                min: 10,
                max: 300,
            };
            assert!((10..=300).contains(&d.sample(&mut rng)));
            assert!((1..=4).contains(&geometric(&mut rng, 3.0, 4)));
            assert_eq!(exponential(&mut rng, f64::NAN), 0.0);
            assert!(ZipfRanks::new(10, 1.0).sample(&mut rng) < 10);
            assert!(ZipfRanks::new(0, f64::NAN).sample(&mut rng) < 1);
        }
    }

    #[test]
    fn geometric_mean_matches_samples() {
        let mut rng = Pcg64Mcg::seed_from_u64(2);
        let n = 20_000;
        let sum: u64 = (0..n)
            .map(|_| u64::from(geometric(&mut rng, 3.0, 10)))
            .sum();
        let got = sum as f64 / n as f64;
        let want = geometric_mean(3.0, 10);
        assert!((got - want).abs() < 0.1, "{got} vs {want}");
    }
}
