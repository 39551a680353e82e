//! KV-cache events over ZeroMQ, as vLLM publishes them (`--kv-events-config`): every block the
//! engine model's prefix cache stores or evicts, batched per engine step, on a PUB socket as
//! `[topic, seq, payload]`, with a ROUTER socket that replays buffered batches on request. The
//! frames and payloads come from `prefix-router-kv-events`, in either layout vLLM has used, so
//! the router's subscriber is tested end to end against both; `drop_rate` loses batches on the
//! PUB socket on purpose (they stay buffered, so a replay recovers them).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use prefix_router_engine_model::{CacheChange, Engine};

use crate::driver::Adapter;
use prefix_router_kv_events::wire::{end_of_replay_frame, parse_replay_request, seq_frame};
use prefix_router_kv_events::{
    block_digest, encode_batch, BlockRemoved, BlockStored, Encoding, EngineHash, EventBatch,
    KvEvent, Medium, DIGEST_MASK,
};
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64;
use tokio::sync::{mpsc, watch};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// Batches vLLM keeps for replay by default (`buffer_steps`).
pub const DEFAULT_REPLAY_BUFFER: usize = 10_000;

/// Where and how a mock engine publishes its KV events.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsConfig {
    /// The PUB socket's address (port 0: any free port; see
    /// [`MockEngine::kv_events_endpoint`](crate::MockEngine::kv_events_endpoint)).
    pub addr: SocketAddr,
    /// The replay (ROUTER) socket's address; `None` for no replay.
    pub replay_addr: Option<SocketAddr>,
    /// The topic frame of every message.
    pub topic: String,
    /// The payload layout.
    pub encoding: Encoding,
    /// Fraction of batches not sent on the PUB socket (still buffered for replay).
    pub drop_rate: f64,
    /// Batches kept for replay.
    pub replay_buffer: usize,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        Self {
            addr: any,
            replay_addr: Some(any),
            topic: String::new(),
            encoding: Encoding::default(),
            drop_rate: 0.0,
            replay_buffer: DEFAULT_REPLAY_BUFFER,
        }
    }
}

/// The sockets' listeners, bound before the engine starts so their addresses are known.
#[derive(Debug)]
pub(crate) struct Bound {
    publish: std::net::TcpListener,
    replay: Option<std::net::TcpListener>,
    /// `tcp://ADDR` of each.
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
}

fn listen(addr: SocketAddr) -> Result<std::net::TcpListener, crate::StartError> {
    let l = std::net::TcpListener::bind(addr)
        .map_err(|source| crate::StartError::Bind { addr, source })?;
    l.set_nonblocking(true)
        .map_err(|source| crate::StartError::Bind { addr, source })?;
    Ok(l)
}

fn endpoint(l: &std::net::TcpListener) -> Result<String, crate::StartError> {
    let a = l.local_addr().map_err(crate::StartError::LocalAddr)?;
    Ok(format!("tcp://{a}"))
}

/// Binds both sockets' addresses.
pub(crate) fn bind(cfg: &KvEventsConfig) -> Result<Bound, crate::StartError> {
    let publish = listen(cfg.addr)?;
    let replay = cfg.replay_addr.map(listen).transpose()?;
    Ok(Bound {
        endpoint: endpoint(&publish)?,
        replay_endpoint: replay.as_ref().map(endpoint).transpose()?,
        publish,
        replay,
    })
}

/// What the driver knows of a block it may have to announce.
#[derive(Debug)]
struct BlockInfo {
    parent: Option<u64>,
    tokens: Box<[u32]>,
    /// The adapter whose request brought it (its blocks are announced with its id and name).
    adapter: Option<Adapter>,
}

/// The engine task's side: turns what the cache did into events for the publisher.
#[derive(Debug)]
pub(crate) struct Sink {
    tx: mpsc::UnboundedSender<Vec<KvEvent>>,
    blocks: HashMap<u64, BlockInfo>,
    block_size: u32,
    changes: Vec<CacheChange>,
    encoding: Encoding,
    /// XOR of `block_digest` over what the cache holds, as a subscriber reads the hashes:
    /// what a correct view's digest equals (`mock:prefix_cache_digest`).
    digest: u64,
}

