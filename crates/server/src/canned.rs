//! hyper, which serves TLS and HTTP/2 connections (plaintext HTTP/1.1 is the router's own
//! [`crate::front`]), answers a request it cannot parse itself, before the router sees it: 400
//! for a malformed request line or header, 431 for a head over the buffer, 414 for a URI too
//! long, each with an empty body. Clients of an OpenAI-compatible endpoint expect every error in
//! the OpenAI shape, so the client socket's writer ([`crate::conn::TrackedIo`]) swaps such a
//! canned head for the same status with a JSON body that says what was wrong. The front answers
//! the same errors with the same bodies ([`malformed`], [`head_too_large`]).
//!
//! A canned answer is recognised by its form alone: written while no request of the connection
//! is open, one of those three statuses, `content-length: 0` and no `content-type`. Every answer
//! the router writes itself has a JSON body and a `content-type`, and every answer it relays
//! carries its routing headers, so none of them can match.

use crate::error::ApiError;

/// The OpenAI-shaped answer replacing hyper's canned `head`, or None when `head` is not one.
pub fn replace(head: &[u8], max_header_bytes: usize) -> Option<Vec<u8>> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = &head[..end + 2];
    let status = head.strip_prefix(b"HTTP/1.1 ")?.get(..3)?;
    let lower = head.to_ascii_lowercase();
    let has = |needle: &[u8]| lower.windows(needle.len()).any(|w| w == needle);
    if !has(b"\r\ncontent-length: 0\r\n") || has(b"\r\ncontent-type:") {
        return None;
    }
    let (status_line, error) = match status {
        b"400" => (
            "400 Bad Request",
            malformed("the request line or a header could not be parsed"),
        ),
        b"431" => (
            "431 Request Header Fields Too Large",
            head_too_large(max_header_bytes),
        ),
        b"414" => (
            "414 URI Too Long",
            ApiError {
                status: http::StatusCode::URI_TOO_LONG,
                ..ApiError::bad_request("uri_too_long", "the request URI is too long", None)
            },
        ),
        _ => return None,
    };
    let body = error.to_json().to_string();
    Some(
        format!(
            "HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

/// A request the router cannot read as HTTP/1.x: `what` says which part (400).
pub fn malformed(what: &str) -> ApiError {
    ApiError::bad_request(
        "malformed_request",
        format!("malformed HTTP request: {what}"),
        None,
    )
}

/// A request framing the router does not implement (501).
pub fn not_implemented(what: &str) -> ApiError {
    ApiError {
        status: http::StatusCode::NOT_IMPLEMENTED,
        ..ApiError::bad_request(
            "unsupported_transfer_coding",
            format!("{what}; send the body with content-length or chunked alone"),
            None,
        )
    }
}

/// A request head over `limits.max_header_bytes` (431).
pub fn head_too_large(max_header_bytes: usize) -> ApiError {
    ApiError {
        status: http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
        ..ApiError::bad_request(
            "header_too_large",
            format!("the request head is over {max_header_bytes} bytes (limits.max_header_bytes)"),
            None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypers_canned_heads_become_openai_errors_and_nothing_else_does() {
        let canned = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 15:00:00 GMT\r\n\r\n";
        let out = replace(canned, 65536).map(|b| String::from_utf8_lossy(&b).to_string());
        let out = out.unwrap_or_else(|| panic!("not replaced"));
        assert!(out.starts_with("HTTP/1.1 431 "), "{out}");
        assert!(out.contains("\"code\":\"header_too_large\""), "{out}");
        assert!(out.contains("65536"), "{out}");
        let bad = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let out = replace(bad, 1).map(|b| String::from_utf8_lossy(&b).to_string());
        assert!(out.is_some_and(|o| o.contains("malformed_request")));

        for keep in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"0\r\n\r\n",
            b"HTTP/1.1 400 Bad Req",
        ] {
            assert_eq!(replace(keep, 1), None, "{}", String::from_utf8_lossy(keep));
        }
    }
}
