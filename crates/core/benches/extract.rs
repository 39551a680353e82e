//! Chat key extraction, the own reader (`scan_impl`, the default) against serde_json and
//! sonic-rs, on three labelled kinds of body:
//!
//! - `english`: the typical case. A system prompt, then user/assistant turns of English-like
//!   prose (paragraph breaks and list items, so strings carry `\n` escapes, an occasional quoted
//!   phrase `\"...\"`, an occasional non-ASCII character such as `é`, `—` or `’`; about 99.5% of
//!   the bytes are ASCII), then `model`, `stream`, `max_tokens`, `prompt_cache_key`.
//! - `cjk`: the worst case for raw UTF-8. The same shape with Chinese prose sent as raw UTF-8
//!   (3-byte characters, a few ASCII terms and newlines), so one character costs 3 bytes.
//! - `cjk_escaped`: the worst case for escapes. The `cjk` request serialized ASCII-only, every
//!   non-ASCII character as a `\uXXXX` escape (what Python's `json.dumps` sends by default), so
//!   one character costs 6 bytes and every character is an escape to decode.
//!
//! Sizes 4 KiB, 64 KiB and 1 MiB; prefix lengths 4,096 characters (typical) and 65,536 (the
//! maximum). With `BASELINE=1` in the environment, the floors instead: skipping the body with
//! serde_json (`IgnoredAny`), iterating it with sonic-rs, and UTF-8 validation alone.

use criterion::{black_box, criterion_group, BenchmarkId, Criterion, Throughput};
use prefix_router_core::extract::{scan_impl, serde_impl, sonic_impl};
use prefix_router_core::PrefixLength;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;
use serde_json::{json, Value};

const ENGLISH_WORDS: &[&str] = &[
    "the",
    "a",
    "of",
    "to",
    "and",
    "in",
    "is",
    "that",
    "for",
    "it",
    "with",
    "as",
    "on",
    "be",
    "this",
    "are",
    "by",
    "from",
    "or",
    "an",
    "can",
    "which",
    "we",
    "you",
    "not",
    "all",
    "will",
    "cache",
    "prefix",
    "request",
    "router",
    "server",
    "model",
    "token",
    "latency",
    "memory",
    "engine",
    "batch",
    "queue",
    "instance",
    "document",
    "question",
    "answer",
    "summary",
    "function",
    "value",
    "result",
    "example",
    "system",
    "user",
    "assistant",
    "context",
    "time",
    "first",
    "second",
    "each",
    "every",
    "more",
    "less",
    "than",
    "when",
    "then",
    "because",
    "should",
    "would",
    "could",
    "into",
    "over",
    "under",
    "between",
    "through",
    "during",
    "before",
    "after",
    "data",
    "report",
    "quarter",
    "revenue",
    "growth",
    "customer",
    "product",
    "design",
    "review",
    "change",
    "update",
    "support",
    "service",
    "network",
    "storage",
    "performance",
    "throughput",
    "configuration",
    "deployment",
    "measurement",
    "approach",
    "important",
    "different",
    "available",
    "specific",
    "following",
    "general",
    "simple",
    "however",
    "therefore",
    "usually",
    "quickly",
    "carefully",
    "probably",
    "exactly",
];
const ENGLISH_RARE: &[&str] = &["café", "naïve", "—", "it’s", "résumé", "€20", "déjà vu"];
const SYSTEM_PROMPT: &str = "You are a helpful assistant for an engineering team. Answer \
precisely and briefly.\nFollow these rules:\n- Cite the document section you rely on.\n- If \
the question is ambiguous, say so and state your assumption.\n- Use metric units.\n- Never \
invent numbers; say \"unknown\" when the documents do not say.\nFormat code in fenced blocks.";

/// English-like prose of about `bytes` bytes.
fn english_text(bytes: usize, rng: &mut Pcg64Mcg) -> String {
    let mut s = String::with_capacity(bytes + 200);
    let mut sentences_in_paragraph = 0;
    while s.len() < bytes {
        let words = rng.gen_range(6..20);
        let quoted = rng.gen_ratio(1, 12);
        if quoted {
            s.push('"');
        }
        for w in 0..words {
            let word = if rng.gen_ratio(1, 150) {
                ENGLISH_RARE[rng.gen_range(0..ENGLISH_RARE.len())]
            } else {
                ENGLISH_WORDS[rng.gen_range(0..ENGLISH_WORDS.len())]
            };
            if w == 0 {
                let mut cs = word.chars();
                if let Some(c) = cs.next() {
                    s.extend(c.to_uppercase());
                    s.push_str(cs.as_str());
                }
            } else {
                s.push_str(word);
            }
            if w + 1 < words {
                s.push_str(if rng.gen_ratio(1, 10) { ", " } else { " " });
            }
        }
        s.push('.');
        if quoted {
            s.push('"');
        }
        sentences_in_paragraph += 1;
        if sentences_in_paragraph >= rng.gen_range(3..7) {
            sentences_in_paragraph = 0;
            s.push_str(if rng.gen_ratio(1, 4) { "\n- " } else { "\n\n" });
        } else {
            s.push(' ');
        }
    }
    s
}

