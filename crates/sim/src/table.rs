//! The side-by-side text table printed after a simulation.

use std::fmt::Write;

use crate::clairvoyant::{CLAIRVOYANT, CLAIRVOYANT_NOTE};
use crate::{Driver, Placement, Report, StrategyResult, WorkloadSource};

/// Renders the report as a text table with a header that says what ran, one row per strategy,
/// the oracle's ceiling, a legend and, when both ran, prefix-aware against random.
pub fn render(report: &Report) -> String {
    let mut out = String::new();
    let w = &report.workload;
    let f = &report.fleet;
    let source = match &w.source {
        WorkloadSource::Generated { spec } => format!("generated, workload seed {}", spec.seed),
        WorkloadSource::Trace { path, format } => format!("{format} trace {path}"),
    };
    let driver = match w.driver {
        Driver::OpenLoop => format!("open loop, arrivals over {:.0} s", w.arrival_span_s),
        Driver::ClosedLoop { clients } => format!("closed loop, {clients} concurrent clients"),
    };
    let _ = writeln!(
        out,
        "Workload: {} ({source}): {} requests, mean prompt {:.0} tokens, mean output {:.0} tokens, {driver}",
        w.name, w.requests, w.mean_prompt_tokens, w.mean_output_tokens
    );
    let scale = if f.scale_events.is_empty() {
        String::new()
    } else {
        let items: Vec<String> = f
            .scale_events
            .iter()
            .map(|e| format!("{:+}@{}s", e.delta, e.at_s))
            .collect();
        format!(", scale events {}", items.join(","))
    };
    let _ = writeln!(
        out,
        "Fleet:    {} x {} (KV cache {} blocks of {} tokens each), routing key = first {} characters, router seed {}{scale}",
        f.instances, f.preset, f.engine.kv_capacity_blocks, f.engine.block_tokens, f.prefix_length, f.seed
    );
    if f.routers.replicas > 1 {
        let scrape = match f.routers.scrape {
            Some(s) => format!(
                "each scrapes the engines' queues every {} ms (read {} ms later, trusted {} ms)",
                s.interval_s * 1e3,
                s.delay_s * 1e3,
                s.stale_after_s * 1e3
            ),
            None => "the engines' queues not scraped".to_string(),
        };
        let _ = writeln!(
            out,
            "Routers:  {} replicas, requests dealt round-robin, each learning on its own; {scrape}",
            f.routers.replicas
        );
    }
    out.push('\n');

    let header = [
        "strategy",
        "requests",
        "TTFT p50 ms",
        "TTFT p90 ms",
        "TTFT p99 ms",
        "e2e p50 s",
        "hit rate",
        "req/s",
        "output tok/s",
        "overflow",
        "share min-max",
    ];
    let rows: Vec<Vec<String>> = report.results.iter().map(row).collect();
    out.push_str(&align(&header, &rows));
    out.push('\n');
    let _ = writeln!(
        out,
        "Oracle hit rate (one infinite cache seeing every request: the ceiling for any router): {}",
        pct(report.oracle_hit_rate)
    );
    if let Some(floor) = &report.ttft_floor_ms {
        let _ = writeln!(
            out,
            "TTFT floor (each request alone on an idle engine holding every prefix sent before it: no router does better): p50 {:.1} / p90 {:.1} / p99 {:.1} ms",
            floor.p50, floor.p90, floor.p99
        );
    }
    if has_clairvoyant(&report.results) {
        let _ = writeln!(out, "{CLAIRVOYANT_NOTE}");
    }
    placement_lines(&report.results, "", &mut out);
    if let Some(line) = comparison(report) {
        let _ = writeln!(out, "{line}");
    }
    for r in &report.results {
        // Where replicas each place alone, how far they agreed.
        if let (Some(a), true) = (r.affinity, f.routers.replicas > 1) {
            let _ = writeln!(
                out,
                "{} placement: {} of each shared prefix's requests on its home instance; busiest instance {:.2}x the mean",
                r.strategy,
                pct(a.on_home),
                a.max_share_over_mean
            );
        }
        for a in &r.after_scale {
            let _ = writeln!(
                out,
                "{} around {:+}@{}s: hit rate {} in the minute before, {} in the minute after; TTFT P90 {:.1} ms before, {:.1} ms after",
                r.strategy,
                a.delta,
                a.at_s,
                pct(a.hit_rate_before),
                pct(a.hit_rate_after),
                a.ttft_p90_before_ms,
                a.ttft_p90_after_ms
            );
        }
        if let Some(line) = r
            .strategy_stats
            .as_ref()
            .and_then(|s| learned(&r.strategy, s))
        {
            let _ = writeln!(out, "{line}");
        }
    }
    out.push('\n');
    out.push_str(
        "hit rate: prompt tokens served from the engines' prefix caches over all prompt tokens.\n\
         overflow: requests sent away from their key's preferred instance because it was busy.\n\
         share min-max: smallest and largest fraction of requests one instance received.\n",
    );
    out
}

