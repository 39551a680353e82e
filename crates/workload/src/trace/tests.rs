use super::*;
use crate::generators::{generate, WorkloadKind, WorkloadSpec};
use proptest::prelude::*;

const MOONCAKE: &str = include_str!("../../../../data/traces/mooncake_synthetic_trace.jsonl");

#[test]
fn mooncake_trace_facts() {
    let records = parse_mooncake_records(MOONCAKE, "mooncake").unwrap();
    assert_eq!(records.len(), 3_993);
    let rate = hash_id_hit_rate(&records);
    assert!((rate - 0.640).abs() < 0.0005, "{rate}");
    let requests = parse_mooncake(MOONCAKE, "mooncake").unwrap();
    assert_eq!(requests.len(), 3_993);
    let tokens: u64 = requests.iter().map(|r| u64::from(r.prompt_tokens())).sum();
    let want: u64 = records.iter().map(|r| u64::from(r.input_length)).sum();
    assert_eq!(tokens, want);
    // Counting prompt tokens in full 512-token blocks (partial last blocks never hit).
    let oracle = oracle_hit_rate(&requests, MOONCAKE_BLOCK_TOKENS);
    assert!((oracle - 0.650).abs() < 0.0005, "{oracle}");
    // Engine-sized blocks also hit inside shared partial blocks: a little higher.
    let fine = oracle_hit_rate(&requests, 16);
    assert!(fine > oracle && fine < 0.66, "{fine}");
    assert!(requests
        .windows(2)
        .all(|w| w[0].arrival_s <= w[1].arrival_s));
    assert!((requests.last().unwrap().arrival_s - 1022.025).abs() < 1e-9);
}

#[test]
fn mooncake_lengths_that_do_not_match_the_ids() {
    let rec = |input_length, ids: Vec<u64>| MooncakeRecord {
        timestamp: 1500.0,
        input_length,
        output_length: 0,
        hash_ids: ids,
    };
    let short = rec(600, vec![1, 2, 3]).to_request(0).unwrap();
    let segs = &short.messages[0].segments;
    assert_eq!(
        segs.iter().map(|s| s.tokens).collect::<Vec<_>>(),
        vec![512, 88]
    );
    assert_eq!(segs[0].id, mooncake_id(1));
    assert_eq!(short.output_tokens, 1);
    assert_eq!(short.arrival_s, 1.5);
    let long = rec(1100, vec![1, 2]).to_request(5).unwrap();
    let segs = &long.messages[0].segments;
    assert_eq!(segs.len(), 3);
    assert_eq!(segs[2].tokens, 76);
    assert_ne!(
        segs[2].id,
        rec(1100, vec![1, 2]).to_request(6).unwrap().messages[0].segments[2].id
    );
    assert!(rec(0, vec![1])
        .to_request(0)
        .unwrap_err()
        .contains("input_length"));
    let err = parse_mooncake(
        "{\"timestamp\": 0, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}",
        "m.jsonl",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "m.jsonl:1: input_length: must be at least 1"
    );
}

#[test]
fn jsonl_round_trip() {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::Sharegpt);
    spec.requests = 200;
    spec.groups = Some(3);
    let mut requests: Vec<Request> = generate(&spec).collect();
    requests[3].model = Some("lora-\"x\"".into());
    let mut buf = Vec::new();
    write_jsonl(&requests, &mut buf).unwrap();
    let text = String::from_utf8(buf).unwrap();
    assert_eq!(text.lines().count(), 200);
    assert_eq!(detect_format(&text), TraceFormat::Jsonl);
    assert_eq!(parse_jsonl(&text, "rt.jsonl").unwrap(), requests);
}

