//! Helpers shared by the fuzz targets (see `README.md`).

use prefix_router_core::{ExtractError, PrefixLength, RequestInfo};
use std::sync::OnceLock;

/// Splits a fuzz input into a prefix length within `PrefixLength::MIN..=MAX` (taken from the
/// first two bytes, big-endian, so every length in the range is reachable) and the rest.
/// Inputs shorter than two bytes get the minimum length and are used whole.
pub fn split_prefix_length(data: &[u8]) -> (PrefixLength, &[u8]) {
    let (n, rest) = match data {
        [a, b, rest @ ..] => {
            let span = u64::from(PrefixLength::MAX - PrefixLength::MIN) + 1;
            let v = u64::from(u16::from_be_bytes([*a, *b]));
            (u64::from(PrefixLength::MIN) + v % span, rest)
        }
        _ => (u64::from(PrefixLength::MIN), data),
    };
    let len = PrefixLength::new(n).expect("a length within MIN..=MAX is accepted");
    assert_eq!(len.get() as u64, n);
    (len, rest)
}

/// Whether `PREFIX_ROUTER_FUZZ_STRICT_ERRORS=1`: then the two back ends must also return the
/// same error, except that two JSON syntax errors may word their messages differently (the
/// rule the unit tests in `crates/core/src/extract.rs` apply to hand-written bodies).
fn strict_errors() -> bool {
    static STRICT: OnceLock<bool> = OnceLock::new();
    *STRICT.get_or_init(|| {
        std::env::var_os("PREFIX_ROUTER_FUZZ_STRICT_ERRORS").is_some_and(|v| v == "1")
    })
}

/// The differential check of the extract targets: both back ends return the same `Ok` value, or
/// both an error (the same error under [`strict_errors`]). Panics, naming the body, otherwise.
pub fn assert_back_ends_agree(
    what: &str,
    body: &[u8],
    len: PrefixLength,
    serde: &Result<RequestInfo, ExtractError>,
    sonic: &Result<RequestInfo, ExtractError>,
) {
    let pair = [("serde_impl", serde), ("sonic_impl", sonic)];
    assert_pair_agrees(what, body, len, pair, strict_errors());
}

/// The own reader (`scan_impl`) against serde_json: the same `Ok` value, and the same typed
/// error (both read in document order and stop at the first problem); two JSON syntax errors
/// may word their messages differently. Panics, naming the body, otherwise.
pub fn assert_reader_agrees(
    what: &str,
    body: &[u8],
    len: PrefixLength,
    serde: &Result<RequestInfo, ExtractError>,
    scan: &Result<RequestInfo, ExtractError>,
) {
    assert_pair_agrees(
        what,
        body,
        len,
        [("serde_impl", serde), ("scan_impl", scan)],
        true,
    );
}

/// Two back ends' answers agree: equal, or both JSON syntax errors, or (unless `strict`) both
/// errors of any kind.
fn assert_pair_agrees(
    what: &str,
    body: &[u8],
    len: PrefixLength,
    [(a_name, a), (b_name, b)]: [(&str, &Result<RequestInfo, ExtractError>); 2],
    strict: bool,
) {
    let agree = match (a, b) {
        (Err(ExtractError::Json(_)), Err(ExtractError::Json(_))) => true,
        (Err(_), Err(_)) if !strict => true,
        _ => a == b,
    };
    if !agree {
        panic!(
            "{what}: {a_name} and {b_name} disagree (prefix length {})\n  {a_name}: {a:?}\n  {b_name}: {b:?}\n  body: {:?}",
            len.get(),
            String::from_utf8_lossy(body),
        );
    }
}
