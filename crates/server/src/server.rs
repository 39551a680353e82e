//! Listeners and lifecycle: bind, accept (HTTP/1.1 and HTTP/2), run health checks, shut down
//! gracefully.

use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

use std::convert::Infallible;

use crate::body::RequestBody;
use crate::conn::{Activity, PerClient, Tracked, TrackedIo, Verdict};
use crate::discovery;
use crate::error::{ApiError, ServerError};
use crate::front;
use crate::handler;
use crate::health;
use crate::io_threads::IoThreads;
use crate::metrics::ReasonLabels;
use crate::settings::{ConfigSource, Settings};
use crate::state::AppState;

/// Starts routers.
#[derive(Debug)]
pub struct Router;

/// What answers on the traffic listener, over the router's state, until the stop signal turns
/// true; it returns once what it had in flight has finished (or the shutdown grace is over).
/// `serve` answers HTTP ([`Router::start`]); the endpoint picker answers Envoy's ext_proc gRPC
/// over the very same state, health checks, discovery and admin API.
pub type Front = Box<
    dyn FnOnce(TcpListener, Arc<AppState>, watch::Receiver<bool>) -> BoxFuture<'static, ()> + Send,
>;

/// A started router: its address, its state, and the handle that stops it.
#[derive(Debug)]
pub struct RunningRouter {
    addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    state: Arc<AppState>,
    shutdown: watch::Sender<bool>,
    serve: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
    /// The access log's writer: drained, not aborted, at shutdown.
    log_writer: Option<JoinHandle<()>>,
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
        let listen = settings.listen;
        let io = match settings.limits.io_threads {
            0 => None,
            n => Some(IoThreads::start(n)?),
        };
        let front: Front =
            Box::new(|listener, state, stop| Box::pin(accept_loop(listener, state, stop, io)));
        Self::start_with(settings, source, listen, front).await
    }

    /// As [`Router::start`], with `front` answering on `listen` instead of the HTTP proxy.
    pub async fn start_with(
        settings: Settings,
        source: Option<ConfigSource>,
        listen: SocketAddr,
        front: Front,
    ) -> Result<RunningRouter, ServerError> {
        let state = AppState::new(settings, source)?;
        let listener = bind(listen).await?;
        // Resolve DNS targets once before serving, so the first requests find the fleet.
        let mut dns = Vec::with_capacity(state.settings.discovery.dns.len());
        for (i, target) in state.settings.discovery.dns.iter().enumerate() {
            let source = discovery::DnsSource::new(target).map_err(|e| {
                ServerError::Config(crate::settings::SettingsError::Invalid {
                    field: format!("discovery.dns[{i}]"),
                    message: e.to_string(),
                })
            })?;
            discovery::refresh_dns(&state, &source).await;
            dns.push(source);
        }
        // The Service's endpoints: the first list is waited for (bounded) like DNS above.
        let kubernetes = match &state.settings.discovery.kubernetes {
            Some(target) => Some(crate::kubernetes::start(&state, target).await?),
            None => None,
        };
        // And check them once (concurrently, within the probe timeout): the instances already
        // up take requests from the first one, the others once they pass a later check.
        if state.settings.health.active {
            health::check_once(&state).await;
        }
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: listen,
            source,
        })?;
        crate::kv_events::warn_if_blind(&state);
        let (tx, rx) = watch::channel(false);
        let mut background = vec![tokio::spawn(health::run(Arc::clone(&state)))];
        if state.prewarm.is_some() {
            background.push(tokio::spawn(crate::prewarm::run(Arc::clone(&state))));
        }
        background.extend(kubernetes);
        for source in dns {
            background.push(tokio::spawn(discovery::run_dns(Arc::clone(&state), source)));
        }
        if state.kv_events.is_some() {
            background.push(tokio::spawn(crate::kv_events::run(Arc::clone(&state))));
        }
        let em = &state.settings.engine_metrics;
        if em.scrape {
            background.push(tokio::spawn(crate::engine_metrics::run(
                Arc::clone(&state),
                em.interval,
                em.path.clone(),
            )));
        }
        if let Some(interval) = state.settings.discovery.models_every() {
            background.push(tokio::spawn(discovery::run_models(
                Arc::clone(&state),
                interval,
            )));
        }
        let mut admin_addr = None;
        if let Some(admin) = &state.settings.admin.api() {
            let listener = bind(admin.listen).await?;
            let local = listener.local_addr().map_err(|source| ServerError::Bind {
                addr: admin.listen,
                source,
            })?;
            let app = crate::admin::router(Arc::clone(&state), &admin.token);
            // The live page's history: only where the page can be asked for.
            background.push(tokio::spawn(crate::dashboard::run(Arc::clone(&state))));
            background.push(tokio::spawn(serve_axum(listener, app, rx.clone(), "admin")));
            tracing::info!(addr = %local, "admin API listening");
            admin_addr = Some(local);
        }
        let log_writer = state.access_log.as_ref().and_then(|log| log.spawn_writer());
        let serve = tokio::spawn(front(listener, Arc::clone(&state), rx));
        tracing::info!(%addr, instances = state.fleet.snapshot().len(), "router listening");
        Ok(RunningRouter {
            addr,
            admin_addr,
            state,
            shutdown: tx,
            serve,
            background,
            log_writer,
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
        if let (Some(log), Some(writer)) = (&self.state.access_log, self.log_writer) {
            log.close();
            // Bounded: a stuck disk must not hold the process forever.
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), writer).await;
        }
    }
}

