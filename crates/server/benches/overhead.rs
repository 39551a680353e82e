//! The router's own cost on loopback: the same client drives an instant-answer upstream directly
//! and through the router, with 16 KiB chat bodies.
//!
//! Phase 1, latency at a fixed rate (default 2,000 requests/s, open loop over 16 connections):
//! p50/p99/p99.9 both ways and what the router adds. Phase 2, maximum throughput (closed loop,
//! 32 connections): requests/s both ways and their ratio. Everything (client, router, four
//! upstreams) shares one process and the machine's cores, as a router shares a host with its
//! clients' load generator in this measurement.
//!
//! Run: `cargo bench -p prefix-router-server --bench overhead`
//! Knobs: `BENCH_SECONDS` (per phase and path, default 5), `BENCH_RATE` (default 2000),
//! `BENCH_WORKERS` (runtime worker threads, default 2), `BENCH_SEQ=1` (instead: one connection,
//! one request at a time, 16 KiB and tiny bodies: the added latency without any queueing),
//! `BENCH_MAX_ONLY=direct|router` (instead: only that path's throughput run, for profiling).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prefix_router_server::settings::Settings;
use prefix_router_server::Router;
use tokio::net::{TcpListener, TcpStream};

const ANSWER: &[u8] = br#"{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// 16 KiB chat bodies, each with its own document (distinct routing keys).
fn bodies(n: usize) -> Vec<Bytes> {
    (0..n)
        .map(|i| {
            let mut doc = format!("Document {i}. ");
            let mut x = i as u64 + 1;
            while doc.len() < 16 * 1024 - 200 {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                doc.push_str(
                    ["policy ", "clause ", "section ", "rate ", "term ", "limit "]
                        [(x >> 60) as usize % 6],
                );
            }
            let body = serde_json::json!({
                "model": "m",
                "messages": [
                    {"role": "system", "content": doc},
                    {"role": "user", "content": "Summarise."}
                ]
            });
            Bytes::from(body.to_string())
        })
        .collect()
}

