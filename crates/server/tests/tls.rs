//! TLS over loopback with certificates made at test time (rcgen): the listener serves TLS and
//! takes a rotated certificate on reload; `https://` instances are reached through a private CA
//! with a client certificate (mutual TLS), and a failed handshake is a 502 that says why.

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, StatusCode};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use prefix_router_server::tls::{TlsFiles, UpstreamTls};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use support::*;
use tokio::net::TcpStream;

/// A test CA that signs certificates.
struct Ca {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca { cert, key }
    }

    fn pem(&self) -> String {
        self.cert.pem()
    }

    /// A certificate for 127.0.0.1 (server) or a client, as (certificate PEM, key PEM).
    fn issue(&self, purpose: ExtendedKeyUsagePurpose) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("params");
        params.subject_alt_names = vec![SanType::IpAddress([127, 0, 0, 1].into())];
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.extended_key_usages = vec![purpose];
        let cert = params
            .signed_by(&key, &self.cert, &self.key)
            .expect("signed");
        (cert.pem(), key.serialize_pem())
    }
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("prefix-router-tls-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn write_pair(
    dir: &Path,
    name: &str,
    (cert, key): &(String, String),
    section: &'static str,
) -> TlsFiles {
    let (c, k) = (
        dir.join(format!("{name}.crt")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&c, cert).expect("write cert");
    std::fs::write(&k, key).expect("write key");
    TlsFiles {
        cert_file: c,
        key_file: k,
        section,
    }
}

fn roots(ca_pem: &str) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.expect("cert")).expect("root");
    }
    roots
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// GET or POST over TLS to `addr`, trusting `ca_pem`; Err when the handshake fails.
async fn tls_request(
    addr: SocketAddr,
    ca_pem: &str,
    method: Method,
    path: &str,
    body: &str,
) -> Result<(StatusCode, String), String> {
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca_pem))
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = request(method, path, &[], body.to_string());
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, String::from_utf8_lossy(&body).to_string()))
}

#[tokio::test]
async fn the_listener_serves_tls_and_takes_a_rotated_certificate_on_reload() {
    let up = Upstream::start("u", Mode::Echo, &[]).await;
    let d = dir("listener");
    let (ca1, ca2) = (Ca::new("first CA"), Ca::new("second CA"));
    let files = write_pair(
        &d,
        "server",
        &ca1.issue(ExtendedKeyUsagePurpose::ServerAuth),
        "tls",
    );
    // Started from a configuration file, as `serve --config` is, so that a reload (what
    // SIGHUP runs) goes through the whole path.
    let config = d.join("router.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[health]\nactive = false\n[tls]\ncert_file = {:?}\nkey_file = {:?}\n[[instances]]\nurl = \"{}\"\n",
        files.cert_file.display().to_string(),
        files.key_file.display().to_string(),
        up.url()
    );
    std::fs::write(&config, text).expect("write config");
    let source = prefix_router_server::ConfigSource {
        path: Some(config),
        overrides: Default::default(),
    };
    let loaded = source.load().expect("valid config");
    assert_eq!(loaded.tls.as_ref(), Some(&files));
    let r = prefix_router_server::Router::start(loaded, Some(source))
        .await
        .expect("starts");
    let addr = r.local_addr();

    let (status, _) = tls_request(addr, &ca1.pem(), Method::GET, "/health", "")
        .await
        .expect("TLS");
    assert_eq!(status, StatusCode::OK);
    let (status, body) = tls_request(
        addr,
        &ca1.pem(),
        Method::POST,
        "/v1/completions",
        r#"{"prompt":"over tls"}"#,
    )
    .await
    .expect("TLS");
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, r#"{"prompt":"over tls"}"#)
    );
    // Plain HTTP on the TLS port is not served.
    let (text, _) = raw(
        addr,
        b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n",
        complete_answer,
    )
    .await;
    assert!(!text.starts_with("HTTP/1.1 200"), "{text}");

    // A rotated certificate (another CA) in the same files: new connections get it.
    write_pair(
        &d,
        "server",
        &ca2.issue(ExtendedKeyUsagePurpose::ServerAuth),
        "tls",
    );
    prefix_router_server::reload::reload(r.state())
        .await
        .expect("reload");
    assert!(tls_request(addr, &ca1.pem(), Method::GET, "/health", "")
        .await
        .is_err());
    let (status, _) = tls_request(addr, &ca2.pem(), Method::GET, "/health", "")
        .await
        .expect("rotated");
    assert_eq!(status, StatusCode::OK);

    // A broken file on reload: refused, naming the field; the certificate in force stays.
    std::fs::write(&files.key_file, "not a key").expect("write");
    let e = prefix_router_server::reload::reload(r.state())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("tls.key_file"), "{e}");
    let (status, _) = tls_request(addr, &ca2.pem(), Method::GET, "/health", "")
        .await
        .expect("kept");
    assert_eq!(status, StatusCode::OK);
    r.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}

