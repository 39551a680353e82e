//! One instance's subscriber: the SUB socket, the replay DEALER, and applying batches in
//! sequence order to the instance's feed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures_util::StreamExt;
use prefix_router_kv_events::wire::{self, Replayed};
use prefix_router_kv_events::{decode_batch, Completeness, KvEvent, Sequence, Step};
use zeromq::{DealerSocket, Socket, SocketEvent, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use super::*;
use crate::metrics::InstanceLabels;
use crate::state::AppState;

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
        let before = tasks.len();
        tasks.retain(|id, task| {
            if snapshot.get(id).is_some() {
                return true;
            }
            task.abort();
            lock(&feeds.feeds).remove(id);
            feeds.metrics.forget(id);
            false
        });
        if tasks.len() != before {
            feeds.recount_block_size();
        }
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
    for f in [&m.batches, &m.gaps, &m.malformed, &m.unknown] {
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
    /// Connected or not. A connection after an earlier one (the socket reconnected, or a new
    /// session) leaves the view untrusted until the first batch says which publisher this is
    /// (in [`Self::session`]): the same one, resumed from the last batch applied (what was missed
    /// meanwhile is replayed), or a new one (its number went back: the view is cleared). An
    /// engine restarted in place publishes nothing until it has traffic, and its old view,
    /// trusted meanwhile, sent hot prefixes to a cold engine.
    fn set_connected(&self, on: bool) {
        {
            let mut f = lock(&self.feed);
            f.connected = on;
            f.recovering = on && self.seq.next().is_some();
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
        self.dealer = None;
        self.set_connected(true);
        loop {
            let frames = tokio::select! {
                m = sub.recv() => m?.into_vec(),
                e = events.next() => {
                    match e {
                        Some(SocketEvent::Disconnected(_)) => self.set_connected(false),
                        // What it was sent while away is replayed from the last batch applied,
                        // once the next one shows the gap; a publisher started again shows
                        // itself by counting from a number already passed. Resetting here
                        // cleared the view and asked for a replay from 0, which an engine up
                        // for longer than its replay buffer no longer holds: the view stayed
                        // partial, and kv-aware off, for good after any reconnect.
                        Some(SocketEvent::Connected(..)) => {
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
            // The first batch since a reconnect said which publisher this is (a new one's
            // view was cleared above; a gap is replayed below, still untrusted): the view is
            // trusted again.
            if missing.is_none() {
                lock(&self.feed).recovering = false;
            }
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
        // Decoded before the feed is locked: a routing decision reads the feed (under the
        // strategy's own lock), and a large batch's decoding need not hold it up.
        let decoded = decode_batch(payload);
        let mut f = lock(&self.feed);
        f.last_seq = Some(seq);
        let batch = match decoded {
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
        let size_before = f.view.block_size();
        f.view.apply(&batch);
        self.feeds.note_adapters(&batch);
        let resized = f.view.block_size() != size_before;
        f.batches += 1;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let lag = (now - batch.ts).max(0.0);
        f.lag_s = Some(lag);
        m.batches.get_or_create(&self.labels).inc();
        if batch.unknown_events > 0 {
            m.unknown
                .get_or_create(&self.labels)
                .inc_by(u64::from(batch.unknown_events));
        }
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
        // Every feed's lock is taken to recount: not while holding this one.
        drop(f);
        if resized {
            self.feeds.recount_block_size();
        }
    }
}