/// What a learning strategy's index holds at the end, and how its predictions fared.
fn learned(strategy: &str, s: &prefix_router_core::StrategyStats) -> Option<String> {
    if s.index_budget_blocks == 0 {
        return None;
    }
    let mut line = format!(
        "{strategy} index at the end: {} of {} blocks, {:.1} MiB",
        s.index_blocks,
        s.index_budget_blocks,
        s.index_bytes as f64 / f64::from(1 << 20)
    );
    if let Some(ratio) = s.prediction_ratio() {
        let _ = write!(
            line,
            "; engine-reported / predicted cached tokens: {ratio:.3}"
        );
    }
    Some(line)
}

fn row(r: &StrategyResult) -> Vec<String> {
    let min = r
        .instance_share
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let max = r
        .instance_share
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max);
    let share = if r.instance_share.is_empty() {
        "-".to_string()
    } else {
        format!("{}-{}", pct(min), pct(max))
    };
    // A run that completed nothing (a real one, over HTTP) has no latencies: "-", not 0.0.
    let measured = |v: String| if r.requests == 0 { "-".to_string() } else { v };
    vec![
        r.strategy.clone(),
        r.requests.to_string(),
        measured(format!("{:.1}", r.ttft_ms.p50)),
        measured(format!("{:.1}", r.ttft_ms.p90)),
        measured(format!("{:.1}", r.ttft_ms.p99)),
        measured(format!("{:.2}", r.e2e_ms.p50 / 1000.0)),
        pct(r.kv_hit_rate),
        format!("{:.2}", r.throughput_rps),
        format!("{:.0}", r.output_tokens_per_s),
        pct(r.overflow_rate),
        share,
    ]
}

/// `prefix-aware vs random: ...` and `cache-aware vs random: ...` for those that ran beside random.
fn comparison(report: &Report) -> Option<String> {
    let find = |name: &str| report.results.iter().find(|r| r.strategy == name);
    let rnd = find("random")?;
    let lines: Vec<String> = ["prefix-aware", "cache-aware"]
        .iter()
        .filter_map(|name| {
            let r = find(name)?;
            if r.requests == 0 || rnd.requests == 0 {
                return Some(format!(
                    "{name} vs random: not compared, {} completed no request",
                    if r.requests == 0 { *name } else { "random" }
                ));
            }
            Some(format!(
                "{name} vs random: TTFT P50 {}, TTFT P90 {}, hit rate {} -> {}, throughput {}",
                change(rnd.ttft_ms.p50, r.ttft_ms.p50),
                change(rnd.ttft_ms.p90, r.ttft_ms.p90),
                pct(rnd.kv_hit_rate),
                pct(r.kv_hit_rate),
                change(rnd.throughput_rps, r.throughput_rps),
            ))
        })
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// Whether `results` hold the clairvoyant reference's row.
pub(crate) fn has_clairvoyant(results: &[StrategyResult]) -> bool {
    results.iter().any(|r| r.strategy == CLAIRVOYANT)
}

/// A [`placement_line`] for each strategy read against the clairvoyant reference, each after
/// `prefix`.
pub(crate) fn placement_lines(results: &[StrategyResult], prefix: &str, out: &mut String) {
    for r in results {
        if let Some(p) = &r.placement {
            let _ = writeln!(out, "{prefix}{}", placement_line(&r.strategy, p));
        }
    }
}

/// One strategy's decisions against the soonest start on offer at each.
pub fn placement_line(strategy: &str, p: &Placement) -> String {
    format!(
        "{strategy} placement: {} of requests sent where they would start soonest (within 1 ms); start lost to the choice P50 {:.1} / P90 {:.1} / P99 {:.1} ms; {} of its slowest 10% could have started under its P90 elsewhere",
        pct(p.at_soonest),
        p.lost_ms.p50,
        p.lost_ms.p90,
        p.lost_ms.p99,
        pct(p.slow_placed)
    )
}

/// Relative change from `before` to `after` as a signed percentage.
fn change(before: f64, after: f64) -> String {
    if before == 0.0 {
        return "n/a".to_string();
    }
    format!("{:+.1}%", (after - before) / before * 100.0)
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// Left-aligns the first column, right-aligns the others, two spaces between columns.
fn align(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i == 0 {
                let _ = write!(text, "{cell:<w$}");
            } else {
                let _ = write!(text, "  {cell:>w$}");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for r in rows {
        line(&mut r.iter().map(String::as_str));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_line_up() {
        let t = align(
            &["name", "n"],
            &[
                vec!["random".into(), "12345".into()],
                vec!["x".into(), "1".into()],
            ],
        );
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines[0], "name        n");
        assert_eq!(lines[1], "random  12345");
        assert_eq!(lines[2], "x           1");
    }

    #[test]
    fn change_is_signed_percent() {
        assert_eq!(change(200.0, 50.0), "-75.0%");
        assert_eq!(change(10.0, 11.5), "+15.0%");
        assert_eq!(change(0.0, 1.0), "n/a");
    }
}
