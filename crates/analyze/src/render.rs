//! The analysis as text for a terminal: the traffic, the sweep, the recommendation beside
//! today's setting, what fleet size changes, and how far to trust it.

use std::fmt::Write;

use crate::{Analysis, Outcome};

fn tokens(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.1}M", n as f64 / 1e6),
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", 100.0 * x)
}

/// The whole analysis as text.
pub fn text(a: &Analysis) -> String {
    let mut out = String::new();
    traffic(a, &mut out);
    sweep(a, &mut out);
    recommendation(a, &mut out);
    let _ = writeln!(out, "\nHow far to trust this: {}", a.trust);
    out
}

fn traffic(a: &Analysis, out: &mut String) {
    let t = &a.traffic;
    let _ = writeln!(
        out,
        "Trace: {} ({}), {} requests over {:.1} s ({:.2} req/s)",
        a.trace, a.format, t.requests, t.span_s, t.rate_rps
    );
    let _ = writeln!(
        out,
        "Prompts: mean {} tokens (p50 {}, p99 {}, max {}); outputs mean {:.0} tokens",
        tokens(t.prompt_tokens.mean as u64),
        tokens(t.prompt_tokens.p50),
        tokens(t.prompt_tokens.p99),
        tokens(t.prompt_tokens.max),
        t.output_tokens.mean
    );
    if let Some(o) = &a.observed {
        let _ = write!(
            out,
            "As served (the access log): {} requests, {} ok",
            o.requests, o.ok
        );
        if let Some(h) = o.hit_rate {
            let _ = write!(out, ", hit rate {}", pct(h));
        }
        if let Some(l) = &o.ttft_ms {
            let _ = write!(
                out,
                ", TTFT p50/p90/p99 {:.1}/{:.1}/{:.1} ms",
                l.p50, l.p90, l.p99
            );
        }
        if let Some((id, share)) = o.instance_share.first() {
            let _ = write!(out, ", busiest instance {id} {}", pct(*share));
        }
        out.push('\n');
    }

    let _ = writeln!(
        out,
        "\nShared openings (leading tokens a request shares with an earlier one, in {}-token blocks):",
        t.block_tokens
    );
    for b in &t.openings {
        let range = match (b.from_tokens, b.to_tokens) {
            (0, _) => "none".to_string(),
            (lo, Some(hi)) => format!("{}-{}", tokens(lo), tokens(hi - 1)),
            (lo, None) => format!("{}+", tokens(lo)),
        };
        let _ = writeln!(out, "  {range:<12} {:>6}", pct(b.share));
    }
    if !t.hottest.is_empty() {
        let _ = writeln!(out, "Hottest prefixes (where sharing ends):");
        for (i, h) in t.hottest.iter().enumerate() {
            let _ = writeln!(
                out,
                "  #{} {:>6} of requests ({}), {} tokens, first in request {}",
                i + 1,
                pct(h.share),
                h.requests,
                tokens(h.tokens),
                h.first_request
            );
        }
    }
    let _ = writeln!(
        out,
        "Oracle hit rate {}: a perfect router with unbounded caches would skip {} of {} prefill tokens.",
        pct(t.oracle_hit_rate),
        tokens(t.oracle_saved_tokens),
        tokens(t.total_prompt_tokens)
    );
    let r = &t.reuse;
    if r.reuses > 0 {
        let _ = writeln!(
            out,
            "Reuse distance (distinct tokens between two uses of a prefix): p50 {}, p90 {}; \
             {} within one instance's cache ({} tokens), {} within the fleet's ({}) only, {} beyond it.",
            tokens(r.p50_tokens),
            tokens(r.p90_tokens),
            pct(r.within_instance),
            tokens(r.instance_cache_tokens),
            pct(r.within_fleet_only),
            tokens(r.fleet_cache_tokens),
            pct(r.beyond_fleet)
        );
    }
    let ten = &t.tenants;
    if ten.groups == 0 {
        let _ = writeln!(out, "Tenants: none (no request names a prompt_cache_key).");
    } else {
        let largest = ten
            .largest
            .iter()
            .map(|(g, s)| format!("{g} {}", pct(*s)))
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            out,
            "Tenants: {} groups on {} of requests; largest: {largest}",
            ten.groups,
            pct(ten.grouped_share)
        );
    }
    if let Some(k) = t.keys.first() {
        let _ = writeln!(
            out,
            "prefix-aware's routing key by prefix length ({} requests sampled):",
            k.sampled
        );
        let _ = writeln!(
            out,
            "  {:>7} {:>8} {:>15}",
            "length", "keys", "largest bucket"
        );
        for k in &t.keys {
            let _ = writeln!(
                out,
                "  {:>7} {:>8} {:>15}",
                k.prefix_length,
                k.distinct,
                pct(k.largest_share)
            );
        }
    }
    if let Some(c) = &t.collapse {
        let _ = write!(
            out,
            "WARNING: one opening covers {} of requests at prefix length {}: prefix-aware sends all of them to one instance. ",
            pct(c.largest_share),
            c.prefix_length
        );
        match (c.splits_at, c.split_share) {
            (Some(len), Some(share)) => {
                let _ = writeln!(
                    out,
                    "It splits at {len} characters (largest bucket {}); cache-aware needs no prefix length.",
                    pct(share)
                );
            }
            _ => {
                let _ = writeln!(
                    out,
                    "It does not split up to 65536 characters; use cache-aware, which needs no prefix length."
                );
            }
        }
    }
}

