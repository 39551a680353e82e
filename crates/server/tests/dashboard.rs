//! The live page (`GET /dashboard` on the admin listener) rendered by a real headless
//! Chromium against a router and three mock engines after a short load: the DOM holds a row
//! per instance with non-zero shares, TTFT and a decision mix, and a screenshot is written to
//! `target/dashboard.png`. Also, without a browser: the page needs no token, its data does.
//!
//! Chromium is found at `CHROMIUM_BIN`, else as `chromium` on the PATH (Debian's package). Without
//! it the browser test says so and passes, unless `PREFIX_ROUTER_REQUIRE_CHROMIUM=1` (as
//! `.ci/run` sets), where it fails.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use http::{Method, StatusCode};
use prefix_router_mock_engine::{MockEngine, DEFAULT_MODEL};
use prefix_router_server::settings::Admin;
use support::*;

const TOKEN: &str = "dash-token";

fn chromium() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CHROMIUM_BIN") {
        return Some(PathBuf::from(p)).filter(|p| p.is_file());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
}

async fn fleet_under_load() -> (Vec<MockEngine>, prefix_router_server::RunningRouter) {
    let engines = mock_engines(3, 0.1).await;
    let urls: Vec<String> = engines.iter().map(MockEngine::url).collect();
    let mut s = settings(&urls);
    s.admin = Admin::on("127.0.0.1:0".parse().expect("addr"), TOKEN);
    let r = router(s).await;
    // Eight documents, each asked three times: cold first, then cache hits.
    for round in 0..3 {
        for doc in 0..8 {
            let text = format!(
                "{} question {round}",
                format!("document {doc} about routing ").repeat(120)
            );
            let body = serde_json::json!({
                "model": DEFAULT_MODEL,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": 4,
                "stream": true,
                "stream_options": {"include_usage": true}
            })
            .to_string();
            let ans = post(r.local_addr(), "/v1/chat/completions", &[], body).await;
            assert_eq!(ans.status, StatusCode::OK);
        }
    }
    (engines, r)
}

