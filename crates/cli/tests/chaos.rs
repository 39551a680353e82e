//! Chaos: real processes on 127.0.0.1 (mock engines and `serve`, this build's binary) under an
//! open-loop load, while engines are killed mid-stream (SIGKILL), hung (SIGSTOP, then SIGCONT),
//! all taken down and brought back, added and removed through the admin API, and the instance
//! list reloaded with SIGHUP, and added and removed by DNS (SRV records from a name server the
//! test runs). Each case reports requests sent, answered, failed with a clear
//! error, retried by the router, and lost; and checks that none is lost, every failure says
//! what happened, and nothing is left in flight.
//!
//! `CHAOS_RATE` (requests per second, default 25) and `CHAOS_SECONDS` (per case, default 4)
//! scale it; `bench/chaos.sh` runs it longer on a release build and writes the table that
//! RELIABILITY.md quotes.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use prefix_router_loadgen::{BenchConfig, BenchOutcome, FailureKind, LoadMode};

#[path = "../../server/tests/support/dns.rs"]
mod dns;
use prefix_router_workload::{Message, Request, Role, Segment};

mod support;
use support::*;

fn env_f64(name: &str, default: f64) -> f64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn signal(child: &Child, sig: &str) {
    assert!(signal_pid(child.id(), sig), "kill -{sig} {}", child.id());
}

