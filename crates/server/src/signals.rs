//! Running until a signal: SIGHUP reloads the configuration (and reopens the access log),
//! SIGUSR1 only reopens the access log (for logrotate: a reload also puts the file's instance
//! list and strategy back over admin API edits, which a nightly rotation should not do), and
//! SIGTERM and SIGINT shut down gracefully (after `timeouts.shutdown_delay_ms` of serving on
//! with health answering 503, stop accepting, let in-flight requests finish up to the grace
//! period).

use tokio::signal::unix::{signal, SignalKind};

use crate::error::ServerError;
use crate::reload::reload;
use std::net::SocketAddr;

use crate::server::{Front, Router};
use crate::settings::ConfigSource;

fn install(
    kind: SignalKind,
    name: &'static str,
) -> Result<tokio::signal::unix::Signal, ServerError> {
    signal(kind).map_err(|source| ServerError::Signal {
        signal: name,
        source,
    })
}

/// Loads the configuration, starts the router and serves until SIGTERM or SIGINT.
pub async fn run_until_signal(source: ConfigSource) -> Result<(), ServerError> {
    run_front_until_signal(source, None).await
}

/// As [`run_until_signal`], with `front` answering on its address instead of the HTTP proxy
/// on `listen` (the endpoint picker's gRPC).
pub async fn run_front_until_signal(
    source: ConfigSource,
    front: Option<(SocketAddr, Front)>,
) -> Result<(), ServerError> {
    let settings = source.load()?;
    let mut hangup = install(SignalKind::hangup(), "SIGHUP")?;
    let mut rotate = install(SignalKind::user_defined1(), "SIGUSR1")?;
    let mut terminate = install(SignalKind::terminate(), "SIGTERM")?;
    let mut interrupt = install(SignalKind::interrupt(), "SIGINT")?;
    let router = match front {
        None => Router::start(settings, Some(source)).await?,
        Some((listen, front)) => Router::start_with(settings, Some(source), listen, front).await?,
    };
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                if let Err(e) = reload(router.state()).await {
                    tracing::error!(error = %e, "reload failed; keeping the current configuration");
                }
            }
            _ = rotate.recv() => {
                if let Some(log) = &router.state().access_log {
                    log.reopen();
                    tracing::info!("SIGUSR1: access log reopened");
                }
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    let delay = router.state().settings.timeouts.shutdown_delay;
    if !delay.is_zero() {
        router.state().begin_shutdown();
        tracing::info!(?delay, "shutting down: serving on meanwhile, with /health and /ready answering 503 (a second signal stops at once)");
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = terminate.recv() => {
                tracing::warn!("second signal: stopping without waiting for in-flight requests");
                return Ok(());
            }
            _ = interrupt.recv() => {
                tracing::warn!("second signal: stopping without waiting for in-flight requests");
                return Ok(());
            }
        }
    }
    tracing::info!("shutting down: no new connections, waiting for in-flight requests (a second signal stops at once)");
    let shutdown = router.shutdown();
    tokio::pin!(shutdown);
    // An operator who does not want to wait out the grace period signals again.
    tokio::select! {
        _ = &mut shutdown => {}
        _ = terminate.recv() => tracing::warn!("second signal: stopping without waiting for in-flight requests"),
        _ = interrupt.recv() => tracing::warn!("second signal: stopping without waiting for in-flight requests"),
    }
    Ok(())
}
