//! The in-flight guard: acquires an instance's in-flight slot and releases it exactly once, when
//! the request is finished however it finishes (answered, failed, cancelled by the client).

use std::sync::Arc;
use std::time::Instant;

use prefix_router_core::Instance;

use crate::metrics::{ApiLabels, InstanceLabels, RequestLabels};
use crate::state::AppState;

/// Holds one in-flight slot on an instance. Moved into the response body stream once the answer
/// starts, so the slot is held until the last byte went out or the client went away.
#[derive(Debug)]
pub struct InFlightGuard {
    state: Arc<AppState>,
    instance: Arc<Instance>,
    api: &'static str,
    received: Instant,
    outcome: &'static str,
    completed: bool,
    first_byte_seen: bool,
}

impl InFlightGuard {
    /// Counts one request in flight on `instance`.
    pub fn acquire(
        state: Arc<AppState>,
        instance: Arc<Instance>,
        api: &'static str,
        received: Instant,
    ) -> Self {
        instance.acquire();
        Self {
            state,
            instance,
            api,
            received,
            // Until told otherwise, a guard dropped early was cancelled.
            outcome: "cancelled",
            completed: false,
            first_byte_seen: false,
        }
    }

    /// The router's metrics.
    pub fn metrics(&self) -> &crate::metrics::Metrics {
        &self.state.metrics
    }

    /// Counts an upstream error against the instance (admin API's `errors`).
    pub fn count_error(&self) {
        crate::stats::InstanceStats::bump(
            &self.state.stats.get(self.instance.id().as_str()).errors,
        );
    }

    /// The instance it holds a slot on.
    pub fn instance(&self) -> &Arc<Instance> {
        &self.instance
    }

    /// The outcome recorded if the response completes (`ok`, `upstream_4xx`, `upstream_5xx`).
    pub fn set_outcome(&mut self, outcome: &'static str) {
        self.outcome = outcome;
    }

    /// The response went out completely.
    pub fn complete(&mut self) {
        self.completed = true;
    }

    /// The response failed part way; `outcome` says how.
    pub fn fail(&mut self, outcome: &'static str) {
        self.outcome = outcome;
        self.completed = true;
    }

    /// The first response body byte is about to go to the client: records TTFT once.
    pub fn first_byte(&mut self) {
        if !self.first_byte_seen {
            self.first_byte_seen = true;
            self.state
                .metrics
                .ttft
                .get_or_create(&InstanceLabels {
                    instance: self.instance.id().to_string(),
                })
                .observe(self.received.elapsed().as_secs_f64());
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.instance.release();
        let outcome = if self.completed {
            self.outcome
        } else {
            "cancelled"
        };
        let m = &self.state.metrics;
        m.requests
            .get_or_create(&RequestLabels {
                instance: self.instance.id().to_string(),
                api: self.api,
                outcome,
            })
            .inc();
        m.duration
            .get_or_create(&ApiLabels { api: self.api })
            .observe(self.received.elapsed().as_secs_f64());
    }
}
