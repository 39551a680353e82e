//! The KV-event decoder on arbitrary bytes: no panic, and a batch it accepts survives a round
//! trip through the positional encoding unchanged (integer hashes read back as themselves).
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_kv_events::{decode_batch, encode_batch, wire, Encoding};

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = decode_batch(data) {
        let again = decode_batch(&encode_batch(&batch, Encoding::Positional))
            .unwrap_or_else(|e| panic!("re-encoded batch refused: {e}\n{batch:?}"));
        assert_eq!(again.ts.to_bits(), batch.ts.to_bits());
        assert_eq!(again.events, batch.events);
        assert_eq!(again.data_parallel_rank, batch.data_parallel_rank);
        // The map encoding is accepted too.
        let mapped = decode_batch(&encode_batch(&batch, Encoding::Map)).expect("map layout");
        assert_eq!(mapped.events.len(), batch.events.len());
    }
    // The frame readers on the same bytes cut into up to three frames.
    let cut = data.len() / 3;
    let frames = [&data[..cut], &data[cut..2 * cut], &data[2 * cut..]];
    let _ = wire::published(&frames);
    let _ = wire::replayed(&frames);
    let _ = wire::replayed(&frames[1..]);
    let _ = wire::parse_replay_request(&frames[1..]);
});