/// An admin API call naming one instance: (status, body).
fn admin_post(admin: u16, path: &str, url: &str) -> (u16, String) {
    http(admin, "POST", path, &format!(r#"{{"url":"{url}"}}"#))
}

/// The router process, configured from a file it reloads on SIGHUP.
struct Router {
    port: u16,
    admin: u16,
    config: PathBuf,
    child: Child,
}

fn config_text(port: u16, admin: u16, instances: &[String]) -> String {
    let mut text = format!(
        r#"listen = "127.0.0.1:{port}"
[admin]
listen = "127.0.0.1:{admin}"
token = "{TOKEN}"
[timeouts]
connect_ms = 500
first_byte_ms = 3000
idle_stream_ms = 1500
shutdown_grace_ms = 3000
[health]
interval_ms = 200
timeout_ms = 300
unhealthy_threshold = 2
healthy_threshold = 1
passive_failures = 2
eject_backoff_ms = 500
max_eject_backoff_ms = 2000
"#
    );
    for url in instances {
        text.push_str(&format!("[[instances]]\nurl = \"{url}\"\n"));
    }
    text
}

impl Router {
    fn start(dir: &std::path::Path, instances: &[String]) -> Router {
        Router::start_with(dir, instances, "", instances.len())
    }

    /// A router with `extra` appended to its configuration, ready once `n` instances are.
    fn start_with(dir: &std::path::Path, instances: &[String], extra: &str, n: usize) -> Router {
        let (port, admin) = (free_port(), free_port());
        let config = dir.join(format!("router-{port}.toml"));
        let text = config_text(port, admin, instances) + extra;
        std::fs::write(&config, text).unwrap_or_else(|e| panic!("{e}"));
        let child = Command::new(env!("CARGO_BIN_EXE_prefix-router"))
            .args(["serve", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start serve: {e}"));
        let r = Router {
            port,
            admin,
            config,
            child,
        };
        wait_until("the router to be ready", Duration::from_secs(10), || {
            let (status, body) = http(port, "GET", "/ready", "");
            status == 200 && body.contains(&format!("\"healthy_instances\":{n}"))
        });
        r
    }

    /// The sum of `name`'s samples over every label set.
    fn metric(&self, name: &str) -> f64 {
        let (_, page) = http(self.port, "GET", "/metrics", "");
        prefix_router_server::prom::value(&page, name, &[]).unwrap_or(0.0)
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `n` requests at `rate` per second, each a short document then a question, streamed.
fn workload(n: usize, rate: f64) -> Vec<Request> {
    (0..n)
        .map(|i| Request {
            id: i as u64,
            arrival_s: i as f64 / rate,
            group: None,
            model: None,
            messages: vec![Message::new(
                Role::User,
                vec![
                    Segment {
                        id: 1 + (i % 12) as u64,
                        tokens: 300,
                    },
                    Segment {
                        id: 100_000 + i as u64,
                        tokens: 20,
                    },
                ],
            )],
            output_tokens: 40,
        })
        .collect()
}

/// What one case measured.
struct Report {
    case: &'static str,
    sent: usize,
    ok: usize,
    clear: usize,
    unclear: Vec<String>,
    retried: f64,
    lost: usize,
    in_flight_after: f64,
    /// Failures by kind and the start of their message.
    seen: std::collections::BTreeMap<String, usize>,
}

/// Runs the load for the case's duration while `chaos` acts (it gets the run's start).
fn run_case(
    case: &'static str,
    router: &Router,
    chaos: impl FnOnce(Instant) + Send + 'static,
) -> Report {
    let rate = env_f64("CHAOS_RATE", 25.0);
    let seconds = env_f64("CHAOS_SECONDS", 4.0);
    let n = (rate * seconds).round().max(1.0) as usize;
    let retried_before = router.metric("prefix_router_retries_total");
    let mut config = BenchConfig::new(
        format!("http://127.0.0.1:{}", router.port),
        LoadMode::OpenLoop { rate: None },
    );
    config.timeout = Duration::from_secs(20);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    let started = Instant::now();
    let actor = std::thread::spawn(move || chaos(started));
    let outcome: BenchOutcome = runtime
        .block_on(prefix_router_loadgen::run(&config, workload(n, rate)))
        .unwrap_or_else(|e| panic!("{case}: {e}"));
    actor
        .join()
        .unwrap_or_else(|_| panic!("{case}: the chaos thread panicked"));
    let mut in_flight_after = f64::NAN;
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until("nothing in flight", Duration::from_secs(10), || {
            in_flight_after = router.metric("prefix_router_in_flight");
            in_flight_after == 0.0
        })
    }));
    let mut report = Report {
        case,
        sent: outcome.records.len(),
        ok: outcome.completed() as usize,
        clear: 0,
        unclear: Vec::new(),
        retried: router.metric("prefix_router_retries_total") - retried_before,
        lost: (outcome.planned as usize).saturating_sub(outcome.records.len()),
        in_flight_after,
        seen: Default::default(),
    };
    for f in outcome.records.iter().filter_map(|r| r.failure.as_ref()) {
        // Clear: an answer of the router's that names what failed, or its stream's error event.
        // Unclear: a cut connection, a stream that just stops, a client-side timeout.
        let clear = matches!(
            f.kind,
            FailureKind::Http4xx | FailureKind::Http5xx | FailureKind::StreamError
        ) && f.detail.contains(':');
        *report.seen.entry(summary(&f.detail)).or_insert(0) += 1;
        if clear {
            report.clear += 1;
        } else {
            report.unclear.push(format!("{}: {}", f.kind, f.detail));
        }
    }
    let seen: Vec<String> = report
        .seen
        .iter()
        .map(|(k, n)| format!("{n}x {k}"))
        .collect();
    println!(
        "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
        report.case,
        report.sent,
        report.ok,
        report.clear,
        report.unclear.len(),
        report.retried,
        report.lost,
        report.in_flight_after,
        seen.join("; ")
    );
    report
}

/// A failure's message without what differs from one request to the next (ports, times).
fn summary(detail: &str) -> String {
    let code = detail
        .rsplit_once('(')
        .map(|(_, c)| c.trim_end_matches(')'))
        .filter(|c| c.chars().all(|ch| ch.is_ascii_lowercase() || ch == '_'));
    match code {
        Some(c) => format!("`{c}`"),
        None => detail
            .split(|c: char| c.is_ascii_digit())
            .next()
            .unwrap_or(detail)
            .trim()
            .to_string(),
    }
}

/// Clients that go away mid-stream, send their heads a byte at a time and never finish, and
/// announce bodies over the limit, all at once beside the load.
fn misbehave(port: u16) {
    let body = r#"{"messages":[{"role":"user","content":"tell me a long story"}],"max_tokens":200,"stream":true}"#;
    let stream_req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: c\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut held = Vec::new();
    for i in 0..40 {
        // Gone after the first bytes of the answer.
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
            let _ = s.write_all(stream_req.as_bytes());
            let mut first = [0u8; 64];
            let _ = s.read(&mut first);
        }
        // Half a head, never finished (held open until the router cuts them).
        if i % 2 == 0 {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: c\r\n");
                held.push(s);
            }
        }
        // A body over the limit: 413 before it is sent.
        if i % 4 == 0 {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                let _ = s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: c\r\ncontent-length: 41943040\r\n\r\n{");
                let mut answer = [0u8; 12];
                let _ = s.read(&mut answer);
                assert_eq!(&answer[9..12], b"413", "an oversized body gets 413");
            }
        }
    }
    drop(held);
}

fn check(r: &Report) {
    assert_eq!(r.lost, 0, "{}: lost requests", r.case);
    assert!(
        r.unclear.is_empty(),
        "{}: failures without a clear error: {:?}",
        r.case,
        r.unclear
    );
    assert_eq!(
        r.in_flight_after, 0.0,
        "{}: requests left in flight",
        r.case
    );
    assert!(r.ok > 0, "{}: nothing was answered", r.case);
}

fn at(start: Instant, s: f64) {
    let due = start + Duration::from_secs_f64(s);
    if let Some(wait) = due.checked_duration_since(Instant::now()) {
        std::thread::sleep(wait);
    }
}

#[test]
fn engines_killed_hung_and_brought_back_lose_no_request() {
    let dir = std::env::temp_dir().join(format!("prefix-router-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let seconds = env_f64("CHAOS_SECONDS", 4.0);
    let engines: Vec<Engine> = (0..3).map(|_| Engine::start(free_port())).collect();
    let urls: Vec<String> = engines.iter().map(Engine::url).collect();
    let router = Router::start(&dir, &urls);
    let engines = std::sync::Arc::new(std::sync::Mutex::new(engines));
    println!("| case | sent | ok | failed, clear error | failed, unclear | retried | lost | in flight after | failures |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |");
    let mut reports = Vec::new();

    reports.push(run_case("baseline", &router, |_| {}));

    let e = std::sync::Arc::clone(&engines);
    reports.push(run_case(
        "SIGKILL one engine mid-stream, restart it",
        &router,
        move |t| {
            at(t, seconds * 0.3);
            let port = {
                let mut g = e.lock().unwrap_or_else(|p| p.into_inner());
                g[0].kill();
                g[0].port
            };
            at(t, seconds * 0.6);
            let mut g = e.lock().unwrap_or_else(|p| p.into_inner());
            assert_eq!(g[0].port, port);
            g[0].spawn();
        },
    ));

    let e = std::sync::Arc::clone(&engines);
    reports.push(run_case(
        "SIGSTOP one engine, SIGCONT it",
        &router,
        move |t| {
            at(t, seconds * 0.25);
            let g = e.lock().unwrap_or_else(|p| p.into_inner());
            signal(g[1].child(), "STOP");
            drop(g);
            at(t, seconds * 0.65);
            let g = e.lock().unwrap_or_else(|p| p.into_inner());
            signal(g[1].child(), "CONT");
        },
    ));

    let e = std::sync::Arc::clone(&engines);
    reports.push(run_case(
        "every engine down, then back",
        &router,
        move |t| {
            at(t, seconds * 0.3);
            for eng in e.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
                eng.kill();
            }
            at(t, seconds * 0.55);
            for eng in e.lock().unwrap_or_else(|p| p.into_inner()).iter_mut() {
                eng.spawn();
            }
        },
    ));
    wait_until("all back", Duration::from_secs(10), || {
        http(router.port, "GET", "/ready", "")
            .1
            .contains("\"healthy_instances\":3")
    });

    // Scale out and in through the admin API: a new engine joins, one drains and leaves.
    let extra = Engine::start(free_port());
    let (extra_url, admin, first) = (extra.url(), router.admin, urls[0].clone());
    reports.push(run_case(
        "admin: add one, drain and remove one",
        &router,
        move |t| {
            at(t, seconds * 0.3);
            let (s, b) = admin_post(admin, "/admin/instances", &extra_url);
            assert!(s == 200 || s == 201, "add: {s} {b}");
            at(t, seconds * 0.5);
            let (s, b) = admin_post(admin, "/admin/instances/drain", &first);
            assert_eq!(s, 200, "drain: {b}");
            at(t, seconds * 0.7);
            let (s, b) = admin_post(admin, "/admin/instances/remove", &first);
            assert_eq!(s, 200, "remove: {b}");
        },
    ));

    // SIGHUP with a changed instance list: the removed one is back, the added one leaves.
    let reload_to = urls.clone();
    let hup = {
        let cfg = router.config.clone();
        let (port, admin_port, pid) = (router.port, router.admin, router.child.id());
        move |t: Instant| {
            at(t, seconds * 0.4);
            std::fs::write(&cfg, config_text(port, admin_port, &reload_to))
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(signal_pid(pid, "HUP"), "kill -HUP {pid}");
        }
    };
    reports.push(run_case("SIGHUP reload of the instance list", &router, hup));
    drop(extra);

    let port = router.port;
    reports.push(run_case(
        "clients: mid-stream disconnects, slowloris, oversized bodies",
        &router,
        move |t| {
            at(t, seconds * 0.2);
            misbehave(port);
        },
    ));

    // Scale out and in through DNS: a router whose fleet is an SRV name on a name server the
    // test runs (CoreDNS or Consul in production); an engine joins the answer, one leaves it.
    drop(router);
    let entry = |port: u16| dns::Entry::local(&format!("e{port}.chaos.test."), port);
    let ports: Vec<u16> = urls
        .iter()
        .filter_map(|u| u.rsplit(':').next()?.parse().ok())
        .collect();
    let joining = Engine::start(free_port());
    let server = std::sync::Arc::new(dns::DnsServer::start(
        "_http._tcp.chaos.test.",
        &ports.iter().map(|&p| entry(p)).collect::<Vec<_>>(),
    ));
    let discovery = format!(
        "[[discovery.dns]]\nname = \"{}\"\nrecord = \"srv\"\nserver = \"{}\"\ninterval_ms = 200\n",
        server.srv_name(),
        server.addr
    );
    let by_dns = Router::start_with(&dir, &[], &discovery, 3);
    let (answer, joined, published) = (std::sync::Arc::clone(&server), joining.port, ports.clone());
    reports.push(run_case(
        "DNS: one joins the SRV answer, one leaves it",
        &by_dns,
        move |t| {
            at(t, seconds * 0.3);
            let mut now: Vec<dns::Entry> = published.iter().map(|&p| entry(p)).collect();
            now.push(entry(joined));
            answer.set(&now);
            at(t, seconds * 0.6);
            answer.set(&now[1..]);
        },
    ));
    let (_, listed) = http(by_dns.admin, "GET", "/admin/instances", "");
    let has = |port: u16| listed.contains(&format!("127.0.0.1:{port}\""));
    assert!(
        has(joined) && !has(ports[0]) && ports[1..].iter().all(|&p| has(p)),
        "the fleet follows the DNS answer: {listed}"
    );
    drop(joining);

    println!(
        "(rate {} req/s, {seconds} s per case)",
        env_f64("CHAOS_RATE", 25.0)
    );
    for r in &reports {
        check(r);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
