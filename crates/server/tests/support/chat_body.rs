//! The 16 KiB chat bodies the router's cost is measured with: shared by the overhead bench
//! (`benches/overhead.rs`, which includes this file by path) and the allocation test.

use bytes::Bytes;

/// A chat body of about 16 KiB with its own document `i` (its own routing key and prefix).
pub fn chat_body(i: usize) -> Bytes {
    let mut doc = format!("Document {i}. ");
    let mut x = i as u64 + 1;
    while doc.len() < 16 * 1024 - 200 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        doc.push_str(
            ["policy ", "clause ", "section ", "rate ", "term ", "limit "][(x >> 60) as usize % 6],
        );
    }
    let body = serde_json::json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": doc},
            {"role": "user", "content": "Summarise."}
        ]
    });
    Bytes::from(body.to_string())
}