async fn upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async move {
                    let _ = req.into_body().collect().await;
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(ANSWER))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connection(addr: SocketAddr) -> Sender {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let _ = stream.set_nodelay(true);
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

async fn one(sender: &mut Sender, body: &Bytes) -> Duration {
    let req = Request::post("/v1/chat/completions")
        .header("host", "bench")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .expect("request");
    let start = Instant::now();
    sender.ready().await.expect("connection ready");
    let resp = sender.send_request(req).await.expect("response");
    assert!(resp.status().is_success(), "status {}", resp.status());
    let _ = resp.into_body().collect().await.expect("body");
    start.elapsed()
}

/// Open loop at `rate` requests/s spread over `conns` connections; latencies in microseconds.
async fn fixed_rate(addr: SocketAddr, bodies: Arc<Vec<Bytes>>, rate: u64, secs: u64) -> Vec<u64> {
    let conns = 16u64;
    let per_conn = Duration::from_secs_f64(conns as f64 / rate as f64);
    let mut tasks = Vec::new();
    for c in 0..conns {
        let bodies = Arc::clone(&bodies);
        tasks.push(tokio::spawn(async move {
            let mut sender = connection(addr).await;
            let mut out = Vec::new();
            // Staggered starts: the connections must not fire in synchronized bursts.
            let offset = per_conn.mul_f64(c as f64 / conns as f64);
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + offset, per_conn);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let end = Instant::now() + Duration::from_secs(secs);
            let mut i = c as usize;
            while Instant::now() < end {
                tick.tick().await;
                out.push(
                    one(&mut sender, &bodies[i % bodies.len()])
                        .await
                        .as_micros() as u64,
                );
                i += conns as usize;
            }
            out
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    all.sort_unstable();
    all
}

/// Closed loop over `conns` connections; requests per second.
async fn max_rate(addr: SocketAddr, bodies: Arc<Vec<Bytes>>, secs: u64) -> f64 {
    let conns = 32usize;
    let end = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..conns {
        let bodies = Arc::clone(&bodies);
        tasks.push(tokio::spawn(async move {
            let mut sender = connection(addr).await;
            let mut n = 0u64;
            let mut i = c;
            while Instant::now() < end {
                one(&mut sender, &bodies[i % bodies.len()]).await;
                n += 1;
                i += conns;
            }
            n
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("client task");
    }
    total as f64 / start.elapsed().as_secs_f64()
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

fn main() {
    let secs = env("BENCH_SECONDS", 5);
    let rate = env("BENCH_RATE", 2000);
    let workers = env("BENCH_WORKERS", 2) as usize;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut ups = Vec::new();
        for _ in 0..4 {
            ups.push(upstream().await);
        }
        let urls: Vec<String> = ups.iter().map(|a| format!("http://{a}")).collect();
        let mut settings = Settings::with_instances(urls).expect("settings");
        settings.listen = "127.0.0.1:0".parse().expect("addr");
        settings.health.active = false;
        let router = Router::start(settings, None).await.expect("router");
        let routed = router.local_addr();
        let direct = ups[0];
        let bodies = Arc::new(bodies(256));
        // Warm up connections and allocators on both paths.
        fixed_rate(direct, Arc::clone(&bodies), rate, 1).await;
        fixed_rate(routed, Arc::clone(&bodies), rate, 1).await;

        if let Ok(which) = std::env::var("BENCH_MAX_ONLY") {
            let a = if which == "router" { routed } else { direct };
            let start = Instant::now();
            let rps = max_rate(a, Arc::clone(&bodies), secs).await;
            println!(
                "{which}: {rps:.0} rps, {:.0} requests",
                rps * start.elapsed().as_secs_f64()
            );
            return;
        }
        if std::env::var("BENCH_SEQ").is_ok() {
            for (name, a) in [("direct", direct), ("router", routed)] {
                let mut sender = connection(a).await;
                let mut v: Vec<u64> = Vec::new();
                for i in 0..2000 {
                    v.push(
                        one(&mut sender, &bodies[i % bodies.len()])
                            .await
                            .as_micros() as u64,
                    );
                }
                v.sort_unstable();
                println!(
                    "sequential {name}: p50 {} p99 {}",
                    pct(&v, 0.5),
                    pct(&v, 0.99)
                );
            }
            let small: Vec<Bytes> = (0..64)
                .map(|i| {
                    Bytes::from(format!(
                        r#"{{"messages":[{{"role":"user","content":"hi {i}"}}]}}"#
                    ))
                })
                .collect();
            for (name, a) in [("direct", direct), ("router", routed)] {
                let mut sender = connection(a).await;
                let mut v: Vec<u64> = Vec::new();
                for i in 0..2000 {
                    v.push(one(&mut sender, &small[i % small.len()]).await.as_micros() as u64);
                }
                v.sort_unstable();
                println!(
                    "sequential small {name}: p50 {} p99 {}",
                    pct(&v, 0.5),
                    pct(&v, 0.99)
                );
            }
            return;
        }
        println!(
            "loopback overhead: 16 KiB chat bodies, {workers} runtime threads, {secs} s per run"
        );
        let d = fixed_rate(direct, Arc::clone(&bodies), rate, secs).await;
        let r = fixed_rate(routed, Arc::clone(&bodies), rate, secs).await;
        println!("\nlatency at {rate} requests/s (microseconds)");
        println!(
            "{:<10} {:>8} {:>8} {:>8} {:>8}",
            "path", "p50", "p90", "p99", "p99.9"
        );
        for (name, v) in [("direct", &d), ("router", &r)] {
            println!(
                "{:<10} {:>8} {:>8} {:>8} {:>8}",
                name,
                pct(v, 0.5),
                pct(v, 0.9),
                pct(v, 0.99),
                pct(v, 0.999)
            );
        }
        let add = |p: f64| pct(&r, p) as i64 - pct(&d, p) as i64;
        println!(
            "{:<10} {:>8} {:>8} {:>8} {:>8}",
            "added",
            add(0.5),
            add(0.9),
            add(0.99),
            add(0.999)
        );

        let dmax = max_rate(direct, Arc::clone(&bodies), secs).await;
        let rmax = max_rate(routed, Arc::clone(&bodies), secs).await;
        println!("\nmaximum throughput (closed loop, 32 connections)");
        println!("direct {dmax:>10.0} requests/s");
        println!("router {rmax:>10.0} requests/s");
        println!("ratio  {:>10.2}", rmax / dmax);
        router.shutdown().await;
    });
}
