//! SVID material as the rest of the crate sees it: one X.509-SVID (chain + key) and the trust
//! bundles (own and federated trust domains), bundled into an immutable [`SvidState`] that
//! sources publish through a `watch` channel on every rotation.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::RootCertStore;
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::id::{SpiffeId, TrustDomain};
use crate::transport::{self, PeerError};

/// Why SVID material was refused.
#[derive(Debug, thiserror::Error)]
pub enum SvidError {
    /// The chain is empty.
    #[error("X.509-SVID has an empty certificate chain")]
    EmptyChain,
    /// The leaf does not carry a usable SPIFFE ID. The message carries the cause, so it is
    /// no `source` (a chain would print it twice).
    #[error("X.509-SVID leaf: {0}")]
    Leaf(PeerError),
    /// A certificate could not be parsed.
    #[error("certificate {what}: {reason}")]
    Certificate {
        /// Which certificate.
        what: String,
        /// Why it was refused.
        reason: String,
    },
    /// The private key does not fit rustls (unsupported algorithm or does not match).
    #[error("X.509-SVID private key for {id}: {reason}")]
    Key {
        /// The SVID's SPIFFE ID.
        id: String,
        /// Why it was refused.
        reason: String,
    },
    /// A bundle has no certificates.
    #[error("trust bundle for {0} has no certificates")]
    EmptyBundle(String),
}

impl From<PeerError> for SvidError {
    fn from(e: PeerError) -> Self {
        SvidError::Leaf(e)
    }
}

/// One X.509-SVID: the SPIFFE ID, the chain (leaf first) and its private key.
#[derive(Clone)]
pub struct X509Svid {
    spiffe_id: SpiffeId,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    not_after: SystemTime,
    certified: Arc<CertifiedKey>,
}

impl X509Svid {
    /// Builds an SVID from a DER chain (leaf first) and a DER private key. The SPIFFE ID is
    /// read from the leaf's single URI SAN; the key must be one rustls (ring) can sign with.
    pub fn new(
        chain: Vec<CertificateDer<'static>>,
        key: PrivateKeyDer<'static>,
    ) -> Result<Self, SvidError> {
        let leaf = chain.first().ok_or(SvidError::EmptyChain)?;
        let spiffe_id = transport::spiffe_id_from_chain(&chain)?;
        let not_after = not_after(leaf).map_err(|e| SvidError::Certificate {
            what: format!("leaf of {}", spiffe_id.as_str()),
            reason: e.to_string(),
        })?;
        let provider = rustls::crypto::ring::default_provider();
        let signing_key = provider
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| SvidError::Key {
                id: spiffe_id.as_str().to_string(),
                reason: e.to_string(),
            })?;
        let certified = CertifiedKey::new(chain.clone(), signing_key);
        certified.keys_match().map_err(|e| SvidError::Key {
            id: spiffe_id.as_str().to_string(),
            reason: format!("does not match the leaf certificate: {e}"),
        })?;
        Ok(Self {
            spiffe_id,
            chain,
            key: Arc::new(key),
            not_after,
            certified: Arc::new(certified),
        })
    }

    /// The SPIFFE ID in the leaf's URI SAN.
    pub fn spiffe_id(&self) -> &SpiffeId {
        &self.spiffe_id
    }

    /// The certificate chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }

    /// The private key (PKCS#8 DER).
    pub fn key(&self) -> &PrivateKeyDer<'static> {
        &self.key
    }

    /// When the leaf expires.
    pub fn not_after(&self) -> SystemTime {
        self.not_after
    }

    /// Whether the leaf has expired at `now`.
    pub fn is_expired_at(&self, now: SystemTime) -> bool {
        now >= self.not_after
    }

    /// The chain and key as rustls uses them in handshakes.
    pub fn certified_key(&self) -> Arc<CertifiedKey> {
        self.certified.clone()
    }
}

impl fmt::Debug for X509Svid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("X509Svid")
            .field("spiffe_id", &self.spiffe_id.as_str())
            .field("chain_len", &self.chain.len())
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// CA certificates per trust domain: the own trust domain and every federated one. A peer is
/// verified against the bundle of the trust domain in its own SPIFFE ID.
#[derive(Clone, Default)]
pub struct TrustBundles {
    bundles: BTreeMap<TrustDomain, Bundle>,
}

