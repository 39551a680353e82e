//! An instance's answer as the router's upstream client reads it (`h1::parse_head`, then
//! `h1::BodyDecoder`), on arbitrary bytes cut into reads at arbitrary places (the first byte
//! chooses the cuts): never a panic; the head and body come out the same however the bytes were
//! split; a body never holds more bytes than were fed; a length-framed body is exactly its
//! length.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use prefix_router_server::h1::{parse_head, BodyDecoder, Decoded, Framing};

/// What a read loop makes of `wire` fed `step`-byte pieces (all at once for 0): the status and
/// framing, the body, and whether it ended; `None` for an error.
fn read(wire: &[u8], step: usize) -> Option<(u16, Framing, Vec<u8>, bool)> {
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut feed = |buf: &mut BytesMut| -> bool {
        if fed == wire.len() {
            return false;
        }
        let n = if step == 0 {
            wire.len() - fed
        } else {
            step.min(wire.len() - fed)
        };
        buf.extend_from_slice(&wire[fed..fed + n]);
        fed += n;
        true
    };
    let head = loop {
        match parse_head(&mut buf, false) {
            Err(_) => return None,
            Ok(Some(h)) if h.status.is_informational() => continue,
            Ok(Some(h)) => break h,
            Ok(None) => {
                if !feed(&mut buf) {
                    return None;
                }
            }
        }
    };
    let mut decoder = BodyDecoder::new(head.framing);
    let mut body = Vec::new();
    loop {
        match decoder.decode(&mut buf) {
            Err(_) => return None,
            Ok(Decoded::Data(d)) => {
                assert!(!d.is_empty(), "an empty data piece");
                body.extend_from_slice(&d);
            }
            Ok(Decoded::End) => return Some((head.status.as_u16(), head.framing, body, true)),
            Ok(Decoded::More) => {
                if !feed(&mut buf) {
                    return Some((head.status.as_u16(), head.framing, body, false));
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&seed, wire)) = data.split_first() else {
        return;
    };
    let whole = read(wire, 0);
    if let Some((_, framing, body, ended)) = &whole {
        assert!(body.len() <= wire.len());
        if let (Framing::Length(n), true) = (framing, ended) {
            assert_eq!(body.len() as u64, *n, "a length-framed body is its length");
        }
    }
    let step = usize::from(seed % 17) + 1;
    let split = read(wire, step);
    // A close-framed body that has not ended reads as far as the bytes go either way; every
    // other outcome is the same however the reads cut the wire.
    assert_eq!(split, whole, "cut every {step} bytes");
});
