//! The client side: connections to the instances ([`crate::pool`]), and the headers that are
//! never passed on from one to the other (hop-by-hop).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderName};
use http::Request;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::pool::Upstreams;
use prefix_router_core::wire::{DECISION_HEADER, INSTANCE_HEADER};

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
    Arc::new(Upstreams::new(connector, connect, io_threads))
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

/// Whether `name` (raw, any case) is one of the [`HOP_BY_HOP`] names.
pub fn is_hop_by_hop(name: &[u8]) -> bool {
    let len = name.len();
    len < 32
        && HOP_LENGTHS & (1 << len) != 0
        && HOP_BY_HOP
            .iter()
            .any(|h| h.as_str().as_bytes().eq_ignore_ascii_case(name))
}

/// Whether `name` (raw, any case) is a header the router sets on its answers
/// ([`INSTANCE_HEADER`], [`DECISION_HEADER`]): an instance's own (another router in front of
/// it, say) is not passed on, so the client reads this router's, once.
pub fn is_router_owned(name: &[u8]) -> bool {
    // Both are 24 bytes long: most names are ruled out by their length.
    name.len() == INSTANCE_HEADER.len()
        && (name.eq_ignore_ascii_case(INSTANCE_HEADER.as_bytes())
            || name.eq_ignore_ascii_case(DECISION_HEADER.as_bytes()))
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
    let (parts, ()) = Request::get(path).body(()).ok()?.into_parts();
    let answer = async {
        let resp = client.send(base, &parts, &Bytes::new()).await.ok()?;
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

    #[test]
    fn hop_by_hop_names_are_found_in_any_case_and_no_others() {
        for name in HOP_BY_HOP.iter() {
            assert!(is_hop_by_hop(name.as_str().as_bytes()), "{name}");
            assert!(
                is_hop_by_hop(name.as_str().to_uppercase().as_bytes()),
                "{name}"
            );
        }
        for other in [
            "host",
            "content-type",
            "content-length",
            "te2",
            "connections",
            "x-te",
            "",
        ] {
            assert!(!is_hop_by_hop(other.as_bytes()), "{other}");
        }
    }

    #[test]
    fn the_routing_headers_are_the_routers_own_in_any_case() {
        const _: () = assert!(INSTANCE_HEADER.len() == DECISION_HEADER.len());
        for name in [INSTANCE_HEADER, DECISION_HEADER] {
            assert!(is_router_owned(name.as_bytes()), "{name}");
            assert!(is_router_owned(name.to_uppercase().as_bytes()), "{name}");
        }
        for other in [
            "x-prefix-router-instances",
            "x-prefix-router-group",
            "content-type",
            "",
        ] {
            assert!(!is_router_owned(other.as_bytes()), "{other}");
        }
    }
}