const HANZI: &str = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动\
同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两\
体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反\
你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象\
员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强\
放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联\
什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确\
才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商\
非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标\
写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严缓\
存模型请求路由缓存前缀延迟吞吐量";
const CJK_TERMS: &[&str] = &["GPU", "API", "2024", "KV", "vLLM", "TTFT", "64", "HTTP"];

/// Chinese-like prose of about `bytes` bytes of UTF-8.
fn cjk_text(bytes: usize, rng: &mut Pcg64Mcg) -> String {
    let hanzi: Vec<char> = HANZI.chars().collect();
    let mut s = String::with_capacity(bytes + 200);
    let mut sentences_in_paragraph = 0;
    while s.len() < bytes {
        let chars = rng.gen_range(8..30);
        for c in 0..chars {
            if rng.gen_ratio(1, 40) {
                s.push(' ');
                s.push_str(CJK_TERMS[rng.gen_range(0..CJK_TERMS.len())]);
                s.push(' ');
            } else {
                s.push(hanzi[rng.gen_range(0..hanzi.len())]);
            }
            if c > 3 && c + 3 < chars && rng.gen_ratio(1, 10) {
                s.push('，');
            }
        }
        s.push('。');
        sentences_in_paragraph += 1;
        if sentences_in_paragraph >= rng.gen_range(3..6) {
            sentences_in_paragraph = 0;
            s.push('\n');
        }
    }
    s
}

/// A chat request of about `size` bytes: system prompt, alternating user/assistant turns of
/// `text(bytes)`, model and options.
fn chat_value(
    size: usize,
    system: &str,
    rng: &mut Pcg64Mcg,
    text: fn(usize, &mut Pcg64Mcg) -> String,
) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system})];
    let mut total = 150 + system.len();
    let mut turn = 0;
    while total < size {
        // Short questions and longer answers; turns scale with the body so that even 1 MiB
        // has a plausible number of messages.
        let base = (size / 10).clamp(150, 120_000);
        let want = if turn % 2 == 0 {
            base / 2
        } else {
            base * 3 / 2
        };
        let want = rng
            .gen_range(want / 2..=want)
            .min(size - total + 20)
            .max(20);
        let content = text(want, rng);
        total += content.len() + 40;
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": content}));
        turn += 1;
    }
    json!({"model": "llama-3.1-70b", "messages": messages, "stream": true, "max_tokens": 512,
           "temperature": 0.2, "prompt_cache_key": "tenant-1"})
}

/// `v` as JSON text, with every non-ASCII character written as `\uXXXX` (surrogate pairs above
/// U+FFFF), as Python's `json.dumps` does by default.
fn ascii_json(v: &Value) -> Vec<u8> {
    let text = v.to_string();
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if c.is_ascii() {
            out.push(c);
        } else {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                out.push_str(&format!("\\u{u:04x}"));
            }
        }
    }
    out.into_bytes()
}

struct Body {
    kind: &'static str,
    size: &'static str,
    bytes: Vec<u8>,
}

fn bodies() -> Vec<Body> {
    let mut out = Vec::new();
    for (size, n) in [
        ("4KiB", 4usize << 10),
        ("64KiB", 64 << 10),
        ("1MiB", 1 << 20),
    ] {
        let mut rng = Pcg64Mcg::seed_from_u64(11);
        let english = chat_value(n, SYSTEM_PROMPT, &mut rng, english_text);
        out.push(Body {
            kind: "english",
            size,
            bytes: english.to_string().into_bytes(),
        });
        let mut rng = Pcg64Mcg::seed_from_u64(12);
        let system = "你是一个工程团队的助手。请准确、简要地回答。\n引用你所依据的文档章节。\
                      如果问题不明确，请说明你的假设。";
        // Raw UTF-8 CJK: 3 bytes a character, so aim at the byte size directly.
        let cjk = chat_value(n, system, &mut rng, cjk_text);
        out.push(Body {
            kind: "cjk",
            size,
            bytes: cjk.to_string().into_bytes(),
        });
        // Escaped CJK: 6 bytes a character; half the text gives the same body size.
        let mut rng = Pcg64Mcg::seed_from_u64(13);
        let escaped = chat_value(n / 2, system, &mut rng, cjk_text);
        out.push(Body {
            kind: "cjk_escaped",
            size,
            bytes: ascii_json(&escaped),
        });
    }
    out
}