#[test]
fn jsonl_content_messages_chain_like_text_segments() {
    let text = r#"
{"t": 2, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}], "output_tokens": 5}
{"t": 1, "messages": [{"role": "system", "content": "be  brief"}, {"role": "user", "segments": [[7, 3]]}], "output_tokens": 4, "group": "g"}
"#;
    let r = parse_jsonl(text, "mine.jsonl").unwrap();
    assert_eq!(r[0].arrival_s, 1.0);
    assert_eq!(r[0].id, 0);
    assert_eq!(r[0].group.as_deref(), Some("g"));
    assert_eq!(r[1].messages[0], r[0].messages[0]);
    assert_eq!(r[1].prompt_tokens(), 4);
    assert_eq!(r[0].prompt_tokens(), 5);
}

#[test]
fn jsonl_errors_name_line_and_field() {
    let cases = [
        ("{\"t\": 1, \"messages\": [], \"output_tokens\": 0}", "output_tokens"),
        ("{\"t\": -1, \"messages\": [], \"output_tokens\": 3}", "t:"),
        ("{\"messages\": [], \"output_tokens\": 3}", "missing field `t`"),
        ("{\"t\": 1, \"messages\": [{\"role\": \"user\"}], \"output_tokens\": 3}", "messages[0]"),
        ("{\"t\": 1, \"messages\": [{\"role\": \"bot\", \"content\": \"x\"}], \"output_tokens\": 3}", "bot"),
        ("{\"t\": 1, \"messages\": [{\"role\": \"user\", \"segments\": [[1, 0]]}], \"output_tokens\": 3}", "0 tokens"),
    ];
    for (line, field) in cases {
        let text = format!("\n{line}\n");
        let err = parse_jsonl(&text, "bad.jsonl").unwrap_err().to_string();
        assert!(err.starts_with("bad.jsonl:2: "), "{err}");
        assert!(err.contains(field), "{err}");
    }
}

