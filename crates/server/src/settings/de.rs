//! Field decoders: each reads one value of the file and refuses what the field cannot hold,
//! with a message that the parse error places at the value's line and names by its key (see
//! `source::parse_text`). Ranges are const parameters, so the rule sits beside the field.

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::de::{Deserializer, Error};
use serde::Deserialize;

use crate::tls::{TlsFiles, UpstreamTls};

fn fail<E: Error>(m: impl Display) -> E {
    E::custom(m)
}

/// Milliseconds, more than 0, as a duration.
pub fn millis<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    match u64::deserialize(d)? {
        0 => Err(fail("must be greater than 0")),
        n => Ok(Duration::from_millis(n)),
    }
}

/// Milliseconds, 0 included (0: at once), as a duration.
pub fn millis_or_zero<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    u64::deserialize(d).map(Duration::from_millis)
}

/// A count within `LO..=HI`.
pub fn within<'de, const LO: u64, const HI: u64, T, D>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    let n = u64::deserialize(d)?;
    if !(LO..=HI).contains(&n) {
        return Err(fail(format!("must be within {LO}..={HI}, got {n}")));
    }
    T::try_from(n).map_err(|_| fail(format!("{n} is too large")))
}

/// A count of at least 1 (thresholds, weights).
pub fn at_least_one<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    match u32::deserialize(d)? {
        0 => Err(fail("must be at least 1")),
        n => Ok(n),
    }
}

/// At most `HI`, 0 meaning "off" (`None`).
pub fn zero_off<'de, const HI: u64, T, D>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<u64>,
{
    match u64::deserialize(d)? {
        0 => Ok(None),
        n if n <= HI => T::try_from(n)
            .map(Some)
            .map_err(|_| fail(format!("{n} is too large"))),
        n => Err(fail(format!("must be within 0..={HI} (0: off), got {n}"))),
    }
}

fn parse_addr<E: Error>(text: &str) -> Result<SocketAddr, E> {
    text.trim()
        .parse()
        .map_err(|_| fail(format!("'{text}' is not an IP:port socket address")))
}

/// An `IP:port` socket address.
pub fn addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    parse_addr(&String::deserialize(d)?)
}

/// An optional `IP:port` socket address.
pub fn opt_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    parse_addr(&String::deserialize(d)?).map(Some)
}

/// An absolute request path (`/health`, `/metrics`).
pub fn abs_path<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let path = String::deserialize(d)?;
    if !path.starts_with('/') || path.parse::<http::uri::PathAndQuery>().is_err() {
        return Err(fail(format!("'{path}' is not an absolute path")));
    }
    Ok(path)
}

/// A certificate file and its key, given together or not at all.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Pair {
    cert_file: Option<PathBuf>,
    key_file: Option<PathBuf>,
    /// Only in `[upstream_tls]`.
    ca_file: Option<PathBuf>,
}

fn pair<E: Error>(
    section: &'static str,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
) -> Result<Option<TlsFiles>, E> {
    match (cert, key) {
        (None, None) => Ok(None),
        (Some(cert_file), Some(key_file)) => Ok(Some(TlsFiles {
            cert_file,
            key_file,
            section,
        })),
        (Some(_), None) => Err(fail(format!(
            "`{section}.key_file` is required with cert_file"
        ))),
        (None, Some(_)) => Err(fail(format!(
            "`{section}.cert_file` is required with key_file"
        ))),
    }
}

/// `[tls]`: the listener's certificate and key.
pub fn listener_tls<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TlsFiles>, D::Error> {
    let p = Pair::deserialize(d)?;
    if p.ca_file.is_some() {
        return Err(fail(
            "`tls.ca_file` is not a field of [tls] (a CA for instances goes in [upstream_tls])",
        ));
    }
    pair("tls", p.cert_file, p.key_file)
}

/// `[upstream_tls]`: the CA instances' certificates chain to, and a client certificate.
pub fn upstream_tls<'de, D: Deserializer<'de>>(d: D) -> Result<UpstreamTls, D::Error> {
    let p = Pair::deserialize(d)?;
    Ok(UpstreamTls {
        ca_file: p.ca_file,
        client: pair("upstream_tls", p.cert_file, p.key_file)?,
    })
}

/// An `[[instances]]` entry as a spec (its URL checked later, with its index, by
/// `Settings::validate`).
pub fn spec_of(e: &super::InstanceEntry) -> prefix_router_core::InstanceSpec {
    prefix_router_core::InstanceSpec {
        id: e.url.clone(),
        url: e.url.clone(),
        weight: e.weight.unwrap_or(1),
        models: e.models.clone(),
    }
}

/// `[[instances]]`.
pub fn instances<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Vec<prefix_router_core::InstanceSpec>, D::Error> {
    Ok(Vec::<super::InstanceEntry>::deserialize(d)?
        .iter()
        .map(spec_of)
        .collect())
}
