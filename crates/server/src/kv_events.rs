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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use prefix_router_core::{Instance, Report, Residency, TokenRoute};
use prefix_router_kv_events::wire::{self, Replayed};
use prefix_router_kv_events::{
    decode_batch, token_chain, Completeness, EngineView, KvEvent, Sequence, Step,
};
use prefix_router_tokenize::{ChatTokenizer, Prompt, TokenizeError};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::metrics::InstanceLabels;
use crate::settings::KvEventsSettings;
use crate::state::AppState;

/// `instance, result`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// Instance id.
    pub instance: String,
    /// `stored`/`removed` (blocks), `recovered`/`lost` (replays), `gpu`/`offloaded` (view).
    pub kind: &'static str,
}

/// The metrics of the subscribers (registered beside the router's own).
#[derive(Debug)]
pub struct KvEventMetrics {
    batches: Family<InstanceLabels, Counter>,
    blocks: Family<ResultLabels, Counter>,
    gaps: Family<InstanceLabels, Counter>,
    replays: Family<ResultLabels, Counter>,
    malformed: Family<InstanceLabels, Counter>,
    lag: Family<InstanceLabels, Gauge<f64, AtomicU64>>,
    view_blocks: Family<ResultLabels, Gauge>,
    view_partial: Family<InstanceLabels, Gauge>,
    connected: Family<InstanceLabels, Gauge>,
    recovery: Histogram,
}

/// Seconds from a gap's detection to the end of its replay: 0.1 ms to about 50 s.
fn recovery_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-4, 2.0, 20))
}

impl Default for KvEventMetrics {
    fn default() -> Self {
        Self {
            batches: Family::default(),
            blocks: Family::default(),
            gaps: Family::default(),
            replays: Family::default(),
            malformed: Family::default(),
            lag: Family::default(),
            view_blocks: Family::default(),
            view_partial: Family::default(),
            connected: Family::default(),
            recovery: recovery_histogram(),
        }
    }
}

impl KvEventMetrics {
    /// Registers every series under `registry` (prefixed `prefix_router_`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry;
        r.register(
            "kv_event_batches",
            "KV-event batches applied, per instance",
            self.batches.clone(),
        );
        r.register(
            "kv_event_blocks",
            "Blocks named by applied KV events, per instance and kind (stored, removed)",
            self.blocks.clone(),
        );
        r.register(
            "kv_event_gaps",
            "Sequence gaps in an instance's KV events (lost messages, or joining mid-stream)",
            self.gaps.clone(),
        );
        r.register(
            "kv_event_replays",
            "Gaps filled from the replay socket (recovered) or given up (lost)",
            self.replays.clone(),
        );
        r.register(
            "kv_event_malformed",
            "KV-event messages or payloads that could not be decoded",
            self.malformed.clone(),
        );
        r.register(
            "kv_event_lag_seconds",
            "Now minus the engine's timestamp of the last applied batch",
            self.lag.clone(),
        );
        r.register(
            "kv_view_blocks",
            "Blocks the router's view of an engine lists (gpu: resident; offloaded)",
            self.view_blocks.clone(),
        );
        r.register(
            "kv_view_partial",
            "1 while an instance's view misses batches it could not replay",
            self.view_partial.clone(),
        );
        r.register(
            "kv_events_connected",
            "1 while subscribed to the instance's KV events",
            self.connected.clone(),
        );
        r.register(
            "kv_event_recovery_seconds",
            "From a gap's detection to the end of its replay: how long a view was not trusted for routing (cache-aware's inference stood in)",
            self.recovery.clone(),
        );
    }

    fn forget(&self, instance: &str) {
        let i = InstanceLabels {
            instance: instance.into(),
        };
        let k = |kind| ResultLabels {
            instance: instance.to_string(),
            kind,
        };
        for f in [&self.batches, &self.gaps, &self.malformed] {
            f.remove(&i);
        }
        self.lag.remove(&i);
        self.view_partial.remove(&i);
        self.connected.remove(&i);
        for kind in ["stored", "removed"] {
            self.blocks.remove(&k(kind));
        }
        for kind in ["recovered", "lost"] {
            self.replays.remove(&k(kind));
        }
        for kind in ["gpu", "offloaded"] {
            self.view_blocks.remove(&k(kind));
        }
    }
}

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
    /// The block size an engine last reported (0: none yet), read on every tokenized request
    /// without taking any feed's lock.
    reported_block: std::sync::atomic::AtomicU32,
}

