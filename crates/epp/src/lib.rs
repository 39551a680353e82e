//! The endpoint picker of prefix-router (`prefix-router epp`).
//!
//! Envoy (or any gateway with Envoy's ext_proc filter, as the Gateway API Inference Extension
//! specifies) asks it where each request goes. It reads the request's headers and buffered
//! body, routes them exactly as `serve` does (the same extraction, strategy, admission control,
//! health and membership, from the same configuration), and answers the chosen endpoint in the
//! `x-gateway-destination-endpoint` header and in the `envoy.lb` dynamic metadata. It reads
//! the response on its way back (the endpoint that served, the first token, usage with
//! `cached_tokens`) to feed the strategy, as `serve` does for what it proxies itself.
//!
//! Beside the gRPC listener it serves `/health`, `/ready` and `/metrics` over HTTP, and the
//! admin API when it is configured, as `serve` does.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod exchange;
pub mod service;
pub mod wire;

use std::net::SocketAddr;
use std::sync::Arc;

use prefix_router_server::error::{ApiError, ServerError};
use prefix_router_server::handler::operational;
use prefix_router_server::server::serve_axum;
use prefix_router_server::state::AppState;
use prefix_router_server::{
    run_front_until_signal, ConfigSource, Front, Router, RunningRouter, Settings,
};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use exchange::PickerOptions;

/// Where the picker listens.
#[derive(Debug, Clone, Copy)]
pub struct Listeners {
    /// ext_proc and gRPC health.
    pub grpc: SocketAddr,
    /// `/health`, `/ready`, `/metrics` over HTTP; `None`: not served.
    pub ops: Option<SocketAddr>,
}

/// A started picker: the router underneath (its state, admin API, shutdown) and the address of
/// its HTTP operations listener.
#[derive(Debug)]
pub struct RunningPicker {
    /// The router; its `local_addr` is the gRPC listener's.
    pub router: RunningRouter,
    /// The operations listener's address (the real port when configured with port 0).
    pub ops: Option<SocketAddr>,
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| ServerError::Bind { addr, source })
}

/// The front that answers ext_proc on the router's traffic listener, with the operations
/// listener beside it when one is bound.
fn front(options: PickerOptions, ops: Option<TcpListener>) -> Front {
    Box::new(move |listener, state, stop| {
        Box::pin(async move {
            if let Some(ops) = ops {
                tokio::spawn(serve_ops(ops, Arc::clone(&state), stop.clone()));
            }
            service::serve(listener, state, options, stop).await;
        })
    })
}

/// Starts the picker (tests and embedders; the CLI runs [`run_until_signal`]).
pub async fn start(
    settings: Settings,
    source: Option<ConfigSource>,
    listeners: Listeners,
    options: PickerOptions,
) -> Result<RunningPicker, ServerError> {
    let (ops, ops_addr) = bind_ops(listeners.ops).await?;
    let router = Router::start_with(settings, source, listeners.grpc, front(options, ops)).await?;
    Ok(RunningPicker {
        router,
        ops: ops_addr,
    })
}

async fn bind_ops(
    addr: Option<SocketAddr>,
) -> Result<(Option<TcpListener>, Option<SocketAddr>), ServerError> {
    let Some(addr) = addr else {
        return Ok((None, None));
    };
    let l = bind(addr).await?;
    let local = l
        .local_addr()
        .map_err(|source| ServerError::Bind { addr, source })?;
    Ok((Some(l), Some(local)))
}

/// Loads the configuration, starts the picker and serves until SIGTERM or SIGINT (SIGHUP
/// reloads, as for `serve`).
pub async fn run_until_signal(
    source: ConfigSource,
    listeners: Listeners,
    options: PickerOptions,
) -> Result<(), ServerError> {
    let (ops, ops_addr) = bind_ops(listeners.ops).await?;
    match ops_addr {
        Some(ops) => tracing::info!(grpc = %listeners.grpc, %ops, "endpoint picker starting"),
        None => tracing::info!(grpc = %listeners.grpc, ops = "off", "endpoint picker starting"),
    }
    run_front_until_signal(source, Some((listeners.grpc, front(options, ops)))).await
}

/// `/health`, `/ready`, `/metrics` (the same answers as `serve`'s), 404 for anything else;
/// served as the admin API is, by axum, until `stop` turns true.
async fn serve_ops(listener: TcpListener, state: Arc<AppState>, stop: watch::Receiver<bool>) {
    let app = axum::Router::new().fallback(move |req: axum::extract::Request| {
        let state = Arc::clone(&state);
        async move {
            let path = req.uri().path();
            operational(&state, req.method(), path)
                .unwrap_or_else(|| ApiError::unknown_route(path).into_response())
                .map(axum::body::Body::new)
        }
    });
    serve_axum(listener, app, stop, "operations").await;
}