/// Serves `app` (an axum router: the admin API, the picker's operations listener) on
/// `listener` until `stop` turns true; `what` names it in the log if it fails.
pub async fn serve_axum(
    listener: TcpListener,
    app: axum::Router,
    mut stop: watch::Receiver<bool>,
    what: &'static str,
) {
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop.changed().await;
        })
        .await;
    if let Err(e) = served {
        tracing::error!(error = %e, listener = what, "listener failed");
    }
}

/// Accepts connections and serves each on an I/O thread (or, with `io_threads = 0`, as a task
/// of the shared runtime) until `stop`; then waits for them to finish, up to the grace.
async fn accept_loop(
    listener: TcpListener,
    state: Arc<AppState>,
    stop: watch::Receiver<bool>,
    io: Option<IoThreads>,
) {
    let limits = &state.settings.limits;
    let max = limits.max_connections;
    let connections = Arc::new(Semaphore::new(max));
    let per_client = PerClient::new(limits.max_connections_per_client);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .keep_alive(true)
        .max_buf_size(limits.max_header_bytes);
    builder
        .http2()
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX));
    let builder = Arc::new(builder);
    let mut stop_accepting = stop.clone();
    loop {
        // At the connection limit, wait for one to close before accepting more.
        let permit = tokio::select! {
            p = Arc::clone(&connections).acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
            _ = stop_accepting.changed() => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stop_accepting.changed() => break,
        };
        let _ = stream.set_nodelay(true);
        let state = Arc::clone(&state);
        let stop = stop.clone();
        let admitted = per_client.admit(peer.ip());
        let builder = Arc::clone(&builder);
        let serve = move |stream: TcpStream| -> BoxFuture<'static, ()> {
            Box::pin(async move {
                // Held until the connection ends, however it ends.
                let _permit = permit;
                let Some(tls) = &state.tls else {
                    serve_plain(&builder, stream, &state, stop, admitted).await;
                    return;
                };
                // The handshake is part of the head: bounded by the same timeout.
                let handshake = tls.acceptor().accept(stream);
                match tokio::time::timeout(state.settings.timeouts.client_header, handshake).await {
                    Ok(Ok(stream)) => {
                        serve_admitted(&builder, stream, &state, stop, admitted).await;
                    }
                    Ok(Err(e)) => {
                        count_close(&state, "tls_handshake");
                        tracing::debug!(error = %e, "TLS handshake failed");
                    }
                    Err(_) => count_close(&state, "header_timeout"),
                }
            })
        };
        match &io {
            Some(io) => io.hand(stream, Box::new(serve)),
            None => {
                tokio::spawn(serve(stream));
            }
        }
    }
    drop(listener);
    let grace = state.settings.timeouts.shutdown_grace;
    // Every connection holds a permit until it ends: all of them back means all finished.
    let all = connections.acquire_many(u32::try_from(max).unwrap_or(u32::MAX));
    tokio::select! {
        _ = all => tracing::info!("all connections finished"),
        _ = tokio::time::sleep(grace) => tracing::warn!(?grace, "shutdown grace over; closing remaining connections"),
    }
    // The I/O threads stop here, dropping what they still serve (only past the grace).
    drop(io);
}

/// Serves a plaintext connection the per-address limit admitted with the router's own
/// HTTP/1.1 front ([`crate::front`]), and with hyper if it turns out to speak HTTP/2; or
/// refuses it with 429.
async fn serve_plain(
    builder: &auto::Builder<TokioExecutor>,
    stream: TcpStream,
    state: &Arc<AppState>,
    mut stop: watch::Receiver<bool>,
    admitted: Result<Option<crate::conn::ClientSlot>, usize>,
) {
    match admitted {
        Ok(slot) => {
            if let Some(h2) = front::serve(stream, state, &mut stop).await {
                serve_connection(builder, h2, Arc::clone(state), stop).await;
            }
            drop(slot);
        }
        Err(limit) => refuse_connection(stream, state, limit).await,
    }
}

