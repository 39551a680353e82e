//! Starting, serving and stopping a mock engine.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::faults::FaultState;
use crate::handlers::{handle, AppState};
use crate::metrics::Metrics;
use crate::{driver, kv_events, MockEngineConfig, StartError};

/// A running mock engine. Dropping it stops it (like [`MockEngine::shutdown`], without
/// waiting).
#[derive(Debug)]
pub struct MockEngine {
    addr: SocketAddr,
    /// `tcp://` endpoints of the KV-event PUB and replay sockets, when publishing.
    kv_events: Option<(String, Option<String>)>,
    stop: ShutdownHandle,
    accept: Option<JoinHandle<()>>,
}

/// Stops a mock engine from anywhere (cloneable).
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<watch::Sender<bool>>);

impl ShutdownHandle {
    /// Stops accepting, drops open connections and stops the engine task.
    pub fn shutdown(&self) {
        self.0.send_replace(true);
    }
}

impl MockEngine {
    /// Binds `addr` (port 0 for an ephemeral port) and starts serving.
    pub async fn bind(addr: SocketAddr, config: MockEngineConfig) -> Result<Self, StartError> {
        config.validate()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| StartError::Bind { addr, source })?;
        Self::start(listener, config)
    }

    /// Starts serving on an already-bound listener. Must be called inside a Tokio runtime.
    pub fn start(listener: TcpListener, config: MockEngineConfig) -> Result<Self, StartError> {
        config.validate()?;
        let addr = listener.local_addr().map_err(StartError::LocalAddr)?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let (submit, submissions) = mpsc::unbounded_channel();
        let metrics = Arc::new(Mutex::new(Metrics::new(
            &config.model,
            config.engine.kv_capacity_blocks,
        )));
        let mut kv_endpoints = None;
        let mut sink = None;
        if let Some(kv) = &config.kv_events {
            let bound = kv_events::bind(kv)?;
            kv_endpoints = Some((bound.endpoint.clone(), bound.replay_endpoint.clone()));
            let (tx, rx) = mpsc::unbounded_channel();
            sink = Some(kv_events::Sink::new(
                tx,
                config.engine.block_tokens,
                kv.encoding,
            ));
            tokio::spawn(kv_events::run(
                bound,
                kv.clone(),
                config.seed,
                rx,
                stop_rx.clone(),
            ));
        }
        tokio::spawn(driver::run(
            config.engine.clone(),
            config.time_scale,
            submissions,
            metrics.clone(),
            sink,
            stop_rx.clone(),
        ));
        let state = Arc::new(AppState {
            faults: FaultState::new(config.faults.clone(), config.seed),
            config,
            submit,
            metrics,
            next_id: AtomicU64::new(0),
            responses: crate::responses::ResponseStore::default(),
            engine_tag: engine_tag(addr),
        });
        let accept = tokio::spawn(accept_loop(listener, state, stop_rx));
        Ok(MockEngine {
            addr,
            kv_events: kv_endpoints,
            stop: ShutdownHandle(Arc::new(stop_tx)),
            accept: Some(accept),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the base URL for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `tcp://ADDR` of the KV-event PUB socket, when it publishes events.
    pub fn kv_events_endpoint(&self) -> Option<&str> {
        self.kv_events.as_ref().map(|(e, _)| e.as_str())
    }

    /// `tcp://ADDR` of the KV-event replay socket, when it has one.
    pub fn kv_events_replay_endpoint(&self) -> Option<&str> {
        self.kv_events.as_ref().and_then(|(_, r)| r.as_deref())
    }

    /// A handle that stops this engine.
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.stop.clone()
    }

    /// Stops the engine and waits until it no longer accepts connections.
    pub async fn shutdown(mut self) {
        self.stop.shutdown();
        if let Some(task) = self.accept.take() {
            // A panicked accept loop has stopped accepting too.
            let _ = task.await;
        }
    }

    /// Runs until stopped through a [`ShutdownHandle`].
    pub async fn wait(mut self) {
        if let Some(task) = self.accept.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MockEngine {
    fn drop(&mut self) {
        self.stop.shutdown();
    }
}

/// Accepts connections until told to stop; each connection lives until it ends or the stop.
/// Sets this engine's response ids apart from every other engine's: its address and the time it
/// started. (A counter alone started at 0 in every engine, so two engines gave the same ids, and
/// a router following `previous_response_id` could not tell their responses apart; vLLM's ids
/// are random.)
fn engine_tag(addr: std::net::SocketAddr) -> u64 {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    xxhash_rust::xxh3::xxh3_64(format!("{addr} {started}").as_bytes())
}

async fn accept_loop(listener: TcpListener, state: Arc<AppState>, mut stop: watch::Receiver<bool>) {
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let accepted = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let state = state.clone();
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| handle(state.clone(), req));
            let conn = builder.serve_connection(TokioIo::new(stream), svc);
            tokio::select! {
                r = conn => {
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }
                _ = stop.wait_for(|s| *s) => {}
            }
        });
    }
}
