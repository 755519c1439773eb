//! Who is calling over mutual TLS, and what they may ask.
//!
//! A node-enforcer's client certificate names its node in its subject
//! Common Name as `node:NODE_NAME` (the prefix keeps the controller's own
//! server certificate, or any other certificate of the same CA, from
//! passing for a node). Over TLS with a client CA:
//! - no client certificate: UNAUTHENTICATED, for every service but health;
//! - a node certificate: PlanService for its own node only (another node's
//!   name is PERMISSION_DENIED naming both), nothing else;
//! - any other certificate of the CA (an operator's): the debug service and
//!   reflection, not plans.
//!
//! Every refusal is counted by reason and logged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use palisade_proto::v1::CallerRefusals;
use tonic::{Request, Status};

pub const NODE_PREFIX: &str = "node:";

/// Refusals so far, by reason.
#[derive(Debug, Default)]
pub struct Refusals {
    /// No client certificate over TLS.
    pub unauthenticated: AtomicU64,
    /// A node certificate asking for another node's plan or state.
    pub wrong_node: AtomicU64,
    /// A certificate asking for what its kind may not have (a node for the
    /// debug service, an operator for plans, or a certificate whose name
    /// cannot be read).
    pub not_permitted: AtomicU64,
}

impl Refusals {
    pub fn snapshot(&self) -> [u64; 3] {
        [
            self.unauthenticated.load(Ordering::Relaxed),
            self.wrong_node.load(Ordering::Relaxed),
            self.not_permitted.load(Ordering::Relaxed),
        ]
    }

    /// The counts as the debug service reports them.
    pub fn counts(&self) -> CallerRefusals {
        let [unauthenticated, wrong_node, not_permitted] = self.snapshot();
        CallerRefusals {
            unauthenticated,
            wrong_node,
            not_permitted,
        }
    }
}

/// How callers are authenticated.
#[derive(Clone, Debug, Default)]
pub struct Authz {
    /// Client certificates are verified against a CA: identities apply.
    pub mutual: bool,
    pub refusals: Arc<Refusals>,
}

/// The caller as its certificate names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caller {
    /// No mutual TLS: everyone is trusted alike (the lab, unix sockets).
    Anyone,
    Node(String),
    Operator(String),
}

impl Authz {
    fn refuse(&self, counter: &AtomicU64, status: Status) -> Status {
        counter.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(code = ?status.code(), "refused: {}", status.message());
        status
    }

    /// Who is calling; UNAUTHENTICATED without a certificate over mutual TLS.
    pub fn caller<T>(&self, request: &Request<T>) -> Result<Caller, Status> {
        if !self.mutual {
            return Ok(Caller::Anyone);
        }
        let certs = request.peer_certs();
        let Some(leaf) = certs.as_deref().and_then(|c| c.first()) else {
            return Err(self.refuse(
                &self.refusals.unauthenticated,
                Status::unauthenticated("a client certificate is required"),
            ));
        };
        let cn = common_name(leaf.as_ref()).map_err(|e| {
            self.refuse(
                &self.refusals.not_permitted,
                Status::permission_denied(format!("the client certificate's subject: {e}")),
            )
        })?;
        Ok(match cn.strip_prefix(NODE_PREFIX) {
            Some(node) if !node.is_empty() => Caller::Node(node.to_string()),
            _ => Caller::Operator(cn),
        })
    }

    /// Allows a request about `node` only from that node (or anyone
    /// without mutual TLS).
    pub fn check_node<T>(&self, request: &Request<T>, node: &str) -> Result<(), Status> {
        match self.caller(request)? {
            Caller::Anyone => Ok(()),
            Caller::Node(n) if n == node => Ok(()),
            Caller::Node(n) => Err(self.refuse(
                &self.refusals.wrong_node,
                Status::permission_denied(format!(
                    "the client certificate is node {n:?}'s; it may not act for node {node:?}"
                )),
            )),
            Caller::Operator(cn) => Err(self.refuse(
                &self.refusals.not_permitted,
                Status::permission_denied(format!(
                    "the client certificate {cn:?} names no node (a node's is CN={NODE_PREFIX}NODE_NAME); plans are for nodes only"
                )),
            )),
        }
    }

    /// For the debug service and reflection: operators only.
    pub fn check_operator<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match self.caller(request)? {
            Caller::Anyone | Caller::Operator(_) => Ok(()),
            Caller::Node(n) => Err(self.refuse(
                &self.refusals.not_permitted,
                Status::permission_denied(format!(
                    "node {n:?}'s certificate may use the plan service only"
                )),
            )),
        }
    }
}

