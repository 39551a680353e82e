//! Prefix-cache and batching behaviour over real HTTP.

mod support;

use std::time::Instant;

use prefix_router_mock_engine::{MockEngineConfig, DEFAULT_MODEL};
use serde_json::Value;
use support::*;

#[tokio::test]
async fn a_repeated_prompt_is_served_from_cache() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = start_default(0.05).await;
        // 100 words: 6 full blocks of 16.
        let body = chat_body(DEFAULT_MODEL, &words(100, "doc"), 4, false);
        let (s, first) = post_json(e.local_addr(), "/v1/chat/completions", body.clone()).await;
        assert_eq!(s, 200, "{first}");
        assert_eq!(first["usage"]["prompt_tokens"], 100);
        assert_eq!(cached_tokens(&first), 0);
        let (_, second) = post_json(e.local_addr(), "/v1/chat/completions", body).await;
        assert_eq!(cached_tokens(&second), 96);
        // Same prompt, same answer.
        assert_eq!(
            first["choices"][0]["message"],
            second["choices"][0]["message"]
        );
        // A prompt sharing only the first 40 words hits the first 2 blocks.
        let partial = format!("{} {}", &words(40, "doc"), words(60, "other"));
        let (_, third) = post_json(
            e.local_addr(),
            "/v1/completions",
            serde_json::json!({"model": DEFAULT_MODEL, "prompt": partial, "max_tokens": 2})
                .to_string(),
        )
        .await;
        assert_eq!(cached_tokens(&third), 32);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn a_prompt_evicted_by_others_is_not_a_hit_and_metrics_agree() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // 32 blocks = 512 tokens of KV: a few 200-token prompts push the first one out.
        let e = start(MockEngineConfig::new(engine(32)).with_time_scale(0.05)).await;
        let addr = e.local_addr();
        let target = chat_body(DEFAULT_MODEL, &words(100, "target"), 4, false);
        let mut cached_sum = 0;
        let mut prompt_sum = 0;
        let mut send = |v: serde_json::Value| {
            cached_sum += cached_tokens(&v);
            prompt_sum += v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
            cached_tokens(&v)
        };
        let (_, v) = post_json(addr, "/v1/chat/completions", target.clone()).await;
        assert_eq!(send(v), 0);
        let (_, v) = post_json(addr, "/v1/chat/completions", target.clone()).await;
        assert_eq!(send(v), 96, "still cached before the others come");
        for i in 0..4 {
            let other = chat_body(DEFAULT_MODEL, &words(200, &format!("o{i}-")), 4, false);
            let (s, v) = post_json(addr, "/v1/chat/completions", other).await;
            assert_eq!(s, 200);
            assert_eq!(send(v), 0);
        }
        let (_, v) = post_json(addr, "/v1/chat/completions", target).await;
        assert_eq!(send(v), 0, "evicted by the others");
        let (s, m) = get(addr, "/metrics").await;
        assert_eq!(s, 200);
        assert_eq!(
            metric(&m, "vllm:prefix_cache_hits_total"),
            cached_sum as f64
        );
        assert_eq!(
            metric(&m, "vllm:prefix_cache_queries_total"),
            prompt_sum as f64
        );
        assert_eq!(metric(&m, "vllm:prompt_tokens_total"), prompt_sum as f64);
        assert_eq!(metric(&m, "vllm:generation_tokens_total"), 7.0 * 4.0);
        assert_eq!(metric(&m, "vllm:time_to_first_token_seconds_count"), 7.0);
        assert_eq!(metric(&m, "vllm:num_requests_running"), 0.0);
        assert_eq!(metric(&m, "vllm:num_requests_waiting"), 0.0);
        assert_eq!(metric(&m, "vllm:kv_cache_usage_perc"), 0.0);
        assert!(m.contains(&format!("model_name=\"{DEFAULT_MODEL}\"")));
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn concurrent_requests_share_decode_steps() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // 40 decode steps of 10 ms engine time = 0.4 s engine, 80 ms wall per request.
        let e = start_default(0.2).await;
        let addr = e.local_addr();
        let body = |i: usize| chat_body(DEFAULT_MODEL, &words(20, &format!("c{i}-")), 40, false);
        let t = Instant::now();
        for i in 0..4 {
            let (s, _) = post_json(addr, "/v1/chat/completions", body(i)).await;
            assert_eq!(s, 200);
        }
        let sequential = t.elapsed();
        let t = Instant::now();
        let handles: Vec<_> = (4..8)
            .map(|i| tokio::spawn(post_json(addr, "/v1/chat/completions", body(i))))
            .collect();
        for h in handles {
            let (s, v) = h.await.expect("join");
            assert_eq!(s, 200);
            assert_eq!(v["usage"]["completion_tokens"], 40);
        }
        let concurrent = t.elapsed();
        // Four in one batch take about as long as one; sequentially, four times that.
        assert!(
            concurrent.as_secs_f64() < 0.5 * sequential.as_secs_f64(),
            "concurrent {concurrent:?} vs sequential {sequential:?}"
        );
        // And time does follow the engine model: 40 steps at 10 ms × 0.2 = 80 ms at least.
        assert!(sequential.as_millis() >= 4 * 80, "{sequential:?}");
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn requests_past_max_num_seqs_wait_and_metrics_show_it() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut config = engine(1000);
        config.max_num_seqs = 2;
        let e = start(MockEngineConfig::new(config).with_time_scale(0.2)).await;
        let addr = e.local_addr();
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let body = chat_body(DEFAULT_MODEL, &words(20, &format!("q{i}-")), 40, false);
                tokio::spawn(post_json(addr, "/v1/chat/completions", body))
            })
            .collect();
        // Each batch of two takes 40 steps × 10 ms × 0.2 = 80 ms of wall time.
        let mut seen = (0.0, 0.0);
        for _ in 0..50 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            let (_, m) = get(addr, "/metrics").await;
            let now = (
                metric(&m, "vllm:num_requests_running"),
                metric(&m, "vllm:num_requests_waiting"),
            );
            seen = now;
            if now.0 >= 2.0 && now.1 > 0.0 {
                break;
            }
        }
        assert_eq!(seen.0, 2.0, "running is capped at max_num_seqs: {seen:?}");
        assert!(seen.1 >= 1.0, "the rest wait: {seen:?}");
        for h in handles {
            assert_eq!(h.await.expect("join").0, 200);
        }
        let (_, m) = get(addr, "/metrics").await;
        assert_eq!(metric(&m, "vllm:num_requests_waiting"), 0.0);
    })
    .await
    .expect("timed out");
}

