//! `POST /v1/responses` key extraction on arbitrary bytes: no panic, the same answer twice, and
//! a body the reader accepts keeps its key when `instructions` and `input` change places.
//! Input: 2 bytes of prefix length, then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::extract::{responses_route, KeyOptions};
use prefix_router_core::ChainSpec;
use prefix_router_fuzz::split_prefix_length;

fuzz_target!(|data: &[u8]| {
    let (len, body) = split_prefix_length(data);
    let opts = KeyOptions {
        prefix_length: len,
        chain: Some(ChainSpec::DEFAULT),
    };
    let first = responses_route(body, &opts);
    assert_eq!(responses_route(body, &opts), first, "not deterministic");
    let Ok(info) = first else {
        return;
    };
    // A body that is one object of JSON with both fields: swapped, the same text.
    let Ok(serde_json::Value::Object(map)) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    let (Some(instructions), Some(input)) = (map.get("instructions"), map.get("input")) else {
        return;
    };
    let swapped = serde_json::json!({ "input": input, "instructions": instructions }).to_string();
    let forward = serde_json::json!({ "instructions": instructions, "input": input }).to_string();
    let a = responses_route(swapped.as_bytes(), &opts).map(|i| (i.key, i.chain));
    let b = responses_route(forward.as_bytes(), &opts).map(|i| (i.key, i.chain));
    assert_eq!(a, b, "field order changed the text");
    let _ = info;
});
