//! A client's request as the router's HTTP/1.1 front reads it (`front::parse_request`, then a
//! chunked body through `h1::BodyDecoder`), on arbitrary bytes cut into reads at arbitrary places
//! (the first byte chooses the cuts): never a panic; the head, its framing and the body come out
//! the same however the bytes were split; a body never holds more bytes than were fed.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use prefix_router_server::front::{parse_request, BodyFraming};
use prefix_router_server::h1::{BodyDecoder, Decoded, Framing};

/// The most head bytes accepted here: small, so that the limit is reached too.
const MAX_HEAD: usize = 2048;

/// What the front makes of `wire` fed `step`-byte pieces (all at once for 0): method, URI,
/// framing, keep-alive, the body and whether it ended; `None` for a refused head or body.
fn read(wire: &[u8], step: usize) -> Option<(String, String, BodyFraming, bool, Vec<u8>, bool)> {
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut feed = |buf: &mut BytesMut| -> bool {
        if fed == wire.len() {
            return false;
        }
        let n = if step == 0 { wire.len() - fed } else { step.min(wire.len() - fed) };
        buf.extend_from_slice(&wire[fed..fed + n]);
        fed += n;
        true
    };
    let head = loop {
        match parse_request(&mut buf, MAX_HEAD) {
            Err(_) => return None,
            Ok(Some(h)) => break h,
            Ok(None) => {
                if !feed(&mut buf) {
                    return None;
                }
            }
        }
    };
    let what = (
        head.parts.method.to_string(),
        head.parts.uri.to_string(),
        head.framing,
        head.keep_alive,
    );
    let mut decoder = BodyDecoder::new(match head.framing {
        BodyFraming::Length(n) => Framing::Length(n),
        BodyFraming::Chunked => Framing::Chunked,
    });
    let mut body = Vec::new();
    loop {
        match decoder.decode(&mut buf) {
            Err(_) => return None,
            Ok(Decoded::Data(d)) => body.extend_from_slice(&d),
            Ok(Decoded::End) => return Some((what.0, what.1, what.2, what.3, body, true)),
            Ok(Decoded::More) => {
                if !feed(&mut buf) {
                    return Some((what.0, what.1, what.2, what.3, body, false));
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
    if let Some((.., body, _)) = &whole {
        assert!(body.len() <= wire.len());
    }
    let step = usize::from(seed % 17) + 1;
    assert_eq!(read(wire, step), whole, "cut every {step} bytes");
});
