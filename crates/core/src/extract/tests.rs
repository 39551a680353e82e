//! Key extraction's unit tests: every case runs all three back ends and checks they agree.

use super::*;

type Extract = fn(&[u8], PrefixLength) -> Result<RequestInfo, ExtractError>;
const CHAT: [(&str, Extract); 3] = [
    ("serde", serde_impl::chat_request),
    ("sonic", sonic_impl::chat_request),
    ("scan", scan_impl::chat_request),
];
const COMPLETION: [(&str, Extract); 3] = [
    ("serde", serde_impl::completion_request),
    ("sonic", sonic_impl::completion_request),
    ("scan", scan_impl::completion_request),
];

fn len(n: u64) -> PrefixLength {
    PrefixLength::new(n).unwrap_or_else(|e| panic!("{e}"))
}

fn key(group: Option<&str>, text: &str) -> KeyHash {
    KeyHash::new(group, text.as_bytes())
}

/// Every back end's answer, checked to agree with the first's.
fn both(fs: [(&str, Extract); 3], body: &str) -> Result<RequestInfo, ExtractError> {
    let a = (fs[0].1)(body.as_bytes(), len(1024));
    for (name, f) in &fs[1..] {
        let b = f(body.as_bytes(), len(1024));
        // JSON syntax errors carry each parser's own message; everything else must be equal.
        if !matches!(
            (&a, &b),
            (Err(ExtractError::Json(_)), Err(ExtractError::Json(_)))
        ) {
            let shown: String = body.chars().take(200).collect();
            assert_eq!(a, b, "{} and {name} disagree on {shown}", fs[0].0);
        }
    }
    a
}

#[test]
fn native_key_takes_bytes_and_group() {
    let body = vec![b'x'; 5000];
    let k = native_key(&body, None, len(1024));
    assert_eq!(k, Ok(KeyHash::new(None, &body[..1024])));
    assert_eq!(
        native_key(b"short", Some(b"t1"), len(1024)),
        Ok(KeyHash::new(Some("t1"), b"short"))
    );
    assert_eq!(
        native_key(b"short", Some(b""), len(1024)),
        Err(ExtractError::Group(GroupError::Length(0)))
    );
    assert!(matches!(
        native_key(b"x", Some(b"a\nb"), len(1024)),
        Err(ExtractError::Group(_))
    ));
}

#[test]
fn chat_canonical_text() {
    let body = r#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"content":"Hi \u00e9\n","role":"user"}],"stream":true}"#;
    let info = both(CHAT, body).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        info.key,
        key(None, "system\u{1F}Be brief.\u{1E}user\u{1F}Hi é\n\u{1E}")
    );
    assert_eq!(info.model.as_deref(), Some("m"));
    assert!(info.stream);
}

#[test]
fn chat_parts_tool_calls_and_late_group() {
    let body = r#"{"messages":[
        {"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"http://x/1.png"}},{"text":"b","type":"text"}]},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"arguments":"{\"q\":1}","name":"search"}}]}
    ],"prompt_cache_key":"tenant-7","model":null}"#;
    let info = both(CHAT, body).unwrap_or_else(|e| panic!("{e}"));
    let part = r#"{"type":"image_url","image_url":{"url":"http://x/1.png"}}"#;
    let h = xxhash_rust::xxh3::xxh3_64_with_seed(part.as_bytes(), PART_SEED);
    let text = format!(
        "user\u{1F}a\u{FFFC}{h:016x}b\u{1E}assistant\u{1F}\u{1D}search\u{1F}{{\"q\":1}}\u{1E}"
    );
    assert_eq!(info.key, key(Some("tenant-7"), &text));
    assert_eq!(info.model, None);
    assert!(!info.stream);
    let other = body.replace("1.png", "2.png");
    assert_ne!(
        both(CHAT, &other).map(|i| i.key),
        Ok(info.key),
        "different images, different keys"
    );
}

