//! Each instance's KV-cache events (vLLM's ZeroMQ publisher), subscribed to and applied to a
//! view of what that engine holds ([`EngineView`]), with its health on `/metrics`.
//!
//! One task per instance: a SUB socket on the instance's publisher and, when it has one, a
//! DEALER on its replay socket. Batches are applied in sequence order. A gap (lost messages) or
//! a first message past sequence 0 (this router joined mid-stream) is filled from the replay
//! socket before anything later is applied; what the engine no longer buffers is lost for
//! good, and the view is then marked partial (blocks stored in the lost batches are missing,
//! blocks removed in them still listed) until the engine clears its cache. A malformed payload
//! is counted and likewise leaves the view partial; nothing here panics or stops serving.
//! Membership is followed once a second: a new instance gets a subscriber, a removed one loses
//! its subscriber, its view and its series.

mod metrics;
mod subscriber;
#[cfg(test)]
mod tests;

pub use metrics::{KvEventMetrics, ResultLabels};
pub use subscriber::run;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use prefix_router_core::{Instance, Report, Residency, TokenRoute};
use prefix_router_kv_events::{
    adapter_mix, token_chain, Completeness, EngineView, EventBatch, KvEvent,
};
use prefix_router_tokenize::{ChatTokenizer, Prompt, TokenizeError};

use crate::settings::KvEventsSettings;
use crate::state::AppState;

/// One instance's feed: its view and how the subscription stands.
#[derive(Debug, Default)]
pub struct Feed {
    /// What the engine holds.
    pub view: EngineView,
    /// Subscribed now.
    pub connected: bool,
    /// Batches applied.
    pub batches: u64,
    /// The last sequence number applied.
    pub last_seq: Option<u64>,
    /// Now minus the engine's timestamp of the last batch, seconds.
    pub lag_s: Option<f64>,
    /// A gap is being filled from the replay socket: the view misses batches until it is, and
    /// routing does not trust it meanwhile.
    pub recovering: bool,
}

/// Where an instance's events come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    /// `tcp://host:port` of the PUB socket.
    pub publisher: String,
    /// `tcp://host:port` of the replay socket.
    pub replay: Option<String>,
}

/// Every instance's feed.
#[derive(Debug)]
pub struct KvFeeds {
    settings: KvEventsSettings,
    feeds: Mutex<HashMap<String, Arc<Mutex<Feed>>>>,
    /// The subscribers' metrics.
    pub metrics: KvEventMetrics,
    /// The default tokenizer (`[kv_events] tokenizer`), when configured: for requests naming a
    /// model without its own, or naming none (`kv-aware` needs this one or `tokenizers`).
    pub tokenizer: Option<Arc<ChatTokenizer>>,
    /// Each model's own tokenizer (`[[kv_events.tokenizers]]`), by the name requests give.
    pub tokenizers: HashMap<String, Arc<ChatTokenizer>>,
    /// The block size most engines' views report (0: none yet), read on every tokenized request
    /// without taking any feed's lock: a request's token blocks are cut at this size, and an
    /// engine whose blocks are another size (a second model with its own, say) is not asked
    /// (see [`KvFeeds::report`](Residency::report)). Recounted when a view's size changes.
    reported_block: std::sync::atomic::AtomicU32,
    /// The [`adapter_mix`] of every LoRA adapter some engine has stored blocks for: a request
    /// naming one of them is matched against that adapter's blocks, any other `model` against
    /// the base model's.
    adapters: std::sync::RwLock<HashSet<u64>>,
    /// Tokenizations that may run at once, off the runtime: one per core. More would only
    /// share the cores, each taking longer, and hold a blocking thread apiece.
    tokenizing: Arc<tokio::sync::Semaphore>,
    /// Requests waiting for a tokenizing slot, at most [`TOKENIZE_QUEUE`] per core: past that,
    /// a request is routed without its token blocks (the strategy infers) rather than queue
    /// without bound ahead of admission control.
    tokenize_waiting: Arc<std::sync::atomic::AtomicUsize>,
    tokenize_queue: usize,
}

/// Requests that may wait for a tokenizing slot, per core.
const TOKENIZE_QUEUE: usize = 8;

