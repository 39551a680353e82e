//! Fault decisions, drawn from a seeded generator so a test run repeats exactly.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use http::StatusCode;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;

use crate::Faults;

/// What happens to one inference request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve it, after an optional delay.
    Serve(Option<Duration>),
    /// Fail it at once with this status.
    Fail(StatusCode),
}

/// Fault settings plus their state.
#[derive(Debug)]
pub(crate) struct FaultState {
    faults: Faults,
    rng: Mutex<Pcg64>,
    /// Inference requests received.
    received: AtomicU64,
}

impl FaultState {
    pub fn new(faults: Faults, seed: u64) -> Self {
        FaultState {
            faults,
            rng: Mutex::new(Pcg64::seed_from_u64(seed)),
            received: AtomicU64::new(0),
        }
    }

    /// Whether the engine has stopped answering (`stop_after` requests received).
    pub fn stopped(&self) -> bool {
        self.faults
            .stop_after
            .is_some_and(|n| self.received.load(Ordering::Relaxed) >= n)
    }

    /// Counts an inference request; true if it arrives after the engine stopped.
    pub fn arrive(&self) -> bool {
        let k = self.received.fetch_add(1, Ordering::Relaxed) + 1;
        self.faults.stop_after.is_some_and(|n| k > n)
    }

    /// Decides a request's fate. Always draws the same numbers per request, so one setting
    /// does not shift the others' decisions.
    pub fn draw(&self) -> Verdict {
        let (fail, spike) = {
            let mut rng = match self.rng.lock() {
                Ok(r) => r,
                Err(poisoned) => poisoned.into_inner(),
            };
            (rng.gen::<f64>(), rng.gen::<f64>())
        };
        if fail < self.faults.fail_rate {
            let status = StatusCode::from_u16(self.faults.fail_status)
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            return Verdict::Fail(status);
        }
        let delay = (spike < self.faults.latency_spike_rate
            && !self.faults.latency_spike.is_zero())
        .then_some(self.faults.latency_spike);
        Verdict::Serve(delay)
    }

    /// Stream cut point, if any.
    pub fn close_stream_after_tokens(&self) -> Option<u32> {
        self.faults.close_stream_after_tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_hold_and_repeat_with_the_seed() {
        let faults = Faults {
            fail_rate: 0.3,
            fail_status: 503,
            latency_spike_rate: 0.5,
            latency_spike: Duration::from_millis(5),
            ..Faults::default()
        };
        let run = || {
            let f = FaultState::new(faults.clone(), 9);
            (0..1000).map(|_| f.draw()).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let failed = a
            .iter()
            .filter(|v| matches!(v, Verdict::Fail(s) if *s == 503))
            .count();
        assert!((230..370).contains(&failed), "{failed}");
        let spiked = a
            .iter()
            .filter(|v| matches!(v, Verdict::Serve(Some(_))))
            .count();
        assert!((270..430).contains(&spiked), "{spiked}");
    }

    #[test]
    fn stops_after_n() {
        let f = FaultState::new(
            Faults {
                stop_after: Some(2),
                ..Faults::default()
            },
            0,
        );
        assert!(!f.stopped());
        assert!(!f.arrive());
        assert!(!f.arrive());
        assert!(f.stopped());
        assert!(f.arrive());
    }
}
