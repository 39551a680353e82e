//! The own reader's unit tests (the differential tests against serde_json and sonic-rs are in
//! `extract.rs` and `tests/extract_props.rs`).

use super::*;

#[test]
fn a_run_stops_at_its_first_quote_backslash_or_control_character() {
    for len in [
        0usize, 1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 101, 128, 129, 300,
    ] {
        assert_eq!(find_stop(&vec![b'a'; len]), None, "{len}");
        for at in (0..len).step_by(7).chain(len.checked_sub(1)) {
            for stop in [b'"', b'\\', 0x00, 0x1F] {
                let mut run = vec![b' '; len];
                run[at] = stop;
                if at + 1 < len {
                    run[at + 1] = b'"';
                }
                assert_eq!(find_stop(&run), Some(at), "{len} {at} {stop}");
            }
        }
    }
    assert_eq!(find_stop("é€\u{7f}\u{80}\"".as_bytes()), Some(8));
}

#[test]
fn strings_escapes_and_numbers() {
    let ok = |s: &str| Reader::new(s).value().map(str::len);
    assert_eq!(ok(r#""a\"b\\c\/\u00e9\n" x"#), Ok(19));
    assert_eq!(ok("-0.5e+10,"), Ok(8));
    assert_eq!(ok("[1, {\"a\": [true, false, null]}] "), Ok(31));
    for bad in [
        "\"a\u{1}\"",
        "\"aaaaaaaaaaaaaaaaaaaa\u{1f}aaa\"",
        "\"aaaaaaaaaaaaaaaaaaaa\\xaa\"",
        "\"aaaaaaaaaaaaaaaaaaaa",
        "\"\\q\"",
        "\"\\u12\"",
        "\"abc",
        "01",
        "1.",
        "1e",
        "-",
        "tru",
        "[1,]",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{1:2}",
        "[1 2]",
    ] {
        assert!(Reader::new(bad).value().is_err(), "{bad:?}");
    }
}

#[test]
fn keys_are_unescaped_and_must_be_unicode() {
    let mut r = Reader::new(r#""mod\u0065l""#);
    assert_eq!(r.key().as_deref(), Ok("model"));
    assert!(Reader::new(r#""\ud800""#).key().is_err());
    // Not read, not decoded: serde_json's skipping accepts it too.
    assert!(Reader::new(r#"{"\ud800": 1}"#).value().is_ok());
    let mut r = Reader::new(r#""\ud83d\ude00""#);
    assert_eq!(r.key().as_deref(), Ok("\u{1F600}"));
}