impl Sink {
    pub(crate) fn new(
        tx: mpsc::UnboundedSender<Vec<KvEvent>>,
        block_size: u32,
        encoding: Encoding,
    ) -> Self {
        Self {
            tx,
            blocks: HashMap::new(),
            block_size,
            changes: Vec::new(),
            encoding,
            digest: 0,
        }
    }

    /// See the field.
    pub(crate) fn digest(&self) -> u64 {
        self.digest & DIGEST_MASK
    }

    /// Remembers the parent and tokens of a submitted request's blocks (`tokens`: the full
    /// blocks' tokens, `block_size` each).
    pub(crate) fn learn(&mut self, hashes: &[u64], tokens: &[u32], adapter: Option<&Adapter>) {
        let size = self.block_size as usize;
        for (k, h) in hashes.iter().enumerate() {
            let Some(t) = tokens.get(k * size..(k + 1) * size) else {
                break;
            };
            self.blocks.entry(*h).or_insert_with(|| BlockInfo {
                parent: k.checked_sub(1).map(|p| hashes[p]),
                tokens: t.into(),
                adapter: adapter.cloned(),
            });
        }
    }

    /// Publishes what the cache stored and evicted since the last call, as one batch.
    pub(crate) fn publish(&mut self, engine: &mut Engine) {
        engine.cache_mut().take_changes(&mut self.changes);
        if self.changes.is_empty() {
            return;
        }
        let mut events: Vec<KvEvent> = Vec::new();
        let mut evicted = Vec::new();
        for change in self.changes.drain(..) {
            let h = match change {
                CacheChange::Stored(h) | CacheChange::Evicted(h) => h,
            };
            self.digest ^= block_digest(self.encoding.read_back(EngineHash(h)));
            match change {
                CacheChange::Stored(h) => {
                    let (parent, tokens, adapter) = match self.blocks.get(&h) {
                        Some(b) => (b.parent, &b.tokens[..], b.adapter.as_ref()),
                        None => (None, &[][..], None),
                    };
                    let lora_name = adapter.map(|a| &*a.name);
                    // A block that continues the last stored run joins its event, as vLLM
                    // announces one request's new blocks together.
                    if let Some(KvEvent::Stored(s)) = events.last_mut() {
                        if parent.is_some()
                            && s.block_hashes.last().map(|x| x.0) == parent
                            && s.lora_name.as_deref() == lora_name
                        {
                            s.block_hashes.push(EngineHash(h));
                            s.token_ids.extend_from_slice(tokens);
                            continue;
                        }
                    }
                    events.push(KvEvent::Stored(BlockStored {
                        block_hashes: vec![EngineHash(h)],
                        parent: parent.map(EngineHash),
                        token_ids: tokens.to_vec(),
                        block_size: self.block_size,
                        lora_id: adapter.map(|a| a.id),
                        lora_name: lora_name.map(str::to_string),
                        medium: Medium::Gpu,
                        ..BlockStored::default()
                    }));
                }
                CacheChange::Evicted(h) => {
                    evicted.push(h);
                    if let Some(KvEvent::Removed(r)) = events.last_mut() {
                        r.block_hashes.push(EngineHash(h));
                        continue;
                    }
                    events.push(KvEvent::Removed(BlockRemoved {
                        block_hashes: vec![EngineHash(h)],
                        medium: Medium::Gpu,
                        group_idx: None,
                    }));
                }
            }
        }
        // An evicted block's parent and tokens are learned again from the next request that
        // brings it (after the batch: one batch may evict a block and store it again).
        let cache = engine.cache();
        for h in evicted {
            if !cache.contains(h) {
                self.blocks.remove(&h);
            }
        }
        // A backstop for blocks learned but never cached (requests refused after they were
        // learned): kept far above what requests in flight can hold.
        if self.blocks.len() > 4 * cache.capacity() as usize + 65_536 {
            self.blocks.retain(|h, _| cache.contains(*h));
        }
        // A stopped publisher: nothing is listening any more.
        let _ = self.tx.send(events);
    }
}

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn message(frames: Vec<Bytes>) -> Option<ZmqMessage> {
    ZmqMessage::try_from(frames).ok()
}

