//! Percentiles by nearest rank: the one definition `simulate`, `bench`, `demo` and `analyze`
//! share, so a P99 printed by one means what it means in the others.

/// Nearest-rank percentile (`p` in 0..=100) of any ascending samples (`None` when empty).
///
/// Nearest rank (rather than interpolation) always returns an observed value, so a reported
/// P99 is a latency some request really had.
pub fn nearest_rank<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let n = sorted.len();
    // `p × n / 100` with the product first, and a hair below before rounding up: `p / 100 × n`
    // read 7.000000000000001 for p = 7 of 100 samples (rank 8, not 7), and 99.9 of 1,000
    // rounds the same way. Exact for every integer `p` and `n` up to millions.
    let rank = ((p * n as f64) / 100.0 - 1e-9).ceil() as usize;
    sorted.get(rank.clamp(1, n.max(1)) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_are_exact_for_integer_percentiles() {
        let v: Vec<u32> = (1..=100).collect();
        assert_eq!(nearest_rank(&v, 7.0), Some(7));
        assert_eq!(nearest_rank(&v, 0.0), Some(1));
        assert_eq!(nearest_rank(&v, 100.0), Some(100));
        let v: Vec<u32> = (1..=1000).collect();
        assert_eq!(nearest_rank(&v, 99.9), Some(999));
        assert_eq!(nearest_rank::<u32>(&[], 50.0), None);
    }
}
