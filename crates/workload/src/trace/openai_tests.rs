use super::*;
use crate::generators::{generate, WorkloadKind, WorkloadSpec};
use crate::text::text_segment;
use crate::trace::{detect_format, parse_trace, write_jsonl, TraceFormat};

/// `n` distinct words starting at `from`.
fn words(prefix: &str, from: usize, n: usize) -> String {
    (from..from + n)
        .map(|i| format!("{prefix}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat(system: &str, user: &str) -> String {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": 8,
    })
    .to_string()
}

fn parse(text: &str) -> Vec<Request> {
    parse_openai_bodies(text, "bodies.jsonl").unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> String {
    parse_openai_bodies(text, "bodies.jsonl")
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

#[test]
fn chat_and_completions_lines() {
    let text = r#"
{"model": "chat-m", "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi there you"}, {"role": "assistant", "content": "hello"}, {"role": "tool", "content": "42"}], "max_completion_tokens": 9, "max_tokens": 3, "prompt_cache_key": "tenant-a", "stream": true}
{"model": "text-m", "prompt": "once upon a time", "max_tokens": 0}
{"messages": [{"role": "user", "content": "no limit"}], "max_tokens": null}
"#;
    let r = parse(text);
    assert_eq!(r.len(), 3);
    let roles: Vec<Role> = r[0].messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::System, Role::User, Role::Assistant, Role::User]
    );
    assert_eq!(r[0].prompt_tokens(), 2 + 3 + 1 + 1);
    assert_eq!(
        r[0].output_tokens, 9,
        "max_completion_tokens wins over max_tokens"
    );
    assert_eq!(r[0].group.as_deref(), Some("tenant-a"));
    assert_eq!(r[0].model.as_deref(), Some("chat-m"));
    // Chained across messages: the user message's segment follows the system one.
    let system = text_segment(0, Role::System, "be brief").unwrap();
    assert_eq!(r[0].messages[0].segments, [system]);
    assert_eq!(
        r[0].messages[1].segments,
        [text_segment(system.id, Role::User, "hi there you").unwrap()]
    );
    assert_eq!(r[1].messages.len(), 1);
    assert_eq!(r[1].messages[0].role, Role::User);
    assert_eq!(r[1].prompt_tokens(), 4);
    assert_eq!(r[1].output_tokens, 1, "0 is read as 1");
    assert_eq!(r[1].model.as_deref(), Some("text-m"));
    assert_eq!(r[1].group, None);
    assert_eq!(r[2].output_tokens, OPENAI_DEFAULT_OUTPUT_TOKENS);
    assert_eq!(r[2].model, None);
}

#[test]
fn content_parts_keep_text_and_skip_the_rest() {
    let text = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "look at"}, {"type": "image_url", "image_url": {"url": "http://x"}}, {"type": "text", "text": "this  picture"}]}, {"role": "assistant", "content": null, "tool_calls": []}]}"#;
    let r = parse(text);
    assert_eq!(r[0].messages.len(), 2);
    assert_eq!(
        r[0].messages[0].segments,
        [text_segment(0, Role::User, "look at this picture").unwrap()]
    );
    assert!(
        r[0].messages[1].segments.is_empty(),
        "a turn without text stays, empty"
    );
}

#[test]
fn a_shared_system_prompt_shares_its_leading_blocks() {
    let system = words("s", 0, 200);
    let text = format!(
        "{}\n{}\n",
        chat(&system, &words("a", 0, 50)),
        chat(&system, &words("b", 0, 50))
    );
    let r = parse(&text);
    let (a, b) = (r[0].block_hashes(16), r[1].block_hashes(16));
    assert_eq!(a.len(), 250 / 16);
    // 200 shared words: 12 full 16-token blocks; the 13th reaches into the user's text.
    let shared = 200 / 16;
    assert_eq!(a[..shared], b[..shared]);
    assert!(a[shared..].iter().zip(&b[shared..]).all(|(x, y)| x != y));
    assert_eq!(
        r[0].messages[0].segments.len(),
        200usize.div_ceil(OPENAI_CHUNK_WORDS)
    );
}

#[test]
fn a_shared_document_in_a_user_message_shares_its_leading_chunks() {
    let document = words("d", 0, 300);
    let ask = |q: &str| chat("be brief", &format!("{document}\n\nquestion: {q}"));
    let text = format!(
        "{}\n{}\n",
        ask("what is clause four?"),
        ask("who signed it?")
    );
    let r = parse(&text);
    let (a, b) = (&r[0].messages[1].segments, &r[1].messages[1].segments);
    // 300 document words: four full 64-word chunks shared, the fifth mixes in the question.
    let full = 300 / OPENAI_CHUNK_WORDS;
    assert_eq!(a[..full], b[..full]);
    assert_ne!(a[full], b[full]);
    let (ha, hb) = (r[0].block_hashes(16), r[1].block_hashes(16));
    // The system prompt's 2 words plus 4 chunks of 64: 258 shared tokens, 16 full blocks.
    let shared = (2 + full * OPENAI_CHUNK_WORDS) / 16;
    assert_eq!(ha[..shared], hb[..shared]);
    assert_ne!(ha[shared], hb[shared]);
}