#[test]
fn chat_prefix_is_cut_at_characters() {
    let content = "é".repeat(3000);
    let body = format!(r#"{{"messages":[{{"role":"user","content":"{content}"}}],"model":"m"}}"#);
    let info = both(CHAT, &body).unwrap_or_else(|e| panic!("{e}"));
    let mut text = String::from("user\u{1F}");
    text.extend(std::iter::repeat_n('é', 1024 - 5));
    assert_eq!(info.key, key(None, &text));
    // Characters past the prefix do not matter, but they are still validated.
    let tail_differs = body.replace("\"}],", "x\"}],");
    assert_eq!(both(CHAT, &tail_differs).map(|i| i.key), Ok(info.key));
    let tail_malformed = body.replace("\"}],", "\\q\"}],");
    assert!(matches!(
        both(CHAT, &tail_malformed),
        Err(ExtractError::Json(_))
    ));
}

#[test]
fn chat_errors_name_the_field() {
    use ExtractError::*;
    let cases: &[(&str, ExtractError)] = &[
        (r#"{"model":"m"}"#, Missing("messages")),
        (
            r#"{"messages":{}}"#,
            FieldType {
                field: "messages",
                expected: "an array of message objects",
            },
        ),
        (
            r#"{"messages":[1]}"#,
            FieldType {
                field: "messages[]",
                expected: "an object",
            },
        ),
        (
            r#"{"messages":[{"content":"x"}]}"#,
            Missing("messages[].role"),
        ),
        (
            r#"{"messages":[{"role":1}]}"#,
            FieldType {
                field: "messages[].role",
                expected: "a string",
            },
        ),
        (
            r#"{"messages":[{"role":"u","content":5}]}"#,
            FieldType {
                field: "messages[].content",
                expected: "a string, an array of content parts or null",
            },
        ),
        (
            r#"{"messages":[{"role":"u","content":[{"text":"x"}]}]}"#,
            Missing("messages[].content[].type"),
        ),
        (
            r#"{"messages":[{"role":"u","content":[{"type":"text"}]}]}"#,
            Missing("messages[].content[].text"),
        ),
        (
            r#"{"messages":[],"model":3}"#,
            FieldType {
                field: "model",
                expected: "a string",
            },
        ),
        (
            r#"{"messages":[],"stream":"yes"}"#,
            FieldType {
                field: "stream",
                expected: "a boolean",
            },
        ),
        (
            r#"{"messages":[],"prompt_cache_key":""}"#,
            Group(GroupError::Length(0)),
        ),
        (
            r#"{"messages":[],"prompt_cache_key":"a\u0001"}"#,
            Group(GroupError::NotPrintableAscii {
                position: 1,
                byte: 1,
            }),
        ),
        (
            r#"{"messages":[{"role":"u","content":"\ud800"}]}"#,
            FieldType {
                field: "messages[].content",
                expected: text::NO_LONE_SURROGATE,
            },
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(both(CHAT, body).as_ref(), Err(expected), "{body}");
    }
    let long_group = format!(
        r#"{{"messages":[],"prompt_cache_key":"{}"}}"#,
        "a".repeat(70)
    );
    assert_eq!(both(CHAT, &long_group), Err(Group(GroupError::Length(70))));
    for malformed in [
        "",
        "[]",
        "{",
        r#"{"messages":[{"role":"u","content":"x"}]"#,
        r#"{"messages":[]} x"#,
        r#"{"messages":[],"model":"a","model":"b"}"#,
        r#"{"messages":[],"x":"\uZZZZ"}"#,
        r#"{"messages":[],"x":01}"#,
        r#"{"messages":[],"x":[1,]}"#,
    ] {
        assert!(matches!(both(CHAT, malformed), Err(Json(_))), "{malformed}");
    }
    let bad_utf8 = b"{\"messages\":[],\"x\":\"\xff\"}";
    for (name, f) in CHAT {
        assert!(matches!(f(bad_utf8, len(1024)), Err(Json(_))), "{name}");
    }
}

#[test]
fn completion_prompt_forms() {
    let cases = [
        (r#"{"prompt":"hello"}"#, "hello"),
        (r#"{"prompt":["a","b"]}"#, "a\u{1E}b"),
        (r#"{"prompt":[1,22,333]}"#, "1 22 333"),
        (r#"{"prompt":[[1,2],[],[3]]}"#, "1 2\u{1E}\u{1E}3"),
    ];
    for (body, text) in cases {
        assert_eq!(
            both(COMPLETION, body).map(|i| i.key),
            Ok(key(None, text)),
            "{body}"
        );
    }
    for bad in [
        r#"{"prompt":5}"#,
        r#"{"prompt":["a",1]}"#,
        r#"{"prompt":[-1]}"#,
        r#"{"prompt":[1.5]}"#,
        r#"{"prompt":[[1,"a"]]}"#,
    ] {
        assert!(
            matches!(
                both(COMPLETION, bad),
                Err(ExtractError::FieldType {
                    field: "prompt",
                    ..
                })
            ),
            "{bad}"
        );
    }
    assert_eq!(
        both(COMPLETION, r#"{"messages":[]}"#),
        Err(ExtractError::Missing("prompt"))
    );
}

#[test]
fn token_ids_followed_by_whitespace() {
    // Found by the `extract_completion` fuzz target: sonic-rs hands out the raw text of a
    // number in an array with the whitespace before the next `,`/`]`, and the sonic back end
    // refused `{"prompt":[22,3\r\r\r]}`, which serde_json accepts.
    for (body, text) in [
        ("{\"prompt\":[22,3\r\r\r]}", "22 3"),
        ("{\"prompt\":[1 ,\t2\n]}", "1 2"),
        ("{\"prompt\":[ [ 1 , 2 ] , [ 3 ] ]}", "1 2\u{1E}3"),
    ] {
        assert_eq!(
            both(COMPLETION, body).map(|i| i.key),
            Ok(key(None, text)),
            "{body:?}"
        );
    }
}

#[test]
fn deep_nesting_neither_crashes_nor_differs() {
    // Refused, even in a field the key does not read: forwarded, it may crash the engine's
    // parser (Python's json gives up near 1,000 levels).
    let n = 100_000;
    let body = format!(
        r#"{{"x":{}{},"messages":[]}}"#,
        "[".repeat(n),
        "]".repeat(n)
    );
    assert!(
        matches!(both(CHAT, &body), Err(ExtractError::Json(m)) if m.contains("deeper than 128")),
        "{:?}",
        both(CHAT, &body)
    );
    let at_limit = format!(
        r#"{{"x":"{}","y":{}{},"messages":[]}}"#,
        "[".repeat(500),
        "[".repeat(MAX_DEPTH - 1),
        "]".repeat(MAX_DEPTH - 1)
    );
    assert!(serde_impl::chat_request(at_limit.as_bytes(), len(1024)).is_ok());
    // The own reader recurses once per level: 127 levels fit a 2 MiB test thread even in
    // a debug build.
    assert!(scan_impl::chat_request(at_limit.as_bytes(), len(1024)).is_ok());
    let unterminated = format!(r#"{{"x":{}"#, "[".repeat(n));
    assert!(both(CHAT, &unterminated).is_err());
}

#[test]
fn keys_of_skipped_objects_are_not_decoded() {
    // Found by the `extract_chat` fuzz target against the own reader: serde_json does not
    // decode the keys of a value it skips, so a lone surrogate there is no error.
    let body =
        r#"{"messages":[{"x":[{"\uDDD0":1}],"role":"user","content":"c"}],"y":{"\uD800":2}}"#;
    assert!(both(CHAT, body).is_ok());
    let read = r#"{"messages":[],"\uD800":1}"#;
    assert!(matches!(both(CHAT, read), Err(ExtractError::Json(_))));
}

#[test]
fn chains_agree_across_back_ends() {
    let opts = KeyOptions {
        prefix_length: len(1024),
        chain: Some(ChainSpec {
            block_units: 16,
            max_units: 4096,
        }),
    };
    let long = "word \\n\\u00e9 ".repeat(400);
    for body in [
        format!(
            r#"{{"messages":[{{"role":"system","content":"{long}"}},{{"role":"user","content":[{{"type":"text","text":"q"}}]}}],"prompt_cache_key":"t"}}"#
        ),
        format!(r#"{{"prompt":["{long}","b"]}}"#),
    ] {
        let api = if body.contains("prompt\":[") {
            canon::Api::Completion
        } else {
            canon::Api::Chat
        };
        let scan = scan_impl::extract(body.as_bytes(), &opts, api);
        assert_eq!(scan, serde_impl::extract(body.as_bytes(), &opts, api));
        assert_eq!(scan, sonic_impl::extract(body.as_bytes(), &opts, api));
        assert!(scan.is_ok_and(|i| i.chain.blocks.len() > 100));
    }
}

#[test]
fn default_functions_match_back_ends() {
    let body = br#"{"messages":[{"role":"user","content":"x"}]}"#;
    assert_eq!(
        chat_request(body, len(1024)),
        sonic_impl::chat_request(body, len(1024))
    );
    let body = br#"{"prompt":"x"}"#;
    assert_eq!(
        completion_request(body, len(1024)),
        sonic_impl::completion_request(body, len(1024))
    );
}

#[test]
fn the_chain_is_hashed_as_decoded_and_equals_the_whole_texts() {
    // The extractor hashes the chain from the decoded pieces (runs between escapes, escapes,
    // separators) without a copy of the prompt; it must equal the chain of the canonical text
    // written out whole, whichever bound is the larger and wherever the group is named.
    let doc = "para\\n\\u00e9t\\u00e9 \\\"q\\\" \\ud83d\\ude00 ".repeat(200);
    let decoded = "para\nété \"q\" 😀 ".repeat(200);
    let text = format!("system\u{1F}{decoded}\u{1E}user\u{1F}why?\u{1E}");
    for (prefix, max) in [(1024, 4096), (4096, 300), (1024, 1024)] {
        let opts = KeyOptions {
            prefix_length: len(prefix),
            chain: Some(ChainSpec {
                block_units: 16,
                max_units: max,
            }),
        };
        let messages = format!(
            r#"[{{"role":"system","content":"{doc}"}},{{"role":"user","content":"why?"}}]"#
        );
        let before = format!(r#"{{"prompt_cache_key":"t","messages":{messages}}}"#);
        let after = format!(r#"{{"messages":{messages},"prompt_cache_key":"t"}}"#);
        let spec = opts.chain.unwrap_or_default();
        let head: String = text.chars().take(prefix as usize).collect();
        for body in [&before, &after] {
            for api_fn in [scan_impl::extract, serde_impl::extract, sonic_impl::extract] {
                let info = api_fn(body.as_bytes(), &opts, canon::Api::Chat)
                    .unwrap_or_else(|e| panic!("{e}"));
                assert_eq!(info.chain, Chain::of_chars(Some("t"), &text, spec));
                assert_eq!(info.key, key(Some("t"), &head));
            }
        }
    }
}
