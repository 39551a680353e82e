//! Request routing and the endpoint handlers.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use prefix_router_engine_model::EngineRequest;
use tokio::sync::mpsc;

use crate::api_error::ApiError;
use crate::body::ResponseBody;
use crate::driver::{Adapter, Progress, Submission};
use crate::faults::{FaultState, Verdict};
use crate::instant;
use crate::metrics::Metrics;
use crate::request::{self, ApiKind};
use crate::response::Meta;
use crate::responses::ResponseStore;
use crate::stream::SseStream;
use crate::MockEngineConfig;

/// Largest request body accepted (a 100k-token prompt is well under 1 MiB).
const MAX_BODY_BYTES: usize = 32 << 20;

/// Everything the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub config: MockEngineConfig,
    pub submit: mpsc::UnboundedSender<Submission>,
    pub metrics: Arc<Mutex<Metrics>>,
    pub faults: FaultState,
    pub next_id: AtomicU64,
    /// The Responses API's stored responses.
    pub responses: ResponseStore,
    /// Part of every response id: unique to this engine ([`crate::server`]).
    pub engine_tag: u64,
}

type Reply = Response<ResponseBody>;

/// Answers one request.
pub(crate) async fn handle<B>(state: Arc<AppState>, req: Request<B>) -> Result<Reply, Infallible>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    let path = req.uri().path().to_owned();
    if path == "/metrics" {
        return Ok(match *req.method() {
            Method::GET => metrics(&state),
            _ => error(ApiError::method_not_allowed(&path)),
        });
    }
    if state.faults.stopped() {
        return Ok(stopped());
    }
    let kind = match path.as_str() {
        "/v1/chat/completions" => Some(ApiKind::Chat),
        "/v1/completions" => Some(ApiKind::Completion),
        "/v1/responses" => Some(ApiKind::Responses),
        "/invocations" => None,
        "/health" | "/ping" | "/v1/models" => {
            return Ok(match *req.method() {
                Method::GET if path == "/v1/models" => models(&state.config),
                Method::GET => plain(StatusCode::OK, ResponseBody::empty()),
                _ => error(ApiError::method_not_allowed(&path)),
            })
        }
        p => match p.strip_prefix("/v1/responses/") {
            Some(id) if *req.method() == Method::GET => return Ok(stored_response(&state, id)),
            Some(_) => return Ok(error(ApiError::method_not_allowed(&path))),
            None => return Ok(error(ApiError::not_found(&path))),
        },
    };
    if req.method() != Method::POST {
        return Ok(error(ApiError::method_not_allowed(&path)));
    }
    Ok(inference(&state, kind, req).await.unwrap_or_else(error))
}

/// Chat, completions and the native invoke API.
async fn inference<B>(
    state: &AppState,
    kind: Option<ApiKind>,
    req: Request<B>,
) -> Result<Reply, ApiError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: std::error::Error + Send + Sync + 'static,
{
    if state.faults.arrive() {
        return Ok(stopped());
    }
    let body = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(ApiError::too_large(MAX_BODY_BYTES))
        }
        Err(e) => return Err(ApiError::bad_body(format!("cannot read the body: {e}"))),
    };
    let config = &state.config;
    // A request without `model` is for the model it serves, as vLLM takes it (the native
    // API names none at all).
    let default_model = Some(config.model.as_str());
    if config.instant {
        let i = instant::skim(kind, &body, default_model)?;
        let head = Head {
            kind: i.kind,
            model: i.model,
            prompt_tokens: i.prompt_tokens,
            digest: 0,
            stream: i.stream,
            include_usage: i.include_usage,
            max_tokens: i.max_tokens,
        };
        let (pending, _) = admit(state, head).await?;
        return answer(state, pending, instant::progress(i.max_tokens)).await;
    }
    let parsed = request::parse_in(
        kind,
        &body,
        default_model,
        config.engine.block_tokens,
        config.tokenizer.as_deref(),
        &state.responses,
    )?;
    let head = Head {
        kind: parsed.kind,
        model: parsed.model,
        prompt_tokens: parsed.prompt.tokens.max(1),
        digest: parsed.prompt.digest,
        stream: parsed.stream,
        include_usage: parsed.include_usage,
        max_tokens: parsed.max_tokens,
    };
    let adapter = config
        .loras
        .iter()
        .position(|l| *l == head.model)
        .map(|k| Adapter {
            id: k as i64 + 1,
            name: Arc::from(head.model.as_str()),
        });
    let mut block_hashes = parsed.prompt.block_hashes;
    if let Some(a) = &adapter {
        keyed_by_adapter(&mut block_hashes, &a.name);
    }
    let (pending, id) = admit(state, head).await?;
    if let Some(mut conversation) = parsed.conversation {
        // Stored with its answer (known now: the mock answers exactly its output tokens).
        let answer = crate::responses::answer_text(&pending.meta, pending.max_tokens);
        conversation.push(("assistant".into(), answer));
        state.responses.put(&pending.meta.id, conversation);
    }
    let (tx, rx) = mpsc::unbounded_channel();
    let submission = Submission {
        request: EngineRequest {
            id,
            block_hashes,
            prompt_tokens: pending.meta.prompt_tokens,
            output_tokens: pending.max_tokens,
        },
        progress: tx,
        block_tokens: parsed.prompt.block_token_ids,
        adapter,
    };
    if state.submit.send(submission).is_err() {
        return Err(ApiError::injected(
            StatusCode::SERVICE_UNAVAILABLE,
            "the engine has stopped",
        ));
    }
    answer(state, pending, rx).await
}