/// vLLM keys a block by its LoRA adapter as well as its tokens: the same prompt under the base
/// model and under each adapter is cached once for each, and a hit only ever comes from the
/// same model's earlier run.
#[tokio::test]
async fn an_adapters_blocks_are_its_own() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut config = MockEngineConfig::new(engine(1000)).with_time_scale(0.05);
        config.loras = vec!["sql-lora".into(), "chat-lora".into()];
        let e = start(config).await;
        let text = words(100, "doc");
        let mut cached = Vec::new();
        for model in [
            DEFAULT_MODEL,
            "sql-lora",
            "chat-lora",
            "sql-lora",
            DEFAULT_MODEL,
        ] {
            let body = chat_body(model, &text, 2, false);
            let (s, v) = post_json(e.local_addr(), "/v1/chat/completions", body).await;
            assert_eq!(s, 200, "{v}");
            cached.push(cached_tokens(&v));
        }
        // 100 words: 6 full blocks of 16, cached the second time each model sends them.
        assert_eq!(cached, vec![0, 0, 0, 96, 96]);
    })
    .await
    .expect("timed out");
}

/// The Responses API: a stored response continued with `previous_response_id` is the prompt's
/// opening, so its blocks are cached; a stream opens with `response.created` and
/// `response.in_progress` before its first token; a response another engine gave is a 404.
#[tokio::test]
async fn a_stored_response_is_continued_from_cache() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = start_default(0.05).await;
        let addr = e.local_addr();
        let first = serde_json::json!({
            "model": DEFAULT_MODEL,
            "instructions": words(60, "rules"),
            "input": words(40, "q1"),
            "max_output_tokens": 8,
        });
        let (s, a) = post_json(addr, "/v1/responses", first.to_string()).await;
        assert_eq!(s, 200, "{a}");
        assert_eq!(a["object"], "response");
        assert_eq!(a["status"], "completed");
        assert_eq!(a["usage"]["input_tokens"], 100);
        assert_eq!(a["usage"]["output_tokens"], 8);
        let id = a["id"].as_str().unwrap_or_default().to_owned();
        assert!(id.starts_with("resp_"), "{id}");
        let text = a["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(text.split(' ').count(), 8);
        // The next turn: the stored conversation (100 + 8 words) and 30 more.
        let next = serde_json::json!({
            "model": DEFAULT_MODEL,
            "previous_response_id": id,
            "input": words(30, "q2"),
            "max_output_tokens": 4,
            "stream": true,
        });
        let s = post_stream(addr, "/v1/responses", next.to_string()).await;
        assert_eq!(s.status, 200);
        assert!(s.clean_end);
        let events: Vec<Value> = s
            .events
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("event JSON"))
            .collect();
        let types: Vec<&str> = events.iter().filter_map(|v| v["type"].as_str()).collect();
        assert_eq!(
            &types[..3],
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added"
            ]
        );
        assert_eq!(types.last(), Some(&"response.completed"));
        let done = &events[events.len() - 1]["response"];
        assert_eq!(done["usage"]["input_tokens"], 138);
        // The 108 tokens of the first turn fill 6 blocks of 16.
        assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 96);
        // Stored, and readable back; unknown ids are 404s, as on another engine.
        let (s, _) = get(addr, &format!("/v1/responses/{id}")).await;
        assert_eq!(s, 200);
        let (s, body) = get(addr, "/v1/responses/resp_elsewhere").await;
        assert_eq!(s, 404, "{body}");
        let (s, v) = post_json(
            addr,
            "/v1/responses",
            serde_json::json!({"previous_response_id": "resp_elsewhere", "input": "x"}).to_string(),
        )
        .await;
        assert_eq!(s, 404, "{v}");
        assert_eq!(v["error"]["param"], "previous_response_id");
        // Another engine's first response has an id of its own (a router tells them apart).
        let other = start_default(0.05).await;
        let (_, b) = post_json(other.local_addr(), "/v1/responses", first.to_string()).await;
        assert_ne!(b["id"], a["id"]);
        assert!(
            b["id"].as_str().is_some_and(|i| i.starts_with("resp_")),
            "{b}"
        );
    })
    .await
    .expect("timed out");
}
