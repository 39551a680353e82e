//! Open-loop send times and the request bodies sent.

use prefix_router_workload::Request;

/// Seconds after the run's start at which each request is due, in the requests' order: their
/// `arrival_s` relative to the first. With `rate`, the gaps are scaled (keeping their shape) so
/// that the mean rate over the span is `rate`: `n - 1` gaps in `(n - 1) / rate` seconds. A
/// workload with a single request, or with all arrivals equal, is sent at once. Negative or
/// non-finite gaps count as 0 (a malformed trace cannot stall the run).
pub fn send_offsets(requests: &[Request], rate: Option<f64>) -> Vec<f64> {
    let Some(first) = requests.first().map(|r| r.arrival_s) else {
        return Vec::new();
    };
    let mut offsets: Vec<f64> = Vec::with_capacity(requests.len());
    let mut last = 0.0f64;
    for r in requests {
        let t = r.arrival_s - first;
        // Keep the schedule monotone: a request is never due before the one listed before it.
        last = if t.is_finite() { last.max(t) } else { last };
        offsets.push(last);
    }
    let span = last;
    if let Some(rate) = rate.filter(|r| r.is_finite() && *r > 0.0) {
        if requests.len() >= 2 && span > 0.0 {
            let factor = (requests.len() - 1) as f64 / rate / span;
            for o in &mut offsets {
                *o *= factor;
            }
        }
    }
    offsets
}

/// Stretches or squeezes arrival times (keeping their shape) so the mean rate becomes `rate`:
/// the load generator's own open-loop schedule, so `simulate` and `bench` replay a trace at the
/// same times.
pub fn rescale_arrivals(requests: &mut [Request], rate: f64) {
    // A single request, or one instant for all, has no rate to set: left as it is.
    let (Some(first), Some(last)) = (requests.first(), requests.last()) else {
        return;
    };
    if last.arrival_s <= first.arrival_s {
        return;
    }
    let offsets = send_offsets(requests, Some(rate));
    for (r, at) in requests.iter_mut().zip(offsets) {
        r.arrival_s = at;
    }
}

/// The JSON body sent for `request`: its chat body, streamed with
/// `"stream_options":{"include_usage":true}` so the final chunk reports token counts, or, when
/// `whole`, with `"stream": false` (the answer then reports `usage` itself).
pub fn request_body(request: &Request, whole: bool) -> String {
    let mut body = request.chat_body(!whole, None);
    // `chat_body` always renders one JSON object; insert the extra field before its closing
    // brace rather than parsing and re-serializing tens of kilobytes of prompt.
    if !whole && body.ends_with('}') {
        body.pop();
        body.push_str(",\"stream_options\":{\"include_usage\":true}}");
    }
    body
}

/// Whether the run's request `index` asks for its answer whole, when `share` of them do: spread
/// evenly, so that any first `n` requests hold `floor(n × share)` of them (a run cut short by
/// `--duration` keeps the mix).
pub fn asks_whole(index: usize, share: f64) -> bool {
    let at = |i: usize| (i as f64 * share).floor();
    share > 0.0 && at(index + 1) > at(index)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_router_workload::{Message, Role, Segment};

    fn at(times: &[f64]) -> Vec<Request> {
        times
            .iter()
            .enumerate()
            .map(|(i, &t)| Request {
                id: i as u64,
                arrival_s: t,
                group: Some("g".into()),
                model: None,
                messages: vec![Message::new(Role::User, vec![Segment { id: 7, tokens: 3 }])],
                output_tokens: 2,
            })
            .collect()
    }

    #[test]
    fn offsets_are_relative_to_the_first_arrival() {
        assert_eq!(
            send_offsets(&at(&[5.0, 5.5, 7.0]), None),
            vec![0.0, 0.5, 2.0]
        );
        assert!(send_offsets(&[], Some(3.0)).is_empty());
    }

    #[test]
    fn rate_rescales_keeping_the_shape() {
        // 3 gaps over 4 s at 1 per second become 3 gaps over 3 s.
        let o = send_offsets(&at(&[10.0, 11.0, 13.0, 14.0]), Some(1.0));
        assert_eq!(o, vec![0.0, 0.75, 2.25, 3.0]);
        assert_eq!(send_offsets(&at(&[2.0, 2.0]), Some(5.0)), vec![0.0, 0.0]);
    }

    #[test]
    fn out_of_order_or_bad_times_never_go_backwards() {
        let o = send_offsets(&at(&[0.0, 2.0, 1.0, f64::NAN, 3.0]), None);
        assert_eq!(o, vec![0.0, 2.0, 2.0, 2.0, 3.0]);
    }

    #[test]
    fn body_streams_with_usage() {
        let r = &at(&[0.0])[0];
        let v: serde_json::Value =
            serde_json::from_str(&request_body(r, false)).unwrap_or(serde_json::Value::Null);
        assert_eq!(v["stream"], true);
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["prompt_cache_key"], "g");
        assert_eq!(v["max_tokens"], 2);
        // Same request, same bytes.
        assert_eq!(request_body(r, false), request_body(r, false));
        let v: serde_json::Value =
            serde_json::from_str(&request_body(r, true)).unwrap_or(serde_json::Value::Null);
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["prompt_cache_key"], "g");
    }

    #[test]
    fn whole_answers_are_spread_evenly_at_their_share() {
        let whole = |share: f64, n: usize| (0..n).filter(|&i| asks_whole(i, share)).count();
        assert_eq!(whole(0.0, 100), 0);
        assert_eq!(whole(1.0, 100), 100);
        assert_eq!(whole(0.5, 100), 50);
        assert_eq!(whole(0.3, 10), 3);
        for n in 1..40 {
            assert_eq!(whole(0.25, n), n / 4, "first {n}");
        }
    }

    #[test]
    fn rescaling_keeps_the_shape_and_sets_the_mean_rate() {
        let mut r = at(&[10.0, 11.0, 13.0, 14.0]);
        rescale_arrivals(&mut r, 1.0);
        let t: Vec<f64> = r.iter().map(|r| r.arrival_s).collect();
        // 3 gaps over 4 s become 3 gaps over 3 s (mean 1 per second), same proportions.
        assert_eq!(t, vec![0.0, 0.75, 2.25, 3.0]);
    }

    #[test]
    fn rescaling_leaves_degenerate_traces_alone() {
        let mut one = at(&[5.0]);
        rescale_arrivals(&mut one, 2.0);
        assert_eq!(one[0].arrival_s, 5.0);
        let mut same = at(&[2.0, 2.0]);
        rescale_arrivals(&mut same, 2.0);
        assert_eq!((same[0].arrival_s, same[1].arrival_s), (2.0, 2.0));
    }
}
