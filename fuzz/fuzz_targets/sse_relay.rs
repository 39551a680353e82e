//! What the relay reads from a response body as it streams by, on arbitrary bytes cut at
//! arbitrary places: the usage scanner finds the same usage however the body is split (the
//! first byte chooses the cuts), and the rewriting of hyper's canned error heads and the path
//! check never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_server::usage::UsageScanner;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let mut whole = UsageScanner::new();
    whole.feed(body);
    let expected = whole.finish();

    let mut split = UsageScanner::new();
    let step = usize::from(seed % 31) + 1;
    let mut at = 0;
    let mut n = 0usize;
    while at < body.len() {
        // Uneven pieces: 1..=step bytes, varying with the position.
        let len = (1 + (n * 7 + usize::from(seed)) % step).min(body.len() - at);
        split.feed(&body[at..at + len]);
        at += len;
        n += 1;
    }
    assert_eq!(split.finish(), expected, "split every {step}");

    let _ = prefix_router_server::canned::replace(body, 8192);
    if let Ok(path) = std::str::from_utf8(body) {
        let _ = prefix_router_server::handler::check_path(path);
    }
});
