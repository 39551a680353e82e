//! `POST /v1/chat/completions` key extraction on arbitrary bytes: no panic, and the serde_json,
//! sonic-rs and own-reader back ends agree. Input: 2 bytes of prefix length, then the body.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_core::extract::{self, scan_impl, serde_impl, sonic_impl};
use prefix_router_fuzz::{assert_back_ends_agree, assert_reader_agrees, split_prefix_length};

fuzz_target!(|data: &[u8]| {
    let (len, body) = split_prefix_length(data);
    let serde = serde_impl::chat_request(body, len);
    let sonic = sonic_impl::chat_request(body, len);
    assert_back_ends_agree("chat_request", body, len, &serde, &sonic);
    let scan = scan_impl::chat_request(body, len);
    assert_reader_agrees("chat_request", body, len, &serde, &scan);
    // The public entry point is one of the back ends (whichever is the default).
    let default = extract::chat_request(body, len);
    assert!(
        default == serde || default == sonic || default == scan,
        "default differs from both: {default:?}"
    );
});
