//! An instance's response headers on their way to the client, kept in HTTP/1 wire form.
//!
//! Why not a `HeaderMap`: building one from the instance's head (each name parsed and hashed,
//! each value checked and stored), stripping it, adding the routing headers and writing it out
//! again was about 3,000 of the 46,000 instructions of a 1 KiB request (callgrind,
//! `bench/peers.sh` count mode). httparse has already checked every name and value by the
//! rules a `HeaderMap` enforces, so the lines are copied once, less what must not be passed on,
//! and the HTTP/1 front writes them as they are. A front served by hyper (HTTP/2, TLS) turns
//! them into a map ([`Fields::into_map`]).

use bytes::BytesMut;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_LENGTH};

/// End-to-end response headers, `name: value\r\n` each (names as the instance spelled them;
/// HTTP/1 names are case-insensitive), without the hop-by-hop ones, those `Connection` names,
/// the framing ones (`content-length`, `transfer-encoding`: the front frames every answer
/// itself) and the router's own routing headers (the proxy adds its own).
#[derive(Debug, Clone, Default)]
pub struct Fields {
    lines: BytesMut,
    /// The `content-length` the instance declared (what a `HEAD` answer announces).
    content_length: Option<u64>,
    /// `content-type` is `text/event-stream`.
    event_stream: bool,
    /// A `date` header is among the lines.
    date: bool,
}

impl Fields {
    /// Room for `bytes` of lines.
    pub fn with_capacity(bytes: usize) -> Self {
        Self {
            lines: BytesMut::with_capacity(bytes),
            ..Self::default()
        }
    }