/// One request's place among those waiting for a tokenizing slot, given back when it stops
/// waiting (a slot came, or the request was given up).
struct Waiting(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// vLLM's default KV block size, until an engine reports its own.
const DEFAULT_BLOCK_TOKENS: u32 = 16;

/// A request's token blocks, named as the views name the engines' blocks.
#[derive(Debug)]
pub struct Tokenized {
    chain: Vec<u64>,
    block_tokens: u32,
    prompt_tokens: u32,
    /// The adapter the request names ([`TokenRoute::adapter`]).
    adapter: u64,
}

impl Tokenized {
    /// What a strategy gets of it, answered from `feeds`.
    pub fn route<'a>(&'a self, feeds: &'a KvFeeds) -> TokenRoute<'a> {
        TokenRoute {
            chain: &self.chain,
            block_tokens: self.block_tokens,
            prompt_tokens: self.prompt_tokens,
            adapter: self.adapter,
            residency: feeds,
        }
    }
}

impl Residency for KvFeeds {
    /// From the instance's view, only while it is subscribed, complete and not being replayed;
    /// one lock of its feed.
    /// Not known for a request naming an adapter whose blocks this engine's view has not named
    /// (it never stored one it could name): the strategy then infers, from its index keyed by
    /// model, rather than reading "none cached" from a view that could not have said.
    /// Not known either for an engine whose blocks are not the size the request was cut at:
    /// its view names other blocks, and would read "nothing cached" for a prefix it holds.
    fn report(&self, instance: &Instance, chain: &[u64], adapter: u64) -> Option<Report> {
        let feed = self.feed(instance.id().as_str())?;
        let f = lock(&feed);
        let size = f.view.block_size();
        if size != 0 && size != self.block_tokens() {
            return None;
        }
        let exact = f.connected && !f.recovering && f.view.completeness() == Completeness::Exact;
        (exact && (adapter == 0 || f.view.has_adapter(adapter))).then(|| {
            let (gpu, offloaded) = f.view.matched_with_offloaded(chain, adapter);
            let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
            Report {
                matched_blocks: count(gpu),
                offloaded_blocks: count(offloaded),
            }
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A configured tokenizer (or its chat template) that could not be loaded.
#[derive(Debug, thiserror::Error)]
#[error("{}{source}", .model.as_ref().map(|m| format!("model '{m}': ")).unwrap_or_default())]
pub struct TokenizerLoadError {
    /// The dotted settings field that names the file, e.g. `kv_events.tokenizers[1].tokenizer`.
    pub field: String,
    /// The model whose tokenizer it is (`None`: the default one).
    pub model: Option<String>,
    /// What went wrong, naming the file.
    pub source: TokenizeError,
}

/// Loads a tokenizer and its chat template file, the errors naming `prefix`'s fields.
fn load_tokenizer(
    prefix: &str,
    model: Option<&str>,
    file: &std::path::Path,
    chat_template: Option<&std::path::Path>,
) -> Result<Arc<ChatTokenizer>, TokenizerLoadError> {
    let error = |field: &str, source| TokenizerLoadError {
        field: format!("{prefix}{field}"),
        model: model.map(str::to_string),
        source,
    };
    let template = match chat_template {
        Some(t) => Some(std::fs::read_to_string(t).map_err(|e| {
            error(
                "chat_template",
                TokenizeError::Read {
                    path: t.display().to_string(),
                    message: e.to_string(),
                },
            )
        })?),
        None => None,
    };
    ChatTokenizer::from_setting(file, template)
        .map(Arc::new)
        .map_err(|e| error("tokenizer", e))
}

impl KvFeeds {
    /// Feeds for these settings (none running yet: see [`run`]); loads the tokenizers.
    pub fn new(settings: KvEventsSettings) -> Result<Self, TokenizerLoadError> {
        let tokenizer = settings
            .tokenizer
            .as_deref()
            .map(|file| load_tokenizer("kv_events.", None, file, settings.chat_template.as_deref()))
            .transpose()?;
        let mut tokenizers = HashMap::with_capacity(settings.tokenizers.len());
        for (i, t) in settings.tokenizers.iter().enumerate() {
            let loaded = load_tokenizer(
                &format!("kv_events.tokenizers[{i}]."),
                Some(&t.model),
                &t.tokenizer,
                t.chat_template.as_deref(),
            )?;
            tokenizers.insert(t.model.clone(), loaded);
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(Self {
            settings,
            feeds: Mutex::new(HashMap::new()),
            metrics: KvEventMetrics::default(),
            tokenizer,
            tokenizers,
            reported_block: std::sync::atomic::AtomicU32::new(0),
            adapters: Default::default(),
            tokenizing: Arc::new(tokio::sync::Semaphore::new(cores)),
            tokenize_waiting: Arc::default(),
            tokenize_queue: cores * TOKENIZE_QUEUE,
        })
    }

    /// A slot to tokenize one request in, once one is free; `None` when too many requests wait
    /// for one already (the request is then routed without its token blocks).
    pub(crate) async fn tokenizing_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if let Ok(slot) = Arc::clone(&self.tokenizing).try_acquire_owned() {
            return Some(slot);
        }
        let waiting = Waiting(Arc::clone(&self.tokenize_waiting));
        if waiting.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= self.tokenize_queue {
            self.metrics.tokenize_skipped.inc();
            return None;
        }
        Arc::clone(&self.tokenizing).acquire_owned().await.ok()
    }

    /// Whether any request can be tokenized: a default tokenizer or a model's own.
    pub fn has_tokenizer(&self) -> bool {
        self.tokenizer.is_some() || !self.tokenizers.is_empty()
    }

    /// The tokenizer of requests naming `model`: its own, else the default.
    pub fn tokenizer_for(&self, model: Option<&str>) -> Option<&Arc<ChatTokenizer>> {
        model
            .and_then(|m| self.tokenizers.get(m))
            .or(self.tokenizer.as_ref())
    }

    /// The block size the engines report, else vLLM's default.
    fn block_tokens(&self) -> u32 {
        match self
            .reported_block
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            0 => DEFAULT_BLOCK_TOKENS,
            b => b,
        }
    }

    /// A request body's token blocks, computed with the tokenizer of the model the body names
    /// (else the default), when there is one and the body is a chat or completion it can
    /// tokenize (`None` otherwise: the strategy then infers). The body is parsed once.
    pub fn tokenize(&self, body: &[u8]) -> Option<Tokenized> {
        if !self.has_tokenizer() {
            return None;
        }
        let (model, prompt) = Prompt::from_body_with_model(body)?;
        let tokenizer = self.tokenizer_for(model.as_deref())?;
        let adapter = model
            .as_deref()
            .map(adapter_mix)
            .filter(|m| self.is_adapter(*m))
            .unwrap_or(0);
        let ids = tokenizer.ids(&prompt).ok()?;
        let block_tokens = self.block_tokens();
        Some(Tokenized {
            chain: token_chain(&ids, block_tokens as usize),
            block_tokens,
            prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
            adapter,
        })
    }

    /// Sets the block size requests are cut at to the one most views report (the smaller of
    /// two as common): with one size in the fleet, that one; with engines of two sizes, the
    /// others' reports are left out rather than read wrong. The last engine to report used to
    /// set it, so in a mixed fleet it flipped with every batch and each view in turn read
    /// "nothing cached" for everything it held.
    pub(crate) fn recount_block_size(&self) {
        let feeds: Vec<Arc<Mutex<Feed>>> = lock(&self.feeds).values().cloned().collect();
        let mut counts: Vec<(u32, usize)> = Vec::new();
        for feed in feeds {
            let size = lock(&feed).view.block_size();
            if size == 0 {
                continue;
            }
            match counts.iter_mut().find(|(s, _)| *s == size) {
                Some((_, n)) => *n += 1,
                None => counts.push((size, 1)),
            }
        }
        let most = counts
            .iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map_or(0, |&(size, _)| size);
        self.reported_block
            .store(most, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether some engine stored blocks for the adapter of `mix`.
    fn is_adapter(&self, mix: u64) -> bool {
        self.adapters
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&mix)
    }

    /// Notes the adapters a batch stored blocks for (by name).
    pub(crate) fn note_adapters(&self, batch: &EventBatch) {
        for e in &batch.events {
            if let KvEvent::Stored(s) = e {
                if let Some(name) = &s.lora_name {
                    let mix = adapter_mix(name);
                    if !self.is_adapter(mix) {
                        self.adapters
                            .write()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(mix);
                    }
                }
            }
        }
    }

    /// The endpoints of the instance at `url`: from `[[kv_events.endpoints]]`, else its host
    /// at the configured ports.
    pub fn endpoints_for(&self, url: &str) -> Option<Endpoints> {
        if let Some(e) = self.settings.endpoints.iter().find(|e| e.instance == url) {
            return Some(Endpoints {
                publisher: e.publisher.clone(),
                replay: e.replay.clone(),
            });
        }
        let uri: http::Uri = url.parse().ok()?;
        let host = uri.host()?;
        let s = &self.settings;
        Some(Endpoints {
            publisher: format!("tcp://{host}:{}", s.port),
            replay: (s.replay_port != 0).then(|| format!("tcp://{host}:{}", s.replay_port)),
        })
    }

    /// The feed of `instance`, if subscribed.
    pub fn feed(&self, instance: &str) -> Option<Arc<Mutex<Feed>>> {
        lock(&self.feeds).get(instance).cloned()
    }

    /// Whether the router is subscribed to `instance`'s events now.
    pub fn is_connected(&self, instance: &str) -> bool {
        self.feed(instance).is_some_and(|f| lock(&f).connected)
    }

    /// A JSON summary of one instance's view (the admin API's `GET /admin/kv-view`).
    pub fn describe(&self, instance: &str, top: usize) -> Option<serde_json::Value> {
        let feed = self.feed(instance)?;
        let f = lock(&feed);
        let size = f.view.block_size();
        let prefixes: Vec<serde_json::Value> = f
            .view
            .longest_prefixes(top)
            .into_iter()
            .map(|p| {
                serde_json::json!({
                    "last_block": format!("{:016x}", p.last.0),
                    "blocks": p.blocks,
                    "tokens": u64::from(p.blocks) * u64::from(size),
                })
            })
            .collect();
        Some(serde_json::json!({
            "instance": instance,
            "connected": f.connected,
            "complete": f.view.completeness() == Completeness::Exact,
            "gpu_blocks": f.view.gpu_blocks(),
            "offloaded_blocks": f.view.offloaded_blocks(),
            "block_size": size,
            "batches": f.batches,
            "last_seq": f.last_seq,
            "lag_s": f.lag_s,
            "longest_prefixes": prefixes,
        }))
    }
}

/// Why the strategy in force, which routes on the engines' reports, cannot have any (it then
/// runs as cache-aware, on what the router infers); `None` when it does not read them or can.
/// Said at start, on a reload and in the admin API's answer to a strategy change: `[kv_events]`
/// is read at start only, so switching to kv-aware later does not subscribe.
pub fn blind(state: &AppState) -> Option<String> {
    let routing = state.routing.load();
    if !routing.strategy.reads_tokens() {
        return None;
    }
    let name = routing.strategy.name();
    match &state.kv_events {
        None => Some(format!(
            "[kv_events] subscribe is off (read at start only): {name} has no engine reports and runs as cache-aware"
        )),
        Some(f) if !f.has_tokenizer() => Some(format!(
            "no [kv_events] tokenizer: requests cannot be matched to the engines' blocks, so {name} runs as cache-aware"
        )),
        Some(_) => None,
    }
}

/// Says at start when the strategy routes on the engines' reports but cannot have them: it then
/// runs as cache-aware, on what the router infers.
pub fn warn_if_blind(state: &AppState) {
    let routing = state.routing.load();
    if !routing.strategy.reads_tokens() {
        return;
    }
    let name = routing.strategy.name();
    if let Some(why) = blind(state) {
        tracing::warn!(strategy = name, "{why}");
        return;
    }
    match &state.kv_events {
        Some(f) if f.tokenizer.is_none() => {
            let mut models: Vec<&str> = f.tokenizers.keys().map(String::as_str).collect();
            models.sort_unstable();
            let models = models.join(", ");
            tracing::info!(
                strategy = name,
                models = %models,
                "[kv_events] tokenizes requests for these models only (no default tokenizer): \
                 {name} runs as cache-aware for the others"
            );
        }
        _ => {}
    }
}
