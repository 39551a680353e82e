//! Response shapes (what the OpenAI SDK parses), streaming, errors and the side endpoints.

mod support;

use prefix_router_mock_engine::{MockEngineConfig, DEFAULT_MODEL};
use serde_json::Value;
use support::*;

/// Checks the fields an OpenAI SDK reads from every streaming chunk.
fn check_chunk(v: &Value, object: &str) {
    assert!(v["id"].as_str().is_some_and(|s| !s.is_empty()), "{v}");
    assert_eq!(v["object"], object, "{v}");
    assert!(v["created"].as_u64().is_some(), "{v}");
    assert_eq!(v["model"], DEFAULT_MODEL, "{v}");
    let choices = v["choices"].as_array().expect("choices");
    for c in choices {
        assert_eq!(c["index"], 0, "{v}");
        assert!(
            c["finish_reason"].is_null() || c["finish_reason"].is_string(),
            "{v}"
        );
        if object == "chat.completion.chunk" {
            assert!(c["delta"].is_object(), "{v}");
            assert!(c["delta"]["content"].is_string(), "{v}");
        } else {
            assert!(c["text"].is_string(), "{v}");
        }
    }
}

#[tokio::test]
async fn chat_streams_incrementally_with_done_last_and_usage() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // 10 ms decode steps × 0.5: a token every 5 ms of wall time.
        let e = start_default(0.5).await;
        let text = words(50, "s");
        let s = post_stream(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body(DEFAULT_MODEL, &text, 12, true),
        )
        .await;
        assert_eq!(s.status, 200);
        assert!(
            s.content_type.starts_with("text/event-stream"),
            "{}",
            s.content_type
        );
        assert!(s.clean_end);
        let (last_at, last) = s.events.last().expect("events");
        assert_eq!(last, "[DONE]");
        let chunks: Vec<Value> = s.events[..s.events.len() - 1]
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("chunk JSON"))
            .collect();
        let usage = chunks.last().expect("usage chunk");
        check_chunk(usage, "chat.completion.chunk");
        assert_eq!(usage["choices"].as_array().map(Vec::len), Some(0));
        assert_eq!(usage["usage"]["prompt_tokens"], 50);
        assert_eq!(usage["usage"]["completion_tokens"], 12);
        assert_eq!(usage["usage"]["total_tokens"], 62);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        let content = &chunks[..chunks.len() - 1];
        assert!(
            content.len() >= 6,
            "tokens arrive step by step: {} chunks",
            content.len()
        );
        let id = &content[0]["id"];
        let mut text_out = String::new();
        for (i, c) in content.iter().enumerate() {
            check_chunk(c, "chat.completion.chunk");
            assert_eq!(&c["id"], id);
            assert!(
                c.get("usage").is_some_and(Value::is_null),
                "usage: null while streaming"
            );
            let delta = &c["choices"][0]["delta"];
            assert_eq!(delta.get("role").is_some(), i == 0, "role only first: {c}");
            text_out.push_str(delta["content"].as_str().unwrap_or_default());
            let finish = &c["choices"][0]["finish_reason"];
            if i + 1 == content.len() {
                assert_eq!(finish, "length");
            } else {
                assert!(finish.is_null());
            }
        }
        assert_eq!(text_out.split(' ').count(), 12);
        // Incremental: the first content chunk came well before the end.
        let first_at = s.events[0].0;
        assert!(
            last_at.duration_since(first_at).as_millis() >= 20,
            "all at once"
        );
        // The same prompt without streaming gives the same text.
        let (_, whole) = post_json(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body(DEFAULT_MODEL, &text, 12, false),
        )
        .await;
        assert_eq!(whole["choices"][0]["message"]["content"], text_out.as_str());
        assert_eq!(whole["object"], "chat.completion");
        assert_eq!(whole["choices"][0]["message"]["role"], "assistant");
        assert_eq!(whole["choices"][0]["finish_reason"], "length");
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn completions_stream_without_usage_unless_asked() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = start_default(0.05).await;
        let body = serde_json::json!({"model": DEFAULT_MODEL, "prompt": words(20, "p"), "max_tokens": 5, "stream": true});
        let s = post_stream(e.local_addr(), "/v1/completions", body.to_string()).await;
        assert_eq!(s.status, 200);
        assert_eq!(s.events.last().map(|e| e.1.as_str()), Some("[DONE]"));
        let mut n = 0;
        for (_, d) in &s.events[..s.events.len() - 1] {
            let v: Value = serde_json::from_str(d).expect("JSON");
            check_chunk(&v, "text_completion");
            assert!(v.get("usage").is_none(), "no usage without include_usage: {v}");
            n += v["choices"][0]["text"].as_str().unwrap_or_default().split_whitespace().count();
        }
        assert_eq!(n, 5);
        let (st, v) = post_json(e.local_addr(), "/v1/completions",
            serde_json::json!({"model": DEFAULT_MODEL, "prompt": "a b c", "max_completion_tokens": 3}).to_string()).await;
        assert_eq!(st, 200);
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["usage"]["completion_tokens"], 3);
        assert_eq!(v["usage"]["total_tokens"], 6);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_field() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = start_default(0.05).await;
        let addr = e.local_addr();
        let cases = [
            ("/v1/chat/completions", r#"{"model":7,"messages":[{"role":"user","content":"x"}]}"#.to_owned(), Some("model")),
            ("/v1/chat/completions", r#"{"model":"mock-llama","messages":[{"role":"user","content":"x"}],"stream_options":{"include_usage":true}}"#.to_owned(), Some("stream_options")),
            ("/v1/chat/completions", r#"{"model":"mock-llama"}"#.to_owned(), Some("messages")),
            ("/v1/chat/completions", r#"{"model":"mock-llama","messages":[{"role":"user","content":"x"}],"max_tokens":0}"#.to_owned(), Some("max_tokens")),
            ("/v1/chat/completions", r#"{"model":"mock-llama","messages":[{"role":"user","content":"x"}],"stream":"yes"}"#.to_owned(), Some("stream")),
            ("/v1/completions", r#"{"model":"mock-llama","prompt":7}"#.to_owned(), Some("prompt")),
            ("/v1/chat/completions", "{oops".to_owned(), None),
        ];
        for (path, body, param) in cases {
            let (s, v) = post_json(addr, path, body.clone()).await;
            assert_eq!(s, 400, "{body}: {v}");
            let err = &v["error"];
            assert!(err["message"].is_string() && err["type"].is_string(), "{v}");
            assert!(err.get("code").is_some() && err.get("param").is_some(), "{v}");
            assert_eq!(err["param"].as_str(), param, "{body}: {v}");
        }
        // Without `model`, the model it serves (vLLM takes it so).
        let (s, v) = post_json(addr, "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"max_tokens":1}"#.to_owned()).await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["model"], DEFAULT_MODEL);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn models_loras_and_unknown_models() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let mut config = MockEngineConfig::new(engine(1000)).with_time_scale(0.05);
        config.loras = vec!["sql-lora".into()];
        let e = start(config).await;
        let addr = e.local_addr();
        let (s, list) = get(addr, "/v1/models").await;
        assert_eq!(s, 200);
        let list: Value = serde_json::from_str(&list).expect("JSON");
        let ids: Vec<&str> = list["data"]
            .as_array()
            .expect("data")
            .iter()
            .filter_map(|m| m["id"].as_str())
            .collect();
        assert_eq!(ids, [DEFAULT_MODEL, "sql-lora"]);
        assert_eq!(list["object"], "list");
        let (s, _) = post_json(
            addr,
            "/v1/chat/completions",
            chat_body("sql-lora", "hi there", 2, false),
        )
        .await;
        assert_eq!(s, 200);
        let (s, v) = post_json(
            addr,
            "/v1/chat/completions",
            chat_body("gpt-9", "hi", 2, false),
        )
        .await;
        assert_eq!(s, 404);
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(get(addr, "/health").await.0, 200);
        assert_eq!(get(addr, "/ping").await.0, 200);
        assert_eq!(get(addr, "/nope").await.0, 404);
        assert_eq!(get(addr, "/v1/chat/completions").await.0, 405);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn invocations_take_chat_or_completion_bodies_without_model() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = start_default(0.05).await;
        let addr = e.local_addr();
        let (s, v) = post_json(
            addr,
            "/invocations",
            r#"{"messages":[{"role":"user","content":"a b c d"}],"max_tokens":3}"#.into(),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(v["model"], DEFAULT_MODEL);
        assert_eq!(v["usage"]["prompt_tokens"], 4);
        let (s, v) = post_json(
            addr,
            "/invocations",
            r#"{"prompt":"a b","max_tokens":2}"#.into(),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert_eq!(v["object"], "text_completion");
        let (s, _) = post_json(addr, "/invocations", r#"{"inputs":"x"}"#.into()).await;
        assert_eq!(s, 400);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn instant_mode_answers_at_once_in_the_same_shapes() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // Real time (scale 1): the engine model would take well over a second for 4,000 words
        // with 200 output tokens on the small preset; instant mode answers in milliseconds.
        let e = start(MockEngineConfig {
            instant: true,
            ..MockEngineConfig::default()
        })
        .await;
        let text = words(4000, "i");
        let started = std::time::Instant::now();
        let s = post_stream(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body(DEFAULT_MODEL, &text, 200, true),
        )
        .await;
        assert_eq!(s.status, 200);
        assert!(s.clean_end);
        assert_eq!(s.events.last().map(|(_, d)| d.as_str()), Some("[DONE]"));
        let chunks: Vec<Value> = s.events[..s.events.len() - 1]
            .iter()
            .map(|(_, d)| serde_json::from_str(d).expect("chunk JSON"))
            .collect();
        // One chunk per token, then the usage chunk.
        assert_eq!(chunks.len(), 201);
        chunks[..200]
            .iter()
            .for_each(|c| check_chunk(c, "chat.completion.chunk"));
        let usage = &chunks[200]["usage"];
        assert_eq!(usage["completion_tokens"], 200);
        // No cache, so no cached count: the details are left out, not reported as 0.
        assert!(usage.get("prompt_tokens_details").is_none(), "{usage}");
        assert!(usage["prompt_tokens"].as_u64().is_some_and(|n| n > 1000));
        let (status, whole) = post_json(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body(DEFAULT_MODEL, &text, 200, false),
        )
        .await;
        assert_eq!(status, 200);
        assert_eq!(whole["object"], "chat.completion");
        assert_eq!(whole["usage"]["completion_tokens"], 200);
        assert!(whole["usage"].get("prompt_tokens_details").is_none());
        assert!(
            started.elapsed() < std::time::Duration::from_secs(1),
            "instant answers took {:?}",
            started.elapsed()
        );
        // What the engine would refuse, instant mode refuses too.
        let (status, err) = post_json(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body("other-model", &text, 5, false),
        )
        .await;
        assert_eq!(status, 404, "{err}");
        let (status, err) = post_json(e.local_addr(), "/v1/chat/completions", "{nope".into()).await;
        assert_eq!(status, 400, "{err}");
    })
    .await
    .expect("timed out");
}