    /// Appends a header, its name as given. `name` must be a valid header name (any case) and
    /// `value` a valid value ([`valid_value`]); the caller has checked them.
    pub fn push(&mut self, name: &[u8], value: &[u8]) {
        self.note(name, value);
        self.lines.reserve(name.len() + value.len() + 4);
        self.lines.extend_from_slice(name);
        self.lines.extend_from_slice(b": ");
        self.lines.extend_from_slice(value);
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Appends an instance's header line as it came (`line`: from its name to the end of its
    /// value, line end excluded), `name` and `value` being its parts as httparse read and
    /// checked them: one copy, the instance's spelling kept (names are case-insensitive).
    pub fn push_line(&mut self, name: &[u8], value: &[u8], line: &[u8]) {
        self.note(name, value);
        self.lines.reserve(line.len() + 2);
        self.lines.extend_from_slice(line);
        self.lines.extend_from_slice(b"\r\n");
    }

    /// Notes what the front needs to know of a header.
    fn note(&mut self, name: &[u8], value: &[u8]) {
        match name.len() {
            4 if name.eq_ignore_ascii_case(b"date") => self.date = true,
            12 if name.eq_ignore_ascii_case(b"content-type") => {
                self.event_stream = is_event_stream(value);
            }
            _ => {}
        }
    }

    /// Appends a header whose value may not be valid (an instance id from configuration):
    /// left out, as a `HeaderMap` would refuse it, when it is not.
    pub fn push_checked(&mut self, name: &[u8], value: &[u8]) {
        if valid_value(value) {
            self.push(name, value);
        }
    }

    /// Records the declared `content-length`.
    pub fn set_content_length(&mut self, n: Option<u64>) {
        self.content_length = n;
    }

    /// The lines, in wire form.
    pub fn lines(&self) -> &[u8] {
        &self.lines
    }
    /// The `content-length` the instance declared.
    pub fn content_length(&self) -> Option<u64> {
        self.content_length
    }
    /// Whether the answer is a server-sent event stream.
    pub fn is_event_stream(&self) -> bool {
        self.event_stream
    }
    /// Whether the lines carry a `date`.
    pub fn has_date(&self) -> bool {
        self.date
    }

    /// Appends the headers to `map`, the declared `content-length` included (hyper frames the
    /// answer by it, as it did when the instance's whole head was a map).
    pub fn into_map(self, map: &mut HeaderMap) {
        for line in self.lines[..]
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
        {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let (name, value) = (&line[..colon], line[colon + 1..].trim_ascii_start());
            // Both were checked when pushed: neither fails.
            if let (Ok(name), Ok(value)) =
                (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
            {
                map.append(name, value);
            }
        }
        if let Some(n) = self.content_length {
            map.insert(CONTENT_LENGTH, HeaderValue::from(n));
        }
    }
}

/// Whether `value` may be a header value: visible characters, spaces and tabs, and bytes of
/// 0x80 and above (obs-text), as both httparse and `HeaderValue` accept.
pub fn valid_value(value: &[u8]) -> bool {
    value
        .iter()
        .all(|&b| (b >= 0x20 && b != 0x7f) || b == b'\t')
}

/// Whether a `content-type` value names a server-sent event stream (parameters such as
/// `; charset=utf-8` after it allowed).
pub fn is_event_stream(content_type: &[u8]) -> bool {
    content_type
        .trim_ascii_start()
        .get(..17)
        .is_some_and(|t| t.eq_ignore_ascii_case(b"text/event-stream"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lines_are_kept_as_given_and_flags_follow_the_names_in_any_case() {
        let mut f = Fields::default();
        f.push(b"Content-Type", b"text/event-stream; charset=utf-8");
        f.push(b"X-Request-Id", b"Ab1");
        assert_eq!(
            f.lines(),
            b"Content-Type: text/event-stream; charset=utf-8\r\nX-Request-Id: Ab1\r\n"
        );
        assert!(f.is_event_stream());
        assert!(!f.has_date());
        f.push(b"DATE", b"Sun, 06 Nov 1994 08:49:37 GMT");
        assert!(f.has_date());
        let mut g = Fields::default();
        g.push(b"content-type", b"application/json");
        assert!(!g.is_event_stream());
    }

    #[test]
    fn an_invalid_value_is_left_out() {
        let mut f = Fields::default();
        f.push_checked(b"x-prefix-router-instance", b"bad\nid");
        f.push_checked(b"x-prefix-router-instance", b"del\x7f");
        assert!(f.lines().is_empty());
        f.push_checked(b"x-prefix-router-instance", b"gpu-0\tx\xff");
        assert_eq!(f.lines(), b"x-prefix-router-instance: gpu-0\tx\xff\r\n");
    }

    #[test]
    fn into_map_keeps_every_line_and_the_declared_length() {
        let mut f = Fields::default();
        f.push(b"Set-Cookie", b"a=1");
        f.push(b"set-cookie", b"b=2");
        f.push(b"x-empty", b"");
        f.set_content_length(Some(42));
        let mut map = HeaderMap::new();
        f.into_map(&mut map);
        let cookies: Vec<_> = map.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert_eq!(map["x-empty"], "");
        assert_eq!(map["content-length"], "42");
        assert_eq!(map.len(), 4);
    }

    proptest! {
        /// `valid_value` is `HeaderValue`'s own rule.
        #[test]
        fn valid_value_agrees_with_header_value(v in proptest::collection::vec(any::<u8>(), 0..8)) {
            prop_assert_eq!(valid_value(&v), HeaderValue::from_bytes(&v).is_ok());
        }

        /// Whatever valid headers go in come out of `into_map` as a map built directly would
        /// hold them.
        #[test]
        fn into_map_round_trips(
            pairs in proptest::collection::vec(("[A-Za-z][A-Za-z0-9-]{0,12}", "[ -~]{0,20}"), 0..6)
        ) {
            let mut f = Fields::default();
            let mut direct = HeaderMap::new();
            for (n, v) in &pairs {
                let v = v.trim_matches(' ');
                f.push(n.as_bytes(), v.as_bytes());
                direct.append(
                    HeaderName::from_bytes(n.as_bytes()).expect("valid name"),
                    HeaderValue::from_str(v).expect("valid value"),
                );
            }
            let mut map = HeaderMap::new();
            f.into_map(&mut map);
            prop_assert_eq!(map, direct);
        }
    }
}
