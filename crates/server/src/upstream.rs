//! The client side: connections to the instances ([`crate::pool`]), and how a client's request
//! is turned into an instance's request (and an instance's response head into the client's).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::{Request, Uri, Version};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::pool::Upstreams;

/// Every connection to the instances (`http://` and `https://`): connect timeout,
/// TCP_NODELAY, HTTP/1.1 keep-alive, and `tls` for `https://` instances; idle connections are
/// kept per thread, for the shared runtime and `io_threads` I/O threads.
pub fn client(connect: Duration, tls: rustls::ClientConfig, io_threads: usize) -> Arc<Upstreams> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(connect));
    connector.set_nodelay(true);
    // The TLS layer picks by scheme; the TCP layer must let https URIs through to it.
    connector.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    Arc::new(Upstreams::new(connector, io_threads))
}

/// How many [`HOP_BY_HOP`] names there are.
const HOPS: usize = 8;

/// Headers that belong to one connection, never forwarded (RFC 9110 section 7.6.1).
static HOP_BY_HOP: [HeaderName; HOPS] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// The lengths of the [`HOP_BY_HOP`] names, one bit each: a name of another length is none of
/// them, found without comparing it with the eight (`Host`, `Content-Type`, `Content-Length`,
/// `Accept`, `Date`, `Server`: most of a head). The comparisons were 800 instructions of a 1 KiB
/// request's 46,000 (callgrind, bench/peers.sh count mode).
const HOP_LENGTHS: u32 = 1 << 2 | 1 << 7 | 1 << 10 | 1 << 16 | 1 << 17 | 1 << 19;

/// Whether `name` is as long as one of the [`HOP_BY_HOP`] names.
fn hop_length(name: &HeaderName) -> bool {
    let len = name.as_str().len();
    len < 32 && HOP_LENGTHS & (1 << len) != 0
}

/// Whether `name` (raw, any case) is one of the [`HOP_BY_HOP`] names.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    let len = name.len();
    len < 32
        && HOP_LENGTHS & (1 << len) != 0
        && HOP_BY_HOP
            .iter()
            .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(name))
}

/// Removes hop-by-hop headers, including those named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most heads carry none or one of them: one pass over the names present finds which,
    // where a removal per hop-by-hop name would hash each of the eight.
    let mut present = [false; HOPS];
    let mut connection = false;
    for name in headers.keys().filter(|n| hop_length(n)) {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| h == name) {
            present[i] = true;
            connection |= name == header::CONNECTION;
        }
    }
    // Names listed in `Connection` count only when there is a `Connection` header.
    if connection {
        strip_connection_named(headers);
    }
    for (name, here) in HOP_BY_HOP.iter().zip(present) {
        if here {
            headers.remove(name);
        }
    }
}

/// Removes the headers that `Connection` names.
fn strip_connection_named(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
}

/// The instance's request: same method, path, query, headers (less hop-by-hop) and body, sent
/// over HTTP/1.1 (the connection sets `Host` to the instance's).
pub fn build_request(parts: &http::request::Parts, body: Bytes) -> Request<Bytes> {
    // Origin form (path and query): the connection is already the instance's. The path is
    // shared with the client's request, not copied.
    let uri = match parts.uri.path_and_query() {
        Some(p) => Uri::from(p.clone()),
        None => Uri::from_static("/"),
    };
    let mut req = Request::new(body);
    *req.method_mut() = parts.method.clone();
    *req.uri_mut() = uri;
    *req.version_mut() = Version::HTTP_11;
    let headers = req.headers_mut();
    *headers = parts.headers.clone();
    strip_hop_by_hop(headers);
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    // The router already holds the whole body: the instance has nothing to confirm.
    headers.remove(header::EXPECT);
    req
}

/// `GET {instance}{path}` for the router's own checks (health probes, model lists, engine
/// metrics): the status and at most `max_bytes` of the body, within `timeout`. None when the
/// instance does not answer in time, the body is larger, or the connection fails.
pub async fn get(
    client: &Arc<Upstreams>,
    base: &str,
    path: &str,
    max_bytes: usize,
    timeout: Duration,
) -> Option<(http::StatusCode, Bytes)> {
    use http_body_util::BodyExt;
    let req = Request::get(path).body(Bytes::new()).ok()?;
    let answer = async {
        let resp = client.send(base, req).await.ok()?;
        let status = resp.status();
        // Read whole, so the pooled connection is reused.
        let body = http_body_util::Limited::new(resp.into_body(), max_bytes)
            .collect()
            .await
            .ok()?
            .to_bytes();
        Some((status, body))
    };
    tokio::time::timeout(timeout, answer).await.ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn map(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<String> {
        let mut n: Vec<String> = h.keys().map(|k| k.as_str().to_string()).collect();
        n.sort();
        n
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_removed() {
        let mut h = map(&[
            ("connection", "keep-alive, X-Secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("transfer-encoding", "chunked"),
            ("te", "trailers"),
            ("trailer", "x-t"),
            ("upgrade", "h2c"),
            ("proxy-authorization", "Basic eA=="),
            ("content-type", "application/json"),
            ("authorization", "Bearer k"),
            ("x-keep", "1"),
        ]);
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["authorization", "content-type", "x-keep"]);
    }

    #[test]
    fn a_head_without_hop_by_hop_headers_is_unchanged_and_one_alone_goes() {
        let pairs = [
            ("content-type", "application/json"),
            ("x-a", "1"),
            ("x-a", "2"),
        ];
        let mut h = map(&pairs);
        strip_hop_by_hop(&mut h);
        assert_eq!(h, map(&pairs));
        // Without `Connection`, what a header lists is not read as names to strip.
        let mut h = map(&[("transfer-encoding", "chunked"), ("x-secret", "1")]);
        strip_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["x-secret"]);
    }

    #[test]
    fn the_instance_request_drops_host_length_and_expect() {
        let (mut parts, ()) = Request::post("http://client.example/v1/chat/completions?x=1")
            .header("host", "client.example")
            .header("content-length", "2")
            .header("expect", "100-continue")
            .header("connection", "close")
            .header("content-type", "application/json")
            .body(())
            .unwrap()
            .into_parts();
        parts.version = Version::HTTP_2;
        let req = build_request(&parts, Bytes::from_static(b"{}"));
        assert_eq!(req.uri(), "/v1/chat/completions?x=1");
        assert_eq!(req.version(), Version::HTTP_11);
        assert_eq!(names(req.headers()), ["content-type"]);
    }
}