#[test]
fn timestamps_sort_and_start_at_zero() {
    let text = r#"{"prompt": "third", "timestamp": 1700000002.5}
{"prompt": "first", "timestamp": 1700000000}
{"prompt": "second", "timestamp": 1700000001.0}
{"prompt": "also second", "timestamp": 1700000001.0}
"#;
    let r = parse(text);
    let t: Vec<f64> = r.iter().map(|q| q.arrival_s).collect();
    assert_eq!(t, [0.0, 1.0, 1.0, 2.5]);
    assert_eq!(r.iter().map(|q| q.id).collect::<Vec<_>>(), [0, 1, 2, 3]);
    // Stable: equal times keep file order.
    assert_eq!((r[1].prompt_tokens(), r[2].prompt_tokens()), (1, 2));
}

#[test]
fn without_timestamps_lines_arrive_one_a_second() {
    let text = "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\"}\n";
    let r = parse(text);
    let t: Vec<f64> = r.iter().map(|q| q.arrival_s).collect();
    assert_eq!(t, [0.0, 1.0, 2.0]);
    assert_eq!(r.iter().map(|q| q.id).collect::<Vec<_>>(), [0, 1, 2]);
}

#[test]
fn some_timestamps_missing_is_an_error_at_the_first_such_line() {
    let text = "{\"prompt\": \"a\"}\n{\"prompt\": \"b\", \"timestamp\": 3}\n{\"prompt\": \"c\"}\n";
    assert_eq!(
        error(text),
        "bodies.jsonl:1: timestamp: every line needs one once any line has one"
    );
}

#[test]
fn line_errors_name_the_line_and_field() {
    let cases = [
        (
            r#"{"messages": [{"role": "robot", "content": "x"}]}"#,
            "messages[0].role: unknown role `robot`",
        ),
        (
            r#"{"messages": [{"role": "user", "content": "  "}]}"#,
            "prompt has no text",
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
            "prompt has no text",
        ),
        (
            r#"{"model": "m"}"#,
            "exactly one of `messages` and `prompt`",
        ),
        (
            r#"{"prompt": "x", "messages": []}"#,
            "exactly one of `messages` and `prompt`",
        ),
        (r#"{"prompt": ["x"]}"#, "prompt: must be a string"),
        (r#"{"prompt": "x", "max_tokens": -1}"#, "max_tokens:"),
        (
            r#"{"prompt": "x", "max_completion_tokens": 1.5}"#,
            "max_completion_tokens:",
        ),
        (r#"{"prompt": "x", "timestamp": "noon"}"#, "timestamp:"),
        (
            r#"{"prompt": "x", "prompt_cache_key": 7}"#,
            "prompt_cache_key:",
        ),
        (
            r#"{"messages": [{"role": "user", "content": 7}]}"#,
            "messages[0].content:",
        ),
        (
            r#"{"messages": [{"role": "user", "content": [{"type": "text"}]}]}"#,
            "messages[0].content[0].text:",
        ),
        (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role:"),
        (r#"[1]"#, "JSON object"),
        (r#"{"prompt": "#, "EOF"),
    ];
    for (line, want) in cases {
        let e = error(&format!("{{\"prompt\": \"fine\"}}\n{line}\n"));
        assert!(e.starts_with("bodies.jsonl:2: "), "{e}");
        assert!(e.contains(want), "{e} (wanted {want})");
    }
}

#[test]
fn detect_format_tells_openai_bodies_from_the_other_formats() {
    let chat_line = chat("be brief", "hello");
    assert_eq!(detect_format(&chat_line), TraceFormat::OpenAi);
    let parts = r#"{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]}"#;
    assert_eq!(detect_format(parts), TraceFormat::OpenAi);
    assert_eq!(
        detect_format("\n{\"model\": \"m\", \"prompt\": \"once\"}\n"),
        TraceFormat::OpenAi
    );
    let spec = WorkloadSpec {
        requests: 1,
        ..WorkloadSpec::default_for(WorkloadKind::Sharegpt)
    };
    let requests: Vec<Request> = generate(&spec).collect();
    let mut ours = Vec::new();
    write_jsonl(&requests, &mut ours).unwrap_or_else(|e| panic!("{e}"));
    let ours = String::from_utf8(ours).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(detect_format(&ours), TraceFormat::Jsonl);
    // Our JSONL with literal `content` messages is still ours: it has `t` and `output_tokens`.
    let ours_content =
        r#"{"t": 0, "messages": [{"role": "user", "content": "hi"}], "output_tokens": 3}"#;
    assert_eq!(detect_format(ours_content), TraceFormat::Jsonl);
    let mooncake =
        r#"{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}"#;
    assert_eq!(detect_format(mooncake), TraceFormat::Mooncake);
    let access = r#"{"t":1700000010.5,"api":"chat","model":"m","group":null,"prompt_units":400,"block_units":128,"chain":[11,12,13],"instance":"http://127.0.0.1:1","reason":"cold","attempt":0,"status":200,"outcome":"ok","ttft_s":0.1,"duration_s":0.5,"prompt_tokens":100,"cached_tokens":0,"output_tokens":7}"#;
    assert_eq!(detect_format(access), TraceFormat::AccessLog);
    assert_eq!(TraceFormat::OpenAi.name(), "openai");
}

#[test]
fn parse_trace_reads_openai_bodies() {
    let text = format!("{}\n{}\n", chat("a b", "c"), chat("a b", "d"));
    let (format, requests) = parse_trace(&text, "t.jsonl").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(format, TraceFormat::OpenAi);
    assert_eq!(requests, parse(&text));
    assert!(parse_trace("\n", "empty.jsonl")
        .map(|_| ())
        .unwrap_err()
        .to_string()
        .contains("no request"));
}
