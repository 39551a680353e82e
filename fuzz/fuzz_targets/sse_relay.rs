//! What the relay reads from a response body as it streams by, on arbitrary bytes cut at
//! arbitrary places (the first byte chooses the cuts): the usage scanner finds the same usage,
//! the Responses API's id scanner the same id, and the reader of a Responses stream's opening
//! events the first token in the same event, however the body is split; and the rewriting of
//! hyper's canned error heads and the path check never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router_server::opening::OpeningEvents;
use prefix_router_server::responses::IdScanner;
use prefix_router_server::usage::UsageScanner;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, body)) = data.split_first() else {
        return;
    };
    let mut whole = UsageScanner::new();
    whole.feed(body);
    let expected = whole.finish();

    // Uneven pieces: 1..=step bytes, varying with the position.
    let step = usize::from(seed % 31) + 1;
    let mut pieces = Vec::new();
    let (mut at, mut n) = (0, 0usize);
    while at < body.len() {
        let len = (1 + (n * 7 + usize::from(seed)) % step).min(body.len() - at);
        pieces.push(&body[at..at + len]);
        at += len;
        n += 1;
    }

    let mut split = UsageScanner::new();
    for p in &pieces {
        split.feed(p);
    }
    assert_eq!(split.finish(), expected, "split every {step}");

    let whole_id = IdScanner::default().feed(body);
    let mut ids = IdScanner::default();
    let split_id = pieces.iter().find_map(|p| ids.feed(p));
    assert_eq!(split_id, whole_id, "id, split every {step}");

    // Where the first token begins: found in the whole body exactly when found in the pieces,
    // and, in pieces, no later than the piece holding the first byte after the line that
    // decides (a stream of opening events alone is no token either way).
    let whole_token = OpeningEvents::new().feed(body);
    let mut opening = OpeningEvents::new();
    let split_token = pieces.iter().any(|p| opening.feed(p));
    assert_eq!(split_token, whole_token, "first token, split every {step}");

    let _ = prefix_router_server::canned::replace(body, 8192);
    if let Ok(path) = std::str::from_utf8(body) {
        let _ = prefix_router_server::handler::check_path(path);
    }
});
