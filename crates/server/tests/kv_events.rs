//! KV events end to end: mock engines publish over real ZeroMQ sockets on 127.0.0.1 (both
//! payload layouts), the router subscribes, and its view of each engine must equal what that
//! engine's cache holds: after ordinary traffic, after lost messages (recovered by replay),
//! and when the router joins mid-stream (recovered from the replay buffer, or marked partial
//! when the buffer no longer reaches back); and, with the same tokenizer file on both sides,
//! the token blocks the router computes for a request are the ones the engine reports (each
//! model's own, where engines serve different models with different tokenizers); and a LoRA
//! adapter's prompt is its own prefix for the engines, cache-aware and kv-aware alike.

mod support;

use std::time::{Duration, Instant};

use std::sync::Arc;

use prefix_router_core::Residency;
use prefix_router_kv_events::{token_chain, Completeness, Encoding};
use prefix_router_mock_engine::{KvEventsConfig, MockEngine, MockEngineConfig};
use prefix_router_server::prom;
use prefix_router_server::settings::{KvEventsEndpoint, KvEventsTokenizer};
use prefix_router_server::RunningRouter;
use prefix_router_tokenize::{ChatTokenizer, Prompt, WORDS};
use support::*;

/// Long enough for any wait here on a loaded 2-core machine.
const SETTLE: Duration = Duration::from_secs(20);

async fn engine(encoding: Encoding, drop_rate: f64, replay_buffer: usize) -> MockEngine {
    let mut c = MockEngineConfig::from_preset("small")
        .expect("preset")
        .with_time_scale(0.01);
    // 96 blocks of 16 tokens: the documents below do not all fit, so blocks are evicted.
    c.engine.kv_capacity_blocks = 96;
    c.kv_events = Some(KvEventsConfig {
        encoding,
        drop_rate,
        replay_buffer,
        ..KvEventsConfig::default()
    });
    MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
        .await
        .expect("mock engine starts")
}

async fn start_router(engines: &[&MockEngine]) -> RunningRouter {
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    start_with(engines, settings(&urls)).await
}

