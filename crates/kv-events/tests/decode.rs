//! The decoder against payloads built byte by byte from the MessagePack spec and vLLM's
//! schema (not with our encoder), in both layouts; the encoder round trip; and refusals.

use prefix_router_kv_events::{
    decode_batch, encode_batch, BlockRemoved, BlockStored, DecodeError, Encoding, EngineHash,
    EventBatch, KvEvent, Medium,
};
use proptest::prelude::*;

/// MessagePack by hand: just the forms these payloads use.
fn fixstr(s: &str) -> Vec<u8> {
    assert!(s.len() < 32);
    let mut v = vec![0xa0 | s.len() as u8];
    v.extend_from_slice(s.as_bytes());
    v
}
fn bin8(b: &[u8]) -> Vec<u8> {
    let mut v = vec![0xc4, b.len() as u8];
    v.extend_from_slice(b);
    v
}
fn f64be(x: f64) -> Vec<u8> {
    let mut v = vec![0xcb];
    v.extend_from_slice(&x.to_be_bytes());
    v
}
fn cat(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn positional_batch_of_older_vllm_with_integer_hashes() {
    // [1.5, [["BlockStored", [1, 2], nil, [10, 11, 12, 13], 2, nil, nil],
    //        ["BlockRemoved", [int64 -2, uint64 2^63], nil],
    //        ["AllBlocksCleared"]], 0]
    let payload = cat(&[
        vec![0x93],
        f64be(1.5),
        vec![0x93],
        vec![0x97],
        fixstr("BlockStored"),
        vec![0x92, 0x01, 0x02],
        vec![0xc0],
        vec![0x94, 0x0a, 0x0b, 0x0c, 0x0d],
        vec![0x02, 0xc0, 0xc0],
        vec![0x93],
        fixstr("BlockRemoved"),
        vec![0x92, 0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xfe],
        vec![0xcf, 0x80, 0, 0, 0, 0, 0, 0, 0],
        vec![0xc0],
        vec![0x91],
        fixstr("AllBlocksCleared"),
        vec![0x00],
    ]);
    let b = decode_batch(&payload).unwrap();
    assert_eq!(b.ts, 1.5);
    assert_eq!(b.data_parallel_rank, Some(0));
    assert_eq!(b.unknown_events, 0);
    assert_eq!(
        b.events,
        vec![
            KvEvent::Stored(BlockStored {
                block_hashes: vec![EngineHash(1), EngineHash(2)],
                parent: None,
                token_ids: vec![10, 11, 12, 13],
                block_size: 2,
                lora_id: None,
                lora_name: None,
                medium: Medium::Gpu,
                group_idx: None,
                extra_keys: false,
            }),
            KvEvent::Removed(BlockRemoved {
                block_hashes: vec![EngineHash(u64::MAX - 1), EngineHash(1 << 63)],
                medium: Medium::Gpu,
                group_idx: None,
            }),
            KvEvent::Cleared,
        ]
    );
}

#[test]
fn positional_events_may_leave_out_trailing_fields_and_add_new_ones() {
    // The oldest layout stops at `lora_id`; a newer one runs on to group_idx and beyond.
    let short = cat(&[
        vec![0x92],
        f64be(0.0),
        vec![0x91, 0x96],
        fixstr("BlockStored"),
        vec![0x91, 0x07, 0x05, 0x91, 0x01, 0x01, 0xc0],
    ]);
    let b = decode_batch(&short).unwrap();
    let KvEvent::Stored(s) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(s.parent, Some(EngineHash(5)));
    assert_eq!(s.medium, Medium::Gpu);
    assert_eq!(b.data_parallel_rank, None);
    let long = cat(&[
        vec![0x92],
        f64be(0.0),
        vec![0x91, 0x9c],
        fixstr("BlockStored"),
        vec![0x91, 0x07, 0xc0, 0x91, 0x01, 0x01, 0xc0],
        fixstr("CPU"),
        fixstr("adapter"),
        vec![0x91, 0xc0],         // extra_keys: [nil]
        vec![0x03],               // group_idx
        fixstr("full_attention"), // kv_cache_spec_kind
        vec![0xc0],               // kv_cache_spec_sliding_window
    ]);
    let b = decode_batch(&long).unwrap();
    let KvEvent::Stored(s) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(s.medium, Medium::Cpu);
    assert_eq!(s.lora_name.as_deref(), Some("adapter"));
    assert_eq!(s.group_idx, Some(3));
    assert!(!s.extra_keys, "[nil]: keyed by its tokens alone");
}

#[test]
fn map_batch_of_newer_vllm_with_byte_hashes_and_unknown_fields() {
    let h1 = [0xaa; 32];
    let h2 = [0xbb; 32];
    // {"ts": 2.0, "events": [
    //    {"type": "BlockStored", "block_hashes": [h2], "parent_block_hash": h1,
    //     "token_ids": [1, 2], "block_size": 2, "lora_id": nil, "medium": "GPU",
    //     "lora_name": nil, "novel": 7},
    //    {"type": "BlockRemoved", "block_hashes": [h1], "medium": "CPU"},
    //    {"type": "SomethingNew", "x": 1},
    //    {"type": "AllBlocksCleared"}],
    //  "data_parallel_rank": 1, "also_new": "x"}
    let payload = cat(&[
        vec![0x84],
        fixstr("ts"),
        f64be(2.0),
        fixstr("events"),
        vec![0x94],
        vec![0x89],
        fixstr("type"),
        fixstr("BlockStored"),
        fixstr("block_hashes"),
        vec![0x91],
        bin8(&h2),
        fixstr("parent_block_hash"),
        bin8(&h1),
        fixstr("token_ids"),
        vec![0x92, 0x01, 0x02],
        fixstr("block_size"),
        vec![0x02],
        fixstr("lora_id"),
        vec![0xc0],
        fixstr("medium"),
        fixstr("GPU"),
        fixstr("lora_name"),
        vec![0xc0],
        fixstr("novel"),
        vec![0x07],
        vec![0x83],
        fixstr("type"),
        fixstr("BlockRemoved"),
        fixstr("block_hashes"),
        vec![0x91],
        bin8(&h1),
        fixstr("medium"),
        fixstr("CPU"),
        vec![0x82],
        fixstr("type"),
        fixstr("SomethingNew"),
        fixstr("x"),
        vec![0x01],
        vec![0x81],
        fixstr("type"),
        fixstr("AllBlocksCleared"),
        fixstr("data_parallel_rank"),
        vec![0x01],
        fixstr("also_new"),
        fixstr("x"),
    ]);
    let b = decode_batch(&payload).unwrap();
    assert_eq!(b.ts, 2.0);
    assert_eq!(b.data_parallel_rank, Some(1));
    assert_eq!(b.unknown_events, 1, "SomethingNew is skipped and counted");
    assert_eq!(b.events.len(), 3);
    let KvEvent::Stored(s) = &b.events[0] else {
        panic!("{b:?}")
    };
    assert_eq!(s.block_hashes, vec![EngineHash::of_bytes(&h2)]);
    assert_eq!(s.parent, Some(EngineHash::of_bytes(&h1)));
    assert_eq!(s.token_ids, vec![1, 2]);
    let KvEvent::Removed(r) = &b.events[1] else {
        panic!("{b:?}")
    };
    assert_eq!(r.block_hashes, vec![EngineHash::of_bytes(&h1)]);
    assert_eq!(r.medium, Medium::Cpu);
    assert_eq!(b.events[2], KvEvent::Cleared);
}

#[test]
fn malformed_payloads_are_errors_naming_what_is_wrong() {
    // 0xc1 is the one byte MessagePack never uses; rmpv reads it as nil.
    assert!(decode_batch(&[0xc1]).is_err());
    assert!(matches!(
        decode_batch(&[0xcb, 0x00]),
        Err(DecodeError::Msgpack(_))
    ));
    assert!(matches!(decode_batch(&[]), Err(DecodeError::Msgpack(_))));
    assert_eq!(decode_batch(&[0x90, 0x90]), Err(DecodeError::Trailing(1)));
    assert!(matches!(
        decode_batch(&[0x07]),
        Err(DecodeError::Shape { what: "batch", .. })
    ));
    // block_hashes as a string.
    let bad = cat(&[
        vec![0x92],
        f64be(0.0),
        vec![0x91, 0x92],
        fixstr("BlockRemoved"),
        fixstr("oops"),
    ]);
    assert_eq!(
        decode_batch(&bad).unwrap_err().to_string(),
        "block_hashes: expected an array of block hashes"
    );
    // A token id that does not fit 32 bits, an event without its type.
    let bad = cat(&[
        vec![0x92],
        f64be(0.0),
        vec![0x91, 0x94],
        fixstr("BlockStored"),
        vec![0x90, 0xc0, 0x91, 0xd0, 0xff],
    ]);
    assert!(decode_batch(&bad).is_err());
    let bad = cat(&[
        vec![0x92],
        f64be(0.0),
        vec![0x91, 0x81],
        fixstr("x"),
        vec![0x01],
    ]);
    assert!(decode_batch(&bad).is_err());
    // Nesting past any event's depth.
    let deep = [vec![0x91; 100], vec![0x90]].concat();
    assert!(matches!(decode_batch(&deep), Err(DecodeError::Msgpack(_))));
    // A huge claimed length in a tiny payload fails instead of allocating.
    assert!(decode_batch(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
}

fn arb_hash() -> impl Strategy<Value = EngineHash> {
    any::<u64>().prop_map(EngineHash)
}

fn arb_medium() -> impl Strategy<Value = Medium> {
    prop_oneof![
        Just(Medium::Gpu),
        Just(Medium::Cpu),
        "[A-Z]{1,6}".prop_map(|s| Medium::parse(Some(&s))),
    ]
}

fn arb_event() -> impl Strategy<Value = KvEvent> {
    prop_oneof![
        (
            proptest::collection::vec(arb_hash(), 0..6),
            proptest::option::of(arb_hash()),
            proptest::collection::vec(any::<u32>(), 0..40),
            0u32..64,
            proptest::option::of(any::<i64>()),
            proptest::option::of("[a-z]{0,8}"),
            arb_medium(),
            (proptest::option::of(0i64..8), any::<bool>()),
        )
            .prop_map(
                |(h, p, t, bs, lid, ln, m, (g, x))| KvEvent::Stored(BlockStored {
                    extra_keys: x,
                    block_hashes: h,
                    parent: p,
                    token_ids: t,
                    block_size: bs,
                    lora_id: lid,
                    lora_name: ln,
                    medium: m,
                    group_idx: g,
                })
            ),
        (
            proptest::collection::vec(arb_hash(), 0..6),
            arb_medium(),
            proptest::option::of(0i64..8)
        )
            .prop_map(|(h, m, g)| KvEvent::Removed(BlockRemoved {
                block_hashes: h,
                medium: m,
                group_idx: g,
            })),
        Just(KvEvent::Cleared),
    ]
}

fn read_back(e: &KvEvent, enc: Encoding) -> KvEvent {
    let mut e = e.clone();
    match &mut e {
        KvEvent::Stored(s) => {
            s.block_hashes
                .iter_mut()
                .for_each(|h| *h = enc.read_back(*h));
            s.parent = s.parent.map(|h| enc.read_back(h));
        }
        KvEvent::Removed(r) => r
            .block_hashes
            .iter_mut()
            .for_each(|h| *h = enc.read_back(*h)),
        KvEvent::Cleared => {}
    }
    e
}

proptest! {
    #[test]
    fn both_encodings_read_back(
        events in proptest::collection::vec(arb_event(), 0..8),
        ts in 0.0f64..2e9,
        rank in proptest::option::of(0i64..16),
        positional in any::<bool>(),
    ) {
        let enc = if positional { Encoding::Positional } else { Encoding::Map };
        let batch = EventBatch { ts, events, data_parallel_rank: rank, unknown_events: 0 };
        let payload = encode_batch(&batch, enc);
        let got = decode_batch(&payload).unwrap();
        prop_assert_eq!(got.ts, ts);
        prop_assert_eq!(got.data_parallel_rank, rank);
        let want: Vec<KvEvent> = batch.events.iter().map(|e| read_back(e, enc)).collect();
        prop_assert_eq!(got.events, want);
        // Every cut of a valid payload is refused, never a panic.
        for cut in 0..payload.len() {
            prop_assert!(decode_batch(&payload[..cut]).is_err());
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = decode_batch(&bytes);
    }
}

/// A LoRA request's blocks are hashed with the adapter as their extra key, and vLLM lists it in
/// `extra_keys`: an entry that holds only the block's adapter (by name or number) says nothing
/// the adapter fields do not, and does not count as extra keys; anything beside it does.
#[test]
fn extra_keys_that_only_name_the_adapter_are_not_extra() {
    // ["BlockStored", [7], nil, [1], 1, lora_id, "GPU", lora_name, extra_keys]
    let event = |lora_id: Vec<u8>, lora_name: Vec<u8>, extra: Vec<u8>| {
        cat(&[
            vec![0x92],
            f64be(0.0),
            vec![0x91, 0x99],
            fixstr("BlockStored"),
            vec![0x91, 0x07, 0xc0, 0x91, 0x01, 0x01],
            lora_id,
            fixstr("GPU"),
            lora_name,
            extra,
        ])
    };
    let extra = |bytes: &[u8]| {
        let b = decode_batch(bytes).unwrap_or_else(|e| panic!("{e}"));
        match &b.events[0] {
            KvEvent::Stored(s) => s.extra_keys,
            other => panic!("{other:?}"),
        }
    };
    let named = |keys: &[&str]| {
        let mut v = vec![0x91, 0x90 | keys.len() as u8];
        for k in keys {
            v.extend(fixstr(k));
        }
        v
    };
    // By name: [["sql"]] is the adapter alone; [["sql", "img"]] has an image's hash beside it.
    assert!(!extra(&event(vec![0xc0], fixstr("sql"), named(&["sql"]))));
    assert!(extra(&event(
        vec![0xc0],
        fixstr("sql"),
        named(&["sql", "img"])
    )));
    // Another adapter's name, or a name where the event names none, is not this block's.
    assert!(extra(&event(vec![0xc0], fixstr("sql"), named(&["chat"]))));
    assert!(extra(&event(vec![0xc0], vec![0xc0], named(&["sql"]))));
    // By number: [[3]] with lora_id 3.
    assert!(!extra(&event(
        vec![0x03],
        vec![0xc0],
        vec![0x91, 0x91, 0x03]
    )));
    assert!(extra(&event(
        vec![0x04],
        vec![0xc0],
        vec![0x91, 0x91, 0x03]
    )));
}