#[test]
fn load_trace_detects_formats_and_reports_io() {
    let dir = std::env::temp_dir().join(format!("prefix-router-workload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mooncake = dir.join("m.jsonl");
    std::fs::write(
        &mooncake,
        MOONCAKE.lines().take(10).collect::<Vec<_>>().join("\n"),
    )
    .unwrap();
    assert_eq!(load_trace(&mooncake).unwrap().len(), 10);
    let sharegpt = dir.join("s.json");
    std::fs::write(
        &sharegpt,
        include_str!("../../tests/fixtures/sharegpt_small.json"),
    )
    .unwrap();
    assert_eq!(load_trace(&sharegpt).unwrap().len(), 4);
    let openai = dir.join("o.jsonl");
    std::fs::write(&openai, "{\"prompt\": \"a b\"}\n{\"prompt\": \"c\"}\n").unwrap();
    let (format, requests) = load_trace_as(&openai).unwrap();
    assert_eq!((format, requests.len()), (TraceFormat::OpenAi, 2));
    let empty = dir.join("e.jsonl");
    std::fs::write(&empty, "\n").unwrap();
    assert!(load_trace(&empty)
        .unwrap_err()
        .to_string()
        .contains("no request"));
    let missing = dir.join("missing.jsonl");
    assert!(load_trace(&missing)
        .unwrap_err()
        .to_string()
        .contains("missing.jsonl"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn oracle_counts_leading_blocks() {
    let mut spec = WorkloadSpec::default_for(WorkloadKind::LongContext);
    spec.requests = 50;
    if let crate::generators::WorkloadParams::LongContext(p) = &mut spec.params {
        p.documents = 1;
    }
    let r: Vec<Request> = generate(&spec).collect();
    let rate = oracle_hit_rate(&r, 16);
    // 49 of 50 requests hit the 8,000-token document (500 full blocks).
    let total: u64 = r.iter().map(|q| u64::from(q.prompt_tokens())).sum();
    assert!(
        (rate - 49.0 * 8000.0 / total as f64).abs() < 1e-12,
        "{rate}"
    );
    assert_eq!(oracle_hit_rate(&[], 16), 0.0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn round_trip_any_workload(seed in any::<u64>(), kind in 0usize..5, n in 0u64..40) {
        let spec = WorkloadSpec { seed, requests: n, ..WorkloadSpec::default_for(WorkloadKind::ALL[kind]) };
        let requests: Vec<Request> = generate(&spec).collect();
        let mut buf = Vec::new();
        write_jsonl(&requests, &mut buf).unwrap();
        let back = parse_jsonl(std::str::from_utf8(&buf).unwrap(), "p").unwrap();
        prop_assert_eq!(back, requests);
    }
}

#[test]
fn the_access_log_replays_its_sharing_tokens_and_times() {
    // Two requests sharing the first two blocks, a third in another group; one without usage.
    let text = r#"{"t":1700000010.5,"api":"chat","model":"m","group":"00000000000000aa","prompt_units":400,"block_units":128,"chain":[11,12,13],"instance":"http://127.0.0.1:1","reason":"cold","attempt":0,"status":200,"outcome":"ok","ttft_s":0.1,"duration_s":0.5,"prompt_tokens":100,"cached_tokens":0,"output_tokens":7}
{"t":1700000010.0,"api":"chat","model":"m","group":"00000000000000aa","prompt_units":300,"block_units":128,"chain":[11,12],"instance":"http://127.0.0.1:1","reason":"cold","attempt":0,"status":200,"outcome":"ok","ttft_s":0.1,"duration_s":0.5,"prompt_tokens":null,"cached_tokens":null,"output_tokens":null}
{"t":1700000011.0,"api":"completions","model":null,"group":null,"prompt_units":40,"block_units":128,"chain":[],"instance":"http://127.0.0.1:2","reason":"cold","attempt":0,"status":200,"outcome":"ok","ttft_s":0.1,"duration_s":0.5}
"#;
    assert_eq!(detect_format(text), TraceFormat::AccessLog);
    let r = parse_access_log(text, "access.jsonl").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.len(), 3);
    // Sorted by arrival, seconds from the first.
    let t: Vec<f64> = r.iter().map(|q| q.arrival_s).collect();
    assert_eq!(t, [0.0, 0.5, 1.0]);
    let segs = |q: &Request| q.messages[0].segments.clone();
    let (a, b, c) = (segs(&r[0]), segs(&r[1]), segs(&r[2]));
    // No usage: 300 units at 4 a token = 75 tokens, 32 a block; the tail is its own.
    assert_eq!(a.iter().map(|s| s.tokens).sum::<u32>(), 75);
    assert_eq!(
        b.iter().map(|s| s.tokens).sum::<u32>(),
        100,
        "the engine's count"
    );
    assert_eq!(
        (a[0].id, a[1].id),
        (b[0].id, b[1].id),
        "shared blocks, shared ids"
    );
    assert_ne!(a.last().map(|s| s.id), b.last().map(|s| s.id));
    assert_eq!(c.len(), 1, "shorter than a block: one unique segment");
    assert_eq!((r[0].output_tokens, r[1].output_tokens), (1, 7));
    assert_eq!(r[0].group.as_deref(), Some("00000000000000aa"));
    assert_eq!(r[2].group, None);
    let bad = r#"{"t":"soon","prompt_units":1,"block_units":1,"chain":[]}"#;
    let e = parse_access_log(bad, "x.jsonl")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("x.jsonl:1:"), "{e}");
}

#[test]
fn requests_sharing_a_chain_share_its_tokens_whatever_their_own_density() {
    // One 100-block document (12,800 characters) under two questions of different token
    // densities: the engine reported 3,300 and 3,700 tokens.
    let chain: Vec<String> = (1..=100).map(|h| h.to_string()).collect();
    let line = |t: u32, units: u32, tokens: u32| {
        format!(
            r#"{{"t":{t},"prompt_units":{units},"block_units":128,"chain":[{}],"prompt_tokens":{tokens},"output_tokens":1}}"#,
            chain.join(",")
        )
    };
    let text = format!("{}\n{}\n", line(1, 12_900, 3_300), line(2, 12_950, 3_700));
    let r = parse_access_log(&text, "a.jsonl").unwrap_or_else(|e| panic!("{e}"));
    let cached = crate::trace::oracle_cached_tokens(&r, 16);
    // The rate is the log's: 25,850 units over 7,000 tokens, 35 tokens a block; 3,500 shared.
    assert!(cached[1] >= 3_000, "{cached:?}");
    let tokens: Vec<u32> = r
        .iter()
        .map(|q| q.messages[0].segments.iter().map(|s| s.tokens).sum())
        .collect();
    assert_eq!(
        tokens,
        [3_300, 3_700],
        "each request keeps the engine's count"
    );
}

#[test]
fn access_log_records_keep_what_the_router_observed() {
    // A line as the server writes it (every key of its Entry), then one of an older log.
    let text = r#"{"t":1700000010.5,"api":"chat","model":"m","group":"00000000000000aa","prompt_units":400,"block_units":128,"chain":[11,12,13],"instance":"http://127.0.0.1:1","reason":"cache_hit","attempt":1,"status":200,"outcome":"ok","ttft_s":0.125,"duration_s":0.5,"prompt_tokens":100,"cached_tokens":64,"output_tokens":7}

{"t":1700000009.0,"prompt_units":40,"block_units":128,"chain":[]}
"#;
    let records = parse_access_log_records(text, "access.jsonl").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(records.len(), 2, "file order, not sorted");
    let r = &records[0];
    assert_eq!(r.t, 1700000010.5);
    assert_eq!(r.api.as_deref(), Some("chat"));
    assert_eq!(r.instance.as_deref(), Some("http://127.0.0.1:1"));
    assert_eq!(r.reason.as_deref(), Some("cache_hit"));
    assert_eq!(r.status, Some(200));
    assert_eq!(r.outcome.as_deref(), Some("ok"));
    assert_eq!(r.ttft_s, Some(0.125));
    assert_eq!(r.duration_s, Some(0.5));
    assert_eq!(r.prompt_tokens, Some(100));
    assert_eq!(r.cached_tokens, Some(64));
    assert_eq!(r.output_tokens, Some(7));
    assert_eq!(r.chain, [11, 12, 13]);
    let old = &records[1];
    assert_eq!(
        (old.instance.clone(), old.status, old.ttft_s),
        (None, None, None)
    );
    // The same line errors as the replay.
    let bad = "{\"t\":1,\"prompt_units\":1,\"block_units\":0,\"chain\":[5]}";
    let e = parse_access_log_records(bad, "x.jsonl")
        .unwrap_err()
        .to_string();
    assert_eq!(e, parse_access_log(bad, "x.jsonl").unwrap_err().to_string());
    assert_eq!(e, "x.jsonl:1: block_units: must be at least 1 with a chain");
}

#[test]
fn requests_no_engine_runs_are_refused_with_their_line() {
    let seg =
        r#"{"t":0,"messages":[{"role":"user","segments":[[7,4294967295]]}],"output_tokens":1}"#;
    let out =
        r#"{"t":0,"messages":[{"role":"user","segments":[[7,10]]}],"output_tokens":4000000000}"#;
    let two = r#"{"t":0,"messages":[{"role":"user","segments":[[7,4000000000],[8,4000000000]]}],"output_tokens":1}"#;
    for (line, what) in [
        (seg, "prompt tokens"),
        (out, "output tokens"),
        (two, "prompt tokens"),
    ] {
        let e = parse_jsonl(&format!("{line}\n"), "t.jsonl")
            .map(|_| ())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("t.jsonl:1:") && e.contains(what), "{e}");
    }
    let moon = r#"{"timestamp":0,"input_length":4294967295,"output_length":1,"hash_ids":[1]}"#;
    let e = parse_mooncake(moon, "m.jsonl")
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("prompt tokens"), "{e}");
    // The largest allowed still reads.
    let ok =
        r#"{"t":0,"messages":[{"role":"user","segments":[[7,10000000]]}],"output_tokens":1000000}"#;
    assert!(parse_jsonl(ok, "t.jsonl").is_ok());
}
