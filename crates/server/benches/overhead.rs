//! The router's own cost on loopback: the same client drives an instant-answer upstream directly
//! and through the router, with 16 KiB chat bodies.
//!
//! Phase 1, latency at a fixed rate (default 2,000 requests/s, open loop over 16 connections):
//! p50/p99/p99.9 both ways and what the router adds. Phase 2, maximum throughput (closed loop,
//! 32 connections, direct and router runs alternating for `BENCH_ROUNDS`): requests/s both ways,
//! their ratio, and the CPU time spent per request (per component with `BENCH_LAYOUT=split`),
//! whose ratio is what bounds the throughput ratio when all of it shares the same cores.
//! Everything (client, router, four upstreams) runs in one process on the machine's cores, as a
//! router shares a host with its clients' load generator in this measurement.
//!
//! Run: `bench/router-overhead.sh` (or `cargo bench -p prefix-router-server --bench overhead`)
//! Knobs: `BENCH_SECONDS` (latency run per path, default 5), `BENCH_RATE` (default 2000),
//! `BENCH_MAX_SECONDS` (throughput run, default 3), `BENCH_ROUNDS` (default 3),
//! `BENCH_WORKERS` (worker threads per runtime, default 2), `BENCH_LAYOUT=shared|split`,
//! `BENCH_SEQ=1` (instead: one connection, one request at a time, 16 KiB and tiny bodies: the
//! added latency without any queueing), `BENCH_MAX_ONLY=direct|router` (instead: only that
//! path's throughput run, for profiling).

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

#[path = "../tests/support/chat_body.rs"]
mod chat_body;

const ANSWER: &[u8] = br#"{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// 16 KiB chat bodies, each with its own document (distinct routing keys).
fn bodies(n: usize) -> Vec<Bytes> {
    (0..n).map(chat_body::chat_body).collect()
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

/// Closed loop over `conns` connections; requests done and seconds taken.
async fn max_rate(addr: SocketAddr, bodies: Arc<Vec<Bytes>>, secs: u64) -> (u64, f64) {
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
    (total, start.elapsed().as_secs_f64())
}

fn pct(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let idx = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[idx]
}

/// CPU time of this process's threads, summed by thread name (each runtime names its threads
/// after its component): total nanoseconds on a CPU (`/proc/self/task/*/schedstat`) and the
/// user and kernel clock ticks (`stat`).
fn thread_cpu() -> std::collections::BTreeMap<String, [u64; 3]> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for t in tasks.flatten() {
        let dir = t.path();
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let ns: u64 = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        // Fields 14 and 15 of `stat` (utime, stime); field 3 is the first after the name.
        let stat = std::fs::read_to_string(dir.join("stat")).unwrap_or_default();
        let rest: Vec<&str> = stat
            .rsplit_once(')')
            .map(|(_, r)| r.split_whitespace().collect())
            .unwrap_or_default();
        let field = |n: usize| -> u64 { rest.get(n - 3).and_then(|x| x.parse().ok()).unwrap_or(0) };
        let (user, sys) = (field(14), field(15));
        let name = match name.trim() {
            n if n.starts_with("bench-") => n.trim_start_matches("bench-").to_string(),
            _ => "main".to_string(),
        };
        let e = out.entry(name).or_insert([0; 3]);
        e[0] += ns;
        e[1] += user;
        e[2] += sys;
    }
    out
}

/// By component: CPU microseconds per request between two `thread_cpu` readings, and the share
/// of it spent in the kernel.
fn cpu_per_request(
    before: &std::collections::BTreeMap<String, [u64; 3]>,
    after: &std::collections::BTreeMap<String, [u64; 3]>,
    requests: f64,
) -> Vec<(String, f64, f64)> {
    let mut v: Vec<(String, f64, f64)> = after
        .iter()
        .map(|(k, a)| {
            let b = before.get(k).copied().unwrap_or([0; 3]);
            let us = a[0].saturating_sub(b[0]) as f64 / 1e3 / requests.max(1.0);
            let (u, s) = (a[1].saturating_sub(b[1]), a[2].saturating_sub(b[2]));
            let sys = if u + s == 0 {
                0.0
            } else {
                s as f64 / (u + s) as f64
            };
            (k.clone(), us, sys)
        })
        .collect();
    let total = v.iter().map(|x| x.1).sum();
    let sys = v.iter().map(|x| x.1 * x.2).sum::<f64>() / f64::max(total, 1e-9);
    v.push(("total".into(), total, sys));
    v
}

