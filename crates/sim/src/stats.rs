//! Summary statistics: percentiles of latency samples and bucketed hit rates.

/// Percentiles and mean of a latency, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct LatencySummary {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl LatencySummary {
    /// Summarizes samples that are already sorted ascending (all zeros when empty).
    pub fn from_sorted(sorted: &[f64]) -> Self {
        if sorted.is_empty() {
            return Self::default();
        }
        let mean = sorted.iter().sum::<f64>() / sorted.len() as f64;
        Self {
            p50: percentile_sorted(sorted, 50.0),
            p90: percentile_sorted(sorted, 90.0),
            p99: percentile_sorted(sorted, 99.0),
            mean,
        }
    }
}

/// Nearest-rank percentile (`p` in 0..=100) of ascending samples; 0 when empty.
///
/// Nearest rank (rather than interpolation) always returns an observed value, so a reported
/// P99 is a latency some request really had.
pub fn percentile_sorted(sorted: &[f64], p: f64) -> f64 {
    nearest_rank(sorted, p).unwrap_or(0.0)
}

pub use prefix_router_workload::percentile::nearest_rank;

/// The 101 percentiles 0, 1, ..., 100 of ascending samples (a compact CDF for plots and JSON).
pub fn percentile_curve(sorted: &[f64]) -> Vec<f64> {
    if sorted.is_empty() {
        return Vec::new();
    }
    (0..=100)
        .map(|p| percentile_sorted(sorted, p as f64))
        .collect()
}

/// Hit rate of the requests whose first token came within one time bucket.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct HitRateBucket {
    /// Bucket start, seconds from the run's start.
    pub start_s: f64,
    /// Bucket end, seconds.
    pub end_s: f64,
    /// Requests whose first token fell in the bucket.
    pub requests: u64,
    /// Cached prompt tokens over prompt tokens of those requests; `None` when the bucket is empty.
    pub hit_rate: Option<f64>,
}

/// Splits `[0, horizon_s]` into `buckets` equal buckets and computes each one's hit rate from
/// `(first_token_s, cached_tokens, prompt_tokens)` samples.
pub fn hit_rate_series(
    samples: impl Iterator<Item = (f64, u32, u32)>,
    horizon_s: f64,
    buckets: usize,
) -> Vec<HitRateBucket> {
    if buckets == 0 {
        return Vec::new();
    }
    let horizon = if horizon_s.is_finite() && horizon_s > 0.0 {
        horizon_s
    } else {
        1.0
    };
    let width = horizon / buckets as f64;
    let mut cached = vec![0u64; buckets];
    let mut prompt = vec![0u64; buckets];
    let mut count = vec![0u64; buckets];
    for (at, c, p) in samples {
        let b = ((at / width) as usize).min(buckets - 1);
        cached[b] += u64::from(c);
        prompt[b] += u64::from(p);
        count[b] += 1;
    }
    (0..buckets)
        .map(|b| HitRateBucket {
            start_s: b as f64 * width,
            end_s: (b + 1) as f64 * width,
            requests: count[b],
            hit_rate: (prompt[b] > 0).then(|| cached[b] as f64 / prompt[b] as f64),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = LatencySummary::from_sorted(&v);
        assert_eq!((s.p50, s.p90, s.p99), (50.0, 90.0, 99.0));
        assert!((s.mean - 50.5).abs() < 1e-12);
        assert_eq!(percentile_sorted(&[7.0], 99.0), 7.0);
        assert_eq!(percentile_sorted(&[], 50.0), 0.0);
        assert_eq!(LatencySummary::from_sorted(&[]), LatencySummary::default());
    }

    /// Every point of the curve is the exact nearest rank `ceil(p × n / 100)`: computed as
    /// `p / 100 × n`, 100 samples read rank 8 at p = 7 (and 14, 28, 55, 56 alike).
    #[test]
    fn the_curve_is_the_exact_nearest_rank_at_every_percent() {
        for n in 1..=1_000usize {
            let v: Vec<f64> = (1..=n).map(|i| i as f64).collect();
            let curve = percentile_curve(&v);
            for (p, &got) in curve.iter().enumerate() {
                let rank = (p * n).div_ceil(100).max(1);
                assert_eq!(got, rank as f64, "p{p} of {n}");
            }
        }
        let v: Vec<f64> = (1..=1_000).map(f64::from).collect();
        assert_eq!(percentile_sorted(&v, 99.9), 999.0);
    }

    #[test]
    fn series_buckets_by_time() {
        let s = hit_rate_series(
            [(0.1, 0, 10), (0.9, 10, 10), (1.0, 5, 10)].into_iter(),
            1.0,
            2,
        );
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].hit_rate, Some(0.0));
        assert_eq!(s[1].requests, 2);
        assert_eq!(s[1].hit_rate, Some(0.75));
        assert!(hit_rate_series([].into_iter(), 1.0, 3)
            .iter()
            .all(|b| b.hit_rate.is_none()));
    }

    proptest! {
        #[test]
        fn percentiles_are_ordered_and_observed(mut v in proptest::collection::vec(0.0f64..1e5, 1..300)) {
            v.sort_by(f64::total_cmp);
            let s = LatencySummary::from_sorted(&v);
            prop_assert!(s.p50 <= s.p90 && s.p90 <= s.p99);
            prop_assert!(v.contains(&s.p50) && v.contains(&s.p99));
            prop_assert!(s.mean >= v[0] && s.mean <= v[v.len() - 1] + 1e-9);
            let curve = percentile_curve(&v);
            prop_assert_eq!(curve.len(), 101);
            prop_assert!(curve.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
