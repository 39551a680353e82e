use std::path::PathBuf;

use prefix_router_tokenize::WORDS;

use super::*;
use crate::settings::KvEventsTokenizer;

fn byte_bpe() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/tokenizers/byte-bpe/tokenizer.json")
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

/// A connected feed whose engine stored one block of `block_size` tokens.
fn feed_of_size(block_size: u32) -> Arc<Mutex<Feed>> {
    use prefix_router_kv_events::{BlockStored, EngineHash, EventBatch, KvEvent};
    let mut view = EngineView::new();
    view.apply(&EventBatch {
        events: vec![KvEvent::Stored(BlockStored {
            block_hashes: vec![EngineHash(7)],
            token_ids: (0..block_size).collect(),
            block_size,
            ..BlockStored::default()
        })],
        ..EventBatch::default()
    });
    Arc::new(Mutex::new(Feed {
        view,
        connected: true,
        ..Feed::default()
    }))
}

/// Requests are cut into blocks of the size most engines use, and an engine whose blocks are
/// another size is not asked (its view would read "nothing cached" for what it holds): the
/// strategy infers for it instead. Before, the last engine to report set the size for all.
#[test]
fn engines_with_another_block_size_are_not_asked() {
    let feeds = feeds(Some(byte_bpe()));
    let url = |n: &str| format!("http://{n}:8000");
    let inst = |n: &str| Instance::new(prefix_router_core::InstanceSpec::from_url(url(n)));
    let body = body(None);
    let add = |n: &str, size: u32| {
        lock(&feeds.feeds).insert(url(n), feed_of_size(size));
        feeds.recount_block_size();
    };
    let asked = |n: &str| {
        let t = feeds.tokenize(&body).expect("tokenized");
        let r = t.route(&feeds);
        feeds.report(&inst(n), r.chain, r.adapter).is_some()
    };
    add("a", 16);
    add("c", 32);
    // One of each: the smaller.
    assert_eq!(feeds.block_tokens(), 16);
    assert!(asked("a"));
    assert!(!asked("c"), "a 32-token engine read at 16 tokens a block");
    add("b", 32);
    assert_eq!(feeds.block_tokens(), 32);
    assert!(asked("b") && asked("c"));
    assert!(!asked("a"));
}

/// kv-aware tokenizes a request's prompt on the blocking pool: on a runtime with one thread,
/// another task keeps running while a long prompt is tokenized (tokenized inline, it could not
/// run at all until the tokenization ended).
#[tokio::test(flavor = "current_thread")]
async fn a_request_is_tokenized_off_the_runtime() {
    use crate::pick::{Api, Prepared};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut settings = crate::settings::Settings::with_instances(["http://127.0.0.1:1"])
        .unwrap_or_else(|e| panic!("{e}"));
    settings.health.active = false;
    settings.routing.strategy = prefix_router_core::StrategyConfig::new(
        prefix_router_core::StrategyKind::named("kv-aware").expect("registered"),
    );
    settings.kv_events.subscribe = true;
    settings.kv_events.tokenizer = Some(byte_bpe());
    let state = Arc::new(AppState::new(settings, None).unwrap_or_else(|e| panic!("{e}")));
    // About 64 KiB of prompt: tens of milliseconds to tokenize, more in a debug build.
    let text: String = (0..4000).map(|w| format!("lease{w} clause ")).collect();
    let body = serde_json::json!({"messages": [{"role": "user", "content": text}]}).to_string();
    let body = bytes::Bytes::from(body);
    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = tokio::spawn({
        let ticks = Arc::clone(&ticks);
        async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let started = std::time::Instant::now();
    let p = Prepared::prepare(&state, Api::Chat, &http::HeaderMap::new(), &body, started)
        .await
        .unwrap_or_else(|e| panic!("{e:?}"));
    let took = started.elapsed();
    let during = ticks.load(Ordering::Relaxed);
    ticker.abort();
    assert!(p.request(&state, 0.0).tokens.is_some(), "tokenized");
    assert!(
        during >= 5,
        "the other task ran {during} times during a tokenization of {took:?}"
    );
}

/// The requests waiting for a tokenizing slot are bounded: past the queue, a request gets no
/// slot (it is routed on inference) and is counted; one given up while waiting leaves its place.
#[tokio::test(flavor = "current_thread")]
async fn the_wait_for_a_tokenizing_slot_is_bounded() {
    let f = Arc::new(feeds(None));
    let cores = f.tokenize_queue / TOKENIZE_QUEUE;
    let mut held = Vec::new();
    for _ in 0..cores {
        held.push(f.tokenizing_slot().await.expect("a free slot"));
    }
    let mut waiters = Vec::new();
    for _ in 0..f.tokenize_queue {
        let f = Arc::clone(&f);
        waiters.push(tokio::spawn(
            async move { f.tokenizing_slot().await.is_some() },
        ));
    }
    // Every waiter has taken its place.
    while f
        .tokenize_waiting
        .load(std::sync::atomic::Ordering::Relaxed)
        < f.tokenize_queue
    {
        tokio::task::yield_now().await;
    }
    let past = tokio::time::timeout(std::time::Duration::from_secs(5), f.tokenizing_slot()).await;
    assert!(
        matches!(past, Ok(None)),
        "the queue is full: no slot, at once"
    );
    assert_eq!(f.metrics.tokenize_skipped.get(), 1);
    // One waiter given up: its place is free again.
    waiters.pop().expect("a waiter").abort();
    tokio::task::yield_now().await;
    while f
        .tokenize_waiting
        .load(std::sync::atomic::Ordering::Relaxed)
        >= f.tokenize_queue
    {
        tokio::task::yield_now().await;
    }
    drop(held);
    for w in waiters {
        assert!(w.await.expect("joins"), "each waiter gets a slot in turn");
    }
    assert!(f.tokenizing_slot().await.is_some());
}
