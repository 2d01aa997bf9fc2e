//! The peer's SPIFFE ID, read from a certificate chain rustls has already verified, the
//! [`VerifiedPeer`] a connection carries to every request on it, and the connection that
//! carries it ([`VerifiedStream`]): the transport and whatever reads a request's peer name
//! the same type.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use rustls_pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use x509_parser::extensions::{GeneralName, ParsedExtension};

use crate::id::SpiffeId;
use crate::text::quoted;

/// The verified client of one TLS connection: read once from the chain rustls verified during
/// the handshake, then attached to every request on that connection (tonic puts a stream's
/// connect info into each request's extensions). rustls verifiers have no per-connection
/// output, so the ID is read from the session after the handshake, as linkerd2-proxy does.
#[derive(Debug, Clone)]
pub struct VerifiedPeer {
    /// The client's address.
    pub remote_addr: SocketAddr,
    /// Who the client is: the SPIFFE ID of its X.509-SVID.
    pub id: SpiffeId,
    /// SHA-256 of the client's leaf certificate (DER), lowercase hex: computed once at the
    /// handshake, for blocklists that name certificates.
    pub fingerprint: String,
    /// The leaf's serial number, hex bytes separated by `:` (as x509-parser and
    /// `openssl x509 -serial` print it, the latter without the separators): which SVID of
    /// the client's rotations this connection presented. The chain itself is not kept: the
    /// TLS connection holds its own copy, and a second one cost each connection ~0.6 KB.
    pub serial: String,
    /// When the client's SVID expires (the leaf's notAfter), read at the handshake.
    pub not_after: Option<std::time::SystemTime>,
    /// How long the TLS handshake took, from the accept to the client's verified Finished:
    /// the connection's first round trip, the client's own work (verifying our chain,
    /// signing) included. `None` when not measured.
    pub handshake: Option<std::time::Duration>,
}

impl VerifiedPeer {
    /// The peer of a connection whose handshake verified `chain` (leaf first): the leaf is
    /// parsed once, here, for its SPIFFE ID and notAfter, and hashed once for its fingerprint.
    pub fn from_chain(
        remote_addr: SocketAddr,
        chain: &[CertificateDer<'_>],
    ) -> Result<VerifiedPeer, PeerError> {
        let leaf = chain.first().ok_or(PeerError::NoCertificate)?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| PeerError::Unparsable(e.to_string()))?;
        let id = spiffe_id_of(&cert)?;
        let not_after = not_after_of(&cert);
        let fingerprint = fingerprint(leaf.as_ref());
        Ok(VerifiedPeer {
            remote_addr,
            id,
            fingerprint,
            serial: cert.raw_serial_as_string(),
            not_after,
            handshake: None,
        })
    }
}

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
    #[error("peer URI SAN {uri} is not a SPIFFE ID: {reason}", uri = quoted(.uri))]
    NotSpiffe {
        /// The URI SAN.
        uri: String,
        /// Why it was refused.
        reason: String,
    },
    /// The leaf is a CA certificate, which an SVID leaf must not be.
    #[error(
        "peer leaf certificate with URI SAN {q0} is a CA certificate; an X.509-SVID leaf must not be", q0 = quoted(.0)
    )]
    LeafIsCa(String),
}

/// The SPIFFE ID of a chain's leaf (the first certificate): exactly one URI SAN, which must be
/// a SPIFFE ID, and the leaf must not be a CA.
pub fn spiffe_id_from_chain(chain: &[CertificateDer<'_>]) -> Result<SpiffeId, PeerError> {
    let leaf = chain.first().ok_or(PeerError::NoCertificate)?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| PeerError::Unparsable(e.to_string()))?;
    spiffe_id_of(&cert)
}

/// The SPIFFE ID of a parsed leaf: exactly one URI SAN, a SPIFFE ID, and not a CA.
fn spiffe_id_of(
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Result<SpiffeId, PeerError> {
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
    not_after_of(&cert)
}

/// The notAfter of a parsed certificate.
fn not_after_of(
    cert: &x509_parser::certificate::X509Certificate<'_>,
) -> Option<std::time::SystemTime> {
    let secs = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    Some(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// The verified client of a tonic request served over [`crate::transport::tls_incoming`]:
/// established once per connection, at the handshake.
pub fn verified_peer<T>(request: &tonic::Request<T>) -> Option<&VerifiedPeer> {
    request.extensions().get::<VerifiedPeer>()
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
/// A server-side TLS connection whose client presented a verified SVID. `IO` is what the
/// TLS runs on: TCP, or the WebSocket tunnel of [`crate::websocket`]. The accept streams
/// hand it over inside an [`argocd_agent_listener::H2Connection`] (its HTTP/2 client preface read, and replayed).
pub struct VerifiedStream<IO = TcpStream> {
    inner: tokio_rustls::server::TlsStream<IO>,
    peer: VerifiedPeer,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> VerifiedStream<IO> {
    /// Reads the client's identity from a completed handshake; `None` if the session has no
    /// verified client certificate or its leaf is not an SVID (the verifier should already
    /// have refused such a client).
    pub(crate) fn new(
        inner: tokio_rustls::server::TlsStream<IO>,
        remote_addr: SocketAddr,
        handshake: std::time::Duration,
    ) -> Result<Self, PeerError> {
        let chain = inner.get_ref().1.peer_certificates().unwrap_or_default();
        let mut peer = VerifiedPeer::from_chain(remote_addr, chain)?;
        peer.handshake = Some(handshake);
        Ok(Self { inner, peer })
    }

    /// The verified client.
    pub fn peer(&self) -> &VerifiedPeer {
        &self.peer
    }
}

impl<IO> tonic::transport::server::Connected for VerifiedStream<IO> {
    type ConnectInfo = VerifiedPeer;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.peer.clone()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for VerifiedStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

argocd_agent_listener::forward_async_write!([IO: AsyncRead + AsyncWrite + Unpin] VerifiedStream<IO>, inner);