/// Serves a connection the per-address limit admitted, or refuses it with 429.
async fn serve_admitted<S>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    state: &Arc<AppState>,
    stop: watch::Receiver<bool>,
    admitted: Result<Option<crate::conn::ClientSlot>, usize>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    match admitted {
        Ok(slot) => {
            serve_connection(builder, stream, Arc::clone(state), stop).await;
            drop(slot);
        }
        Err(limit) => refuse_connection(stream, state, limit).await,
    }
}

/// Serves one client connection until it ends, the watchdog closes it ([`crate::conn`]), or
/// shutdown asks it to finish (then it ends once its requests are answered).
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    state: Arc<AppState>,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let io = TokioIo::new(TrackedIo::new(
        stream,
        Arc::clone(&activity),
        state.settings.limits.max_header_bytes,
    ));
    let svc_state = Arc::clone(&state);
    let svc_activity = Arc::clone(&activity);
    let svc = service_fn(move |req| {
        if req.version() == http::Version::HTTP_2 {
            svc_activity.speaks_h2();
        }
        let open = svc_activity.request();
        let state = Arc::clone(&svc_state);
        async move {
            let mut resp = handler::handle(state, req.map(RequestBody::Incoming)).await?;
            // A relayed answer's headers travel as wire lines (`crate::fields`): hyper
            // takes a map.
            let fields = resp.body_mut().take_fields();
            fields.into_map(resp.headers_mut());
            Ok::<_, Infallible>(resp.map(|b| Tracked::new(b, open)))
        }
    });
    let conn = builder.serve_connection(io, svc);
    tokio::pin!(conn);
    let timeouts = &state.settings.timeouts;
    let mut closing = false;
    loop {
        let verdict = activity.verdict(
            timeouts.client_header,
            timeouts.client_idle,
            timeouts.client_write,
        );
        let wait = match verdict {
            // Even a connection shutting down must not wait forever on a client that takes
            // nothing (a GOAWAY or the last bytes of an answer cannot go out).
            Verdict::WriteTimeout => {
                count_close(&state, "write_timeout");
                tracing::debug!("client stopped reading its answers; connection closed");
                return;
            }
            Verdict::StreamsStalled(due) => {
                let n = activity.cancel_waiting(due);
                state
                    .metrics
                    .streams_reset
                    .get_or_create(&ReasonLabels {
                        reason: "write_timeout",
                    })
                    .inc_by(n as u64);
                tracing::debug!(
                    streams = n,
                    "client stopped reading some streams; their requests cancelled"
                );
                if n > 0 {
                    continue;
                }
                // Asked again meanwhile: look again later rather than at once.
                timeouts.client_write.min(timeouts.client_header)
            }
            Verdict::Wait(d) => d,
            // Shutting down already: waits for the connection to finish (the rules above
            // still apply to a client that takes nothing).
            _ if closing => timeouts.client_idle.min(timeouts.client_write),
            Verdict::HeaderTimeout => {
                count_close(&state, "header_timeout");
                tracing::debug!("client too slow sending a request head; connection closed");
                return;
            }
            Verdict::Idle => {
                count_close(&state, "idle");
                conn.as_mut().graceful_shutdown();
                closing = true;
                continue;
            }
        };
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(error = %e, "client connection ended with an error");
                }
                return;
            }
            _ = tokio::time::sleep(wait) => {}
            changed = stop.changed(), if !closing => {
                let _ = changed;
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Answers a connection over the per-address limit with 429 and closes it.
async fn refuse_connection<S>(stream: S, state: &AppState, limit: usize)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    count_close(state, "per_client_limit");
    let svc = service_fn(move |_req| async move {
        let e = ApiError::too_many_connections(limit);
        Ok::<_, Infallible>(e.into_response())
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().keep_alive(false);
    let conn = builder.serve_connection(TokioIo::new(stream), svc);
    // A client that sends no request is not waited for.
    let _ = tokio::time::timeout(state.settings.timeouts.client_header, conn).await;
}

pub(crate) fn count_close(state: &AppState, reason: &'static str) {
    state
        .metrics
        .connections_closed
        .get_or_create(&ReasonLabels { reason })
        .inc();
}