/// Starts a router on `s`, subscribed to `engines`' KV events, once every subscription is up.
async fn start_with(
    engines: &[&MockEngine],
    mut s: prefix_router_server::settings::Settings,
) -> RunningRouter {
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    s.kv_events.subscribe = true;
    s.kv_events.endpoints = engines
        .iter()
        .map(|e| KvEventsEndpoint {
            instance: e.url(),
            publisher: e.kv_events_endpoint().expect("publishes").to_string(),
            replay: e.kv_events_replay_endpoint().map(str::to_string),
        })
        .collect();
    let r = router(s.validate().expect("valid")).await;
    // Subscribed to every engine before any traffic.
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    let deadline = Instant::now() + SETTLE;
    for url in &urls {
        loop {
            if feeds.is_connected(url) {
                break;
            }
            assert!(Instant::now() < deadline, "not subscribed to {url}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // The SUB socket's subscription reaches the publisher just after the connection.
    tokio::time::sleep(Duration::from_millis(200)).await;
    r
}

/// A chat body: document `doc` (about 300 words, 18 blocks), then a question.
fn chat(doc: usize, q: usize) -> String {
    chat_for("mock-llama", doc, q)
}

/// [`chat`] for `model`.
fn chat_for(model: &str, doc: usize, q: usize) -> String {
    let text: String = (0..300).map(|w| format!("d{doc}w{w} ")).collect();
    serde_json::json!({
        "model": model,
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": text},
            {"role": "user", "content": format!("question {q}")},
        ],
    })
    .to_string()
}

async fn traffic(addr: std::net::SocketAddr, requests: usize) {
    for i in 0..requests {
        let a = post(addr, "/v1/chat/completions", &[], chat(i % 16, i)).await;
        assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
    }
}

async fn cached_blocks(e: &MockEngine) -> f64 {
    engine_gauge(e, "mock:prefix_cache_blocks").await
}

async fn engine_gauge(e: &MockEngine, name: &str) -> f64 {
    let page = send(
        e.local_addr(),
        request(http::Method::GET, "/metrics", &[], ""),
    )
    .await;
    let page = String::from_utf8_lossy(&page.body).to_string();
    prom::sums(&page)
        .get(name)
        .copied()
        .unwrap_or_else(|| panic!("the mock reports {name}"))
}

/// A new document for nudges, never sent before.
fn fresh_doc() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(10_000);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Waits until the router's view of `e` lists exactly the blocks `e`'s cache holds (the same
/// count and the same digest of the set); returns the view's completeness and block count.
/// A lost message is only noticed when a later one arrives, so while they differ, a request
/// with a new document goes straight to the engine every half second.
async fn converge(r: &RunningRouter, e: &MockEngine) -> (Completeness, usize) {
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    let deadline = Instant::now() + SETTLE;
    let mut nudge_at = Instant::now() + Duration::from_millis(500);
    loop {
        let want = cached_blocks(e).await;
        let want_digest = engine_gauge(e, "mock:prefix_cache_digest").await;
        let (got, digest, complete) = {
            let feed = feeds.feed(&e.url()).expect("a feed per instance");
            let f = feed.lock().expect("lock");
            (f.view.gpu_blocks(), f.view.digest(), f.view.completeness())
        };
        if got as f64 == want && digest as f64 == want_digest {
            return (complete, got);
        }
        assert!(
            Instant::now() < deadline,
            "{}: view lists {got} blocks (digest {digest}), engine holds {want} ({want_digest})",
            e.url()
        );
        if Instant::now() >= nudge_at {
            nudge(e).await;
            nudge_at = Instant::now() + Duration::from_millis(500);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One request with a new document straight to the engine, so that it publishes a batch.
async fn nudge(e: &MockEngine) {
    // Natively, without `model`: whatever model the engine serves.
    let mut body: serde_json::Value = serde_json::from_str(&chat(fresh_doc(), 0)).expect("json");
    body.as_object_mut().map(|o| o.remove("model"));
    let a = post(e.local_addr(), "/invocations", &[], body.to_string()).await;
    assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
}

async fn router_metrics(r: &RunningRouter) -> String {
    let m = send(
        r.local_addr(),
        request(http::Method::GET, "/metrics", &[], ""),
    )
    .await;
    String::from_utf8_lossy(&m.body).to_string()
}

fn metric(page: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    prom::value(page, name, labels).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_equals_each_engines_cache_in_both_layouts() {
    let a = engine(Encoding::Map, 0.0, 10_000).await;
    let b = engine(Encoding::Positional, 0.0, 10_000).await;
    let r = start_router(&[&a, &b]).await;
    traffic(r.local_addr(), 60).await;
    for e in [&a, &b] {
        let (complete, blocks) = converge(&r, e).await;
        assert_eq!(complete, Completeness::Exact, "{}", e.url());
        assert!(blocks > 0, "{}", e.url());
    }
    let page = router_metrics(&r).await;
    for e in [&a, &b] {
        let url = e.url();
        let i = [("instance", url.as_str())];
        assert!(metric(&page, "prefix_router_kv_event_batches_total", &i) > 0.0);
        // The caches are too small for every document: the engines evicted, and said so.
        let removed = [("instance", url.as_str()), ("kind", "removed")];
        assert!(
            metric(&page, "prefix_router_kv_event_blocks_total", &removed) > 0.0,
            "{page}"
        );
        assert_eq!(metric(&page, "prefix_router_kv_event_gaps_total", &i), 0.0);
        assert_eq!(
            metric(&page, "prefix_router_kv_event_malformed_total", &i),
            0.0
        );
        assert_eq!(metric(&page, "prefix_router_kv_view_partial", &i), 0.0);
    }
    // The admin view names the longest prefixes: a whole document is 18 blocks of 16 tokens.
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    let v = feeds.describe(&a.url(), 3).expect("a view");
    assert_eq!(v["complete"], true);
    assert_eq!(v["block_size"], 16);
    let top = v["longest_prefixes"].as_array().expect("prefixes");
    assert!(!top.is_empty());
    assert!(top[0]["blocks"].as_u64().expect("blocks") >= 18, "{v}");
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_messages_are_replayed_and_the_view_comes_back_exact() {
    // A fifth of the batches never reach the PUB socket.
    let a = engine(Encoding::Map, 0.2, 10_000).await;
    let r = start_router(&[&a]).await;
    traffic(r.local_addr(), 60).await;
    let (complete, _) = converge(&r, &a).await;
    assert_eq!(complete, Completeness::Exact);
    let url = a.url();
    let i = [("instance", url.as_str())];
    let deadline = Instant::now() + SETTLE;
    loop {
        // A recovery may still be under way when the counts first agree.
        let page = router_metrics(&r).await;
        let gaps = metric(&page, "prefix_router_kv_event_gaps_total", &i);
        let replays = |kind| {
            metric(
                &page,
                "prefix_router_kv_event_replays_total",
                &[("instance", url.as_str()), ("kind", kind)],
            )
        };
        assert!(gaps > 0.0, "{page}");
        assert_eq!(replays("lost"), 0.0, "{page}");
        if replays("recovered") == gaps {
            // Each recovery's time is measured (the first connection's replay from 0 is
            // one more).
            let timed = metric(&page, "prefix_router_kv_event_recovery_seconds_count", &[]);
            assert!(
                timed >= gaps,
                "{timed} recoveries timed for {gaps} gaps: {page}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "not every gap recovered: {page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_router_joining_mid_stream_recovers_what_the_engine_still_buffers() {
    let full = engine(Encoding::Positional, 0.0, 10_000).await;
    let short = engine(Encoding::Map, 0.0, 2).await;
    // Traffic straight to the engines, before any router listens.
    for e in [&full, &short] {
        for i in 0..20 {
            let a = post(e.local_addr(), "/v1/chat/completions", &[], chat(i % 9, i)).await;
            assert_eq!(a.status, http::StatusCode::OK);
        }
    }
    let r = start_router(&[&full, &short]).await;
    // One more request each, with a new document (new blocks: a batch): the first message the
    // router sees is far past sequence 0.
    for e in [&full, &short] {
        let a = post(e.local_addr(), "/v1/chat/completions", &[], chat(50, 99)).await;
        assert_eq!(a.status, http::StatusCode::OK);
    }
    // The whole history was still buffered: exact.
    let (complete, _) = converge(&r, &full).await;
    assert_eq!(complete, Completeness::Exact);
    // Only the last two batches were: the view knows what it lacks.
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    let deadline = Instant::now() + SETTLE;
    loop {
        let partial = feeds
            .feed(&short.url())
            .is_some_and(|f| f.lock().expect("lock").view.completeness() == Completeness::Partial);
        if partial {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the short buffer's loss went unnoticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let page = router_metrics(&r).await;
    let url = short.url();
    assert_eq!(
        metric(
            &page,
            "prefix_router_kv_view_partial",
            &[("instance", url.as_str())]
        ),
        1.0
    );
    assert_eq!(
        metric(
            &page,
            "prefix_router_kv_event_replays_total",
            &[("instance", url.as_str()), ("kind", "lost")]
        ),
        1.0
    );
    r.shutdown().await;
}

fn test_tokenizer() -> Arc<ChatTokenizer> {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/tokenizers/byte-bpe/tokenizer.json");
    Arc::new(ChatTokenizer::from_dir_files(&file, None).expect("the test tokenizer loads"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_token_blocks_are_the_ones_the_engine_reports() {
    let tokenizer = test_tokenizer();
    let mut c = MockEngineConfig::from_preset("small")
        .expect("preset")
        .with_time_scale(0.01);
    c.tokenizer = Some(Arc::clone(&tokenizer));
    c.kv_events = Some(KvEventsConfig::default());
    let e = MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
        .await
        .expect("mock engine starts");
    let r = start_router(&[&e]).await;
    let bodies: Vec<String> = (0..4).map(|d| chat(d, d)).collect();
    let completion = serde_json::json!({
        "model": "mock-llama", "max_tokens": 2,
        "prompt": (0..200).map(|w| format!("word{w} ")).collect::<String>(),
    })
    .to_string();
    for b in &bodies {
        let a = post(r.local_addr(), "/v1/chat/completions", &[], b.clone()).await;
        assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
    }
    let a = post(r.local_addr(), "/v1/completions", &[], completion.clone()).await;
    assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
    converge(&r, &e).await;
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    let feed = feeds.feed(&e.url()).expect("a feed");
    {
        let f = feed.lock().expect("lock");
        let block = f.view.block_size() as usize;
        assert_eq!(block, 16);
        for body in bodies.iter().chain([&completion]) {
            let prompt = Prompt::from_body(body.as_bytes()).expect("a prompt");
            let ids = tokenizer.ids(&prompt).expect("tokenizes");
            let chain = token_chain(&ids, block);
            // A few hundred tokens: every full block of each prompt is cached (the cache holds
            // them all), under the router's own names computed from its own tokenization.
            assert!(chain.len() >= 10, "{} blocks", chain.len());
            assert_eq!(f.view.matched(&chain), chain.len(), "{body}");
            // One token off, and the names no longer meet from that block on.
            let mut off = ids.clone();
            off[block * 3] ^= 1;
            assert_eq!(f.view.matched(&token_chain(&off, block)), 3);
        }
    }
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_routes_to_the_engine_that_reports_the_prefix() {
    let tokenizer = test_tokenizer();
    let mut engines = Vec::new();
    for _ in 0..3 {
        let mut c = MockEngineConfig::from_preset("small")
            .expect("preset")
            .with_time_scale(0.01);
        c.tokenizer = Some(Arc::clone(&tokenizer));
        c.kv_events = Some(KvEventsConfig::default());
        engines.push(
            MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
                .await
                .expect("mock engine starts"),
        );
    }
    let refs: Vec<&MockEngine> = engines.iter().collect();
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let mut s = settings(&urls);
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named("kv-aware").expect("registered"),
    );
    s.kv_events.tokenizer = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../data/tokenizers/byte-bpe/tokenizer.json"),
    );
    let r = start_with(&refs, s).await;
    // Six documents, each warmed on one engine behind the router's back (another replica, a
    // batch job): the router never sent them anywhere.
    for d in 0..6 {
        let a = post(
            engines[d % 3].local_addr(),
            "/v1/chat/completions",
            &[],
            chat(d, 0),
        )
        .await;
        assert_eq!(a.status, http::StatusCode::OK);
    }
    for e in &engines {
        converge(&r, e).await;
    }
    for d in 0..6 {
        let a = post(r.local_addr(), "/v1/chat/completions", &[], chat(d, 1)).await;
        assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
        assert_eq!(
            a.header("x-prefix-router-instance"),
            urls[d % 3],
            "document {d}"
        );
        assert_eq!(
            a.header("x-prefix-router-decision"),
            "cache_hit",
            "document {d}"
        );
    }
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_models_requests_are_matched_with_that_models_tokenizer() {
    // model-a's engine counts byte-BPE tokens, model-b's one token per word: the same text
    // gives different ids, hence different blocks, on each.
    let bpe = test_tokenizer();
    let words = ChatTokenizer::words();
    let mut engines = Vec::new();
    for (model, tokenizer) in [("model-a", Some(Arc::clone(&bpe))), ("model-b", None)] {
        let mut c = MockEngineConfig::from_preset("small")
            .expect("preset")
            .with_time_scale(0.01);
        c.model = model.into();
        c.tokenizer = tokenizer;
        c.kv_events = Some(KvEventsConfig::default());
        engines.push(
            MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
                .await
                .expect("mock engine starts"),
        );
    }
    let (a, b) = (&engines[0], &engines[1]);
    let urls = [a.url(), b.url()];
    let mut s = settings(&urls);
    s.instances[0].models = vec!["model-a".into()];
    s.instances[1].models = vec!["model-b".into()];
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named("kv-aware").expect("registered"),
    );
    // No default tokenizer: each model has its own.
    s.kv_events.tokenizers = vec![
        KvEventsTokenizer {
            model: "model-a".into(),
            tokenizer: std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../data/tokenizers/byte-bpe/tokenizer.json"),
            chat_template: None,
        },
        KvEventsTokenizer {
            model: "model-b".into(),
            tokenizer: WORDS.into(),
            chat_template: None,
        },
    ];
    let r = start_with(&[a, b], s).await;
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    // Traffic for both models through the router (an engine refuses the other's model).
    let mut sent = Vec::new();
    for d in 0..4 {
        for model in ["model-a", "model-b"] {
            let body = chat_for(model, d, d);
            let ans = post(r.local_addr(), "/v1/chat/completions", &[], body.clone()).await;
            assert_eq!(ans.status, http::StatusCode::OK, "{:?}", ans.body);
            sent.push((model, body));
        }
    }
    converge(&r, a).await;
    converge(&r, b).await;
    let snapshot = r.state().fleet.snapshot();
    let instance = |url: &str| Arc::clone(snapshot.get(url).expect("an instance").1);
    let (ia, ib) = (instance(&a.url()), instance(&b.url()));
    for (model, body) in &sent {
        let (own, other, home, away) = match *model {
            "model-a" => (&*bpe, &words, &ia, &ib),
            _ => (&words, &*bpe, &ib, &ia),
        };
        let prompt = Prompt::from_body(body.as_bytes()).expect("a prompt");
        let chain = token_chain(&own.ids(&prompt).expect("tokenizes"), 16);
        let wrong = token_chain(&other.ids(&prompt).expect("tokenizes"), 16);
        assert!(chain.len() >= 10, "{model}: {} blocks", chain.len());
        // The router's blocks of the request are its model's tokenizer's...
        let t = feeds.tokenize(body.as_bytes()).expect("tokenized");
        let route = t.route(feeds);
        assert_eq!(route.chain, chain.as_slice(), "{model}");
        // ...which its engine reports holding in full; the other tokenizer's blocks, none.
        let report = feeds
            .report(home, route.chain, route.adapter)
            .expect("a report");
        assert_eq!(report.matched_blocks as usize, chain.len(), "{model}");
        assert_eq!(
            feeds
                .report(home, &wrong, 0)
                .expect("a report")
                .matched_blocks,
            0
        );
        // The other engine never saw it.
        assert_eq!(
            feeds
                .report(away, route.chain, route.adapter)
                .expect("a report")
                .matched_blocks,
            0
        );
    }
    // Documents warmed on each engine behind the router's back: only the engines' reports,
    // matched with the right tokenizer, can make the router's next request for them a hit.
    for d in 10..12 {
        for (model, e) in [("model-a", a), ("model-b", b)] {
            let ans = post(
                e.local_addr(),
                "/v1/chat/completions",
                &[],
                chat_for(model, d, 0),
            )
            .await;
            assert_eq!(ans.status, http::StatusCode::OK, "{:?}", ans.body);
        }
    }
    converge(&r, a).await;
    converge(&r, b).await;
    for d in 10..12 {
        for (model, e) in [("model-a", a), ("model-b", b)] {
            let ans = post(
                r.local_addr(),
                "/v1/chat/completions",
                &[],
                chat_for(model, d, 1),
            )
            .await;
            assert_eq!(ans.status, http::StatusCode::OK, "{:?}", ans.body);
            assert_eq!(
                ans.header("x-prefix-router-instance"),
                e.url(),
                "{model} {d}"
            );
            assert_eq!(
                ans.header("x-prefix-router-decision"),
                "cache_hit",
                "{model} document {d}"
            );
        }
    }
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_restarted_in_place_is_not_mistaken_for_the_old_one() {
    let first = engine(Encoding::Map, 0.0, 10_000).await;
    let r = start_router(&[&first]).await;
    traffic(r.local_addr(), 40).await;
    converge(&r, &first).await;
    // The same addresses, a new process: an empty cache, and sequence numbers from 0 again.
    let http_addr = first.local_addr();
    let endpoint = |e: Option<&str>| -> std::net::SocketAddr {
        e.and_then(|e| e.strip_prefix("tcp://"))
            .and_then(|a| a.parse().ok())
            .expect("a tcp endpoint")
    };
    let kv = endpoint(first.kv_events_endpoint());
    let replay = endpoint(first.kv_events_replay_endpoint());
    first.shutdown().await;
    let mut c = MockEngineConfig::from_preset("small")
        .expect("preset")
        .with_time_scale(0.01);
    c.engine.kv_capacity_blocks = 96;
    c.kv_events = Some(KvEventsConfig {
        addr: kv,
        replay_addr: Some(replay),
        ..KvEventsConfig::default()
    });
    // Its ports may take a moment to be free again.
    let deadline = Instant::now() + SETTLE;
    let second = loop {
        match MockEngine::bind(http_addr, c.clone()).await {
            Ok(e) => break e,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot restart in place: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    // Fewer documents than before: its sequence stays below the first engine's.
    for i in 0..3 {
        let a = post(second.local_addr(), "/v1/chat/completions", &[], chat(i, 7)).await;
        assert_eq!(a.status, http::StatusCode::OK);
    }
    let (complete, blocks) = converge(&r, &second).await;
    assert_eq!(complete, Completeness::Exact);
    assert!(blocks > 0);
    r.shutdown().await;
}

/// Two mock engines serving two LoRA adapters of their base model, keyed per adapter as vLLM
/// keys them and publishing each adapter's blocks with its name, and a router running
/// `strategy` in front, subscribed to their events (with the word tokenizer for kv-aware).
async fn adapter_fleet(strategy: &str) -> (Vec<MockEngine>, RunningRouter) {
    let mut engines = Vec::new();
    for _ in 0..2 {
        let mut c = MockEngineConfig::from_preset("small")
            .expect("preset")
            .with_time_scale(0.01);
        c.loras = vec!["sql-lora".into(), "chat-lora".into()];
        c.kv_events = Some(KvEventsConfig::default());
        engines.push(
            MockEngine::bind("127.0.0.1:0".parse().expect("addr"), c)
                .await
                .expect("mock engine starts"),
        );
    }
    let urls: Vec<String> = engines.iter().map(|e| e.url()).collect();
    let mut s = settings(&urls);
    s.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named(strategy).expect("registered"),
    );
    s.kv_events.tokenizer = Some(WORDS.into());
    let refs: Vec<&MockEngine> = engines.iter().collect();
    let r = start_with(&refs, s).await;
    (engines, r)
}

/// Sends document `doc` (question `q`) for `model`: on its first `visit` for that model it is
/// neither predicted nor found cached; on the next, predicted and found whole.
async fn visit_checked(r: &RunningRouter, model: &str, doc: usize, q: usize, visit: usize) {
    let a = post(
        r.local_addr(),
        "/v1/chat/completions",
        &[],
        chat_for(model, doc, q),
    )
    .await;
    assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
    let decision = a.header("x-prefix-router-decision");
    let cached = a.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    let what = format!("document {doc}, visit {visit}, {model}: {decision}, {cached} cached");
    if visit == 0 {
        assert_ne!(decision, "cache_hit", "{what}");
        assert_eq!(cached, 0, "{what}");
    } else {
        assert_eq!(decision, "cache_hit", "{what}");
        // A whole document: 18 blocks of 16 tokens.
        assert!(cached >= 16 * 18, "{what}");
    }
}

/// Waits until the router's view of every engine is exact (see [`converge`]).
async fn settle(r: &RunningRouter, engines: &[MockEngine]) {
    for e in engines {
        assert_eq!(converge(r, e).await.0, Completeness::Exact, "{}", e.url());
    }
}

/// cache-aware in front of two adapter-serving engines: the same document sent for each
/// adapter (and the base model) is a new prefix for each. The router predicts a hit on a
/// request's second visit for its own model and never on its first, the engines' reports
/// agree with every prediction, and the router's view of each engine, adapter blocks included,
/// stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_adapters_prompt_is_its_own_prefix() {
    let (engines, r) = adapter_fleet("cache-aware").await;
    let mut q = 0;
    for doc in 0..3 {
        for visit in 0..2 {
            for model in ["sql-lora", "chat-lora", "mock-llama"] {
                q += 1;
                visit_checked(&r, model, doc, q, visit).await;
            }
        }
    }
    settle(&r, &engines).await;
    r.shutdown().await;
}

/// kv-aware in front of the same engines, matching on their events: once an engine has
/// announced an adapter's blocks (by name), a request naming that adapter is matched against
/// them only, never against the base model's blocks of the same tokens, and a request for the
/// base model never against an adapter's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_tells_an_adapters_blocks_from_the_base_models() {
    let (engines, r) = adapter_fleet("kv-aware").await;
    // The engines announce each adapter once (an adapter no engine has announced reads as the
    // base model).
    for (q, model) in ["sql-lora", "chat-lora"].into_iter().enumerate() {
        let a = post(
            r.local_addr(),
            "/v1/chat/completions",
            &[],
            chat_for(model, 99, q),
        )
        .await;
        assert_eq!(a.status, http::StatusCode::OK, "{:?}", a.body);
    }
    settle(&r, &engines).await;
    let mut q = 10;
    for doc in 0..3 {
        for visit in 0..2 {
            // The base model first: its blocks are there when each adapter comes.
            for model in ["mock-llama", "sql-lora", "chat-lora"] {
                q += 1;
                visit_checked(&r, model, doc, q, visit).await;
                // The views take in what this request stored before the next one is routed.
                settle(&r, &engines).await;
            }
        }
    }
    r.shutdown().await;
}

/// A TCP relay to `to`: each connection accepted is forwarded until `cut` is notified, which
/// closes every connection open then (a network blip); new ones are accepted after.
async fn cuttable_relay(
    to: std::net::SocketAddr,
) -> (std::net::SocketAddr, Arc<tokio::sync::Notify>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let cut = Arc::new(tokio::sync::Notify::new());
    let cuts = Arc::clone(&cut);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let Ok(mut server) = tokio::net::TcpStream::connect(to).await else {
                continue;
            };
            let cuts = Arc::clone(&cuts);
            tokio::spawn(async move {
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                    _ = cuts.notified() => {}
                }
            });
        }
    });
    (addr, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconnect_resumes_from_the_last_batch_and_the_view_stays_exact() {
    // A replay buffer far shorter than the stream: a replay from 0 after the reconnect could
    // not be served, and the view would stay partial.
    let a = engine(Encoding::Map, 0.0, 4).await;
    let publisher: std::net::SocketAddr = a
        .kv_events_endpoint()
        .and_then(|e| e.strip_prefix("tcp://"))
        .and_then(|e| e.parse().ok())
        .expect("a tcp endpoint");
    let (relay, cut) = cuttable_relay(publisher).await;
    let mut s = settings(&[a.url()]);
    s.kv_events.subscribe = true;
    s.kv_events.endpoints = vec![KvEventsEndpoint {
        instance: a.url(),
        publisher: format!("tcp://{relay}"),
        replay: a.kv_events_replay_endpoint().map(str::to_string),
    }];
    let r = router(s.validate().expect("valid")).await;
    let feeds = r.state().kv_events.as_ref().expect("subscribed");
    let deadline = Instant::now() + SETTLE;
    while !feeds.is_connected(&a.url()) {
        assert!(Instant::now() < deadline, "not subscribed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    traffic(r.local_addr(), 30).await;
    let (complete, _) = converge(&r, &a).await;
    assert_eq!(complete, Completeness::Exact);
    // The connection drops; the socket reconnects by itself. Until a batch says whether the
    // publisher is the same one, the view is not trusted (an engine restarted in place is
    // idle and publishes nothing).
    cut.notify_waiters();
    let deadline = Instant::now() + SETTLE;
    loop {
        let untrusted = {
            let feed = feeds.feed(&a.url()).expect("a feed");
            let f = feed.lock().expect("lock");
            f.connected && f.recovering
        };
        if untrusted {
            break;
        }
        assert!(Instant::now() < deadline, "reconnected and trusted at once");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The subscription reaches the publisher a moment after the connection: what is published
    // meanwhile is dropped, and more than the replay buffer holds would be lost for good. One
    // request at a time until a batch arrives (the view trusted again), then the traffic.
    loop {
        nudge(&a).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let trusted = {
            let feed = feeds.feed(&a.url()).expect("a feed");
            let f = feed.lock().expect("lock");
            f.connected && !f.recovering
        };
        if trusted {
            break;
        }
        assert!(Instant::now() < deadline, "no batch since the reconnect");
    }
    traffic(r.local_addr(), 6).await;
    let (complete, _) = converge(&r, &a).await;
    assert_eq!(complete, Completeness::Exact);
    let page = router_metrics(&r).await;
    let url = a.url();
    assert_eq!(
        metric(
            &page,
            "prefix_router_kv_event_replays_total",
            &[("instance", url.as_str()), ("kind", "lost")]
        ),
        0.0,
        "{page}"
    );
    r.shutdown().await;
}

/// Events of a type the router does not know (an engine newer than the router) are skipped
/// and counted, per instance, and the rest of their batch still applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_of_an_unknown_type_are_skipped_and_counted() {
    use zeromq::{Socket, SocketSend, ZmqMessage};
    let a = engine(Encoding::Map, 0.0, 10).await;
    let mut publisher = zeromq::PubSocket::new();
    let bound = publisher
        .bind("tcp://127.0.0.1:0")
        .await
        .expect("binds on loopback");
    let mut s = settings(&[a.url()]);
    s.kv_events.subscribe = true;
    s.kv_events.endpoints = vec![KvEventsEndpoint {
        instance: a.url(),
        publisher: bound.to_string(),
        replay: None,
    }];
    let r = router(s.validate().expect("valid")).await;
    // MessagePack of [ts, [["FutureEvent", 1], ["BlockStored", [7], nil, [1, 2], 2], ["Other"]]]:
    // two events of no known type around one stored block.
    let mut payload = vec![0x92, 0xcb];
    payload.extend_from_slice(&1.0f64.to_be_bytes());
    payload.push(0x93);
    payload.push(0x92);
    payload.push(0xa0 | 11);
    payload.extend_from_slice(b"FutureEvent");
    payload.push(0x01);
    payload.extend_from_slice(&[0x95, 0xa0 | 11]);
    payload.extend_from_slice(b"BlockStored");
    payload.extend_from_slice(&[0x91, 0x07, 0xc0, 0x92, 0x01, 0x02, 0x02]);
    payload.extend_from_slice(&[0x91, 0xa0 | 5]);
    payload.extend_from_slice(b"Other");
    let url = a.url();
    let i = [("instance", url.as_str())];
    // A published message is dropped until the subscription reaches the socket: one every
    // 50 ms, each numbered on, until the first is applied.
    let deadline = Instant::now() + SETTLE;
    let mut seq = 0u64;
    let page = loop {
        let frames: Vec<bytes::Bytes> = vec![
            bytes::Bytes::new(),
            bytes::Bytes::copy_from_slice(&seq.to_be_bytes()),
            bytes::Bytes::from(payload.clone()),
        ];
        publisher
            .send(ZmqMessage::try_from(frames).expect("frames"))
            .await
            .expect("sends");
        seq += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let page = router_metrics(&r).await;
        if metric(&page, "prefix_router_kv_event_batches_total", &i) > 0.0 {
            break page;
        }
        assert!(Instant::now() < deadline, "no batch applied: {page}");
    };
    // Messages sent before the first was applied may still arrive: the counts are read again
    // until a page shows them settled (each batch counted whole).
    let mut page = page;
    let stored = [("instance", url.as_str()), ("kind", "stored")];
    let settled = |page: &str| {
        let batches = metric(page, "prefix_router_kv_event_batches_total", &i);
        metric(page, "prefix_router_kv_event_unknown_events_total", &i) == 2.0 * batches
            && metric(page, "prefix_router_kv_event_blocks_total", &stored) == batches
    };
    while !settled(&page) {
        assert!(
            Instant::now() < deadline,
            "unknown events not counted: {page}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        page = router_metrics(&r).await;
    }
    let batches = metric(&page, "prefix_router_kv_event_batches_total", &i);
    assert_eq!(
        metric(&page, "prefix_router_kv_event_malformed_total", &i),
        0.0
    );
    assert!(batches > 0.0);
    r.shutdown().await;
}
