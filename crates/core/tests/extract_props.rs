//! Property tests of key extraction: the serde_json, sonic-rs and own-reader (`scan_impl`) back
//! ends agree on generated bodies (valid, mistyped, truncated or corrupted), and no input makes
//! any extractor panic.

use prefix_router_core::extract::{
    chat_request, completion_request, native_key, scan_impl, serde_impl, sonic_impl,
};
use prefix_router_core::{ExtractError, PrefixLength};
use proptest::prelude::*;
use serde_json::{json, Value};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z \\n\"\\\\]{0,40}",
        "\\PC{0,20}",
        Just("é".repeat(700)),
        Just("word ".repeat(300)),
    ]
}

fn part() -> impl Strategy<Value = Value> {
    prop_oneof![
        40 => text().prop_map(|t| json!({"type": "text", "text": t})),
        10 => "[a-z0-9]{1,12}".prop_map(|u| json!({"image_url": {"url": format!("http://img/{u}.png")}, "type": "image_url"})),
        1 => Just(json!({"type": "text"})),
        1 => Just(json!({"type": 3})),
        1 => Just(json!("not an object")),
    ]
}

fn content() -> impl Strategy<Value = Value> {
    prop_oneof![
        20 => text().prop_map(Value::String),
        10 => proptest::collection::vec(part(), 0..4).prop_map(Value::Array),
        3 => Just(Value::Null),
        1 => Just(json!(5)),
    ]
}

fn message() -> impl Strategy<Value = Value> {
    (
        prop_oneof![10 => Just(json!("user")), 10 => Just(json!("assistant")), 5 => Just(json!("system")), 1 => Just(json!(1))],
        proptest::option::of(content()),
        proptest::option::weighted(0.2, "[a-z_]{1,8}".prop_map(|n| json!([{"id": "c", "type": "function", "function": {"name": n, "arguments": "{\"a\":1}"}}]))),
        any::<bool>(),
    )
        .prop_map(|(role, content, calls, role_last)| {
            let mut m = serde_json::Map::new();
            if let Some(c) = content {
                m.insert("content".into(), c);
            }
            if let Some(c) = calls {
                m.insert("tool_calls".into(), c);
            }
            if role_last {
                m.insert("role".into(), role);
            } else {
                let mut first = serde_json::Map::new();
                first.insert("role".into(), role);
                first.extend(m);
                m = first;
            }
            Value::Object(m)
        })
}

fn optional_fields() -> impl Strategy<Value = Vec<(String, Value)>> {
    (
        prop_oneof![10 => Just(None), 10 => Just(Some(json!("llama"))), 1 => Just(Some(json!(7))), 2 => Just(Some(Value::Null))],
        prop_oneof![10 => Just(None), 10 => Just(Some(json!(true))), 1 => Just(Some(json!("yes")))],
        prop_oneof![10 => Just(None), 10 => Just(Some(json!("tenant-1"))), 1 => Just(Some(json!(""))), 1 => Just(Some(json!("a\u{7}")))],
        proptest::option::of(Just(json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}))),
    )
        .prop_map(|(model, stream, group, extra)| {
            let mut v = Vec::new();
            if let Some(m) = model { v.push(("model".to_string(), m)); }
            if let Some(s) = stream { v.push(("stream".to_string(), s)); }
            if let Some(g) = group { v.push(("prompt_cache_key".to_string(), g)); }
            if let Some(e) = extra { v.push(("extra".to_string(), e)); }
            v
        })
}

/// Serializes fields in the given order (serde_json's Map would sort them).
fn object(fields: &[(String, Value)]) -> String {
    let parts: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), v))
        .collect();
    format!("{{{}}}", parts.join(","))
}

#[derive(Debug, Clone)]
enum Damage {
    None,
    Truncate(usize),
    Byte(usize, u8),
    Insert(usize, u8),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        6 => Just(Damage::None),
        1 => any::<usize>().prop_map(Damage::Truncate),
        1 => (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Damage::Byte(i, b)),
        1 => (any::<usize>(), prop_oneof![Just(b'"'), Just(b'\\'), Just(b'{'), Just(b']'), Just(b','), any::<u8>()]).prop_map(|(i, b)| Damage::Insert(i, b)),
    ]
}

fn apply(mut body: Vec<u8>, d: &Damage) -> Vec<u8> {
    let n = body.len().max(1);
    match *d {
        Damage::None => {}
        Damage::Truncate(i) => body.truncate(i % n),
        Damage::Byte(i, b) => {
            if let Some(x) = body.get_mut(i % n) {
                *x = b;
            }
        }
        Damage::Insert(i, b) => body.insert(i % (body.len() + 1), b),
    }
    body
}