fn row(out: &mut String, label: &str, o: &Outcome) {
    let _ = writeln!(
        out,
        "  {label:<46} {:>5}x {:>8.2} {:>9.1} {:>9.1} {:>9.1} {:>7} {:>7} {:>8}{}",
        o.rate_factor,
        o.rate_rps,
        o.ttft_ms.p50,
        o.ttft_ms.p90,
        o.ttft_ms.p99,
        pct(o.hit_rate),
        pct(o.max_share),
        pct(o.overflow_rate),
        if o.overloaded {
            format!("  overloaded: {:.2} req/s completed", o.throughput_rps)
        } else {
            String::new()
        }
    );
}

fn header(out: &mut String, first: &str) {
    let _ = writeln!(
        out,
        "  {first:<46} {:>6} {:>8} {:>9} {:>9} {:>9} {:>7} {:>7} {:>8}",
        "rate", "req/s", "p50 ms", "p90 ms", "p99 ms", "hit", "max sh", "overflow"
    );
}

fn sweep(a: &Analysis, out: &mut String) {
    let _ = writeln!(
        out,
        "\nThe sweep: {} settings x {} rates on {} x {} (TTFT percentiles; score = geometric mean of TTFT {} over the rates)",
        a.settings.len(),
        a.rate_factors.len(),
        a.fleet.instances,
        a.fleet.preset,
        a.objective.name()
    );
    header(out, "setting");
    let mut order: Vec<usize> = (0..a.settings.len()).collect();
    order.sort_by(|&x, &y| a.scores[x].total_cmp(&a.scores[y]).then(x.cmp(&y)));
    for s in order {
        let mut label = a.settings[s].label();
        if s == a.recommended {
            label.push_str(" <- recommended");
        } else if s == a.current {
            label.push_str(" <- today");
        }
        if s == a.recommended && s == a.current {
            label.push_str(", today");
        }
        for rate in 0..a.rate_factors.len() {
            if let Some(o) = a.outcome(s, rate) {
                row(out, if rate == 0 { &label } else { "" }, o);
            }
        }
    }
    if a.outcomes.iter().any(|o| o.overloaded) {
        let _ = writeln!(
            out,
            "  overloaded: the fleet completed under half the offered rate, so a queue grew for the whole run and those\n  \
             TTFTs grow with the trace's length rather than reading a level the fleet holds; the score counts them as\n  \
             they are (a setting that overloads at a lower rate ranks lower)"
        );
    }
}

fn recommendation(a: &Analysis, out: &mut String) {
    let rec = &a.settings[a.recommended];
    let _ = writeln!(out, "\nRecommendation: {} ({})", rec.label(), a.reason);
    if a.recommended != a.current {
        let _ = writeln!(
            out,
            "Beside today's setting ({}, from {}):",
            a.settings[a.current].label(),
            a.current_source
        );
        header(out, "");
        for rate in 0..a.rate_factors.len() {
            for (name, s) in [("recommended", a.recommended), ("today", a.current)] {
                if let Some(o) = a.outcome(s, rate) {
                    row(out, name, o);
                }
            }
        }
    }
    if !a.fleet_sizes.is_empty() {
        let _ = writeln!(out, "\nFleet size, with the recommended setting:");
        header(out, "instances");
        let mut sizes: Vec<u32> = a.fleet_sizes.iter().map(|o| o.instances).collect();
        sizes.push(a.fleet.instances);
        sizes.sort_unstable();
        sizes.dedup();
        for n in sizes {
            for (rate, factor) in a.rate_factors.iter().enumerate() {
                let o = if n == a.fleet.instances {
                    a.outcome(a.recommended, rate)
                } else {
                    a.fleet_sizes
                        .iter()
                        .find(|o| o.instances == n && o.rate_factor == *factor)
                };
                if let Some(o) = o {
                    let label = if rate == 0 {
                        n.to_string()
                    } else {
                        String::new()
                    };
                    row(out, &label, o);
                }
            }
        }
    }
}
