//! The demo's text: `simulate`'s table for the runs, the HTTP path's cost, placement, KV
//! events, `simulate`'s own figures beside, and the published experiment.

use std::fmt::Write as _;

use prefix_router_sim::{table, StrategyResult};

use super::DemoReport;

/// "12.5" for 0.08: how many times faster than real the engines ran.
pub fn fmt_speed(scale: f64) -> String {
    let x = 1.0 / scale;
    if (x - x.round()).abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn change(new: f64, old: f64) -> Option<f64> {
    (old > 0.0).then(|| (new / old - 1.0) * 100.0)
}

fn share_range(r: &StrategyResult) -> String {
    let min = r
        .instance_share
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let max = r.instance_share.iter().copied().fold(0.0, f64::max);
    if r.instance_share.is_empty() {
        "-".into()
    } else {
        format!("{} .. {}", pct(min), pct(max))
    }
}

/// The table (simulate's renderer), the overhead, simulate beside, the published experiment.
pub fn render(demo: &DemoReport) -> String {
    let mut out = String::new();
    let scale = demo.time_scale;
    let _ = writeln!(
        out,
        "Demo over real HTTP: mock engines at {}x real time; every figure below is converted back to engine time.",
        fmt_speed(scale)
    );
    // The routers are real servers whose random choices are not seeded: say so instead of the
    // simulator's "router seed".
    let seed_note = format!(", router seed {}", demo.report.fleet.seed);
    out.push_str(&table::render(&demo.report).replacen(
        &seed_note,
        ", router choices unseeded (real server)",
        1,
    ));

    out.push('\n');
    let _ = writeln!(
        out,
        "HTTP path (load generator -> router -> engine and back: rendering, routing, parsing, tokenizing, SSE),\n\
         measured as the client's mean TTFT minus the engines' own; it runs at real speed, so the table counts it\n\
         as it is instead of stretching it {}x with the engines' time:",
        fmt_speed(scale)
    );
    for r in &demo.runs {
        match r.engine_ttft_mean_ms {
            Some(_) => {
                let _ = writeln!(
                    out,
                    "  {:<14} {:.2} ms per request (stretched it would read {:.1} ms: TTFT P50 {:.1} ms instead of the table's); {} of {} failed, {:.1} s wall",
                    r.strategy,
                    r.http_path_wall_ms,
                    r.http_path_wall_ms / scale,
                    r.ttft_p50_all_scaled_ms,
                    r.failed,
                    r.sent,
                    r.wall_s
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {:<14} engines' TTFT not available: every wall millisecond divided by the time scale",
                    r.strategy
                );
            }
        }
        if let Some(lag) = r.send_lag_p99_wall_ms {
            let _ = writeln!(
                out,
                "  {:<14} sends late against the open-loop schedule: P99 {lag:.2} ms wall{}",
                "",
                if lag > 0.1 * r.client_ttft_mean_wall_ms {
                    " (the load generator fell behind: requests waited before the TTFT clock started, so the TTFTs above read low)"
                } else {
                    ""
                }
            );
        }
    }

    if let Some(first) = demo.runs.first() {
        out.push('\n');
        let _ = writeln!(
            out,
            "Placement: {} router replica{}{}; engine queues {}:",
            first.replicas,
            if first.replicas == 1 { "" } else { "s" },
            if first.replicas == 1 {
                ""
            } else {
                ", the requests dealt among them in turn, each client on one"
            },
            if first.engine_queues {
                "scraped and counted (--engine-queues)"
            } else {
                "not scraped (each router counts its own requests only)"
            }
        );
        for r in &demo.runs {
            let a = &r.affinity;
            let _ = writeln!(
                out,
                "  {:<18} {} of each prefix's requests on its most-used instance ({} prefixes); busiest instance {:.2}x the mean",
                r.strategy,
                pct(a.on_home),
                a.prefixes,
                a.max_share_over_mean
            );
        }
    }

    if demo.runs.iter().any(|r| r.kv_events.is_some()) {
        out.push('\n');
        let _ = writeln!(
            out,
            "KV events (mock engines publishing over ZeroMQ on 127.0.0.1, every router subscribed; times are wall time):"
        );
        for r in &demo.runs {
            if let Some(k) = &r.kv_events {
                let _ = writeln!(
                    out,
                    "  {:<18} {:.0} batches applied, {:.0} gaps: {:.0} replayed, {:.0} lost; recovery mean {:.2} ms, all within {:.1} ms",
                    r.strategy,
                    k.batches,
                    k.gaps,
                    k.recovered,
                    k.lost,
                    k.recovery_mean_ms(),
                    k.recovery_max_ms
                );
            }
        }
    }

    out.push('\n');
    let _ = writeln!(
        out,
        "simulate, same workload and settings (the discrete-event model of the same engines{}):",
        match demo.runs.first().map_or(1, |r| r.replicas) {
            1 => String::new(),
            n => format!(" behind {n} router replicas"),
        }
    );
    for (d, s) in demo.report.results.iter().zip(&demo.simulated) {
        if d.requests == 0 {
            let _ = writeln!(
                out,
                "  {:<18} hit rate {}, TTFT P50 {:.1} ms, P90 {:.1} ms (demo: no completed request)",
                s.strategy,
                pct(s.kv_hit_rate),
                s.ttft_ms.p50,
                s.ttft_ms.p90,
            );
            continue;
        }
        let _ = writeln!(
            out,
            "  {:<18} hit rate {} (demo {}, {:+.1} points), TTFT P50 {:.1} ms (demo {:.1} ms, {:+.1}%), P90 {:.1} ms (demo {:.1} ms)",
            s.strategy,
            pct(s.kv_hit_rate),
            pct(d.kv_hit_rate),
            (d.kv_hit_rate - s.kv_hit_rate) * 100.0,
            s.ttft_ms.p50,
            d.ttft_ms.p50,
            change(d.ttft_ms.p50, s.ttft_ms.p50).unwrap_or(0.0),
            s.ttft_ms.p90,
            d.ttft_ms.p90,
        );
    }

    let find = |name: &str| demo.report.results.iter().find(|r| r.strategy == name);
    // Compared only where both completed requests: no latency is not a latency of 0.
    let find = |name: &str| find(name).filter(|r| r.requests > 0);
    if let (Some(pa), Some(rnd)) = (find("prefix-aware"), find("random")) {
        out.push('\n');
        let fmt_change = |new: f64, old: f64| {
            change(new, old)
                .map(|c| format!("{c:+.1}%"))
                .unwrap_or_else(|| "-".into())
        };
        let rows = [
            (
                "KV hit rate".to_string(),
                "~25% -> up to 82%".to_string(),
                format!("{} -> {}", pct(rnd.kv_hit_rate), pct(pa.kv_hit_rate)),
            ),
            (
                "TTFT P50".into(),
                "-71% .. -77%".into(),
                fmt_change(pa.ttft_ms.p50, rnd.ttft_ms.p50),
            ),
            (
                "TTFT P90".into(),
                "-33% .. -37%".into(),
                fmt_change(pa.ttft_ms.p90, rnd.ttft_ms.p90),
            ),
            (
                "throughput".into(),
                "+15% .. +16%".into(),
                fmt_change(pa.throughput_rps, rnd.throughput_rps),
            ),
            (
                "instance share".into(),
                "13.3% .. 15.4%".into(),
                format!("{} (prefix-aware)", share_range(pa)),
            ),
        ];
        let _ = writeln!(
            out,
            "Published experiment (Llama 3.1 70B on vLLM, 7 instances, 8,000-token shared prefixes) beside this run:"
        );
        let _ = writeln!(
            out,
            "  {:<16} {:<20} this run (prefix-aware vs random)",
            "", "published"
        );
        for (what, published, ours) in rows {
            let _ = writeln!(out, "  {what:<16} {published:<20} {ours}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn speeds_read_as_factors() {
        assert_eq!(fmt_speed(0.05), "20");
        assert_eq!(fmt_speed(0.08), "12.50");
        assert_eq!(fmt_speed(1.0), "1");
    }
}