fn chat_body() -> impl Strategy<Value = String> {
    (
        proptest::collection::vec(message(), 0..5),
        optional_fields(),
        any::<bool>(),
        proptest::bool::weighted(0.05),
    )
        .prop_map(|(messages, mut fields, messages_last, drop_messages)| {
            if !drop_messages {
                let m = ("messages".to_string(), Value::Array(messages));
                if messages_last {
                    fields.push(m)
                } else {
                    fields.insert(0, m)
                }
            }
            object(&fields)
        })
}

fn prompt() -> impl Strategy<Value = Value> {
    prop_oneof![
        text().prop_map(Value::String),
        proptest::collection::vec(text(), 0..3).prop_map(|v| json!(v)),
        proptest::collection::vec(0u64..200_000, 0..20).prop_map(|v| json!(v)),
        proptest::collection::vec(proptest::collection::vec(0u64..50_000, 0..5), 0..3)
            .prop_map(|v| json!(v)),
        Just(json!([1, "a"])),
        Just(json!([-1])),
        Just(json!(2.5)),
    ]
}

fn completion_body() -> impl Strategy<Value = String> {
    (prompt(), optional_fields(), any::<bool>()).prop_map(|(p, mut fields, last)| {
        let p = ("prompt".to_string(), p);
        if last {
            fields.push(p)
        } else {
            fields.insert(0, p)
        }
        object(&fields)
    })
}

fn len(n: u64) -> PrefixLength {
    PrefixLength::new(n).unwrap_or(PrefixLength::new(1024).unwrap_or_else(|e| panic!("{e}")))
}

/// Both back ends give the same answer; JSON syntax errors only need to agree on being errors
/// (each parser words them its own way), unless the body is valid JSON, where they must be equal.
fn agree(
    a: &Result<prefix_router_core::RequestInfo, ExtractError>,
    b: &Result<prefix_router_core::RequestInfo, ExtractError>,
    body: &[u8],
) -> Result<(), TestCaseError> {
    match (a, b) {
        (Err(ExtractError::Json(_)), Err(ExtractError::Json(_))) => Ok(()),
        (Err(_), Err(_)) if serde_json::from_slice::<Value>(body).is_err() => Ok(()),
        _ => {
            prop_assert_eq!(a, b, "body: {}", String::from_utf8_lossy(body));
            Ok(())
        }
    }
}

/// The own reader against serde_json: both read the body in document order and stop at the
/// first problem, so they must give the same typed error even on a malformed body; two syntax
/// errors only need to both be syntax errors.
fn agree_strictly(
    serde: &Result<prefix_router_core::RequestInfo, ExtractError>,
    scan: &Result<prefix_router_core::RequestInfo, ExtractError>,
    body: &[u8],
) -> Result<(), TestCaseError> {
    if !matches!(
        (serde, scan),
        (Err(ExtractError::Json(_)), Err(ExtractError::Json(_)))
    ) {
        prop_assert_eq!(serde, scan, "body: {}", String::from_utf8_lossy(body));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(384))]

    #[test]
    fn chat_back_ends_agree(body in chat_body(), d in damage(), l in prop_oneof![Just(1024u64), Just(1500), Just(65536)]) {
        let body = apply(body.into_bytes(), &d);
        let a = serde_impl::chat_request(&body, len(l));
        let b = sonic_impl::chat_request(&body, len(l));
        agree(&a, &b, &body)?;
        agree_strictly(&a, &scan_impl::chat_request(&body, len(l)), &body)?;
    }

    #[test]
    fn completion_back_ends_agree(body in completion_body(), d in damage(), l in prop_oneof![Just(1024u64), Just(65536)]) {
        let body = apply(body.into_bytes(), &d);
        let a = serde_impl::completion_request(&body, len(l));
        let b = sonic_impl::completion_request(&body, len(l));
        agree(&a, &b, &body)?;
        agree_strictly(&a, &scan_impl::completion_request(&body, len(l)), &body)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512), header in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80))) {
        let l = len(1024);
        let _ = native_key(&body, header.as_deref(), l);
        for f in [chat_request, completion_request, serde_impl::chat_request, sonic_impl::chat_request, scan_impl::chat_request, serde_impl::completion_request, sonic_impl::completion_request, scan_impl::completion_request] {
            let _ = f(&body, l);
        }
    }

    #[test]
    fn json_like_bytes_never_panic(body in "[\\[\\]{}\":,\\\\u0-9a-z \\n]{0,300}") {
        let l = len(1024);
        for f in [serde_impl::chat_request, sonic_impl::chat_request, scan_impl::chat_request, serde_impl::completion_request, sonic_impl::completion_request, scan_impl::completion_request] {
            let _ = f(body.as_bytes(), l);
        }
        // On JSON-like noise too, the own reader gives serde_json's typed errors.
        for (a, b) in [
            (serde_impl::chat_request(body.as_bytes(), l), scan_impl::chat_request(body.as_bytes(), l)),
            (serde_impl::completion_request(body.as_bytes(), l), scan_impl::completion_request(body.as_bytes(), l)),
        ] {
            agree_strictly(&a, &b, body.as_bytes())?;
        }
    }
}
