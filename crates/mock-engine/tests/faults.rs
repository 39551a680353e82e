//! Fault flags: injected failures, latency spikes, stopping, cut streams.

mod support;

use std::time::{Duration, Instant};

use prefix_router_mock_engine::{Faults, MockEngine, MockEngineConfig, DEFAULT_MODEL};
use support::*;

async fn with_faults(faults: Faults, seed: u64) -> MockEngine {
    let mut c = MockEngineConfig::new(engine(1000)).with_time_scale(0.05);
    c.faults = faults;
    c.seed = seed;
    start(c).await
}

fn body(i: usize) -> String {
    chat_body(DEFAULT_MODEL, &words(10, &format!("f{i}-")), 2, false)
}

#[tokio::test]
async fn fail_rate_fails_that_share_with_the_status_and_repeats_with_the_seed() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let faults = Faults {
            fail_rate: 0.5,
            fail_status: 503,
            ..Faults::default()
        };
        let mut runs = Vec::new();
        for _ in 0..2 {
            let e = with_faults(faults.clone(), 42).await;
            let mut statuses = Vec::new();
            for i in 0..40 {
                let (s, v) = post_json(e.local_addr(), "/v1/chat/completions", body(i)).await;
                if s != 200 {
                    assert_eq!(s, 503);
                    assert!(v["error"]["message"].is_string(), "{v}");
                }
                statuses.push(s.as_u16());
            }
            runs.push(statuses);
        }
        assert_eq!(runs[0], runs[1], "same seed, same failures");
        let failed = runs[0].iter().filter(|&&s| s == 503).count();
        assert!((8..=32).contains(&failed), "{failed} of 40");
        let all = with_faults(
            Faults {
                fail_rate: 1.0,
                ..Faults::default()
            },
            1,
        )
        .await;
        assert_eq!(
            post_json(all.local_addr(), "/v1/chat/completions", body(0))
                .await
                .0,
            500
        );
        assert_eq!(
            get(all.local_addr(), "/health").await.0,
            200,
            "health is not failed"
        );
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn latency_spikes_delay_requests() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let faults = Faults {
            latency_spike_rate: 1.0,
            latency_spike: Duration::from_millis(150),
            ..Faults::default()
        };
        let e = with_faults(faults, 0).await;
        let t = Instant::now();
        let (s, _) = post_json(e.local_addr(), "/v1/chat/completions", body(0)).await;
        assert_eq!(s, 200);
        assert!(
            t.elapsed() >= Duration::from_millis(150),
            "{:?}",
            t.elapsed()
        );
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn stop_after_n_requests_answers_503_everywhere_but_metrics() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = with_faults(
            Faults {
                stop_after: Some(2),
                ..Faults::default()
            },
            0,
        )
        .await;
        let addr = e.local_addr();
        assert_eq!(get(addr, "/health").await.0, 200);
        for i in 0..2 {
            assert_eq!(
                post_json(addr, "/v1/chat/completions", body(i)).await.0,
                200
            );
        }
        assert_eq!(
            post_json(addr, "/v1/chat/completions", body(9)).await.0,
            503
        );
        assert_eq!(get(addr, "/health").await.0, 503);
        assert_eq!(get(addr, "/v1/models").await.0, 503);
        assert_eq!(get(addr, "/metrics").await.0, 200);
    })
    .await
    .expect("timed out");
}

#[tokio::test]
async fn streams_are_cut_after_n_tokens() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let e = with_faults(
            Faults {
                close_stream_after_tokens: Some(3),
                ..Faults::default()
            },
            0,
        )
        .await;
        let s = post_stream(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body(DEFAULT_MODEL, "a b c", 10, true),
        )
        .await;
        assert_eq!(s.status, 200);
        assert!(!s.clean_end, "the stream must end abnormally");
        assert!(s.events.iter().all(|(_, d)| d != "[DONE]"));
        let mut tokens = 0;
        for (_, d) in &s.events {
            let v: serde_json::Value = serde_json::from_str(d).expect("JSON");
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                tokens += c.split_whitespace().count();
            }
        }
        assert_eq!(tokens, 3);
        // Shorter answers than the cut point are not affected.
        let s = post_stream(
            e.local_addr(),
            "/v1/chat/completions",
            chat_body(DEFAULT_MODEL, "a", 3, true),
        )
        .await;
        assert!(s.clean_end);
        assert_eq!(s.events.last().map(|e| e.1.as_str()), Some("[DONE]"));
    })
    .await
    .expect("timed out");
}