async fn next_request(router: &mut Option<RouterSocket>) -> zeromq::ZmqResult<ZmqMessage> {
    match router {
        Some(r) => r.recv().await,
        None => std::future::pending().await,
    }
}

/// Publishes the sink's batches and answers replay requests until stopped.
pub(crate) async fn run(
    bound: Bound,
    cfg: KvEventsConfig,
    seed: u64,
    mut batches: mpsc::UnboundedReceiver<Vec<KvEvent>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut publish = PubSocket::new();
    if let Err(e) = publish.bind_listener(bound.publish).await {
        tracing::warn!(error = %e, "kv events: cannot listen");
        return;
    }
    let mut router = None;
    if let Some(l) = bound.replay {
        let mut r = RouterSocket::new();
        match r.bind_listener(l).await {
            Ok(_) => router = Some(r),
            Err(e) => tracing::warn!(error = %e, "kv events: cannot listen for replays"),
        }
    }
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let mut buffer: VecDeque<(u64, Bytes)> = VecDeque::new();
    let mut rng = Pcg64::seed_from_u64(seed ^ 0x6b76_6576);
    let mut seq = 0u64;
    loop {
        tokio::select! {
            biased;
            // (The guard `wait_for` returns is not `Send`: drop it inside.)
            () = async { let _ = stop.wait_for(|s| *s).await; } => return,
            // Replays first: under a steady stream of batches they would otherwise wait out
            // the subscriber's timeout.
            request = next_request(&mut router) => {
                let Ok(request) = request else { continue };
                let Some(r) = router.as_mut() else { continue };
                serve_replay(r, request.into_vec(), &topic, &buffer).await;
            }
            events = batches.recv() => {
                let Some(events) = events else { return };
                let batch = EventBatch {
                    ts: now_s(),
                    events,
                    data_parallel_rank: Some(0),
                    unknown_events: 0,
                };
                let payload = Bytes::from(encode_batch(&batch, cfg.encoding));
                if cfg.replay_buffer > 0 {
                    if buffer.len() >= cfg.replay_buffer {
                        buffer.pop_front();
                    }
                    buffer.push_back((seq, payload.clone()));
                }
                let lost = cfg.drop_rate > 0.0 && rng.gen::<f64>() < cfg.drop_rate;
                if !lost {
                    let frames = vec![topic.clone(), Bytes::copy_from_slice(&seq_frame(seq)), payload];
                    if let Some(m) = message(frames) {
                        // No subscriber yet, or one too slow: the message is gone, as on PUB.
                        let _ = publish.send(m).await;
                    }
                }
                seq += 1;
            }
        }
    }
}

/// Sends every buffered batch from the requested sequence number on, then the end marker, each
/// with the topic frame current vLLM puts before the sequence number (see
/// [`prefix_router_kv_events::wire`]).
async fn serve_replay(
    router: &mut RouterSocket,
    frames: Vec<Bytes>,
    topic: &Bytes,
    buffer: &VecDeque<(u64, Bytes)>,
) {
    let Some((identity, rest)) = frames.split_first() else {
        return;
    };
    let Ok(start) = parse_replay_request(rest) else {
        tracing::debug!(frames = frames.len(), "kv events: bad replay request");
        return;
    };
    for (seq, payload) in buffer.iter().filter(|(s, _)| *s >= start) {
        let frames = vec![
            identity.clone(),
            Bytes::new(),
            topic.clone(),
            Bytes::copy_from_slice(&seq_frame(*seq)),
            payload.clone(),
        ];
        let Some(m) = message(frames) else { return };
        if router.send(m).await.is_err() {
            return;
        }
    }
    let end = vec![
        identity.clone(),
        Bytes::new(),
        Bytes::new(),
        Bytes::copy_from_slice(&end_of_replay_frame()),
        Bytes::new(),
    ];
    if let Some(m) = message(end) {
        let _ = router.send(m).await;
    }
}