async fn get(addr: std::net::SocketAddr, path: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = http::Request::builder()
        .method(Method::GET)
        .uri(path)
        .header("host", "x");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let ans = send(
        addr,
        req.body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("request"),
    )
    .await;
    (ans.status, String::from_utf8_lossy(&ans.body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_open_and_its_data_needs_the_token() {
    let (_engines, r) = fleet_under_load().await;
    let admin = r.admin_addr().expect("admin listener");
    let (status, page) = get(admin, "/dashboard", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("/admin/dashboard.json"));
    let (status, _) = get(admin, "/admin/dashboard.json", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, text) = get(admin, "/admin/dashboard.json?window=0", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    assert!(text.contains("invalid_window"), "{text}");
    let (status, text) = get(admin, "/admin/dashboard.json", Some(TOKEN)).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let instances = v["now"].as_array().expect("instances");
    assert_eq!(instances.len(), 3);
    let requests: u64 = instances
        .iter()
        .map(|i| i["requests"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(requests, 24);
    let ttft: u64 = instances
        .iter()
        .flat_map(|i| i["ttft"].as_array().cloned().unwrap_or_default())
        .map(|c| c.as_u64().unwrap_or(0))
        .sum();
    assert_eq!(ttft, 24, "every request's TTFT is counted once");
    let cached: u64 = instances
        .iter()
        .map(|i| i["usage_cached_tokens"].as_u64().unwrap_or(0))
        .sum();
    assert!(cached > 0, "the engines reported cache hits: {text}");
    let predicted: u64 = instances
        .iter()
        .map(|i| i["predicted_cached_units"].as_u64().unwrap_or(0))
        .sum();
    assert!(predicted > 0, "the router predicted cache hits: {text}");
    r.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chromium_renders_a_row_per_instance_with_numbers() {
    let Some(bin) = skip_without_chromium() else {
        return;
    };
    let (engines, r) = fleet_under_load().await;
    let admin = r.admin_addr().expect("admin listener");
    let profile =
        std::env::temp_dir().join(format!("prefix-router-chromium-{}", std::process::id()));
    let dom = render(&bin, &profile, admin, &["--dump-dom".to_string()]).await;
    let html = String::from_utf8_lossy(&dom.stdout).into_owned();
    assert!(
        dom.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&dom.stderr)
    );

    for e in &engines {
        let id = format!("http://{}", e.local_addr());
        let start = html
            .find(&format!("data-instance=\"{id}\""))
            .unwrap_or_else(|| panic!("no row for {id}: {html}"));
        let row = &html[start
            ..html[start..]
                .find("</tr>")
                .map_or(html.len(), |e| start + e)];
        let share = cell(row, "share");
        assert!(
            share.ends_with('%') && !share.ends_with(">0.0%"),
            "{id}: share {share:?}"
        );
        let p50 = cell(row, "p50");
        assert!(
            p50.ends_with("ms") || p50.ends_with(" s"),
            "{id}: TTFT p50 {p50:?}"
        );
        let mix = cell(row, "decisions");
        assert!(mix.contains('%'), "{id}: decisions {mix:?}");
    }
    let status = html
        .split("id=\"status\"")
        .nth(1)
        .and_then(|t| t.split('>').nth(1))
        .and_then(|t| t.split('<').next())
        .unwrap_or("");
    assert!(
        status.starts_with("updated"),
        "the page read its data with the URL's token: {status:?}"
    );
    let hit = html
        .split("id=\"hit-engine\">")
        .nth(1)
        .and_then(|t| t.split('<').next())
        .unwrap_or("");
    assert!(
        hit.ends_with('%') && hit != "0.0%",
        "fleet engine-reported hit rate {hit:?}"
    );

    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/dashboard.png");
    // Chromium writes nothing into a folder that is not there (a build with CARGO_TARGET_DIR
    // elsewhere leaves the checkout without `target/`).
    if let Some(dir) = shot.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let out = render(
        &bin,
        &profile,
        admin,
        &[format!("--screenshot={}", shot.display())],
    )
    .await;
    assert!(out.status.success());
    let size = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "a screenshot with something in it ({size} bytes)"
    );
    let _ = std::fs::remove_dir_all(&profile);
    r.shutdown().await;
}

/// Runs headless Chromium on the live page of the admin listener at `admin` (its token in the
/// URL's fragment), with `extra` flags (`--dump-dom`, `--screenshot=...`).
async fn render(
    bin: &Path,
    profile: &Path,
    admin: std::net::SocketAddr,
    extra: &[String],
) -> std::process::Output {
    let mut args: Vec<String> = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        // Containers often give /dev/shm 64 MB: Chromium's shared memory goes to /tmp instead.
        "--disable-dev-shm-usage",
        "--virtual-time-budget=3000",
        "--window-size=1400,600",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push(format!("--user-data-dir={}", profile.display()));
    args.extend(extra.iter().cloned());
    args.push(format!("http://{admin}/dashboard#token={TOKEN}"));
    let bin = bin.to_path_buf();
    tokio::time::timeout(
        Duration::from_secs(60),
        tokio::task::spawn_blocking(move || Command::new(bin).args(args).output()),
    )
    .await
    .expect("chromium finished in time")
    .expect("joined")
    .expect("chromium runs")
}

fn skip_without_chromium() -> Option<PathBuf> {
    let found = chromium();
    if found.is_none() {
        assert!(
            std::env::var("PREFIX_ROUTER_REQUIRE_CHROMIUM").as_deref() != Ok("1"),
            "PREFIX_ROUTER_REQUIRE_CHROMIUM=1 but no Chromium (apt-get install chromium)"
        );
        eprintln!("SKIPPED: no Chromium (apt-get install chromium runs this test; .ci/run does)");
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_holds_64_instances() {
    let Some(bin) = skip_without_chromium() else {
        return;
    };
    let mut ups = Vec::new();
    for i in 0..64 {
        ups.push(Upstream::start(&format!("u{i}"), Mode::Echo, &[]).await);
    }
    let urls: Vec<String> = ups.iter().map(Upstream::url).collect();
    let mut s = settings(&urls);
    s.admin = Admin::on("127.0.0.1:0".parse().expect("addr"), TOKEN);
    let r = router(s).await;
    for i in 0..256 {
        // Distinct openings: cold placement spreads them over the fleet.
        let ans = complete(r.local_addr(), &format!("prompt {i}: {}", "x".repeat(1100))).await;
        assert_eq!(ans.status, StatusCode::OK);
    }
    let admin = r.admin_addr().expect("admin listener");
    let profile =
        std::env::temp_dir().join(format!("prefix-router-chromium64-{}", std::process::id()));
    let dom = render(&bin, &profile, admin, &["--dump-dom".to_string()]).await;
    let html = String::from_utf8_lossy(&dom.stdout).into_owned();
    let rows = html.matches("<tr data-instance=").count();
    assert_eq!(rows, 64, "a row per instance");
    let served = urls
        .iter()
        .filter(|u| {
            let start = html
                .find(&format!("data-instance=\"{u}\""))
                .unwrap_or_else(|| panic!("no row for {u}"));
            let row = &html[start..];
            !cell(row, "share").ends_with(">0.0%")
        })
        .count();
    // 256 requests over 64 instances: a few may get none.
    assert!(served >= 56, "{served} of 64 rows show a share");
    let _ = std::fs::remove_dir_all(&profile);
    r.shutdown().await;
}

/// The text of `<td class="NAME...">` in a row of the dumped DOM.
fn cell<'a>(row: &'a str, name: &str) -> &'a str {
    let marker = format!("<td class=\"{name}");
    let Some(at) = row.find(&marker) else {
        return "";
    };
    let rest = &row[at..];
    let open = rest.find('>').map_or(0, |i| i + 1);
    let text = &rest[open..];
    &text[..text.find("</td>").unwrap_or(text.len())]
}
