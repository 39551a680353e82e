//! The workload crate's text parsers on arbitrary UTF-8 text: trace format detection, our
//! JSONL, Mooncake lines, ShareGPT arrays and scale-event lists. No panic, and what parses
//! keeps the documented properties.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_workload::parse_scale_events;
use prefix_router_workload::request::Request;
use prefix_router_workload::sharegpt::{parse_sharegpt, ReplayOptions};
use prefix_router_workload::trace::{
    detect_format, parse_jsonl, parse_mooncake, parse_mooncake_records, write_jsonl, TraceFormat,
    MOONCAKE_BLOCK_TOKENS,
};

/// Requests as every reader returns them: sorted by arrival, numbered 0.., arrivals finite and
/// not negative, at least one output token, no empty segment.
fn check_requests(what: &str, requests: &[Request]) {
    for (i, r) in requests.iter().enumerate() {
        assert_eq!(r.id, i as u64, "{what}: ids are 0..");
        assert!(
            r.arrival_s.is_finite() && r.arrival_s >= 0.0,
            "{what}: arrival {}",
            r.arrival_s
        );
        assert!(r.output_tokens >= 1, "{what}: output tokens");
        for m in &r.messages {
            assert!(
                m.segments.iter().all(|s| s.tokens >= 1),
                "{what}: empty segment"
            );
        }
        if i > 0 {
            assert!(
                requests[i - 1].arrival_s <= r.arrival_s,
                "{what}: not sorted"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };

    let format = detect_format(text);
    if text.trim_start().starts_with('[') {
        assert_eq!(format, TraceFormat::Sharegpt);
    }

    if let Ok(requests) = parse_jsonl(text, "fuzz.jsonl") {
        check_requests("jsonl", &requests);
        // Documented: writing and reading back gives the same requests.
        let mut out = Vec::new();
        write_jsonl(&requests, &mut out).expect("writing to memory");
        let written = String::from_utf8(out).expect("write_jsonl writes UTF-8");
        let again = parse_jsonl(&written, "again.jsonl")
            .unwrap_or_else(|e| panic!("written JSONL does not read back: {e}\n{written}"));
        assert_eq!(again, requests, "JSONL round trip");
    }

    let records = parse_mooncake_records(text, "fuzz.mooncake");
    match parse_mooncake(text, "fuzz.mooncake") {
        Ok(requests) => {
            check_requests("mooncake", &requests);
            let records = records.expect("lines that give requests are records");
            assert_eq!(records.len(), requests.len());
            // Each request's prompt is exactly `input_length` tokens.
            let mut want: Vec<u64> = records.iter().map(|r| u64::from(r.input_length)).collect();
            let mut got: Vec<u64> = requests
                .iter()
                .map(|r| {
                    r.messages
                        .iter()
                        .flat_map(|m| &m.segments)
                        .map(|s| u64::from(s.tokens))
                        .sum()
                })
                .collect();
            want.sort_unstable();
            got.sort_unstable();
            assert_eq!(got, want, "prompt tokens");
            for r in &requests {
                for s in r.messages.iter().flat_map(|m| &m.segments) {
                    assert!(
                        s.tokens <= MOONCAKE_BLOCK_TOKENS
                            || r.messages[0].segments.last() == Some(s)
                    );
                }
            }
        }
        Err(_) => {
            if let Ok(records) = records {
                // Records parse, so some record must be refused as a request.
                assert!(records
                    .iter()
                    .enumerate()
                    .any(|(i, r)| r.to_request(i as u64).is_err()));
            }
        }
    }

    let options = ReplayOptions::default();
    if let Ok(replay) = parse_sharegpt(text, "fuzz.json", &options) {
        check_requests("sharegpt", &replay.requests);
        assert!(replay.conversations_without_request <= replay.conversations);
    }
    let one = ReplayOptions {
        max_conversations: Some(1),
        ..ReplayOptions::default()
    };
    if let Ok(replay) = parse_sharegpt(text, "fuzz.json", &one) {
        assert!(replay.conversations <= 1);
    }

    if let Ok(events) = parse_scale_events(text) {
        for (i, e) in events.iter().enumerate() {
            assert_ne!(e.delta, 0, "scale: zero delta");
            assert!(
                e.at_s.is_finite() && e.at_s >= 0.0,
                "scale: time {} from {text:?}",
                e.at_s
            );
            if i > 0 {
                assert!(events[i - 1].at_s <= e.at_s, "scale: not sorted");
            }
        }
    }
});
