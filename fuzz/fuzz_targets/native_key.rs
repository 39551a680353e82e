//! Native API key extraction on arbitrary bytes: no panic; the key is refused exactly when the
//! group header is not a valid group id, and is the hash of (group, first `len` bytes).
//!
//! Input: 2 bytes of prefix length; 1 byte `g`: 0xFF means no `X-Prefix-Aware-Id` header,
//! otherwise the header is the next `g % 80` bytes (so too long ids are reached too); the rest
//! is the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::extract::native_key;
use prefix_router_core::{ExtractError, GroupId, KeyHash};
use prefix_router_fuzz::split_prefix_length;

fuzz_target!(|data: &[u8]| {
    let (len, rest) = split_prefix_length(data);
    let (header, body) = match rest.split_first() {
        None | Some((0xFF, _)) => (None, rest.get(1..).unwrap_or_default()),
        Some((&g, tail)) => {
            let n = usize::from(g % 80).min(tail.len());
            (Some(&tail[..n]), &tail[n..])
        }
    };
    let got = native_key(body, header, len);
    match header.map(GroupId::parse).transpose() {
        Err(e) => assert_eq!(got, Err(ExtractError::Group(e))),
        Ok(group) => {
            let prefix = &body[..body.len().min(len.get())];
            assert_eq!(got, Ok(KeyHash::new(group.map(|g| g.as_str()), prefix)));
            // Bytes past the prefix never change the key.
            if body.len() >= len.get() {
                let mut longer = body.to_vec();
                longer.push(b'x');
                assert_eq!(native_key(&longer, header, len), got);
            }
        }
    }
});