fn runtime(name: &str, workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name(format!("bench-{name}"))
        .enable_all()
        .build()
        .expect("runtime")
}

struct Max {
    rps: f64,
    cpu: Vec<(String, f64, f64)>,
}

/// One closed-loop run against `addr`, with the CPU each component spent per request.
async fn measure_max(addr: SocketAddr, bodies: &Arc<Vec<Bytes>>, secs: u64) -> Max {
    let before = thread_cpu();
    let (n, took) = max_rate(addr, Arc::clone(bodies), secs).await;
    let after = thread_cpu();
    Max {
        rps: n as f64 / took,
        cpu: cpu_per_request(&before, &after, n as f64),
    }
}

fn print_cpu(name: &str, m: &Max) {
    let parts: Vec<String> = m
        .cpu
        .iter()
        .filter(|(k, us, _)| k != "main" && *us >= 0.05)
        .map(|(k, us, sys)| format!("{k} {us:.1} ({:.0}% kernel)", sys * 100.0))
        .collect();
    println!(
        "{name:<7} {:>8.0} requests/s   CPU us/request: {}",
        m.rps,
        parts.join(", ")
    );
}

fn main() {
    let secs = env("BENCH_SECONDS", 5);
    let max_secs = env("BENCH_MAX_SECONDS", 3);
    let rounds = env("BENCH_ROUNDS", 3).max(1);
    let rate = env("BENCH_RATE", 2000);
    let workers = env("BENCH_WORKERS", 2) as usize;
    // `shared` (default): one runtime of `workers` threads runs client, router and upstreams.
    // `split`: each on its own runtime of `workers` threads, like three processes on the same
    // cores (the router's runtime idles during the direct runs); CPU per request is then also
    // reported per component.
    let layout = std::env::var("BENCH_LAYOUT").unwrap_or_else(|_| "shared".into());
    let (client_rt, router_rt, upstream_rt) = match layout.as_str() {
        "shared" => (runtime("shared", workers), None, None),
        "split" => (
            runtime("client", workers),
            Some(runtime("router", workers)),
            Some(runtime("upstream", workers)),
        ),
        other => panic!("BENCH_LAYOUT must be split or shared, not {other}"),
    };
    let client = client_rt.handle().clone();
    let router_h = router_rt
        .as_ref()
        .map_or(client.clone(), |r| r.handle().clone());
    let upstream_h = upstream_rt
        .as_ref()
        .map_or(client.clone(), |r| r.handle().clone());

    let ups: Vec<SocketAddr> = upstream_h.block_on(async {
        let mut ups = Vec::new();
        for _ in 0..4 {
            ups.push(upstream().await);
        }
        ups
    });
    let urls: Vec<String> = ups.iter().map(|a| format!("http://{a}")).collect();
    let mut settings = Settings::with_instances(urls).expect("settings");
    settings.listen = "127.0.0.1:0".parse().expect("addr");
    settings.health.active = false;
    let router = router_h
        .block_on(Router::start(settings, None))
        .expect("router");
    let routed = router.local_addr();
    let direct = ups[0];
    let bodies = Arc::new(bodies(256));

    client.block_on(async {
        // Warm up connections and allocators on both paths.
        fixed_rate(direct, Arc::clone(&bodies), rate, 1).await;
        fixed_rate(routed, Arc::clone(&bodies), rate, 1).await;

        if let Ok(which) = std::env::var("BENCH_MAX_ONLY") {
            let a = if which == "router" { routed } else { direct };
            let m = measure_max(a, &bodies, secs).await;
            print_cpu(&which, &m);
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
            "loopback overhead: 16 KiB chat bodies, layout {layout}, {workers} worker threads per \
             runtime, {secs} s per latency run, {rounds} x {max_secs} s throughput runs per path"
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

        println!("\nmaximum throughput (closed loop, 32 connections; direct and router alternate)");
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let dm = measure_max(direct, &bodies, max_secs).await;
            let rm = measure_max(routed, &bodies, max_secs).await;
            println!("round {round}");
            print_cpu("direct", &dm);
            print_cpu("router", &rm);
            ratios.push(rm.rps / dm.rps);
        }
        ratios.sort_by(f64::total_cmp);
        let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!(
            "ratio router/direct: median {:.2} (rounds: {})",
            ratios[ratios.len() / 2],
            listed.join(" ")
        );
    });
    router_h.block_on(router.shutdown());
}
