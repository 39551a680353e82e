//! The routers in front of the simulated fleet: how many replicas, and how each learns what the
//! others send (the engines' queues, scraped).
//!
//! With one replica the router sees every request it sent and nothing else exists. With
//! several, the workload is dealt among them round-robin by position (request `i` to replica
//! `i mod n`, as `demo --replicas` deals its clients' requests), so every replica sees a share of
//! every prefix: the hard case for strategies that learn placement from their own traffic. Each
//! replica keeps its own strategy state, its own in-flight counts and its own random stream;
//! they share nothing but the engines (and, for `kv-aware`, the engines' KV events, which every
//! replica reads alike).
//!
//! A scrape reads each engine's running and waiting requests every `interval_s`; the reading
//! reaches the replicas `delay_s` later (the HTTP round trip and the parse of a Prometheus page),
//! where each stores what the engine holds beyond its own in-flight requests at that moment,
//! trusted until `stale_after_s` after the scrape was sent, exactly as the server's
//! `[engine_metrics]` scraper does ([`prefix_router_core::EngineQueue::others`]).

use std::collections::HashMap;

use crate::SimError;

/// The router replicas and what they scrape.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct RouterModel {
    /// Router replicas (≥ 1), each with its own strategy state.
    pub replicas: u32,
    /// The engines' queues, scraped and counted in routing; `None`: not scraped.
    pub scrape: Option<ScrapeModel>,
}

impl Default for RouterModel {
    fn default() -> Self {
        Self {
            replicas: 1,
            scrape: None,
        }
    }
}

/// How the engines' queues are scraped.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct ScrapeModel {
    /// Time between scrapes, seconds (`[engine_metrics] interval_ms`).
    pub interval_s: f64,
    /// From a scrape's send to the replicas storing its reading, seconds.
    pub delay_s: f64,
    /// How long a reading is trusted from its send (`[engine_metrics] stale_after_ms`).
    pub stale_after_s: f64,
}

impl Default for ScrapeModel {
    /// The server's defaults (1 s apart, trusted 3 s), read 5 ms after the scrape is sent.
    fn default() -> Self {
        Self {
            interval_s: 1.0,
            delay_s: 0.005,
            stale_after_s: 3.0,
        }
    }
}

impl RouterModel {
    /// Checks the settings; errors name the flag.
    pub fn validate(&self) -> Result<(), SimError> {
        let bad = |field: &'static str, why: String| Err(SimError::InvalidConfig { field, why });
        if !(1..=64).contains(&self.replicas) {
            return bad(
                "replicas",
                format!("must be within 1..=64, got {}", self.replicas),
            );
        }
        let Some(s) = self.scrape else {
            return Ok(());
        };
        let positive = |v: f64| v.is_finite() && v > 0.0;
        if !positive(s.interval_s) {
            return bad(
                "scrape_interval",
                format!("must be a positive number of seconds, got {}", s.interval_s),
            );
        }
        if !(s.delay_s.is_finite() && s.delay_s >= 0.0) {
            return bad(
                "scrape_delay",
                format!("must be a finite number of seconds ≥ 0, got {}", s.delay_s),
            );
        }
        if !(positive(s.stale_after_s) && s.stale_after_s >= s.interval_s) {
            return bad(
                "scrape_stale_after",
                format!(
                    "must be at least the scrape interval ({} s), got {} s: every reading would go \
                     stale before the next",
                    s.interval_s, s.stale_after_s
                ),
            );
        }
        Ok(())
    }
}

/// One engine's reading: `(instance, running, waiting)`.
pub type Reading = (usize, u32, u32);

/// A scrape: when it was sent, and every live engine's reading.
pub type Scrape = (f64, Vec<Reading>);

/// Readings on their way to the replicas.
#[derive(Debug, Default)]
pub struct Scrapes {
    in_transit: HashMap<u64, Scrape>,
    next: u64,
}

impl Scrapes {
    /// Records a scrape sent at `sent_at`; returns its number to deliver later.
    pub fn send(&mut self, sent_at: f64, readings: Vec<Reading>) -> u64 {
        let n = self.next;
        self.next += 1;
        self.in_transit.insert(n, (sent_at, readings));
        n
    }

    /// Scrape `n` arrives: its send time and readings (once).
    pub fn take(&mut self, n: u64) -> Option<Scrape> {
        self.in_transit.remove(&n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_checked_with_the_flag_named() {
        assert!(RouterModel::default().validate().is_ok());
        let zero = RouterModel {
            replicas: 0,
            scrape: None,
        };
        assert!(zero
            .validate()
            .unwrap_err()
            .to_string()
            .contains("replicas"));
        let stale = RouterModel {
            replicas: 3,
            scrape: Some(ScrapeModel {
                interval_s: 2.0,
                stale_after_s: 1.0,
                ..ScrapeModel::default()
            }),
        };
        let e = stale.validate().unwrap_err().to_string();
        assert!(e.contains("scrape_stale_after"), "{e}");
    }

    #[test]
    fn a_scrape_is_delivered_once() {
        let mut s = Scrapes::default();
        let n = s.send(1.5, vec![(0, 3, 1)]);
        assert_eq!(s.take(n), Some((1.5, vec![(0, 3, 1)])));
        assert_eq!(s.take(n), None);
    }
}
