//! A catalogue of bad inputs, each sent raw over a fresh connection to 127.0.0.1: malformed
//! and truncated JSON, wrong types, invalid UTF-8, unpaired surrogates, deep nesting, oversized
//! bodies and heads, header abuse, request smuggling, absolute-form URIs, traversal, bad group
//! ids, HTTP/1.0 and pipelining. Every case must get a 4xx in the OpenAI error shape from the
//! router itself (nothing of it reaches the engine), and the router must answer a normal request
//! right after.

mod support;

use std::time::Duration;

use support::*;

/// One case: a name, the raw bytes sent, the status expected and the error code expected
/// (`None`: any code; hyper's own answers are rewritten with their own codes).
struct Case {
    name: &'static str,
    raw: Vec<u8>,
    status: u16,
    code: Option<&'static str>,
}

fn post(path: &str, body: &[u8]) -> Vec<u8> {
    post_with(path, "", body)
}

fn post_with(path: &str, headers: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST {path} HTTP/1.1\r\nhost: router.test\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

fn chat_body(messages: &str) -> Vec<u8> {
    format!(r#"{{"model":"m","messages":{messages}}}"#).into_bytes()
}

fn case(name: &'static str, raw: Vec<u8>, status: u16, code: Option<&'static str>) -> Case {
    Case {
        name,
        raw,
        status,
        code,
    }
}

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";
const NATIVE: &str = "/invocations";

/// The body limit the router runs with here (small, so oversized cases stay cheap).
const BODY_LIMIT: u64 = 1 << 20;

fn catalogue() -> Vec<Case> {
    let ok_msgs = r#"[{"role":"user","content":"hello"}]"#;
    let mut deep = b"{\"model\":\"m\",\"unused\":".to_vec();
    deep.extend_from_slice("[".repeat(10_000).as_bytes());
    deep.extend_from_slice("]".repeat(10_000).as_bytes());
    deep.extend_from_slice(format!(r#","messages":{ok_msgs}}}"#).as_bytes());
    let mut bad_utf8 = br#"{"model":"m","messages":[{"role":"user","content":"a"#.to_vec();
    bad_utf8.extend_from_slice(&[0xff, 0xfe]);
    bad_utf8.extend_from_slice(br#""}]}"#);
    let mut huge = br#"{"model":"m","messages":["#.to_vec();
    while huge.len() as u64 <= BODY_LIMIT {
        huge.extend_from_slice(br#"{"role":"user","content":"x"},"#);
    }
    huge.extend_from_slice(br#"{"role":"user","content":"x"}]}"#);
    let group_65 = format!("x-prefix-aware-id: {}\r\n", "g".repeat(65));
    vec![
        // Malformed and truncated JSON.
        case("not json", post(CHAT, b"not json"), 400, Some("invalid_json")),
        case("empty body", post(CHAT, b""), 400, Some("invalid_json")),
        case("lone brace", post(CHAT, b"{"), 400, Some("invalid_json")),
        case("truncated array", post(CHAT, br#"{"model":"m","messages":["#), 400, Some("invalid_json")),
        case("truncated string", post(CHAT, br#"{"model":"m","messages":[{"role":"user","content":"abc"#), 400, Some("invalid_json")),
        case("trailing garbage", post(CHAT, &[chat_body(ok_msgs), b"}}}".to_vec()].concat()), 400, Some("invalid_json")),
        case("byte order mark", post(CHAT, &[b"\xef\xbb\xbf".to_vec(), chat_body(ok_msgs)].concat()), 400, Some("invalid_json")),
        case("top-level array", post(CHAT, b"[]"), 400, None),
        case("top-level null", post(CHAT, b"null"), 400, None),
        case("top-level string", post(CHAT, br#""hello""#), 400, None),
        case("completion not json", post(CMPL, b"{prompt:1}"), 400, Some("invalid_json")),
        // Wrong types, field by field.
        case("messages a string", post(CHAT, &chat_body(r#""hi""#)), 400, Some("invalid_type")),
        case("messages a number", post(CHAT, &chat_body("5")), 400, Some("invalid_type")),
        case("messages an object", post(CHAT, &chat_body("{}")), 400, Some("invalid_type")),
        case("message a number", post(CHAT, &chat_body("[1]")), 400, Some("invalid_type")),
        case("message a string", post(CHAT, &chat_body(r#"["hi"]"#)), 400, Some("invalid_type")),
        case("role a number", post(CHAT, &chat_body(r#"[{"role":5,"content":"x"}]"#)), 400, Some("invalid_type")),
        case("content a number", post(CHAT, &chat_body(r#"[{"role":"user","content":5}]"#)), 400, Some("invalid_type")),
        case("content an object", post(CHAT, &chat_body(r#"[{"role":"user","content":{}}]"#)), 400, Some("invalid_type")),
        case("content part text a number", post(CHAT, &chat_body(r#"[{"role":"user","content":[{"type":"text","text":5}]}]"#)), 400, Some("invalid_type")),
        case("content parts a string list", post(CHAT, &chat_body(r#"[{"role":"user","content":[5]}]"#)), 400, Some("invalid_type")),
        case("model a number", post(CHAT, format!(r#"{{"model":5,"messages":{ok_msgs}}}"#).as_bytes()), 400, Some("invalid_type")),
        case("model an array", post(CHAT, format!(r#"{{"model":["m"],"messages":{ok_msgs}}}"#).as_bytes()), 400, Some("invalid_type")),
        case("messages missing", post(CHAT, br#"{"model":"m"}"#), 400, Some("missing_field")),
        case("prompt missing", post(CMPL, br#"{"model":"m"}"#), 400, Some("missing_field")),
        case("prompt a number", post(CMPL, br#"{"model":"m","prompt":5}"#), 400, Some("invalid_type")),
        case("prompt an object", post(CMPL, br#"{"model":"m","prompt":{}}"#), 400, Some("invalid_type")),
        case("prompt negative token", post(CMPL, br#"{"model":"m","prompt":[-1]}"#), 400, Some("invalid_type")),
        case("prompt fractional token", post(CMPL, br#"{"model":"m","prompt":[1.5]}"#), 400, Some("invalid_type")),
        case("prompt token over u64", post(CMPL, br#"{"model":"m","prompt":[18446744073709551616]}"#), 400, Some("invalid_type")),
        case("prompt token 1e999", post(CMPL, br#"{"model":"m","prompt":[1e999]}"#), 400, None),
        case("prompt mixed list", post(CMPL, br#"{"model":"m","prompt":["a",1]}"#), 400, Some("invalid_type")),
        // Text the router cannot read.
        case("invalid UTF-8 in content", post(CHAT, &bad_utf8), 400, Some("invalid_json")),
        case("unpaired high surrogate", post(CHAT, &chat_body(r#"[{"role":"user","content":"a\ud800b"}]"#)), 400, None),
        case("unpaired low surrogate", post(CHAT, &chat_body(r#"[{"role":"user","content":"\udc00"}]"#)), 400, None),
        case("bad escape", post(CHAT, &chat_body(r#"[{"role":"user","content":"\q"}]"#)), 400, Some("invalid_json")),
        case("control character in string", post(CHAT, &chat_body("[{\"role\":\"user\",\"content\":\"a\u{1}b\"}]")), 400, Some("invalid_json")),
        case("deep nesting in an unused field", post(CHAT, &deep), 400, Some("invalid_json")),
        // Tenants.
        case("prompt_cache_key a number", post(CHAT, format!(r#"{{"model":"m","prompt_cache_key":5,"messages":{ok_msgs}}}"#).as_bytes()), 400, None),
        case("prompt_cache_key too long", post(CHAT, format!(r#"{{"model":"m","prompt_cache_key":"{}","messages":{ok_msgs}}}"#, "k".repeat(65)).as_bytes()), 400, Some("invalid_group_id")),
        case("prompt_cache_key empty", post(CHAT, format!(r#"{{"model":"m","prompt_cache_key":"","messages":{ok_msgs}}}"#).as_bytes()), 400, Some("invalid_group_id")),
        case("prompt_cache_key control char", post(CHAT, format!(r#"{{"model":"m","prompt_cache_key":"a\u0001","messages":{ok_msgs}}}"#).as_bytes()), 400, Some("invalid_group_id")),
        case("group header too long", post_with(NATIVE, &group_65, br#"{"inputs":"x"}"#), 400, Some("invalid_group_id")),
        case("group header non-ASCII", post_with(NATIVE, "x-prefix-aware-id: caf\u{e9}\r\n", br#"{"inputs":"x"}"#), 400, Some("invalid_group_id")),
        case("group header twice", post_with(NATIVE, "x-prefix-aware-id: a\r\nx-prefix-aware-id: b\r\n", br#"{"inputs":"x"}"#), 400, Some("invalid_group_id")),
        case("group header under both names", post_with(NATIVE, "x-prefix-aware-id: a\r\nx-amzn-sagemaker-prefix-aware-id: b\r\n", br#"{"inputs":"x"}"#), 400, Some("invalid_group_id")),
        // Sizes.
        case("body over the limit", post(CHAT, &huge), 413, Some("body_too_large")),
        case("content-length over the limit", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 34603008\r\n\r\n{".to_vec(), 413, Some("body_too_large")),
        case("chunked body over the limit", [b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec(), format!("{:x}\r\n", BODY_LIMIT + 10).into_bytes(), vec![b' '; BODY_LIMIT as usize + 10], b"\r\n0\r\n\r\n".to_vec()].concat(), 413, Some("body_too_large")),
        case("head over the limit", format!("GET /health HTTP/1.1\r\nhost: x\r\nx-big: {}\r\n\r\n", "a".repeat(70_000)).into_bytes(), 431, Some("header_too_large")),
        case("too many headers", [b"GET /health HTTP/1.1\r\nhost: x\r\n".to_vec(), (0..200).flat_map(|i| format!("x-h{i}: v\r\n").into_bytes()).collect(), b"\r\n".to_vec()].concat(), 431, Some("header_too_large")),
        case("URI over the limit", format!("GET /v1/{} HTTP/1.1\r\nhost: x\r\n\r\n", "a".repeat(70_000)).into_bytes(), 431, None),
        // Header abuse and smuggling.
        case("header name with a space", b"GET /health HTTP/1.1\r\nhost: x\r\nbad name: v\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("header without a colon", b"GET /health HTTP/1.1\r\nhost: x\r\nnocolon\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("NUL in a header value", b"GET /health HTTP/1.1\r\nhost: x\r\nx-a: a\0b\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("obsolete line folding", b"GET /health HTTP/1.1\r\nhost: x\r\nx-a: a\r\n  folded\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("two different content-lengths", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n{\"a\":1".to_vec(), 400, Some("malformed_request")),
        case("content-length not a number", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: abc\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("negative content-length", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("transfer-encoding not chunked", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip\r\n\r\n".to_vec(), 501, Some("unsupported_transfer_coding")),
        case("gzip then chunked", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n".to_vec(), 501, Some("unsupported_transfer_coding")),
        case("chunked body ended by a bare LF", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\nGET /health HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, None),
        case("chunk size not hex", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n".to_vec(), 400, None),
        case("CL.TE smuggling: the chunked body is what is read", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n1\r\n{\r\n0\r\n\r\nGET /v1/../admin HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, None),
        case("HTTP/1.1 without a Host header", b"POST /v1/completions HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}".to_vec(), 400, Some("missing_host")),
        case("two Host headers", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nhost: y\r\ncontent-length: 2\r\n\r\n{}".to_vec(), 400, Some("duplicate_host")),
        // Request lines.
        case("garbage request line", b"GARBAGE\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("unknown HTTP version", b"GET /health HTTP/9.9\r\nhost: x\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("space in the path", b"GET /v1/a b HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("malformed_request")),
        case("absolute-form URI with traversal", b"GET http://other.test/v1/../admin/instances HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        case("absolute-form URI, bad body", post("http://other.test/v1/chat/completions", b"{"), 400, Some("invalid_json")),
        // Traversal.
        case("dot-dot segment", b"GET /v1/../admin/instances HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        case("dot segment", b"GET /v1/./models HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        case("encoded dot-dot", b"GET /v1/%2e%2E/admin HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        case("encoded slash", b"GET /v1/..%2fadmin HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        case("encoded backslash", b"GET /v1/..%5cadmin HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        case("encoded NUL", b"GET /v1/models%00 HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_path")),
        // Routes and methods.
        case("admin path on the data plane", post("/admin/instances", b"{}"), 404, Some("unknown_route")),
        case("unknown version", b"GET /v2/models HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 404, Some("unknown_route")),
        case("GET on chat", b"GET /v1/chat/completions HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 405, Some("method_not_allowed")),
        case("PUT on health", b"PUT /health HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n".to_vec(), 405, Some("method_not_allowed")),
        case("DELETE on completions", b"DELETE /v1/completions HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 405, Some("method_not_allowed")),
        case("OPTIONS *", b"OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 404, Some("unknown_route")),
        // Old and pipelined clients.
        case("HTTP/1.0, bad body", b"POST /v1/chat/completions HTTP/1.0\r\ncontent-length: 1\r\n\r\n{".to_vec(), 400, Some("invalid_json")),
        case("pipelined: a bad request first", b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\n\r\n{GET /health HTTP/1.1\r\nhost: x\r\n\r\n".to_vec(), 400, Some("invalid_json")),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_an_openai_error_from_the_router_and_it_keeps_serving() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let mut s = settings(&[up.url()]);
    s.limits.max_body_bytes = BODY_LIMIT;
    s.timeouts.client_body = Duration::from_secs(2);
    let r = router(s).await;
    let addr = r.local_addr();
    let cases = catalogue();
    assert!(cases.len() >= 60, "{} cases", cases.len());
    let mut failures = Vec::new();
    for c in &cases {
        let (text, _) = raw(addr, &c.raw, complete_answer).await;
        let status: u16 = text
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| text.strip_prefix("HTTP/1.0 "))
            .and_then(|t| t.get(..3))
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let v = raw_json(&text);
        let e = &v["error"];
        let shaped = e["message"].is_string()
            && e["type"].is_string()
            && e.get("param").is_some()
            && e["code"].is_string();
        let code = e["code"].as_str().unwrap_or_default();
        let proxied = text
            .to_ascii_lowercase()
            .contains("x-prefix-router-instance");
        let fine =
            status == c.status && shaped && !proxied && c.code.is_none_or(|want| want == code);
        if !fine {
            let head: String = text.chars().take(400).collect();
            failures.push(format!(
                "{}: want {} {:?}, got: {head}",
                c.name, c.status, c.code
            ));
        }
        // Served right after, on a fresh connection.
        let ok = support::post(addr, "/v1/completions", &[], r#"{"prompt":"after"}"#).await;
        assert_eq!(ok.status, http::StatusCode::OK, "after {}", c.name);
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    // Only the normal requests reached the engine.
    assert_eq!(up.hits(), cases.len(), "a bad input was forwarded");
    eventually("nothing in flight", || total_in_flight(&r) == 0).await;
    r.shutdown().await;
}
