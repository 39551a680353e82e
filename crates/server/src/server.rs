//! Listeners and lifecycle: bind, accept (HTTP/1.1 and HTTP/2), run health checks, shut down
//! gracefully.

use std::net::SocketAddr;
use std::sync::Arc;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use crate::discovery;
use crate::error::ServerError;
use crate::handler;
use crate::health;
use crate::settings::{ConfigSource, Settings, SettingsError};
use crate::state::AppState;

/// Starts routers.
#[derive(Debug)]
pub struct Router;

/// A started router: its address, its state, and the handle that stops it.
#[derive(Debug)]
pub struct RunningRouter {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    state: Arc<AppState>,
    shutdown: watch::Sender<bool>,
    serve: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

impl Router {
    /// Binds the listeners and starts serving, health checking and (when configured) the
    /// admin API. `source` is where reloads read settings again.
    pub async fn start(
        settings: Settings,
        source: Option<ConfigSource>,
    ) -> Result<RunningRouter, ServerError> {
        let state = AppState::new(settings, source).map_err(|e| SettingsError::Invalid {
            field: "routing".into(),
            message: e.to_string(),
        })?;
        let listener = bind(state.settings.listen).await?;
        // Resolve DNS targets once before serving, so the first requests find the fleet.
        for target in &state.settings.discovery.dns {
            discovery::refresh_dns(&state, target).await;
        }
        // And check them once (concurrently, within the probe timeout): the instances already
        // up take requests from the first one, the others once they pass a later check.
        if state.settings.health.active {
            health::check_once(&state).await;
        }
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: state.settings.listen,
            source,
        })?;
        let (tx, rx) = watch::channel(false);
        let mut background = vec![tokio::spawn(health::run(Arc::clone(&state)))];
        for target in &state.settings.discovery.dns {
            background.push(tokio::spawn(discovery::run_dns(
                Arc::clone(&state),
                target.clone(),
            )));
        }
        if let Some(em) = &state.settings.engine_metrics {
            background.push(tokio::spawn(crate::engine_metrics::run(
                Arc::clone(&state),
                em.interval,
                em.path.clone(),
            )));
        }
        if let Some(interval) = state.settings.discovery.models_interval {
            background.push(tokio::spawn(discovery::run_models(
                Arc::clone(&state),
                interval,
            )));
        }
        let mut admin_addr = None;
        if let Some(admin) = &state.settings.admin {
            let listener = bind(admin.listen).await?;
            let local = listener.local_addr().map_err(|source| ServerError::Bind {
                addr: admin.listen,
                source,
            })?;
            let app = crate::admin::router(Arc::clone(&state), &admin.token);
            let mut stop = rx.clone();
            background.push(tokio::spawn(async move {
                let served = axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stop.changed().await;
                    })
                    .await;
                if let Err(e) = served {
                    tracing::error!(error = %e, "admin listener failed");
                }
            }));
            tracing::info!(addr = %local, "admin API listening");
            admin_addr = Some(local);
        }
        let serve = tokio::spawn(accept_loop(listener, Arc::clone(&state), rx));
        tracing::info!(%addr, instances = state.fleet.snapshot().len(), "router listening");
        Ok(RunningRouter {
            addr,
            admin_addr,
            state,
            shutdown: tx,
            serve,
            background,
        })
    }
}

impl RunningRouter {
    /// The data-plane address (the real port when configured with port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin API's address, when it runs.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// Shared state (fleet, metrics, settings).
    pub fn state(&self) -> &Arc<AppState> {
        &self.state
    }

    /// Stops accepting, lets in-flight requests finish up to `timeouts.shutdown_grace`, then
    /// returns.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.serve.await;
        for task in &self.background {
            task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let limits = &state.settings.limits;
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(limits.max_connections));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .keep_alive(true)
        .max_buf_size(limits.max_header_bytes);
    builder
        .http2()
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    loop {
        // At the connection limit, wait for one to close before accepting more.
        let permit = tokio::select! {
            p = Arc::clone(&connections).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stop.changed() => break,
        };
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _peer)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let conn_state = Arc::clone(&state);
        let svc = service_fn(move |req| handler::handle(Arc::clone(&conn_state), req));
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .into_owned();
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    let grace = state.settings.timeouts.shutdown_grace;
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("all connections finished"),
        _ = tokio::time::sleep(grace) => tracing::warn!(?grace, "shutdown grace over; closing remaining connections"),
    }
}