#[derive(Clone)]
struct Bundle {
    certs: Vec<CertificateDer<'static>>,
    roots: Arc<RootCertStore>,
}

impl TrustBundles {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) the bundle of one trust domain.
    pub fn insert(
        &mut self,
        trust_domain: TrustDomain,
        certs: Vec<CertificateDer<'static>>,
    ) -> Result<(), SvidError> {
        let mut roots = RootCertStore::empty();
        for (i, cert) in certs.iter().enumerate() {
            roots
                .add(cert.clone())
                .map_err(|e| SvidError::Certificate {
                    what: format!("#{i} of the bundle for {}", trust_domain.as_str()),
                    reason: e.to_string(),
                })?;
        }
        if roots.is_empty() {
            return Err(SvidError::EmptyBundle(trust_domain.as_str().to_string()));
        }
        self.bundles.insert(
            trust_domain,
            Bundle {
                certs,
                roots: Arc::new(roots),
            },
        );
        Ok(())
    }

    /// The CA certificates of one trust domain.
    pub fn get(&self, trust_domain: &TrustDomain) -> Option<&[CertificateDer<'static>]> {
        self.bundles.get(trust_domain).map(|b| b.certs.as_slice())
    }

    /// The bundle of one trust domain as a rustls root store.
    pub fn roots(&self, trust_domain: &TrustDomain) -> Option<Arc<RootCertStore>> {
        self.bundles.get(trust_domain).map(|b| b.roots.clone())
    }

    /// The trust domains that have a bundle.
    pub fn trust_domains(&self) -> impl Iterator<Item = &TrustDomain> {
        self.bundles.keys()
    }

    /// Number of trust domains.
    pub fn len(&self) -> usize {
        self.bundles.len()
    }

    /// Whether there is no bundle at all.
    pub fn is_empty(&self) -> bool {
        self.bundles.is_empty()
    }
}

impl fmt::Debug for TrustBundles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.bundles
                    .iter()
                    .map(|(td, b)| (td.as_str(), b.certs.len())),
            )
            .finish()
    }
}

/// What a source publishes: the current SVID and the bundles to verify peers with.
#[derive(Clone, Debug)]
pub struct SvidState {
    /// The workload's own X.509-SVID.
    pub svid: Arc<X509Svid>,
    /// Trust bundles, own and federated.
    pub bundles: Arc<TrustBundles>,
}

/// The leaf's notAfter as a `SystemTime`.
pub(crate) fn not_after(
    cert: &CertificateDer<'_>,
) -> Result<SystemTime, x509_parser::nom::Err<x509_parser::error::X509Error>> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())?;
    let ts = parsed.validity().not_after.timestamp();
    Ok(if ts <= 0 {
        UNIX_EPOCH
    } else {
        UNIX_EPOCH + Duration::from_secs(ts as u64)
    })
}

/// Subject DN of a certificate, for reports.
pub(crate) fn subject(cert: &CertificateDer<'_>) -> String {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, parsed)) => parsed.subject().to_string(),
        Err(e) => format!("<unparsable certificate: {e}>"),
    }
}

/// Human-readable summary of a state: ID, expiry, chain subjects, bundle trust domains.
pub fn describe(state: &SvidState) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let svid = &state.svid;
    let _ = writeln!(out, "SPIFFE ID:  {}", svid.spiffe_id().as_str());
    let expiry = time::OffsetDateTime::from(svid.not_after());
    let remaining = svid
        .not_after()
        .duration_since(SystemTime::now())
        .map(|d| format!("in {}s", d.as_secs()))
        .unwrap_or_else(|_| "EXPIRED".to_string());
    let _ = writeln!(out, "Expires:    {expiry} ({remaining})");
    let _ = writeln!(out, "Chain:");
    for (i, cert) in svid.chain().iter().enumerate() {
        let _ = writeln!(out, "  [{i}] {}", subject(cert));
    }
    let _ = writeln!(out, "Bundles:");
    for td in state.bundles.trust_domains() {
        let n = state.bundles.get(td).map(|c| c.len()).unwrap_or(0);
        let _ = writeln!(out, "  {} ({n} CA certificate(s))", td.as_str());
    }
    out
}