/// The echoing stand-in behind TLS, named `tls-engine`, requiring a client certificate from
/// `client_ca`.
async fn tls_engine(server: &TlsFiles, client_ca: &str) -> Upstream {
    let chain: Vec<_> = CertificateDer::pem_file_iter(&server.cert_file)
        .expect("read")
        .map(|c| c.expect("cert"))
        .collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_file(&server.key_file).expect("key");
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots(client_ca)),
        provider(),
    )
    .build()
    .expect("verifier");
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .expect("config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    Upstream::start_tls("tls-engine", Mode::Echo, acceptor).await
}

/// A request through a router to `url` with `upstream_tls` that must fail: its 502 message.
async fn refused(url: &str, upstream_tls: UpstreamTls, prompt: &str) -> String {
    let mut s = settings(&[url.to_string()]);
    s.upstream_tls = upstream_tls;
    s.health.passive_failures = 1000;
    let r = router(s).await;
    let body = format!(r#"{{"prompt":"{prompt}"}}"#);
    let a = post(r.local_addr(), "/v1/completions", &[], body).await;
    assert_eq!(a.status, StatusCode::BAD_GATEWAY);
    let msg = a.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    r.shutdown().await;
    msg
}

#[tokio::test]
async fn https_instances_through_a_private_ca_with_a_client_certificate() {
    let d = dir("upstream");
    let ca = Ca::new("engines CA");
    let server = write_pair(
        &d,
        "engine",
        &ca.issue(ExtendedKeyUsagePurpose::ServerAuth),
        "test",
    );
    let client = write_pair(
        &d,
        "router",
        &ca.issue(ExtendedKeyUsagePurpose::ClientAuth),
        "upstream_tls",
    );
    let ca_file = d.join("ca.crt");
    std::fs::write(&ca_file, ca.pem()).expect("write CA");
    let engine = tls_engine(&server, &ca.pem()).await;
    let url = engine.url();

    let mut s = settings(std::slice::from_ref(&url));
    s.upstream_tls = UpstreamTls {
        ca_file: Some(ca_file.clone()),
        client: Some(client),
    };
    let r = router(s).await;
    let a = post(
        r.local_addr(),
        "/v1/completions",
        &[],
        r#"{"prompt":"mtls"}"#,
    )
    .await;
    assert_eq!(
        (a.status, a.upstream()),
        (StatusCode::OK, "tls-engine".to_string())
    );
    assert_eq!(a.body, Bytes::from_static(br#"{"prompt":"mtls"}"#));
    r.shutdown().await;

    // Without the client certificate the engine refuses the handshake: a 502 that says so.
    // With TLS 1.3 the engine refuses the missing certificate after the client's side of the
    // handshake ended, so the failure shows on the request, not the connect; either way the
    // answer names the instance and the certificate.
    let no_cert = UpstreamTls {
        ca_file: Some(ca_file),
        client: None,
    };
    let msg = refused(&url, no_cert, "no cert").await;
    assert!(msg.contains(&url), "{msg}");
    assert!(msg.to_ascii_lowercase().contains("certificate"), "{msg}");

    // With the system's roots only, the private CA is unknown: refused too.
    let msg = refused(&url, UpstreamTls::default(), "unknown CA").await;
    assert!(msg.to_ascii_lowercase().contains("certificate"), "{msg}");
    let _ = std::fs::remove_dir_all(&d);
}

/// A router file with `[upstream_tls]` in `d` and one instance.
fn upstream_config(d: &Path, ca_file: &Path, client: &TlsFiles, instance: &str) -> PathBuf {
    let config = d.join("router.toml");
    let text = format!(
        "listen = \"127.0.0.1:0\"\n[health]\nactive = false\n[upstream_tls]\nca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n[[instances]]\nurl = \"{instance}\"\n",
        ca_file.display().to_string(),
        client.cert_file.display().to_string(),
        client.key_file.display().to_string(),
    );
    std::fs::write(&config, text).expect("write config");
    config
}

#[tokio::test]
async fn a_rotated_engine_ca_and_client_certificate_are_read_again_on_reload() {
    let d = dir("upstream-rotation");
    let (ca1, ca2) = (Ca::new("engines CA 1"), Ca::new("engines CA 2"));
    let ca_file = d.join("ca.crt");
    std::fs::write(&ca_file, ca1.pem()).expect("write CA");
    let client = write_pair(
        &d,
        "router",
        &ca1.issue(ExtendedKeyUsagePurpose::ClientAuth),
        "upstream_tls",
    );
    let first = tls_engine(
        &write_pair(
            &d,
            "engine1",
            &ca1.issue(ExtendedKeyUsagePurpose::ServerAuth),
            "test",
        ),
        &ca1.pem(),
    )
    .await;
    let config = upstream_config(&d, &ca_file, &client, &first.url());
    let source = prefix_router_server::ConfigSource {
        path: Some(config),
        overrides: Default::default(),
    };
    let loaded = source.load().expect("valid config");
    let r = prefix_router_server::Router::start(loaded, Some(source))
        .await
        .expect("starts");
    let ask = |prompt: &'static str| {
        let addr = r.local_addr();
        async move {
            post(
                addr,
                "/v1/completions",
                &[],
                format!(r#"{{"prompt":"{prompt}"}}"#),
            )
            .await
        }
    };
    assert_eq!(ask("first").await.status, StatusCode::OK);

    // Rotation: the engines move to a new CA, which signs both their certificates and the
    // router's; the files keep their names and the instance list moves to the new engine.
    // Only the new CA and the new client certificate together pass both checks.
    let second = tls_engine(
        &write_pair(
            &d,
            "engine2",
            &ca2.issue(ExtendedKeyUsagePurpose::ServerAuth),
            "test",
        ),
        &ca2.pem(),
    )
    .await;
    std::fs::write(&ca_file, ca2.pem()).expect("write CA");
    write_pair(
        &d,
        "router",
        &ca2.issue(ExtendedKeyUsagePurpose::ClientAuth),
        "upstream_tls",
    );
    upstream_config(&d, &ca_file, &client, &second.url());
    prefix_router_server::reload::reload(r.state())
        .await
        .expect("reload");
    let a = ask("rotated").await;
    assert_eq!(
        (a.status, a.upstream()),
        (StatusCode::OK, "tls-engine".to_string()),
        "{}",
        String::from_utf8_lossy(&a.body)
    );

    // A broken key on reload: refused, naming the field (that the pair in force stays is
    // checked beside the code, where a pooled connection cannot hide a swap: src/tls.rs).
    std::fs::write(&client.key_file, "not a key").expect("write");
    let e = prefix_router_server::reload::reload(r.state())
        .await
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("upstream_tls.key_file"), "{e}");
    r.shutdown().await;
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn tls_settings_name_the_field_that_is_wrong() {
    let d = dir("settings");
    let text = |extra: &str| format!("{extra}\n[[instances]]\nurl = \"https://127.0.0.1:9\"\n");
    let path = d.join("r.toml");
    let load = |t: String| {
        prefix_router_server::settings::settings_from_text(&t, &path)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    assert!(load(text("")).is_ok(), "an https instance is accepted");
    let e = load(text("[tls]\ncert_file = \"/nonexistent.crt\"")).unwrap_err();
    assert!(e.contains("tls.key_file"), "{e}");
    let e = load(text(
        "[tls]\ncert_file = \"/nonexistent.crt\"\nkey_file = \"/nonexistent.key\"",
    ))
    .unwrap_err();
    assert!(
        e.contains("tls.cert_file") && e.contains("/nonexistent.crt"),
        "{e}"
    );
    let e = load(text("[upstream_tls]\nca_file = \"/nonexistent-ca.pem\"")).unwrap_err();
    assert!(e.contains("upstream_tls.ca_file"), "{e}");
    let e = load("[[instances]]\nurl = \"ftp://127.0.0.1:9\"\n".into()).unwrap_err();
    assert!(e.contains("http or https"), "{e}");
    let _ = std::fs::remove_dir_all(&d);
}

#[tokio::test]
async fn a_tls_client_that_stops_reading_is_disconnected_and_its_request_cancelled() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::AsyncWriteExt;
    let (gone, asked) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let url = endless_engine(Arc::clone(&gone), Arc::clone(&asked)).await;
    let d = dir("stalled");
    let ca = Ca::new("stalled CA");
    let files = write_pair(
        &d,
        "server",
        &ca.issue(ExtendedKeyUsagePurpose::ServerAuth),
        "tls",
    );
    let mut s = settings(&[url]);
    s.tls = Some(files);
    s.timeouts.client_write = std::time::Duration::from_millis(300);
    let r = router(s).await;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots(&ca.pem()))
        .with_no_client_auth();
    let tcp = TcpStream::connect(r.local_addr()).await.expect("connect");
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    let body = chat("a long answer");
    let req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: router.test\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tls.write_all(req.as_bytes()).await.expect("send");
    // The client never reads: over TLS hyper writes the answer, and stops asking the relay
    // for more once the socket is full, so only the connection's watchdog can see it.
    eventually("the engine was asked", || asked.load(Ordering::SeqCst)).await;
    eventually("the router let go of the engine's answer", || {
        gone.load(Ordering::SeqCst)
    })
    .await;
    eventually("no request left in flight", || total_in_flight(&r) == 0).await;
    let (_, page) = tls_request(r.local_addr(), &ca.pem(), Method::GET, "/metrics", "")
        .await
        .expect("metrics over TLS");
    assert_eq!(
        metric(
            &page,
            "prefix_router_client_connections_closed_total",
            &[("reason", "write_timeout")]
        ),
        1.0,
        "{page}"
    );
    drop(tls);
    r.shutdown().await;
}
