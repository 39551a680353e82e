//! The state every request handler shares.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use prefix_router_core::strategies::LeastOutstanding;
use prefix_router_core::{Fleet, Strategy};

use crate::membership::Membership;
use crate::metrics::Metrics;
use crate::pool::Upstreams;
use crate::routing::Routing;
use crate::settings::{ConfigSource, Settings, SettingsError};
use crate::stats::StatsTable;
use crate::tls;
use crate::upstream;

/// Shared by the data plane, the health checker and the admin API.
#[derive(Debug)]
pub struct AppState {
    /// The live fleet.
    pub fleet: Fleet,
    /// Strategy and key length; swapped whole on reload or by the admin API.
    pub routing: ArcSwap<Routing>,
    /// Strategy for requests without a key (other `/v1/*` routes): least-outstanding, built
    /// once so its tickets share one strategy for the life of the process.
    pub fallback: Arc<dyn Strategy>,
    /// Keep-alive connections to the instances.
    pub client: Arc<Upstreams>,
    /// The listener's TLS, when configured.
    pub tls: Option<tls::Listener>,
    /// The client side for `https://` instances (its files are read again on reload).
    pub upstream_tls: tls::ClientTls,
    /// Metrics.
    pub metrics: Metrics,
    /// Per-instance counters and health records.
    pub stats: StatsTable,
    /// Settings read at start (limits, timeouts, retries and health are fixed for the process).
    pub settings: Settings,
    /// Where to reload settings from, if anywhere.
    pub source: Option<ConfigSource>,
    /// Sources of the member list; the lock serializes edits (reload, admin API, discovery)
    /// so none is lost.
    pub membership: tokio::sync::Mutex<Membership>,
    /// The access log, when configured.
    pub access_log: Option<crate::access_log::AccessLog>,
    /// The engines' KV events, when subscribed.
    pub kv_events: Option<crate::kv_events::KvFeeds>,
    /// Prewarming of instances that join, when `[prewarm] enabled`.
    pub prewarm: Option<crate::prewarm::Prewarm>,
    /// Snapshots of the per-instance counters for the live page (`/dashboard`).
    pub dashboard: crate::dashboard::History,
    /// Where the Responses API's stored responses live ([`crate::responses`]).
    pub response_homes: crate::responses::ResponseHomes,
    /// The origin of [`AppState::now_s`].
    started: Instant,
    /// A shutdown is under way and the router still serves (`timeouts.shutdown_delay_ms`):
    /// `/health`, `/ready` and the picker's gRPC health say so, for the load balancers in front
    /// to stop sending here before the listener closes.
    shutting_down: std::sync::atomic::AtomicBool,
    /// Members an operator drained through the admin API and has not activated since: what
    /// discovery drained on its own it may undo, these it leaves. Kept as the members
    /// themselves, so that an id removed and added again is not held.
    held: std::sync::Mutex<Vec<Arc<prefix_router_core::Instance>>>,
}

impl AppState {
    /// Builds the state from validated settings.
    pub fn new(
        settings: Settings,
        source: Option<ConfigSource>,
    ) -> Result<Arc<Self>, SettingsError> {
        let routing = Routing::new(
            settings.routing.strategy.clone(),
            settings.routing.prefix_length,
        )?;
        let tls = settings.tls.clone().map(tls::Listener::new).transpose()?;
        let upstream_tls = tls::ClientTls::new(&settings.upstream_tls)?;
        let access_log = match &settings.access_log.path {
            None => None,
            Some(path) => Some(
                crate::access_log::AccessLog::open(path, settings.access_log.queue).map_err(
                    |e| SettingsError::Invalid {
                        field: "access_log.path".into(),
                        message: format!("cannot open {}: {e}", path.display()),
                    },
                )?,
            ),
        };
        let mut metrics = Metrics::new();
        if let Some(log) = &access_log {
            metrics.register_access_log(log);
        }
        let kv_events = settings
            .kv_events
            .subscribe
            .then(|| crate::kv_events::KvFeeds::new(settings.kv_events.clone()))
            .transpose()
            .map_err(|e| SettingsError::Invalid {
                field: e.field.clone(),
                message: e.to_string(),
            })?;
        if let Some(feeds) = &kv_events {
            metrics.register_kv_events(feeds);
        }
        let membership = Membership {
            static_specs: settings.instances.clone(),
            ..Membership::default()
        };
        let prewarm = settings
            .prewarm
            .enabled
            .then(|| crate::prewarm::Prewarm::new(settings.prewarm.config()));
        Ok(Arc::new(Self {
            fleet: Fleet::joining_as(settings.instances.clone(), settings.health.joins_as()),
            routing: ArcSwap::from_pointee(routing),
            fallback: Arc::new(LeastOutstanding),
            client: upstream::client(
                settings.timeouts.connect,
                upstream_tls.config(),
                settings.limits.io_threads,
            ),
            tls,
            upstream_tls,
            metrics,
            stats: StatsTable::default(),
            settings,
            source,
            membership: tokio::sync::Mutex::new(membership),
            access_log,
            kv_events,
            prewarm,
            dashboard: crate::dashboard::History::default(),
            response_homes: crate::responses::ResponseHomes::default(),
            started: Instant::now(),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            held: std::sync::Mutex::new(Vec::new()),
        }))
    }

    /// An operator drained `inst` (see [`AppState::is_held`]).
    pub fn hold(&self, inst: &Arc<prefix_router_core::Instance>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        // Members gone since are let go here: the list never outgrows the fleet.
        held.retain(|h| crate::membership::is_member(self, h) && !h.same_member(inst));
        held.push(Arc::clone(inst));
    }

    /// An operator activated `inst`: discovery may drain and undrain it again.
    pub fn release(&self, inst: &prefix_router_core::Instance) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|h| !h.same_member(inst));
    }

    /// Whether an operator drained `inst` and has not activated it since.
    pub fn is_held(&self, inst: &prefix_router_core::Instance) -> bool {
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.iter().any(|h| h.same_member(inst))
    }

    /// Marks a shutdown under way (see [`AppState::is_shutting_down`]).
    pub fn begin_shutdown(&self) {
        self.shutting_down
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a shutdown is under way: health answers 503 while the router still serves.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Seconds since the router started, on a monotonic clock: the `now` every strategy call
    /// (route, ticket feedback, membership) is given, so all of them share one time line.
    pub fn now_s(&self) -> f64 {
        self.secs_at(Instant::now())
    }

    /// [`AppState::now_s`] at `at`, for a caller that has read the clock already for something
    /// else (a request's TTFT, a decision's latency): one clock read serves both.
    pub fn secs_at(&self, at: Instant) -> f64 {
        at.saturating_duration_since(self.started).as_secs_f64()
    }
}
