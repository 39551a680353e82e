//! TLS with rustls (ring provider): the data-plane listener's certificate, and the client side
//! for `https://` instances (the system's roots or a configured CA bundle, and optionally a
//! client certificate for mutual TLS to the engines). Files are read again on SIGHUP, so a
//! rotated certificate or CA takes effect without a restart.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, WebPkiServerVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::settings::SettingsError;

/// A certificate chain and its private key, as PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, leaf first.
    pub cert_file: PathBuf,
    /// Private key (PKCS#8, PKCS#1 or SEC1).
    pub key_file: PathBuf,
    /// The settings section they come from (`tls`, `upstream_tls`), to name in errors.
    pub section: &'static str,
}

/// How the router talks TLS to `https://` instances.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct UpstreamTls {
    /// CA bundle the instances' certificates must chain to (None: the system's roots).
    pub ca_file: Option<PathBuf>,
    /// Client certificate presented to the instances (mutual TLS).
    pub client: Option<TlsFiles>,
}

fn invalid(field: String, message: impl Into<String>) -> SettingsError {
    SettingsError::Invalid {
        field,
        message: message.into(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certs(path: &Path, field: String) -> Result<Vec<CertificateDer<'static>>, SettingsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| {
            invalid(
                field.clone(),
                format!("cannot read {}: {e}", path.display()),
            )
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(field.clone(), format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(invalid(
            field,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

fn chain_and_key(
    files: &TlsFiles,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), SettingsError> {
    let chain = certs(&files.cert_file, format!("{}.cert_file", files.section))?;
    let field = format!("{}.key_file", files.section);
    let key = PrivateKeyDer::from_pem_file(&files.key_file).map_err(|e| {
        invalid(
            field,
            format!("no PEM private key in {}: {e}", files.key_file.display()),
        )
    })?;
    Ok((chain, key))
}

/// The listener's configuration from `files` (ALPN: h2, then HTTP/1.1).
pub fn server_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, SettingsError> {
    let (chain, key) = chain_and_key(files)?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(format!("{}.cert_file", files.section), e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| {
            invalid(
                format!("{}.key_file", files.section),
                format!("the key does not fit the certificate: {e}"),
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The CA bundle's verifier, replaced whole on reload. It only delegates to rustls' WebPKI
/// verifier, which is why building it goes through `dangerous()`: nothing is skipped.
#[derive(Debug)]
struct Roots(ArcSwap<WebPkiServerVerifier>);

impl ServerCertVerifier for Roots {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .load()
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.load().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.load().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.load().supported_verify_schemes()
    }
}

/// The client certificate, replaced whole on reload.
#[derive(Debug)]
struct ClientCert(ArcSwap<CertifiedKey>);

impl ResolvesClientCert for ClientCert {
    fn resolve(&self, _hints: &[&[u8]], _schemes: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

fn verifier(path: &Path) -> Result<Arc<WebPkiServerVerifier>, SettingsError> {
    let field = "upstream_tls.ca_file";
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs(path, field.into())? {
        roots
            .add(cert)
            .map_err(|e| invalid(field.into(), format!("{}: {e}", path.display())))?;
    }
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
        .build()
        .map_err(|e| invalid(field.into(), format!("{}: {e}", path.display())))
}

fn certified(files: &TlsFiles) -> Result<Arc<CertifiedKey>, SettingsError> {
    let (chain, key) = chain_and_key(files)?;
    CertifiedKey::from_der(chain, key, &provider())
        .map(Arc::new)
        .map_err(|e| {
            invalid(
                format!("{}.key_file", files.section),
                format!("the key does not fit the certificate: {e}"),
            )
        })
}

/// The client side for `https://` instances: the system's roots or `ca_file`, and the client
/// certificate for mutual TLS. The CA bundle and the certificate are read again on reload
/// (SIGHUP), so a rotated one reaches the next connection without a restart; connections
/// already open keep the handshake they made.
#[derive(Debug)]
pub struct ClientTls {
    files: UpstreamTls,
    roots: Option<Arc<Roots>>,
    cert: Option<Arc<ClientCert>>,
    config: rustls::ClientConfig,
}

impl ClientTls {
    /// Loads the files of `up`.
    pub fn new(up: &UpstreamTls) -> Result<Self, SettingsError> {
        let roots = match &up.ca_file {
            Some(path) => Some(Arc::new(Roots(ArcSwap::new(verifier(path)?)))),
            None => None,
        };
        let cert = match &up.client {
            Some(files) => Some(Arc::new(ClientCert(ArcSwap::new(certified(files)?)))),
            None => None,
        };
        let builder = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("upstream_tls".into(), e.to_string()))?;
        let builder = match &roots {
            Some(r) => builder
                .dangerous()
                .with_custom_certificate_verifier(r.clone()),
            None => {
                // A minimal container may have none: plain http instances still work, and an
                // https one then fails its handshake with an error that names the issuer.
                let mut native = rustls::RootCertStore::empty();
                native.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
                builder.with_root_certificates(native)
            }
        };
        // No ALPN here: the connector sets it (HTTP/1.1, what engines speak to the router).
        let mut config = match &cert {
            Some(c) => builder.with_client_cert_resolver(c.clone()),
            None => builder.with_no_client_auth(),
        };
        if roots.is_some() || cert.is_some() {
            // A resumed session skips both checks a rotation renews (the engine's chain to
            // the new CA, the new client certificate). Connections are pooled, so a full
            // handshake is paid per new connection, not per request.
            config.resumption = rustls::client::Resumption::disabled();
        }
        Ok(Self {
            files: up.clone(),
            roots,
            cert,
            config,
        })
    }

    /// The configuration the upstream connector is built with (it shares the swaps).
    pub fn config(&self) -> rustls::ClientConfig {
        self.config.clone()
    }

    /// Reads the same files again. Both are read before either is replaced, so a bad file
    /// keeps the pair in force and fails the reload with the field named.
    pub fn reload(&self) -> Result<(), SettingsError> {
        let verifier = match &self.files.ca_file {
            Some(path) => Some(verifier(path)?),
            None => None,
        };
        let cert = match &self.files.client {
            Some(files) => Some(certified(files)?),
            None => None,
        };
        if let (Some(roots), Some(v)) = (&self.roots, verifier) {
            roots.0.store(v);
        }
        if let (Some(c), Some(k)) = (&self.cert, cert) {
            c.0.store(k);
        }
        Ok(())
    }
}

/// The listener's TLS configuration in force, replaced whole on reload.
#[derive(Debug)]
pub struct Listener {
    files: TlsFiles,
    config: ArcSwap<rustls::ServerConfig>,
}

impl Listener {
    /// Loads `files`.
    pub fn new(files: TlsFiles) -> Result<Self, SettingsError> {
        let config = server_config(&files)?;
        Ok(Self {
            files,
            config: ArcSwap::new(config),
        })
    }

    /// The acceptor for the next connection.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.load_full())
    }

    /// Reads the same files again (a rotated certificate); on error the one in force stays.
    pub fn reload(&self) -> Result<(), SettingsError> {
        self.config.store(server_config(&self.files)?);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> TlsFiles {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| panic!("{e}"));
        let params = rcgen::CertificateParams::new(vec!["router".to_string()])
            .unwrap_or_else(|e| panic!("{e}"));
        let cert = params.self_signed(&key).unwrap_or_else(|e| panic!("{e}"));
        let files = TlsFiles {
            cert_file: dir.join(format!("{name}.crt")),
            key_file: dir.join(format!("{name}.key")),
            section: "upstream_tls",
        };
        std::fs::write(&files.cert_file, cert.pem()).unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(&files.key_file, key.serialize_pem()).unwrap_or_else(|e| panic!("{e}"));
        files
    }

    /// A reload with one bad file replaces neither: a rotated CA beside a broken key stays
    /// unread, and the pair in force goes on (a half-applied rotation fails every handshake).
    #[test]
    fn a_reload_with_a_bad_file_keeps_the_pair_in_force() {
        let dir = std::env::temp_dir().join(format!("pr-client-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let client = pair(&dir, "client");
        let ca = pair(&dir, "ca");
        let up = UpstreamTls {
            ca_file: Some(ca.cert_file.clone()),
            client: Some(client.clone()),
        };
        let tls = ClientTls::new(&up).unwrap_or_else(|e| panic!("{e}"));
        let held = |tls: &ClientTls| {
            let roots = tls.roots.as_ref().map(|r| r.0.load_full());
            let cert = tls.cert.as_ref().map(|c| c.0.load_full());
            (roots, cert)
        };
        let (roots, cert) = held(&tls);
        // A good reload replaces both.
        tls.reload().unwrap_or_else(|e| panic!("{e}"));
        let (r2, c2) = held(&tls);
        assert!(!Arc::ptr_eq(
            roots.as_ref().unwrap_or_else(|| panic!()),
            r2.as_ref().unwrap_or_else(|| panic!())
        ));
        assert!(!Arc::ptr_eq(
            cert.as_ref().unwrap_or_else(|| panic!()),
            c2.as_ref().unwrap_or_else(|| panic!())
        ));
        // A new CA with a broken key: refused, naming the key; neither replaced.
        pair(&dir, "ca");
        std::fs::write(&client.key_file, "not a key").unwrap_or_else(|e| panic!("{e}"));
        let e = tls.reload().map_err(|e| e.to_string());
        assert!(
            matches!(&e, Err(m) if m.contains("upstream_tls.key_file")),
            "{e:?}"
        );
        let (r3, c3) = held(&tls);
        assert!(Arc::ptr_eq(
            r2.as_ref().unwrap_or_else(|| panic!()),
            r3.as_ref().unwrap_or_else(|| panic!())
        ));
        assert!(Arc::ptr_eq(
            c2.as_ref().unwrap_or_else(|| panic!()),
            c3.as_ref().unwrap_or_else(|| panic!())
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
