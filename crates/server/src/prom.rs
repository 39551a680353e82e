//! Reading Prometheus text pages: the one parser the router (engine metrics), `demo` (the
//! engines' TTFT) and the tests (the router's own counters) share.
//!
//! A sample line is `name{label="value",...} value [timestamp]`; comments and lines that do
//! not parse are skipped. Label values may hold quotes, braces and commas when escaped or
//! quoted, as the exposition format allows.

use std::collections::HashMap;

/// One sample of a page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    /// Metric name (with its `_total`, `_sum`, `_bucket`... suffix).
    pub name: &'a str,
    /// The label set as written, without the braces (empty when there is none).
    pub labels: &'a str,
    /// The value (may be NaN or infinite).
    pub value: f64,
}

impl Sample<'_> {
    /// The value of label `key`, unescaped, if the sample has it.
    pub fn label(&self, key: &str) -> Option<String> {
        let mut rest = self.labels;
        loop {
            rest = rest.trim_start_matches([',', ' ']);
            let (k, after) = rest.split_once('=')?;
            let after = after.strip_prefix('"')?;
            let (value, len) = quoted(after)?;
            if k.trim() == key {
                return Some(value);
            }
            rest = &after[len + 1..];
        }
    }
}

/// The value up to the closing quote of `s` (which starts just after the opening one),
/// unescaped, and the byte length before that quote.
fn quoted(s: &str) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, i)),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

/// Byte index just past the `}` closing a label set that starts at index 0 (quotes and
/// escapes inside label values are honoured).
fn labels_end(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i + 1),
            _ => {}
        }
    }
    None
}

/// Every sample of `page`, in order.
pub fn samples(page: &str) -> impl Iterator<Item = Sample<'_>> {
    page.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line.find(['{', ' ', '\t']).unwrap_or(line.len());
        let (name, rest) = line.split_at(name_end);
        let (labels, rest) = if rest.starts_with('{') {
            let end = labels_end(rest)?;
            (&rest[1..end - 1], &rest[end..])
        } else {
            ("", rest)
        };
        let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
        Some(Sample {
            name,
            labels,
            value,
        })
    })
}

/// Finite samples summed by metric name over their label sets (an engine may label by model
/// or by engine core).
pub fn sums(page: &str) -> HashMap<String, f64> {
    totals(page)
        .into_iter()
        .map(|(name, (sum, _))| (name, sum))
        .collect()
}

/// Finite samples by metric name over their label sets: their sum and how many there were
/// (a ratio's mean is the sum over the count: summed, two engine cores at 0.8 and 0.7 of their
/// KV cache read 1.5).
pub fn totals(page: &str) -> HashMap<String, (f64, u32)> {
    let mut out: HashMap<String, (f64, u32)> = HashMap::new();
    for s in samples(page).filter(|s| s.value.is_finite()) {
        let e = out.entry(s.name.to_string()).or_insert((0.0, 0));
        e.0 += s.value;
        e.1 += 1;
    }
    out
}

/// The sum of `name`'s samples whose labels include every `(key, value)` of `labels`; None
/// when no sample matches.
pub fn value(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    samples(page)
        .filter(|s| s.name == name)
        .filter(|s| {
            labels
                .iter()
                .all(|(k, v)| s.label(k).is_some_and(|x| x == *v))
        })
        .map(|s| s.value)
        .reduce(|a, b| a + b)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = r#"# HELP vllm:prefix_cache_hits_total Hits
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m {x} \"q\""} 30
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 12 1700000000
vllm:num_requests_running 3
bad line
vllm:kv_cache_usage_perc{model_name="m"} NaN
"#;

    #[test]
    fn parses_and_sums_label_sets() {
        let s = sums(PAGE);
        assert_eq!(s.get("vllm:prefix_cache_hits_total"), Some(&42.0));
        assert_eq!(s.get("vllm:num_requests_running"), Some(&3.0));
        assert_eq!(s.get("vllm:kv_cache_usage_perc"), None, "NaN is skipped");
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn labels_select_samples() {
        let hits = "vllm:prefix_cache_hits_total";
        assert_eq!(value(PAGE, hits, &[]), Some(42.0));
        assert_eq!(value(PAGE, hits, &[("engine", "1")]), Some(12.0));
        assert_eq!(
            value(PAGE, hits, &[("model_name", "m {x} \"q\"")]),
            Some(30.0)
        );
        assert_eq!(value(PAGE, hits, &[("engine", "2")]), None);
        assert_eq!(value(PAGE, "nothing", &[]), None);
        let first = samples(PAGE).next().map(|s| s.label("engine"));
        assert_eq!(first, Some(Some("0".into())));
    }
}
