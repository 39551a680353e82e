//! Chat key extraction from 4 KiB, 64 KiB and 1 MiB bodies: serde_json against sonic-rs, at
//! prefix lengths of 1,024 and 65,536 characters.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use prefix_router_core::extract::{serde_impl, sonic_impl};
use prefix_router_core::PrefixLength;
use rand::{Rng, SeedableRng};
use rand_pcg::Pcg64Mcg;

/// A chat body of about `size` bytes: a system prompt, then user/assistant turns of prose with
/// newlines, quotes and some non-ASCII text (so strings carry escapes), then model and options.
fn chat_body(size: usize, rng: &mut Pcg64Mcg) -> Vec<u8> {
    let words = [
        "the",
        "cache",
        "prefix",
        "router",
        "token",
        "ümlaut",
        "日本",
        "\"quoted\"",
        "line\n",
        "value",
    ];
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": "You are a helpful assistant.\nAnswer briefly."}),
    ];
    let mut total = 100;
    let mut turn = 0;
    while total < size {
        let mut text = String::new();
        let target = (size / 6).clamp(200, 200_000).min(size - total + 50);
        while text.len() < target {
            text.push_str(words[rng.gen_range(0..words.len())]);
            text.push(' ');
        }
        total += text.len() + 40;
        let role = if turn % 2 == 0 { "user" } else { "assistant" };
        messages.push(serde_json::json!({"role": role, "content": text}));
        turn += 1;
    }
    let body = serde_json::json!({"model": "llama-3.1-70b", "messages": messages, "stream": true, "max_tokens": 256, "prompt_cache_key": "tenant-1"});
    match serde_json::to_vec(&body) {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

fn bench(c: &mut Criterion) {
    let mut rng = Pcg64Mcg::seed_from_u64(11);
    let mut group = c.benchmark_group("chat_extraction");
    for (label, size) in [("4KiB", 4 << 10), ("64KiB", 64 << 10), ("1MiB", 1 << 20)] {
        let body = chat_body(size, &mut rng);
        group.throughput(Throughput::Bytes(body.len() as u64));
        if std::env::var_os("BASELINE").is_some() {
            group.bench_with_input(
                BenchmarkId::new("baseline_serde_ignored", label),
                &body,
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
                BenchmarkId::new("baseline_sonic_iter", label),
                &body,
                |b, body| {
                    b.iter(|| {
                        black_box(sonic_rs::to_object_iter(black_box(body.as_slice())).count())
                    })
                },
            );
            group.bench_with_input(
                BenchmarkId::new("baseline_utf8", label),
                &body,
                |b, body| b.iter(|| black_box(std::str::from_utf8(black_box(body)).is_ok())),
            );
            continue;
        }
        for prefix in [1024u64, 65536] {
            let len = match PrefixLength::new(prefix) {
                Ok(l) => l,
                Err(e) => panic!("{e}"),
            };
            assert_eq!(
                serde_impl::chat_request(&body, len),
                sonic_impl::chat_request(&body, len)
            );
            group.bench_with_input(
                BenchmarkId::new(format!("serde_json/prefix_{prefix}"), label),
                &body,
                |b, body| b.iter(|| black_box(serde_impl::chat_request(black_box(body), len).ok())),
            );
            group.bench_with_input(
                BenchmarkId::new(format!("sonic_rs/prefix_{prefix}"), label),
                &body,
                |b, body| b.iter(|| black_box(sonic_impl::chat_request(black_box(body), len).ok())),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
