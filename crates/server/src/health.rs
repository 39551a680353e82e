//! Fleet health: passive ejection on connect errors and repeated 5xx (with a growing backoff),
//! active probes (`GET /health` by default), and recovery. A draining instance is left alone:
//! only the admin API moves it out of draining. Every transition goes through
//! [`membership::transition`], which tells the strategy.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use prefix_router_core::{Instance, InstanceState};

use crate::membership;

/// Largest health answer read (a probe only needs the status; the body is read to reuse the
/// connection).
const MAX_PROBE_BODY: usize = 64 * 1024;
use crate::state::AppState;
use crate::stats::InstanceStats;

/// A request to `inst` failed (connect error or 5xx): ejects it after
/// `health.passive_failures` in a row, for the current backoff, which then doubles (and starts
/// over once the instance has stayed healthy for `health.max_eject_backoff`).
pub fn passive_failure(state: &AppState, inst: &Instance, stats: &InstanceStats) {
    let h = &state.settings.health;
    let failures = stats.passive_failures.fetch_add(1, Ordering::Relaxed) + 1;
    if failures < h.passive_failures || inst.state() != InstanceState::Healthy {
        return;
    }
    let mut rec = stats.health();
    // Under the record's lock: of two requests failing at once, one ejects and sets the backoff.
    if !membership::transition(
        state,
        inst,
        &[InstanceState::Healthy],
        InstanceState::Ejected,
    ) {
        return;
    }
    // Doubling on each repeat, whether it came back by probes or at the end of its backoff; a
    // long healthy stretch since starts over. Recovery by probes used to forget the backoff,
    // so with active checks (the default) a flapping instance was ejected for the first
    // backoff every time; without them, the backoff never came down again.
    let repeat = rec
        .recovered_at
        .is_none_or(|t| t.elapsed() < h.max_eject_backoff);
    let backoff = match rec.next_backoff {
        Some(b) if repeat => b,
        _ => h.eject_backoff,
    };
    rec.ejected_until = Some(Instant::now() + backoff);
    rec.next_backoff = Some((backoff * 2).min(h.max_eject_backoff));
    rec.probe_successes = 0;
    tracing::warn!(instance = %inst.id(), failures, ?backoff, "instance ejected after failed requests");
}

/// A request got an answer below 500 from the instance of `stats`: resets its passive failure
/// count.
pub fn passive_success(stats: &InstanceStats) {
    // Read first: the common case (already zero) writes nothing shared.
    if stats.passive_failures.load(Ordering::Relaxed) != 0 {
        stats.passive_failures.store(0, Ordering::Relaxed);
    }
}

/// Whether one probe of `inst` succeeded (2xx within the timeout).
async fn probe(state: &AppState, inst: &Instance) -> bool {
    let h = &state.settings.health;
    crate::upstream::get(
        &state.client,
        &inst.spec().url,
        &h.path,
        MAX_PROBE_BODY,
        h.timeout,
    )
    .await
    .is_some_and(|(status, _)| status.is_success())
}

/// Applies one probe result to `inst`.
fn record_probe(state: &AppState, inst: &Instance, ok: bool) {
    let h = &state.settings.health;
    let stats = state.stats.get(inst);
    let mut rec = stats.health();
    if ok && inst.state() == InstanceState::Unknown {
        // A new member's first passed probe: it takes requests from now on.
        rec.probe_failures = 0;
        rec.probe_successes = 1;
        if membership::transition(
            state,
            inst,
            &[InstanceState::Unknown],
            InstanceState::Healthy,
        ) {
            tracing::info!(instance = %inst.id(), "instance passed its first health check");
        }
    } else if ok {
        rec.probe_failures = 0;
        rec.probe_successes = rec.probe_successes.saturating_add(1);
        let backoff_over = rec.ejected_until.is_none_or(|t| Instant::now() >= t);
        if inst.state() == InstanceState::Ejected
            && rec.probe_successes >= h.healthy_threshold
            && backoff_over
        {
            rec.ejected_until = None;
            rec.recovered_at = Some(Instant::now());
            stats.passive_failures.store(0, Ordering::Relaxed);
            if membership::transition(
                state,
                inst,
                &[InstanceState::Ejected],
                InstanceState::Healthy,
            ) {
                tracing::info!(instance = %inst.id(), "instance recovered");
            }
        }
    } else {
        rec.probe_successes = 0;
        rec.probe_failures = rec.probe_failures.saturating_add(1);
        if inst.state() == InstanceState::Healthy
            && rec.probe_failures >= h.unhealthy_threshold
            && membership::transition(
                state,
                inst,
                &[InstanceState::Healthy],
                InstanceState::Ejected,
            )
        {
            tracing::warn!(instance = %inst.id(), failures = rec.probe_failures, "instance ejected by health checks");
        }
        if inst.state() == InstanceState::Unknown && rec.probe_failures == h.unhealthy_threshold {
            tracing::warn!(instance = %inst.id(), failures = rec.probe_failures, path = %h.path, "instance has not passed a health check yet; it gets no requests until it does");
        }
    }
}

/// Without active probes, a passively ejected instance comes back on probation when its backoff
/// is over: one more failure ejects it again, for twice as long.
fn end_backoff(state: &AppState, inst: &Instance) {
    let stats = state.stats.get(inst);
    let mut rec = stats.health();
    if inst.state() == InstanceState::Ejected
        && rec.ejected_until.is_some_and(|t| Instant::now() >= t)
    {
        rec.ejected_until = None;
        rec.recovered_at = Some(Instant::now());
        let probation = state.settings.health.passive_failures.saturating_sub(1);
        stats.passive_failures.store(probation, Ordering::Relaxed);
        if membership::transition(
            state,
            inst,
            &[InstanceState::Ejected],
            InstanceState::Healthy,
        ) {
            tracing::info!(instance = %inst.id(), "instance back on probation after its backoff");
        }
    }
}

/// One round over the fleet: probes every instance that is not draining (concurrently), or,
/// without active checks, ends finished backoffs.
pub async fn check_once(state: &Arc<AppState>) {
    let snapshot = state.fleet.snapshot();
    let targets: Vec<Arc<Instance>> = snapshot
        .instances()
        .iter()
        .filter(|i| i.state() != InstanceState::Draining)
        .cloned()
        .collect();
    if state.settings.health.active {
        let probes = targets.iter().map(|inst| async move {
            let ok = probe(state, inst).await;
            record_probe(state, inst, ok);
        });
        futures_util::future::join_all(probes).await;
    } else {
        for inst in &targets {
            end_backoff(state, inst);
        }
    }
}

/// Runs health rounds every `health.interval` until the task is aborted.
pub async fn run(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(state.settings.health.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is now: `Router::start` has just checked every instance.
    tick.tick().await;
    loop {
        tick.tick().await;
        check_once(&state).await;
    }
}
