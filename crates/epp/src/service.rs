//! The gRPC side: Envoy's `ExternalProcessor` service (one bidirectional stream per HTTP
//! request, each driven by an [`Exchange`]) and the gRPC health protocol, with the service
//! names the Gateway API Inference Extension's endpoint pickers answer.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{
    ExternalProcessor, ExternalProcessorServer,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{ProcessingRequest, ProcessingResponse};
use futures_util::{Stream, StreamExt};
use prefix_router_server::state::AppState;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;

use crate::exchange::{Exchange, PickerOptions};

/// The ext_proc service's full name (also its gRPC health service name).
pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";

/// Envoy's external processor, routing with the router's state.
#[derive(Debug)]
pub struct Picker {
    state: Arc<AppState>,
    options: PickerOptions,
}

impl Picker {
    /// A picker over `state`.
    pub fn new(state: Arc<AppState>, options: PickerOptions) -> Self {
        Self { state, options }
    }
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ExternalProcessor for Picker {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: Request<Streaming<ProcessingRequest>>,
    ) -> Result<Response<Self::ProcessStream>, Status> {
        let inbound = request.into_inner();
        let exchange = Exchange::new(Arc::clone(&self.state), self.options.clone());
        // No task per request: the answers are pulled by tonic as it writes them, and the
        // exchange (with the request's in-flight slot) lives exactly as long as the stream. A
        // stream Envoy abandons drops it, which counts the request as cancelled.
        let answers = futures_util::stream::unfold(
            (inbound, exchange, VecDeque::new()),
            |(mut inbound, mut exchange, mut ready)| async move {
                loop {
                    // A message may need several answers (FULL_DUPLEX_STREAMED: headers, then
                    // the body handed back), or none yet.
                    if let Some(answer) = ready.pop_front() {
                        return Some((Ok(answer), (inbound, exchange, ready)));
                    }
                    match inbound.message().await {
                        Ok(Some(msg)) => ready.extend(exchange.on(msg).await),
                        Ok(None) => {
                            exchange.closed();
                            return None;
                        }
                        Err(status) => {
                            tracing::debug!(%status, "ext_proc stream ended with an error");
                            return None;
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(answers)))
    }
}

/// Whether the picker can route: at least one instance takes requests, and it is not shutting
/// down.
fn ready(state: &AppState) -> ServingStatus {
    if !state.is_shutting_down() && state.fleet.snapshot().eligible(None).next().is_some() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// Serves ext_proc and gRPC health on `listener` until `stop` turns true, then lets open
/// streams finish for up to the shutdown grace.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    options: PickerOptions,
    mut stop: watch::Receiver<bool>,
) {
    let (reporter, health) = tonic_health::server::health_reporter();
    // `liveness` is the process; `readiness` and the ext_proc service follow the fleet.
    reporter
        .set_service_status("liveness", ServingStatus::Serving)
        .await;
    let health_state = Arc::clone(&state);
    let watcher = tokio::spawn(async move {
        let mut last = None;
        loop {
            let now = ready(&health_state);
            if last != Some(now) {
                for name in ["", "readiness", EXT_PROC_SERVICE] {
                    reporter.set_service_status(name, now).await;
                }
                last = Some(now);
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|s| {
        if let Ok(s) = &s {
            // Each answer is a small message Envoy waits for: never hold it back.
            let _ = s.set_nodelay(true);
        }
        s
    });
    let grace = state.settings.timeouts.shutdown_grace;
    let mut stopped = stop.clone();
    let keepalive = options.keepalive;
    let server = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(keepalive))
        .add_service(health)
        .add_service(
            // A BUFFERED body is one message: as large as Envoy buffers one, not tonic's 4 MiB
            // (a larger one failed the stream, a 500 instead of the picker's 413).
            ExternalProcessorServer::new(Picker::new(Arc::clone(&state), options))
                .max_decoding_message_size(grpc_message_limit(&state)),
        )
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stopped.changed().await;
        });
    tokio::pin!(server);
    let result = tokio::select! {
        r = &mut server => r,
        _ = async {
            let _ = stop.changed().await;
            tokio::time::sleep(grace).await;
        } => {
            tracing::warn!(?grace, "shutdown grace over; closing remaining ext_proc streams");
            Ok(())
        }
    };
    watcher.abort();
    if let Err(e) = result {
        tracing::error!(error = %e, "ext_proc listener failed");
    }
}

/// The largest message the picker takes from Envoy. A BUFFERED body comes in one message of
/// whatever size Envoy's own buffer let through, which need not be the router's
/// `limits.max_body_bytes`: a message over this limit fails the stream, and Envoy answers 500
/// for what is the client's fault, so the limit is at least [`ENVOY_BUFFER_CEILING`] (an
/// over-long body within it gets the picker's 413), plus room for the rest of the message
/// (headers, metadata, attributes). It still bounds what one stream can make the picker hold.
fn grpc_message_limit(state: &AppState) -> usize {
    usize::try_from(state.settings.limits.max_body_bytes)
        .unwrap_or(usize::MAX)
        .max(ENVOY_BUFFER_CEILING)
        .saturating_add(1 << 20)
}

/// Bodies up to this size are read and judged by the picker whatever `limits.max_body_bytes`
/// says: twice the 32 MiB that `deploy/envoy` buffers.
const ENVOY_BUFFER_CEILING: usize = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    /// Readiness follows the fleet, and turns NOT_SERVING once a shutdown is under way (while
    /// the picker still answers, for `timeouts.shutdown_delay_ms`).
    #[test]
    fn readiness_is_lost_while_shutting_down() {
        let mut settings =
            prefix_router_server::settings::Settings::with_instances(["http://127.0.0.1:1"])
                .unwrap_or_else(|e| panic!("{e}"));
        // No probes: the member starts healthy.
        settings.health.active = false;
        let state = AppState::new(settings, None).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ready(&state), ServingStatus::Serving);
        state.begin_shutdown();
        assert_eq!(ready(&state), ServingStatus::NotServing);
    }
}