/// The subject Common Name of a DER certificate: exactly one, as a string.
/// The certificate has already been verified against the CA by rustls, so
/// this only has to read it, not to judge it.
pub fn common_name(cert: &[u8]) -> Result<String, CertError> {
    let (tag, certificate, _) = tlv(cert)?;
    expect(tag, 0x30, "certificate")?;
    let (tag, tbs, _) = tlv(certificate)?;
    expect(tag, 0x30, "tbsCertificate")?;
    let mut rest = tbs;
    // [0] version is optional; then serial, signature, issuer, validity.
    let (tag, _, after) = tlv(rest)?;
    if tag == 0xA0 {
        rest = after;
    }
    for what in ["serialNumber", "signature", "issuer", "validity"] {
        let (_, _, after) = tlv(rest).map_err(|e| CertError::In {
            what,
            cause: Box::new(e),
        })?;
        rest = after;
    }
    let (tag, mut names, _) = tlv(rest)?;
    expect(tag, 0x30, "subject")?;
    let mut found = Vec::new();
    while !names.is_empty() {
        let (tag, set, after) = tlv(names)?;
        expect(tag, 0x31, "relative distinguished name")?;
        names = after;
        let mut attrs = set;
        while !attrs.is_empty() {
            let (tag, attr, after) = tlv(attrs)?;
            expect(tag, 0x30, "attribute")?;
            attrs = after;
            let (tag, oid, value) = tlv(attr)?;
            expect(tag, 0x06, "attribute type")?;
            if oid == [0x55, 0x04, 0x03] {
                let (tag, text, _) = tlv(value)?;
                // UTF8String, PrintableString, IA5String.
                if ![0x0C, 0x13, 0x16].contains(&tag) {
                    return Err(CertError::StringType(tag));
                }
                let text = std::str::from_utf8(text).map_err(CertError::NotUtf8)?;
                found.push(text.to_string());
            }
        }
    }
    match found.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(CertError::NoCommonName),
        _ => Err(CertError::CommonNames(found.len())),
    }
}

/// Why a certificate's Common Name could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("truncated")]
    Truncated,
    #[error("bad length")]
    BadLength,
    #[error("{what}: tag 0x{tag:02x}, expected 0x{want:02x}")]
    Tag {
        what: &'static str,
        tag: u8,
        want: u8,
    },
    /// A problem inside one of the certificate's fields.
    #[error("{what}: {cause}")]
    In {
        what: &'static str,
        #[source]
        cause: Box<CertError>,
    },
    #[error("common name of unsupported string type 0x{0:02x}")]
    StringType(u8),
    #[error("common name is not UTF-8")]
    NotUtf8(#[source] std::str::Utf8Error),
    #[error("no common name")]
    NoCommonName,
    #[error("{0} common names; exactly one is required")]
    CommonNames(usize),
}

fn expect(tag: u8, want: u8, what: &'static str) -> Result<(), CertError> {
    if tag == want {
        Ok(())
    } else {
        Err(CertError::Tag { what, tag, want })
    }
}

/// One DER element: its tag, content and what follows it.
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), CertError> {
    let [tag, first, rest @ ..] = input else {
        return Err(CertError::Truncated);
    };
    let (len, rest) = if *first < 0x80 {
        (*first as usize, rest)
    } else {
        let n = (*first & 0x7F) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return Err(CertError::BadLength);
        }
        let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(CertError::Truncated);
    }
    Ok((*tag, &rest[..len], &rest[len..]))
}

/// A PEM file that could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {}: {cause}", path.display())]
pub struct ReadPemError {
    pub path: std::path::PathBuf,
    #[source]
    pub cause: std::io::Error,
}

/// The server side's TLS settings from PEM files.
pub fn server_config(
    cert: &std::path::Path,
    key: &std::path::Path,
    client_ca: Option<&std::path::Path>,
) -> Result<tonic::transport::ServerTlsConfig, ReadPemError> {
    let read = |p: &std::path::Path| {
        std::fs::read(p).map_err(|cause| ReadPemError {
            path: p.to_path_buf(),
            cause,
        })
    };
    let mut cfg = tonic::transport::ServerTlsConfig::new().identity(
        tonic::transport::Identity::from_pem(read(cert)?, read(key)?),
    );
    if let Some(ca) = client_ca {
        // Optional at the handshake so that a caller without a certificate
        // gets a counted UNAUTHENTICATED instead of a bare reset; every
        // service but health requires one (see `Authz`). A certificate
        // that does not chain to the CA still fails the handshake.
        cfg = cfg
            .client_ca_root(tonic::transport::Certificate::from_pem(read(ca)?))
            .client_auth_optional(true);
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_or_odd_der_is_an_error_not_a_panic() {
        for bad in [
            &[][..],
            &[0x30][..],
            &[0x30, 0x85, 1, 1, 1, 1, 1][..],
            &[0x30, 0x05, 0x30][..],
            &[0x04, 0x00][..],
        ] {
            assert!(common_name(bad).is_err(), "{bad:?}");
        }
        // A serial number and nothing after it: the field that is missing
        // is named, its problem kept as the cause.
        let e = common_name(&[0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x01]).unwrap_err();
        assert_eq!(e.to_string(), "signature: truncated");
        let cause = std::error::Error::source(&e).expect("the cause");
        assert_eq!(cause.to_string(), "truncated");
    }
}
