//! Fleet scale events (`+1@600s,-2@1800s`).

/// Instances added (positive) or removed (negative) at a time.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ScaleEvent {
    /// Seconds from the start.
    pub at_s: f64,
    /// Instances added (> 0) or removed (< 0).
    pub delta: i32,
}

/// A scale list that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid scale event '{item}': {why} (expected e.g. +1@600s,-2@1800s)")]
pub struct ScaleParseError {
    /// The offending item.
    pub item: String,
    /// What is wrong.
    pub why: String,
}

/// Parses a comma-separated list of scale events such as `+1@600s,-2@1800s` and returns them
/// sorted by time (stable, so events at the same time keep their order).
///
/// Each item is `<delta>@<time>`: `delta` a non-zero integer with an optional sign (`+1`, `-2`,
/// `3`); `time` a non-negative number of seconds, bare or with an `s` suffix, or minutes with an
/// `m` suffix (`10m` = 600 s). Whitespace around items is ignored; an empty string gives no
/// events.
pub fn parse_scale_events(s: &str) -> Result<Vec<ScaleEvent>, ScaleParseError> {
    let mut events = Vec::new();
    if s.trim().is_empty() {
        return Ok(events);
    }
    for item in s.split(',') {
        events.push(parse_item(item.trim())?);
    }
    events.sort_by(|a, b| a.at_s.total_cmp(&b.at_s));
    Ok(events)
}

fn parse_item(item: &str) -> Result<ScaleEvent, ScaleParseError> {
    let fail = |why: &str| ScaleParseError {
        item: item.to_string(),
        why: why.to_string(),
    };
    let (delta, time) = item
        .split_once('@')
        .ok_or_else(|| fail("missing '@' between the instance change and the time"))?;
    let delta: i32 = delta
        .trim()
        .strip_prefix('+')
        .unwrap_or(delta.trim())
        .parse()
        .map_err(|_| fail("the instance change must be an integer such as +1 or -2"))?;
    if delta == 0 {
        return Err(fail("the instance change must not be zero"));
    }
    let time = time.trim();
    let (number, factor) = if let Some(n) = time.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = time.strip_suffix('s') {
        (n, 1.0)
    } else {
        (time, 1.0)
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| fail("the time must be a number of seconds (600, 600s) or minutes (10m)"))?;
    // Checked after scaling: minutes near f64::MAX overflow to infinity.
    let at_s = value * factor;
    if !at_s.is_finite() || at_s < 0.0 {
        return Err(fail("the time must be finite and not negative"));
    }
    Ok(ScaleEvent { at_s, delta })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_overflowing_to_infinity_are_refused() {
        // 1e308 is finite, 1e308 minutes in seconds is not (found with the trace_lines fuzz
        // target's invariant: every parsed time is finite).
        assert!(parse_scale_events("+1@1e308m").is_err());
        assert_eq!(
            parse_scale_events("+1@1e300m").map(|e| e[0].at_s),
            Ok(6e301)
        );
    }

    fn ev(at_s: f64, delta: i32) -> ScaleEvent {
        ScaleEvent { at_s, delta }
    }

    #[test]
    fn parses_and_sorts() {
        assert_eq!(
            parse_scale_events("-2@30m, +1@600s,3@5").unwrap(),
            vec![ev(5.0, 3), ev(600.0, 1), ev(1800.0, -2)]
        );
        assert_eq!(parse_scale_events(" ").unwrap(), vec![]);
        assert_eq!(parse_scale_events("+1@1.5m").unwrap(), vec![ev(90.0, 1)]);
    }

    #[test]
    fn rejects_bad_items_naming_them() {
        for bad in [
            "+1", "x@10s", "0@10s", "+1@", "+1@-5s", "+1@10h", "+1@nan", "+1@10s,,",
        ] {
            let err = parse_scale_events(bad).unwrap_err();
            assert!(bad.contains(err.item.as_str()), "{bad}: {err}");
            assert!(err.to_string().contains("expected e.g."), "{err}");
        }
        assert_eq!(parse_scale_events("+1@10s,oops").unwrap_err().item, "oops");
    }
}
