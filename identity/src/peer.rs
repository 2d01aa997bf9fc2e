//! The peer's SPIFFE ID, read from a certificate chain rustls has already verified.

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use x509_parser::extensions::{GeneralName, ParsedExtension};

use crate::id::SpiffeId;
use crate::transport::VerifiedPeer;

/// Why no SPIFFE ID could be read from a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    /// The connection carries no client certificate (not TLS, or no verified chain).
    #[error("no verified peer certificate on this connection")]
    NoCertificate,
    /// The leaf is not a parsable X.509 certificate.
    #[error("peer leaf certificate cannot be parsed: {0}")]
    Unparsable(String),
    /// SVIDs carry exactly one URI SAN.
    #[error("peer leaf certificate has {0} URI SANs; an X.509-SVID has exactly one")]
    UriSanCount(usize),
    /// The URI SAN is not a valid SPIFFE ID.
    #[error("peer URI SAN {uri:?} is not a SPIFFE ID: {reason}")]
    NotSpiffe {
        /// The URI SAN.
        uri: String,
        /// Why it was refused.
        reason: String,
    },
    /// The leaf is a CA certificate, which an SVID leaf must not be.
    #[error(
        "peer leaf certificate with URI SAN {0:?} is a CA certificate; an X.509-SVID leaf must not be"
    )]
    LeafIsCa(String),
}

/// The SPIFFE ID of a chain's leaf (the first certificate): exactly one URI SAN, which must be
/// a SPIFFE ID, and the leaf must not be a CA.
pub fn spiffe_id_from_chain(chain: &[CertificateDer<'_>]) -> Result<SpiffeId, PeerError> {
    let leaf = chain.first().ok_or(PeerError::NoCertificate)?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| PeerError::Unparsable(e.to_string()))?;
    let mut uris = Vec::new();
    let mut is_ca = false;
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for name in &san.general_names {
                    if let GeneralName::URI(uri) = name {
                        uris.push(uri.to_string());
                    }
                }
            }
            ParsedExtension::BasicConstraints(bc) => is_ca = bc.ca,
            _ => {}
        }
    }
    if uris.len() != 1 {
        return Err(PeerError::UriSanCount(uris.len()));
    }
    let uri = uris.remove(0);
    let id = SpiffeId::parse(&uri).map_err(|e| PeerError::NotSpiffe {
        uri: uri.clone(),
        reason: e.to_string(),
    })?;
    if is_ca {
        return Err(PeerError::LeafIsCa(uri));
    }
    Ok(id)
}

/// The notAfter of a chain's leaf (when the peer's SVID expires); `None` if unparsable.
pub fn not_after_from_chain(chain: &[CertificateDer<'_>]) -> Option<std::time::SystemTime> {
    let leaf = chain.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// The verified client of a tonic request served over [`crate::transport::tls_incoming`]:
/// established once per connection, at the handshake.
pub fn verified_peer<T>(request: &tonic::Request<T>) -> Option<&VerifiedPeer> {
    request.extensions().get::<VerifiedPeer>()
}

/// The verified client chain of a tonic request served over [`crate::transport::tls_incoming`].
pub fn peer_certs<T>(request: &tonic::Request<T>) -> Option<Arc<Vec<CertificateDer<'static>>>> {
    verified_peer(request).map(|p| p.chain.clone())
}

/// The SPIFFE ID of the client of a tonic request served over [`crate::transport::tls_incoming`]
/// (read once per connection from the chain rustls verified).
pub fn peer_spiffe_id<T>(request: &tonic::Request<T>) -> Result<SpiffeId, PeerError> {
    verified_peer(request)
        .map(|p| p.id.clone())
        .ok_or(PeerError::NoCertificate)
}

/// SHA-256 of a certificate (DER), lowercase hex: the certificate fingerprint upstream's
/// blocklist and `openssl x509 -fingerprint -sha256` name (there with `:` separators).
pub fn fingerprint(der: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, der)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

    fn cert(uris: &[&str], ca: bool) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(u.to_string().try_into().unwrap()))
            .collect();
        params.is_ca = if ca {
            IsCa::Ca(BasicConstraints::Unconstrained)
        } else {
            IsCa::ExplicitNoCa
        };
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn single_spiffe_uri_san_is_the_peer_id() {
        let id = spiffe_id_from_chain(&[cert(&["spiffe://example.org/agent"], false)]).unwrap();
        assert_eq!(id.as_str(), "spiffe://example.org/agent");
    }

    #[test]
    fn not_after_is_read_from_the_leaf() {
        // rcgen's default validity ends on 4096-01-01T00:00:00Z.
        let t = not_after_from_chain(&[cert(&["spiffe://example.org/agent"], false)]).unwrap();
        let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 67_090_118_400);
        assert_eq!(not_after_from_chain(&[]), None);
        assert_eq!(
            not_after_from_chain(&[CertificateDer::from(vec![1, 2, 3])]),
            None
        );
    }

    #[test]
    fn leaf_with_zero_or_two_uri_sans_is_refused() {
        assert_eq!(
            spiffe_id_from_chain(&[cert(&[], false)]),
            Err(PeerError::UriSanCount(0))
        );
        assert_eq!(
            spiffe_id_from_chain(&[cert(
                &["spiffe://example.org/a", "spiffe://example.org/b"],
                false
            )]),
            Err(PeerError::UriSanCount(2))
        );
    }

    #[test]
    fn non_spiffe_uri_and_ca_leaf_are_refused() {
        assert!(matches!(
            spiffe_id_from_chain(&[cert(&["https://example.org/agent"], false)]),
            Err(PeerError::NotSpiffe { .. })
        ));
        assert_eq!(
            spiffe_id_from_chain(&[cert(&["spiffe://example.org/agent"], true)]),
            Err(PeerError::LeafIsCa("spiffe://example.org/agent".into()))
        );
        assert_eq!(spiffe_id_from_chain(&[]), Err(PeerError::NoCertificate));
        assert!(matches!(
            spiffe_id_from_chain(&[CertificateDer::from(vec![1, 2, 3])]),
            Err(PeerError::Unparsable(_))
        ));
    }

    #[test]
    fn request_without_tls_info_has_no_peer_id() {
        let request = tonic::Request::new(());
        assert_eq!(peer_spiffe_id(&request), Err(PeerError::NoCertificate));
    }
}
