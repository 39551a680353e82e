//! TLS with rustls (ring provider): the data-plane listener's certificate, reloaded on SIGHUP
//! from the same files (certificate rotation without a restart), and the client side for
//! `https://` instances: the system's roots or a configured CA bundle, and optionally a client
//! certificate for mutual TLS to the engines.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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

/// The client configuration for `https://` instances.
pub fn client_config(up: &UpstreamTls) -> Result<rustls::ClientConfig, SettingsError> {
    let mut roots = rustls::RootCertStore::empty();
    match &up.ca_file {
        Some(path) => {
            for cert in certs(path, "upstream_tls.ca_file".into())? {
                roots.add(cert).map_err(|e| {
                    invalid(
                        "upstream_tls.ca_file".into(),
                        format!("{}: {e}", path.display()),
                    )
                })?;
            }
        }
        None => {
            // A minimal container may have none: plain http instances still work, and an
            // https one then fails its handshake with an error that names the issuer.
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
        }
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("upstream_tls".into(), e.to_string()))?
        .with_root_certificates(roots);
    let config = match &up.client {
        Some(files) => {
            let (chain, key) = chain_and_key(files)?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                invalid(
                    "upstream_tls.key_file".into(),
                    format!("the key does not fit the certificate: {e}"),
                )
            })?
        }
        None => builder.with_no_client_auth(),
    };
    // No ALPN here: the connector sets it (HTTP/1.1, what engines speak to the router).
    Ok(config)
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