/// One line per body for the results file: bytes, characters of text, share of ASCII bytes.
fn describe(b: &Body) {
    let v: Value = match serde_json::from_slice(&b.bytes) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    };
    let messages = v["messages"].as_array().map_or(0, Vec::len);
    let chars: usize = v["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| m["content"].as_str().map_or(0, |s| s.chars().count()))
        .sum();
    let ascii = b.bytes.iter().filter(|c| c.is_ascii()).count();
    let escapes = b.bytes.iter().filter(|&&c| c == b'\\').count();
    eprintln!(
        "body {}/{}: {} bytes, {} messages, {} content characters, {:.1}% ASCII bytes, {} escapes",
        b.kind,
        b.size,
        b.bytes.len(),
        messages,
        chars,
        100.0 * ascii as f64 / b.bytes.len() as f64,
        escapes
    );
}

fn bench(c: &mut Criterion) {
    let bodies = bodies();
    let baseline = std::env::var_os("BASELINE").is_some();
    for kind in ["english", "cjk", "cjk_escaped"] {
        let mut group = c.benchmark_group(format!("chat_extraction/{kind}"));
        for body in bodies.iter().filter(|b| b.kind == kind) {
            describe(body);
            let bytes = body.bytes.as_slice();
            group.throughput(Throughput::Bytes(bytes.len() as u64));
            if baseline {
                group.bench_with_input(
                    BenchmarkId::new("baseline_serde_ignored", body.size),
                    bytes,
                    |b, body| {
                        b.iter(|| {
                            black_box(
                                serde_json::from_slice::<serde::de::IgnoredAny>(black_box(body))
                                    .is_ok(),
                            )
                        })
                    },
                );
                group.bench_with_input(
                    BenchmarkId::new("baseline_sonic_iter", body.size),
                    bytes,
                    |b, body| {
                        b.iter(|| black_box(sonic_rs::to_object_iter(black_box(body)).count()))
                    },
                );
                group.bench_with_input(
                    BenchmarkId::new("baseline_std_utf8", body.size),
                    bytes,
                    |b, body| b.iter(|| black_box(std::str::from_utf8(black_box(body)).is_ok())),
                );
                continue;
            }
            for prefix in [4096u64, 65536] {
                let len = match PrefixLength::new(prefix) {
                    Ok(l) => l,
                    Err(e) => panic!("{e}"),
                };
                let a = serde_impl::chat_request(bytes, len);
                assert!(a.is_ok(), "{a:?}");
                assert_eq!(a, sonic_impl::chat_request(bytes, len));
                assert_eq!(a, scan_impl::chat_request(bytes, len));
                group.bench_with_input(
                    BenchmarkId::new(format!("own_reader/prefix_{prefix}"), body.size),
                    bytes,
                    |b, body| {
                        b.iter(|| black_box(scan_impl::chat_request(black_box(body), len).ok()))
                    },
                );
                group.bench_with_input(
                    BenchmarkId::new(format!("serde_json/prefix_{prefix}"), body.size),
                    bytes,
                    |b, body| {
                        b.iter(|| black_box(serde_impl::chat_request(black_box(body), len).ok()))
                    },
                );
                group.bench_with_input(
                    BenchmarkId::new(format!("sonic_rs/prefix_{prefix}"), body.size),
                    bytes,
                    |b, body| {
                        b.iter(|| black_box(sonic_impl::chat_request(black_box(body), len).ok()))
                    },
                );
            }
        }
        group.finish();
    }
}

/// `EXTRACT_LOOP="<back end> <kind> <size> <n>"` (back end `own_reader`, `serde_json` or
/// `sonic_rs`; kind and size as in the groups): extracts that body `n` times with a 4,096
/// character prefix and exits, for counting instructions under callgrind
/// (`bench/extract-instructions.sh` runs it at two values of `n` and takes the difference).
fn extraction_loop(spec: &str) {
    let parts: Vec<&str> = spec.split_whitespace().collect();
    let [back_end, kind, size, n] = parts.as_slice() else {
        panic!("EXTRACT_LOOP wants '<back end> <kind> <size> <n>', got {spec:?}");
    };
    let n: usize = n.parse().unwrap_or_else(|e| panic!("EXTRACT_LOOP n: {e}"));
    let extract = match *back_end {
        "own_reader" => scan_impl::chat_request,
        "serde_json" => serde_impl::chat_request,
        "sonic_rs" => sonic_impl::chat_request,
        other => panic!("EXTRACT_LOOP: unknown back end {other:?}"),
    };
    let bodies = bodies();
    let Some(body) = bodies.iter().find(|b| b.kind == *kind && b.size == *size) else {
        panic!("EXTRACT_LOOP: no body {kind} {size}");
    };
    let len = PrefixLength::new(4096).unwrap_or_else(|e| panic!("{e}"));
    for _ in 0..n {
        assert!(extract(black_box(&body.bytes), len).is_ok());
    }
}

criterion_group!(benches, bench);

fn main() {
    if let Ok(spec) = std::env::var("EXTRACT_LOOP") {
        extraction_loop(&spec);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
