//! What tokenizing a chat prompt costs with the byte-level BPE in `data/tokenizers` (the file
//! kv-aware's tests use): the time a request's tokenization takes, which `serve` spends on the
//! blocking pool rather than on a runtime worker.
//!
//! `cargo bench -p prefix-router-tokenize --bench tokenize`

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prefix_router_tokenize::{ChatTokenizer, Prompt};

/// A chat body whose one message is about `bytes` of distinct words.
fn body(bytes: usize) -> String {
    let mut text = String::with_capacity(bytes + 32);
    let mut w = 0;
    while text.len() < bytes {
        text.push_str(&format!("lease{w} clause "));
        w += 1;
    }
    serde_json::json!({"messages": [{"role": "user", "content": text}]}).to_string()
}

fn bench(c: &mut Criterion) {
    let file = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../data/tokenizers/byte-bpe/tokenizer.json");
    let tokenizer = match ChatTokenizer::from_setting(&file, None) {
        Ok(t) => t,
        Err(e) => panic!("{}: {e}", file.display()),
    };
    let mut group = c.benchmark_group("chat_prompt_byte_bpe");
    group.sample_size(10);
    for kib in [1usize, 16, 256] {
        let body = body(kib * 1024);
        let prompt = Prompt::from_body(body.as_bytes()).unwrap_or_else(|| panic!("a prompt"));
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("KiB", kib), &prompt, |b, p| {
            b.iter(|| black_box(tokenizer.ids(p).map(|ids| ids.len()).unwrap_or(0)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
