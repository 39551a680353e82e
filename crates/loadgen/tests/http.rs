//! The load generator against small stand-in servers on 127.0.0.1.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{refused_url, reserved_url, start, start_on, After, Behaviour};
use prefix_router_loadgen::schedule::send_offsets;
use prefix_router_loadgen::{run, BenchConfig, BenchOutcome, FailureKind, LoadMode};
use prefix_router_workload::{
    generate, Arrival, Message, Request, Role, Segment, WorkloadKind, WorkloadSpec,
};

const MS: Duration = Duration::from_millis(1);

/// `n` small requests, `gap_s` apart.
fn requests(n: u64, gap_s: f64) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            id: i,
            arrival_s: i as f64 * gap_s,
            group: None,
            model: None,
            messages: vec![Message::new(
                Role::User,
                vec![Segment {
                    id: 1000 + i,
                    tokens: 8,
                }],
            )],
            output_tokens: 4,
        })
        .collect()
}

fn closed(url: &str, concurrency: u32) -> BenchConfig {
    let mut c = BenchConfig::new(url, LoadMode::ClosedLoop { concurrency });
    c.timeout = Duration::from_secs(5);
    // A refused target is a failure to count here, not one to wait for.
    c.wait_for_target = Duration::ZERO;
    c
}

async fn bench(config: &BenchConfig, requests: Vec<Request>) -> BenchOutcome {
    match run(config, requests).await {
        Ok(o) => o,
        Err(e) => panic!("run failed: {e}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_holds_its_rate_against_a_slow_target() {
    let target = start(Behaviour {
        first_after: 300 * MS,
        last_after: 300 * MS,
        chunks: 1,
        ..Behaviour::default()
    })
    .await;
    let mut spec = WorkloadSpec::default_for(WorkloadKind::Rag);
    spec.seed = 7;
    spec.requests = 200;
    spec.arrival = Arrival::Poisson { rate: 50.0 };
    let reqs: Vec<Request> = generate(&spec).collect();
    let due_in_first_second = send_offsets(&reqs, None)
        .iter()
        .filter(|&&t| t < 1.0)
        .count() as u64;
    assert!(
        (35..=65).contains(&due_in_first_second),
        "{due_in_first_second}"
    );

    let mut config = BenchConfig::new(&target.url, LoadMode::OpenLoop { rate: None });
    config.duration = Some(Duration::from_secs(1));
    config.timeout = Duration::from_secs(5);
    let started = Instant::now();
    let out = bench(&config, reqs).await;
    let wall = started.elapsed();

    // Every request due within the second was sent and answered, none after it.
    assert_eq!(out.planned, due_in_first_second);
    assert_eq!(out.sent(), due_in_first_second);
    assert_eq!(out.completed(), out.sent(), "{:?}", out.failures());
    // Sends followed the schedule, not the 300 ms answers: spread over about a second, many
    // at once at the server, each on time.
    let arrivals = target.seen.arrivals();
    let spread = arrivals.last().copied().unwrap_or(0.0) - arrivals.first().copied().unwrap_or(0.0);
    assert!(
        (0.7..1.1).contains(&spread),
        "arrivals spread over {spread} s"
    );
    assert!(target.seen.max_in_flight.load(Ordering::SeqCst) >= 8);
    let lag = out.send_lag_ms();
    // Generous bounds: the test machine may be busy; a serialized sender would be seconds late.
    assert!(lag.p99 < 100.0, "send lag {lag:?}");
    let (sent_rate, due_rate) = (
        out.send_rate_rps().unwrap_or(0.0),
        out.scheduled_rate_rps().unwrap_or(0.0),
    );
    assert!(
        (sent_rate / due_rate - 1.0).abs() < 0.1,
        "{sent_rate} vs {due_rate}"
    );
    assert!(out.e2e_ms().p50 >= 300.0);
    // One second of sending plus the last answer's 300 ms, not 50 x 300 ms.
    assert!(wall < Duration::from_millis(3000), "{wall:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_keeps_exactly_c_in_flight() {
    let target = start(Behaviour {
        first_after: 60 * MS,
        last_after: 60 * MS,
        chunks: 1,
        ..Behaviour::default()
    })
    .await;
    let started = Instant::now();
    let out = bench(&closed(&target.url, 4), requests(16, 0.0)).await;
    let wall = started.elapsed();
    assert_eq!(out.completed(), 16);
    assert_eq!(target.seen.max_in_flight.load(Ordering::SeqCst), 4);
    // Four rounds of four.
    assert!(wall >= 240 * MS && wall < 1500 * MS, "{wall:?}");
    // Requests went out in workload order.
    let ids: Vec<u64> = out.records.iter().map(|r| r.id).collect();
    assert_eq!(ids, (0..16).collect::<Vec<u64>>());
    assert_eq!(
        out.send_lag_ms().count,
        0,
        "closed loop has no schedule to lag"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_stops_sending_and_waits_for_in_flight() {
    let target = start(Behaviour {
        first_after: 100 * MS,
        last_after: 100 * MS,
        chunks: 1,
        ..Behaviour::default()
    })
    .await;
    let mut config = closed(&target.url, 2);
    config.duration = Some(350 * MS);
    let started = Instant::now();
    let out = bench(&config, requests(1000, 0.0)).await;
    let wall = started.elapsed();
    // Two workers, a new request every 100 ms each, none taken after 350 ms.
    assert!((4..=10).contains(&out.sent()), "{}", out.sent());
    assert_eq!(out.completed(), out.sent());
    assert!(out.records.iter().all(|r| r.sent_s < 0.35 + 0.02));
    assert!(wall < 1200 * MS, "{wall:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttft_and_e2e_are_measured_separately() {
    let target = start(Behaviour {
        first_after: 100 * MS,
        last_after: 300 * MS,
        chunks: 5,
        usage: Some((40, 5, 0)),
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&target.url, 1), requests(3, 0.0)).await;
    assert_eq!(out.completed(), 3);
    let (ttft, e2e) = (out.ttft_ms(), out.e2e_ms());
    assert!((100.0..250.0).contains(&ttft.p50), "{ttft:?}");
    assert!((300.0..500.0).contains(&e2e.p50), "{e2e:?}");
    assert!(ttft.max < e2e.p50);
    for r in &out.records {
        assert_eq!(r.content_chunks, 5);
        assert_eq!(r.output_tokens(), 5);
    }
    assert_eq!(out.output_tokens(), 15);
    assert_eq!(out.ttft_percentiles_ms().len(), 101);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_tokens_and_router_headers_are_read() {
    let target = start(Behaviour {
        usage: Some((1000, 4, 768)),
        headers: vec![
            ("x-prefix-router-instance", "engine-b".into()),
            ("x-prefix-router-decision", "overflow".into()),
        ],
        ..Behaviour::default()
    })
    .await;
    let mut config = closed(&target.url, 2);
    config.model = Some("my-model".into());
    let out = bench(&config, requests(4, 0.0)).await;
    assert_eq!(out.completed(), 4);
    assert_eq!((out.prompt_tokens(), out.cached_tokens()), (4000, 3072));
    assert!((out.hit_rate() - 0.768).abs() < 1e-12);
    assert_eq!(out.cached_tokens_reported(), 4);
    assert_eq!(out.instance_requests().get("engine-b"), Some(&4));
    assert_eq!(out.decisions().get("overflow"), Some(&4));
    assert_eq!(out.overflow_rate(), 1.0);
    // What was sent: the streaming chat body with usage asked for and the model replaced.
    for body in target.seen.bodies() {
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["model"], "my-model");
        assert_eq!(body["max_tokens"], 4);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn output_tokens_fall_back_to_counted_chunks() {
    let target = start(Behaviour {
        chunks: 6,
        usage: None,
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&target.url, 1), requests(2, 0.0)).await;
    assert_eq!(out.completed(), 2);
    assert_eq!(out.output_tokens(), 12);
    assert_eq!((out.prompt_tokens(), out.hit_rate()), (0, 0.0));
}

fn kinds(out: &BenchOutcome) -> Vec<(FailureKind, u64)> {
    out.failures().into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_counted_by_kind() {
    // Nothing listening.
    let url = refused_url().await;
    let out = bench(&closed(&url, 2), requests(3, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::Connect, 3)]);
    assert_eq!(out.completed(), 0);

    // A 500 answer.
    let t = start(Behaviour {
        status: 500,
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(2, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::Http5xx, 2)]);
    assert!(out.records.iter().all(|r| r.status == Some(500)));

    // A 404 answer.
    let t = start(Behaviour {
        status: 404,
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(1, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::Http4xx, 1)]);
    // The detail says what the target said, not only its status.
    let detail = out.records[0].failure.as_ref().map(|f| f.detail.clone());
    assert_eq!(detail.as_deref(), Some("HTTP 404 Not Found: no"));

    // Chunks that are not JSON.
    let t = start(Behaviour {
        raw_chunk: Some("{oops"),
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(1, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::MalformedStream, 1)]);

    // A stream that ends without [DONE].
    let t = start(Behaviour {
        done: false,
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(1, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::MalformedStream, 1)]);

    // An error event inside the stream.
    let t = start(Behaviour {
        raw_chunk: Some(r#"{"error":{"message":"engine died"}}"#),
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(1, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::StreamError, 1)]);
    let detail = out.records[0].failure.as_ref().map(|f| f.detail.clone());
    assert_eq!(detail.as_deref(), Some("engine died"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_is_complete_at_done_however_its_stream_ends() {
    for after in [After::Cut, After::Hang(3000 * MS)] {
        let t = start(Behaviour {
            after,
            ..Behaviour::default()
        })
        .await;
        let mut config = closed(&t.url, 1);
        config.timeout = 1000 * MS;
        let started = Instant::now();
        let out = bench(&config, requests(2, 0.0)).await;
        assert_eq!(kinds(&out), vec![], "{after:?}");
        assert_eq!(out.completed(), 2, "{after:?}");
        // Ended at [DONE], not when the stream did.
        assert!(out.e2e_ms().max < 500.0, "{after:?}: {:?}", out.e2e_ms());
        assert!(started.elapsed() < 1500 * MS, "{after:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_that_were_not_streamed_are_told_apart() {
    // A target that ignores `stream: true`: complete, and counted as not streamed.
    let t = start(Behaviour {
        whole: true,
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(2, 0.0)).await;
    assert_eq!(out.completed(), 2, "{:?}", out.failures());
    assert_eq!(out.unstreamed(), 2);
    // A stream without its content type: a failure that says so.
    let t = start(Behaviour {
        untyped: true,
        ..Behaviour::default()
    })
    .await;
    let out = bench(&closed(&t.url, 1), requests(1, 0.0)).await;
    assert_eq!(kinds(&out), vec![(FailureKind::MalformedStream, 1)]);
    let detail = out.records[0].failure.as_ref().map(|f| f.detail.clone());
    assert!(
        detail
            .as_deref()
            .is_some_and(|d| d.contains("without `content-type: text/event-stream`")),
        "{detail:?}"
    );
    // A streamed one is not counted.
    let t = start(Behaviour::default()).await;
    assert_eq!(
        bench(&closed(&t.url, 1), requests(1, 0.0))
            .await
            .unstreamed(),
        0
    );
}

/// `--unstreamed`: that share of the requests, spread through the run, goes out with
/// `stream: false`; their whole answers are theirs by request, not a target ignoring a stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_of_requests_asks_for_whole_answers() {
    let t = start(Behaviour {
        whole: true,
        ..Behaviour::default()
    })
    .await;
    let mut config = closed(&t.url, 1);
    config.unstreamed = 0.5;
    let out = bench(&config, requests(4, 0.0)).await;
    assert_eq!(out.completed(), 4, "{:?}", out.failures());
    let streams: Vec<bool> = t
        .seen
        .bodies()
        .iter()
        .map(|b| b["stream"].as_bool().unwrap_or(false))
        .collect();
    assert_eq!(streams.iter().filter(|&&s| !s).count(), 2, "{streams:?}");
    assert_eq!(out.asked_whole(), 2);
    // The two that asked for a stream got a whole answer: those are the target's doing.
    assert_eq!(out.unstreamed(), 2);
    config.unstreamed = 1.5;
    assert!(
        run(&config, requests(1, 0.0)).await.is_err(),
        "a share over 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_answers_time_out() {
    let t = start(Behaviour {
        first_after: 3000 * MS,
        last_after: 3000 * MS,
        ..Behaviour::default()
    })
    .await;
    let mut config = closed(&t.url, 2);
    config.timeout = 200 * MS;
    let started = Instant::now();
    let out = bench(&config, requests(2, 0.0)).await;
    assert!(started.elapsed() < 1500 * MS);
    assert_eq!(kinds(&out), vec![(FailureKind::Timeout, 2)]);
    // The head arrived before the timeout: the status is still recorded.
    assert!(out.records.iter().all(|r| r.status == Some(200)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_send_nothing() {
    let t = start(Behaviour::default()).await;
    let config = closed(&t.url, 0);
    assert!(run(&config, requests(2, 0.0)).await.is_err());
    let config = closed("https://127.0.0.1:1", 1);
    assert!(run(&config, requests(2, 0.0)).await.is_err());
    assert!(t.seen.arrivals().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_the_target_does_not_list_is_refused_before_sending() {
    let t = start(Behaviour {
        models: vec!["served-a", "served-b"],
        ..Behaviour::default()
    })
    .await;
    let mut reqs = requests(3, 0.0);
    for r in &mut reqs {
        r.model = Some("other".into());
    }
    let e = run(&closed(&t.url, 1), reqs.clone())
        .await
        .err()
        .map(|e| e.to_string());
    assert_eq!(
        e.as_deref(),
        Some("model: the requests name 'other' but the target serves 'served-a', 'served-b' (GET /v1/models); pass --model served-a")
    );
    assert!(t.seen.arrivals().is_empty(), "nothing was sent");
    // With the model it lists, the run goes ahead.
    let mut config = closed(&t.url, 1);
    config.model = Some("served-b".into());
    let out = bench(&config, reqs).await;
    assert_eq!(out.completed(), 3);
    assert_eq!(out.model_from_target, None);
    // Requests that name no model get the first one it lists.
    let mut reqs = requests(2, 0.0);
    for r in &mut reqs {
        r.model = None;
    }
    let out = bench(&closed(&t.url, 1), reqs).await;
    assert_eq!(out.completed(), 2);
    assert_eq!(out.model_from_target.as_deref(), Some("served-a"));
    let models: Vec<_> = t.seen.bodies().iter().map(|b| b["model"].clone()).collect();
    assert_eq!(models[models.len() - 2..], ["served-a", "served-a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_comes_up_a_moment_later_is_waited_for() {
    let (url, reservation) = reserved_url();
    let addr = url.trim_start_matches("http://").to_string();
    let late = tokio::spawn(async move {
        tokio::time::sleep(300 * MS).await;
        drop(reservation);
        start_on(
            &addr,
            Behaviour {
                models: vec!["late-model"],
                ..Behaviour::default()
            },
        )
        .await
    });
    let mut config = closed(&url, 1);
    config.wait_for_target = Duration::from_secs(5);
    let mut reqs = requests(2, 0.0);
    for r in &mut reqs {
        r.model = None;
    }
    let out = bench(&config, reqs).await;
    assert_eq!(out.completed(), 2, "{:?}", out.failures());
    assert_eq!(out.model_from_target.as_deref(), Some("late-model"));
    drop(late.await);
}