/// vLLM's default KV block size, until an engine reports its own.
const DEFAULT_BLOCK_TOKENS: u32 = 16;

/// A request's token blocks, named as the views name the engines' blocks.
#[derive(Debug)]
pub struct Tokenized {
    chain: Vec<u64>,
    block_tokens: u32,
    prompt_tokens: u32,
}

impl Tokenized {
    /// What a strategy gets of it, answered from `feeds`.
    pub fn route<'a>(&'a self, feeds: &'a KvFeeds) -> TokenRoute<'a> {
        TokenRoute {
            chain: &self.chain,
            block_tokens: self.block_tokens,
            prompt_tokens: self.prompt_tokens,
            residency: feeds,
        }
    }
}

impl Residency for KvFeeds {
    /// From the instance's view, only while it is subscribed, complete and not being replayed;
    /// one lock of its feed.
    fn report(&self, instance: &Instance, chain: &[u64]) -> Option<Report> {
        let feed = self.feed(instance.id().as_str())?;
        let f = lock(&feed);
        (f.connected && !f.recovering && f.view.completeness() == Completeness::Exact).then(|| {
            let (gpu, offloaded) = f.view.matched_with_offloaded(chain);
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
        Ok(Self {
            settings,
            feeds: Mutex::new(HashMap::new()),
            metrics: KvEventMetrics::default(),
            tokenizer,
            tokenizers,
            reported_block: std::sync::atomic::AtomicU32::new(0),
        })
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
        let ids = tokenizer.ids(&prompt).ok()?;
        let block_tokens = self.block_tokens();
        Some(Tokenized {
            chain: token_chain(&ids, block_tokens as usize),
            block_tokens,
            prompt_tokens: u32::try_from(ids.len()).unwrap_or(u32::MAX),
        })
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

/// Says at start when the strategy routes on the engines' reports but cannot have them: it then
/// runs as cache-aware, on what the router infers.
pub fn warn_if_blind(state: &AppState) {
    let routing = state.routing.load();
    if !routing.strategy.reads_tokens() {
        return;
    }
    let name = routing.strategy.name();
    match &state.kv_events {
        None => tracing::warn!(
            strategy = name,
            "[kv_events] subscribe is off: {name} has no engine reports and runs as cache-aware"
        ),
        Some(f) if !f.has_tokenizer() => tracing::warn!(
            strategy = name,
            "no [kv_events] tokenizer: requests cannot be matched to the engines' blocks, so \
             {name} runs as cache-aware"
        ),
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
        Some(_) => {}
    }
}

/// Follows membership: a subscriber per instance, started and stopped as instances come and go.
pub async fn run(state: Arc<AppState>) {
    let Some(feeds) = state.kv_events.as_ref() else {
        return;
    };
    let mut tasks: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let snapshot = state.fleet.snapshot();
        for inst in snapshot.instances() {
            let id = inst.id().to_string();
            if tasks.contains_key(&id) {
                continue;
            }
            let Some(endpoints) = feeds.endpoints_for(&inst.spec().url) else {
                continue;
            };
            let feed = Arc::new(Mutex::new(Feed::default()));
            lock(&feeds.feeds).insert(id.clone(), Arc::clone(&feed));
            tracing::info!(instance = %id, publisher = %endpoints.publisher, "subscribing to KV events");
            let task = tokio::spawn(subscribe(Arc::clone(&state), id.clone(), endpoints, feed));
            tasks.insert(id, task);
        }
        tasks.retain(|id, task| {
            if snapshot.get(id).is_some() {
                return true;
            }
            task.abort();
            lock(&feeds.feeds).remove(id);
            feeds.metrics.forget(id);
            false
        });
    }
}

/// One instance's subscriber: reconnects with backoff until aborted.
async fn subscribe(state: Arc<AppState>, id: String, endpoints: Endpoints, feed: Arc<Mutex<Feed>>) {
    let Some(feeds) = state.kv_events.as_ref() else {
        return;
    };
    let mut sub = Subscriber {
        feeds,
        labels: InstanceLabels {
            instance: id.into(),
        },
        endpoints,
        feed,
        seq: Sequence::new(),
        dealer: None,
    };
    // Every series from the start, at 0: a counter that appears only once it moves hides
    // whether a gap has ever happened.
    let m = &feeds.metrics;
    for f in [&m.batches, &m.gaps, &m.malformed] {
        let _ = f.get_or_create(&sub.labels);
    }
    for k in ["recovered", "lost"] {
        let _ = m.replays.get_or_create(&kind(&sub, k));
    }
    let _ = m.view_partial.get_or_create(&sub.labels);
    let mut backoff = Duration::from_millis(100);
    loop {
        if let Err(e) = sub.session().await {
            tracing::warn!(instance = %sub.labels.instance, error = %e, "KV events: subscription failed");
        }
        sub.set_connected(false);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

struct Subscriber<'a> {
    feeds: &'a KvFeeds,
    labels: InstanceLabels,
    endpoints: Endpoints,
    feed: Arc<Mutex<Feed>>,
    seq: Sequence,
    dealer: Option<DealerSocket>,
}

fn kind(s: &Subscriber<'_>, kind: &'static str) -> ResultLabels {
    ResultLabels {
        instance: s.labels.instance.0.to_string(),
        kind,
    }
}

impl Subscriber<'_> {
    fn set_connected(&self, on: bool) {
        {
            let mut f = lock(&self.feed);
            f.connected = on;
            f.recovering = false;
        }
        self.feeds
            .metrics
            .connected
            .get_or_create(&self.labels)
            .set(i64::from(on));
    }

    async fn session(&mut self) -> zeromq::ZmqResult<()> {
        let mut sub = SubSocket::new();
        // Before connecting, to see every connection and disconnection: the socket reconnects
        // by itself, and a publisher that comes back may be a new one counting from 0.
        let mut events = sub.monitor();
        sub.connect(&self.endpoints.publisher).await?;
        sub.subscribe(&self.feeds.settings.topic).await?;
        self.seq.reset();
        self.dealer = None;
        self.set_connected(true);
        loop {
            let frames = tokio::select! {
                m = sub.recv() => m?.into_vec(),
                e = events.next() => {
                    match e {
                        Some(SocketEvent::Disconnected(_)) => self.set_connected(false),
                        // Whatever it was sent while away is unknown: start over from the
                        // next message (which replays what the publisher still buffers).
                        Some(SocketEvent::Connected(..)) => {
                            self.seq.reset();
                            self.dealer = None;
                            self.set_connected(true);
                        }
                        Some(_) => {}
                        None => return Err(zeromq::ZmqError::Other("socket monitor closed")),
                    }
                    continue;
                }
            };
            let Ok(p) = wire::published(&frames) else {
                self.feeds
                    .metrics
                    .malformed
                    .get_or_create(&self.labels)
                    .inc();
                continue;
            };
            let missing = match self.seq.observe(p.seq) {
                Step::Next => None,
                Step::Old => continue,
                Step::Gap { missing } => Some(missing.start),
                // A new stream (first seen, or a publisher started again): nothing listed
                // before holds. What came before this batch may still be buffered.
                Step::First | Step::Restarted => {
                    lock(&self.feed).view.clear();
                    (p.seq > 0).then(|| {
                        self.seq.resume_at(0);
                        0
                    })
                }
            };
            if let Some(from) = missing {
                self.feeds.metrics.gaps.get_or_create(&self.labels).inc();
                let started = std::time::Instant::now();
                lock(&self.feed).recovering = true;
                let recovered = self.recover(from).await;
                lock(&self.feed).recovering = false;
                self.feeds
                    .metrics
                    .recovery
                    .observe(started.elapsed().as_secs_f64());
                match self.seq.observe_replayed(p.seq) {
                    Step::Next => {}
                    // The replay brought it already.
                    Step::Old => {
                        self.count_replay(recovered);
                        continue;
                    }
                    // Not all of it came back: accept the loss.
                    _ => {
                        self.lose();
                        self.seq.resume_at(p.seq);
                        self.seq.observe_replayed(p.seq);
                        self.apply(p.seq, p.payload);
                        continue;
                    }
                }
                self.count_replay(recovered);
            }
            self.apply(p.seq, p.payload);
        }
    }

    fn count_replay(&self, recovered: bool) {
        if recovered {
            self.feeds
                .metrics
                .replays
                .get_or_create(&kind(self, "recovered"))
                .inc();
        }
    }

    /// Batches are gone for good: the view misses them.
    fn lose(&self) {
        self.feeds
            .metrics
            .replays
            .get_or_create(&kind(self, "lost"))
            .inc();
        lock(&self.feed).view.mark_partial();
        self.feeds
            .metrics
            .view_partial
            .get_or_create(&self.labels)
            .set(1);
    }

    /// Asks the replay socket for every batch from `from` on and applies each as it arrives,
    /// in sequence; where the buffer no longer reaches back, the loss is accepted and the rest
    /// applied. Returns whether nothing was lost.
    async fn recover(&mut self, from: u64) -> bool {
        let Some(endpoint) = self.endpoints.replay.clone() else {
            return false;
        };
        let mut dealer = match self.dealer.take() {
            Some(d) => d,
            None => {
                let mut d = DealerSocket::new();
                let wait = self.feeds.settings.replay_timeout;
                match tokio::time::timeout(wait, d.connect(&endpoint)).await {
                    Ok(Ok(())) => d,
                    Ok(Err(e)) => {
                        tracing::debug!(instance = %self.labels.instance, error = %e, "KV events: no replay socket");
                        return false;
                    }
                    Err(_) => return false,
                }
            }
        };
        match self.replay(&mut dealer, from).await {
            Ok(complete) => {
                self.dealer = Some(dealer);
                complete
            }
            // Replies still on the way would answer the next request: start afresh then.
            Err(e) => {
                tracing::debug!(instance = %self.labels.instance, error = %e, "KV events: replay failed");
                false
            }
        }
    }

    /// One replay on `d`; `Ok(false)` when batches were lost, `Err` when the socket can no
    /// longer be trusted (an error, or a reply slower than `replay_timeout`).
    async fn replay(&mut self, d: &mut DealerSocket, from: u64) -> zeromq::ZmqResult<bool> {
        let request: Vec<Bytes> = wire::replay_request(from)
            .into_iter()
            .map(Bytes::from)
            .collect();
        let request = ZmqMessage::try_from(request)
            .map_err(|_| zeromq::ZmqError::Other("empty replay request"))?;
        d.send(request).await?;
        let wait = self.feeds.settings.replay_timeout;
        let mut complete = true;
        loop {
            let frames = match tokio::time::timeout(wait, d.recv()).await {
                Ok(m) => m?.into_vec(),
                Err(_) => return Err(zeromq::ZmqError::Other("replay timed out")),
            };
            match wire::replayed(&frames) {
                Ok(Replayed::End) => return Ok(complete),
                Ok(Replayed::Batch { seq, payload }) => match self.seq.observe_replayed(seq) {
                    Step::Next => self.apply(seq, payload),
                    Step::Old => {}
                    // The buffer starts after what is missing: lose the difference, keep
                    // the rest.
                    _ => {
                        complete = false;
                        self.lose();
                        self.seq.resume_at(seq);
                        self.seq.observe_replayed(seq);
                        self.apply(seq, payload);
                    }
                },
                Err(_) => {
                    self.feeds
                        .metrics
                        .malformed
                        .get_or_create(&self.labels)
                        .inc();
                }
            }
        }
    }

    fn apply(&self, seq: u64, payload: &[u8]) {
        let m = &self.feeds.metrics;
        let mut f = lock(&self.feed);
        f.last_seq = Some(seq);
        let batch = match decode_batch(payload) {
            Ok(b) => b,
            Err(e) => {
                tracing::debug!(instance = %self.labels.instance, error = %e, "KV events: bad payload");
                m.malformed.get_or_create(&self.labels).inc();
                // Its events are lost.
                f.view.mark_partial();
                m.view_partial.get_or_create(&self.labels).set(1);
                return;
            }
        };
        let (mut stored, mut removed) = (0u64, 0u64);
        for e in &batch.events {
            match e {
                KvEvent::Stored(s) => stored += s.block_hashes.len() as u64,
                KvEvent::Removed(r) => removed += r.block_hashes.len() as u64,
                KvEvent::Cleared => {}
            }
        }
        f.view.apply(&batch);
        if f.view.block_size() > 0 {
            self.feeds
                .reported_block
                .store(f.view.block_size(), std::sync::atomic::Ordering::Relaxed);
        }
        f.batches += 1;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let lag = (now - batch.ts).max(0.0);
        f.lag_s = Some(lag);
        m.batches.get_or_create(&self.labels).inc();
        m.blocks.get_or_create(&kind(self, "stored")).inc_by(stored);
        m.blocks
            .get_or_create(&kind(self, "removed"))
            .inc_by(removed);
        m.lag.get_or_create(&self.labels).set(lag);
        m.view_blocks
            .get_or_create(&kind(self, "gpu"))
            .set(f.view.gpu_blocks() as i64);
        m.view_blocks
            .get_or_create(&kind(self, "offloaded"))
            .set(f.view.offloaded_blocks() as i64);
        m.view_partial
            .get_or_create(&self.labels)
            .set(i64::from(f.view.completeness() == Completeness::Partial));
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use prefix_router_tokenize::WORDS;

    use super::*;
    use crate::settings::KvEventsTokenizer;

    fn byte_bpe() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/tokenizers/byte-bpe/tokenizer.json")
    }

    fn entry(model: &str, tokenizer: PathBuf) -> KvEventsTokenizer {
        KvEventsTokenizer {
            model: model.into(),
            tokenizer,
            chat_template: None,
        }
    }

    /// Feeds with `default` and a tokenizer per model: "a" the byte-BPE one, "b" one per word.
    fn feeds(default: Option<PathBuf>) -> KvFeeds {
        KvFeeds::new(KvEventsSettings {
            tokenizer: default,
            tokenizers: vec![entry("a", byte_bpe()), entry("b", WORDS.into())],
            ..KvEventsSettings::default()
        })
        .expect("the tokenizers load")
    }

    /// A chat body naming `model` (none: no `model` field): a few hundred tokens either way.
    fn body(model: Option<&str>) -> Vec<u8> {
        let text: String = (0..120).map(|w| format!("lease{w} clause ")).collect();
        let mut v = serde_json::json!({
            "messages": [
                {"role": "system", "content": text},
                {"role": "user", "content": "what does it say?"},
            ],
        });
        if let Some(m) = model {
            v["model"] = m.into();
        }
        v.to_string().into_bytes()
    }

    /// The chain `tokenizer` gives `body`, in the feeds' default block size.
    fn chain_of(tokenizer: &ChatTokenizer, body: &[u8]) -> Vec<u64> {
        let prompt = Prompt::from_body(body).expect("a prompt");
        let ids = tokenizer.ids(&prompt).expect("tokenizes");
        token_chain(&ids, DEFAULT_BLOCK_TOKENS as usize)
    }

    fn chain(feeds: &KvFeeds, body: &[u8]) -> Option<Vec<u64>> {
        feeds.tokenize(body).map(|t| t.chain)
    }

    #[test]
    fn each_model_is_tokenized_with_its_own_tokenizer() {
        let f = feeds(None);
        let bpe = ChatTokenizer::from_setting(&byte_bpe(), None).expect("loads");
        let words = ChatTokenizer::words();
        let (a, b) = (body(Some("a")), body(Some("b")));
        // The same text: the two tokenizers name different blocks.
        assert_ne!(chain_of(&bpe, &a), chain_of(&words, &a));
        assert!(chain_of(&words, &a).len() >= 10);
        assert_eq!(chain(&f, &a), Some(chain_of(&bpe, &a)));
        assert_eq!(chain(&f, &b), Some(chain_of(&words, &b)));
        // No tokenizer for the model and no default: nothing (the strategy infers).
        assert_eq!(chain(&f, &body(Some("c"))), None);
        assert_eq!(chain(&f, &body(None)), None);
        assert!(f.has_tokenizer());
        assert!(f.tokenizer_for(Some("c")).is_none());
    }

    #[test]
    fn other_models_and_model_less_bodies_use_the_default() {
        let f = feeds(Some(WORDS.into()));
        let bpe = ChatTokenizer::from_setting(&byte_bpe(), None).expect("loads");
        let words = ChatTokenizer::words();
        let (a, c, none) = (body(Some("a")), body(Some("c")), body(None));
        assert_eq!(chain(&f, &a), Some(chain_of(&bpe, &a)));
        assert_eq!(chain(&f, &c), Some(chain_of(&words, &c)));
        assert_eq!(chain(&f, &none), Some(chain_of(&words, &none)));
        // Not a prompt: nothing, whatever the model.
        assert_eq!(chain(&f, br#"{"model":"a","input":"x"}"#), None);
        assert_eq!(chain(&f, b"{"), None);
    }

    #[test]
    fn without_any_tokenizer_nothing_is_tokenized() {
        let f = KvFeeds::new(KvEventsSettings::default()).expect("nothing to load");
        assert!(!f.has_tokenizer());
        assert_eq!(chain(&f, &body(Some("a"))), None);
        assert_eq!(chain(&f, &body(None)), None);
    }

    #[test]
    fn a_tokenizer_that_does_not_load_names_its_model_field_and_file() {
        let missing = PathBuf::from("/nonexistent/model-b/tokenizer.json");
        let e = KvFeeds::new(KvEventsSettings {
            tokenizers: vec![entry("a", byte_bpe()), entry("b", missing)],
            ..KvEventsSettings::default()
        })
        .expect_err("no such file");
        assert_eq!(e.field, "kv_events.tokenizers[1].tokenizer");
        let text = e.to_string();
        assert!(
            text.contains("model 'b'") && text.contains("/nonexistent/model-b/tokenizer.json"),
            "{text}"
        );
        let e = KvFeeds::new(KvEventsSettings {
            tokenizers: vec![KvEventsTokenizer {
                chat_template: Some("/nonexistent/template.jinja".into()),
                ..entry("a", byte_bpe())
            }],
            ..KvEventsSettings::default()
        })
        .expect_err("no such template");
        assert_eq!(e.field, "kv_events.tokenizers[0].chat_template");
        assert!(e.to_string().contains("/nonexistent/template.jinja"), "{e}");
        // The default tokenizer's errors name its own field, and no model.
        let e = KvFeeds::new(KvEventsSettings {
            tokenizer: Some("/nonexistent/tokenizer.json".into()),
            ..KvEventsSettings::default()
        })
        .expect_err("no such file");
        assert_eq!(e.field, "kv_events.tokenizer");
        assert!(!e.to_string().contains("model"), "{e}");
    }
}