/// `GET /v1/responses/{id}`: a response this engine stored, else 404.
fn stored_response(state: &AppState, id: &str) -> Reply {
    match state.responses.get(id) {
        Some(c) => json(
            StatusCode::OK,
            crate::responses::stored(id, &c).to_string().into_bytes(),
        ),
        None => error(crate::responses::not_stored(id)),
    }
}

/// An adapter's blocks are not the base model's, nor another adapter's: vLLM keys each block by
/// its LoRA adapter as well as its tokens, so the same prompt under two adapters is computed and
/// cached twice. Each block hash is mixed with the adapter's name (a chained hash stays
/// chained: equal keys still mean equal tokens and adapter up to that block).
fn keyed_by_adapter(hashes: &mut [u64], adapter: &str) {
    let seed = xxhash_rust::xxh3::xxh3_64(adapter.as_bytes());
    for h in hashes {
        *h = xxhash_rust::xxh3::xxh3_64_with_seed(&h.to_le_bytes(), seed);
    }
}

/// What the answer's shape needs from a request, however it was read.
struct Head {
    kind: ApiKind,
    model: String,
    prompt_tokens: u32,
    /// Seeds the generated text.
    digest: u64,
    stream: bool,
    include_usage: bool,
    max_tokens: u32,
}

/// A request's answer, before the engine has produced it.
struct Pending {
    meta: Meta,
    stream: bool,
    max_tokens: u32,
}

/// Checks the model, draws the injected faults, and names the request.
async fn admit(state: &AppState, head: Head) -> Result<(Pending, u64), ApiError> {
    if !state.config.serves(&head.model) {
        return Err(ApiError::unknown_model(&head.model));
    }
    match state.faults.draw() {
        Verdict::Fail(status) => return Err(ApiError::injected(status, "injected failure")),
        Verdict::Serve(Some(delay)) => tokio::time::sleep(delay).await,
        Verdict::Serve(None) => {}
    }
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let meta = Meta {
        kind: head.kind,
        id: match head.kind {
            ApiKind::Chat => format!("chatcmpl-{id:016x}"),
            ApiKind::Completion => format!("cmpl-{id:016x}"),
            ApiKind::Responses => format!("resp_{:016x}{id:016x}", state.engine_tag),
        },
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: head.model,
        prompt_tokens: head.prompt_tokens,
        seed: head.digest,
        include_usage: head.stream && head.include_usage,
    };
    let pending = Pending {
        meta,
        stream: head.stream,
        max_tokens: head.max_tokens,
    };
    Ok((pending, id))
}

/// The response: a stream of the engine's progress, or the whole completion once it finished.
async fn answer(
    state: &AppState,
    p: Pending,
    mut rx: mpsc::UnboundedReceiver<Progress>,
) -> Result<Reply, ApiError> {
    let Pending {
        meta,
        stream,
        max_tokens,
    } = p;
    if stream {
        let stream = SseStream::new(
            meta,
            rx,
            max_tokens,
            state.faults.close_stream_after_tokens(),
        );
        let mut r = plain(StatusCode::OK, ResponseBody::Sse(Box::new(stream)));
        let h = r.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        h.insert(
            header::CACHE_CONTROL,
            http::HeaderValue::from_static("no-cache"),
        );
        return Ok(r);
    }
    let mut cached_tokens = None;
    loop {
        match rx.recv().await {
            Some(Progress::Started { cached_tokens: c }) => cached_tokens = c,
            Some(Progress::Generated(_)) => {}
            Some(Progress::Finished) => break,
            None => {
                return Err(ApiError::injected(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the engine has stopped",
                ))
            }
        }
    }
    Ok(json(StatusCode::OK, meta.full(max_tokens, cached_tokens)))
}

/// `GET /v1/models`: the base model, then the adapters (with the base model as parent).
fn models(config: &MockEngineConfig) -> Reply {
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let entry = |id: &str, parent: Option<&str>| {
        serde_json::json!({
            "id": id,
            "object": "model",
            "created": created,
            "owned_by": "prefix-router-mock-engine",
            "root": id,
            "parent": parent,
        })
    };
    let mut data = vec![entry(&config.model, None)];
    data.extend(config.loras.iter().map(|l| entry(l, Some(&config.model))));
    let v = serde_json::json!({ "object": "list", "data": data });
    json(StatusCode::OK, v.to_string().into_bytes())
}

fn metrics(state: &AppState) -> Reply {
    let text = match state.metrics.lock() {
        Ok(m) => m.render(),
        Err(poisoned) => poisoned.into_inner().render(),
    };
    let mut r = plain(StatusCode::OK, ResponseBody::full(text));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}

/// A stopped engine: 503 and the connection closed.
fn stopped() -> Reply {
    let mut r = error(ApiError::injected(
        StatusCode::SERVICE_UNAVAILABLE,
        "the engine has stopped answering (stop_after)",
    ));
    r.headers_mut()
        .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
    r
}

fn error(e: ApiError) -> Reply {
    json(e.status, e.to_json())
}

fn json(status: StatusCode, body: Vec<u8>) -> Reply {
    let mut r = plain(status, ResponseBody::full(body));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn plain(status: StatusCode, body: ResponseBody) -> Reply {
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r
}
