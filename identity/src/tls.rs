//! rustls configurations for the principal (server) and the agent (client) built on an
//! [`SvidSource`]. Certificates and trust bundles are read from the source at every handshake,
//! so a rotation needs no restart and leaves established connections alone.
//!
//! Written here rather than with `spiffe-rustls` because that crate only accepts the `spiffe`
//! crate's `X509Source`, while our sources also include PEM files.

use crate::text::quoted;
use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{ResolvesClientCert, Resumption};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, NoServerSessionStorage, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::watch;

use crate::id::{SpiffeId, TrustDomain};
use crate::source::SvidSource;
use crate::svid::SvidState;
use crate::transport::{self, PeerError};

mod profile;
pub use profile::{ProfileError, TlsProfile, TlsVersion, VersionError};

/// Which peer SPIFFE IDs a configuration accepts (after the chain has verified).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerPolicy {
    /// Any ID from a trust domain we hold a bundle for.
    Any,
    /// Any ID from one of these trust domains.
    TrustDomains(Vec<TrustDomain>),
    /// Exactly this ID (the agent pins the principal this way).
    Exact(SpiffeId),
    /// One of these IDs.
    OneOf(Vec<SpiffeId>),
}

impl PeerPolicy {
    /// Whether `id` is acceptable; the error explains the refusal.
    pub fn check(&self, id: &SpiffeId) -> Result<(), TlsError> {
        let allowed = match self {
            PeerPolicy::Any => true,
            PeerPolicy::TrustDomains(tds) => tds.contains(id.trust_domain()),
            PeerPolicy::Exact(want) => want == id,
            PeerPolicy::OneOf(ids) => ids.contains(id),
        };
        if allowed {
            Ok(())
        } else {
            Err(TlsError::NotAllowed {
                peer: id.as_str().to_string(),
                policy: self.to_string(),
            })
        }
    }
}

impl fmt::Display for PeerPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let join = |items: Vec<&str>| items.join(", ");
        match self {
            PeerPolicy::Any => write!(f, "from a trusted trust domain"),
            PeerPolicy::TrustDomains(tds) => write!(
                f,
                "in trust domains [{}]",
                join(tds.iter().map(|t| t.as_str()).collect())
            ),
            PeerPolicy::Exact(id) => write!(f, "the pinned principal {}", id.as_str()),
            PeerPolicy::OneOf(ids) => write!(
                f,
                "one of [{}]",
                join(ids.iter().map(|i| i.as_str()).collect())
            ),
        }
    }
}

/// Configuration and verification failures.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rustls refused the configuration. The messages of this enum carry their cause, so
    /// none is a `source` (a chain would print it twice).
    #[error("TLS configuration: {0}")]
    Config(rustls::Error),
    /// The source has no SVID yet.
    #[error("no X.509-SVID available yet from {0}")]
    NoSvid(String),
    /// The peer's leaf is not a valid SVID.
    #[error("peer certificate is not an X.509-SVID: {0}")]
    Peer(PeerError),
    /// No bundle for the peer's trust domain. The ID is only what the certificate claims.
    #[error(
        "certificate claiming {peer} (not verified) is from trust domain {trust_domain}, for which there is no trust bundle", peer = quoted(.peer), trust_domain = quoted(.trust_domain)
    )]
    UnknownTrustDomain {
        /// The SPIFFE ID the certificate claims (not verified).
        peer: String,
        /// Its trust domain.
        trust_domain: String,
    },
    /// The chain does not verify against the bundle (bad signature, expired, not yet valid).
    /// The ID is only what the certificate claims.
    #[error(
        "certificate claiming {peer} (not verified) does not verify against the bundle of {trust_domain}: {cause}", peer = quoted(.peer), trust_domain = quoted(.trust_domain)
    )]
    Chain {
        /// The SPIFFE ID the certificate claims (not verified).
        peer: String,
        /// Its trust domain.
        trust_domain: String,
        /// What rustls/webpki said (e.g. "certificate expired: ...").
        cause: rustls::Error,
    },
    /// The chain verified but the ID is not the one we accept.
    #[error("{peer} is not {policy}")]
    NotAllowed {
        /// The peer's SPIFFE ID.
        peer: String,
        /// The policy, in words.
        policy: String,
    },
}

impl From<rustls::Error> for TlsError {
    fn from(e: rustls::Error) -> Self {
        TlsError::Config(e)
    }
}

impl From<PeerError> for TlsError {
    fn from(e: PeerError) -> Self {
        TlsError::Peer(e)
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Server configuration for the principal: presents the current SVID, requires a client SVID
/// that chains to the bundle of its own trust domain and passes `policy`. ALPN `h2`. TLS
/// versions and suites are the process's ([`TlsProfile::process`]: TLS 1.3 only unless
/// configured).
pub fn server_config(
    source: &SvidSource,
    policy: PeerPolicy,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    server_config_with(source, policy, &TlsProfile::process())
}

/// [`server_config`] with the TLS versions and suites of `profile`.
pub fn server_config_with(
    source: &SvidSource,
    policy: PeerPolicy,
    profile: &TlsProfile,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let verifier = Arc::new(SpiffeVerifier::new(
        source,
        policy,
        Role::Client,
        provider().signature_verification_algorithms,
    ));
    let mut config = profile
        .server_builder()?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(Arc::new(SvidResolver::new(source)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    // No resumption: every connection re-verifies the peer against current bundles and policy.
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// Client configuration for the agent: presents the current SVID, accepts the server only if
/// it chains to its trust domain's bundle and passes `principal` (usually
/// [`PeerPolicy::Exact`] with the principal's SPIFFE ID). ALPN `h2`. TLS versions and
/// suites are the process's ([`TlsProfile::process`]).
pub fn client_config(
    source: &SvidSource,
    principal: PeerPolicy,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    client_config_with(source, principal, &TlsProfile::process())
}

/// [`client_config`] with the TLS versions and suites of `profile`.
pub fn client_config_with(
    source: &SvidSource,
    principal: PeerPolicy,
    profile: &TlsProfile,
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let verifier = Arc::new(SpiffeVerifier::new(
        source,
        principal,
        Role::Server,
        provider().signature_verification_algorithms,
    ));
    let mut config = profile
        .client_builder()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_cert_resolver(Arc::new(SvidResolver::new(source)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    config.resumption = Resumption::disabled();
    Ok(Arc::new(config))
}

/// Hands out the source's current SVID at each handshake.
struct SvidResolver {
    rx: watch::Receiver<Option<Arc<SvidState>>>,
    description: String,
}

impl SvidResolver {
    fn new(source: &SvidSource) -> Self {
        Self {
            rx: source.subscribe(),
            description: source.description().to_string(),
        }
    }

    fn current(&self) -> Option<Arc<CertifiedKey>> {
        match self.rx.borrow().as_ref() {
            Some(state) => Some(state.svid.certified_key()),
            None => {
                tracing::warn!(source = %self.description, "TLS handshake without an X.509-SVID: the source has none yet");
                None
            }
        }
    }
}

impl fmt::Debug for SvidResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SvidResolver")
            .field("source", &self.description)
            .finish()
    }
}

impl ResolvesServerCert for SvidResolver {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current()
    }
}

impl ResolvesClientCert for SvidResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        self.current()
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// We verify a client (we are the server).
    Client,
    /// We verify a server (we are the client).
    Server,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Server => "server",
        }
    }
}

/// Verifies the peer's chain against the bundle of the trust domain in the peer's own SPIFFE
/// ID, taken from the source's latest state, then applies the policy.
struct SpiffeVerifier {
    rx: watch::Receiver<Option<Arc<SvidState>>>,
    policy: PeerPolicy,
    role: Role,
    algs: WebPkiSupportedAlgorithms,
    provider: Arc<CryptoProvider>,
}

impl SpiffeVerifier {
    fn new(
        source: &SvidSource,
        policy: PeerPolicy,
        role: Role,
        algs: WebPkiSupportedAlgorithms,
    ) -> Self {
        Self {
            rx: source.subscribe(),
            policy,
            role,
            algs,
            provider: provider(),
        }
    }

    fn verify(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<SpiffeId, TlsError> {
        let id = transport::spiffe_id_from_chain(std::slice::from_ref(end_entity))?;
        let td = id.trust_domain();
        let roots = self
            .rx
            .borrow()
            .as_ref()
            .and_then(|s| s.bundles.roots(td))
            .ok_or_else(|| TlsError::UnknownTrustDomain {
                peer: id.as_str().to_string(),
                trust_domain: td.as_str().to_string(),
            })?;
        let chain_err = |cause: rustls::Error| TlsError::Chain {
            peer: id.as_str().to_string(),
            trust_domain: td.as_str().to_string(),
            cause,
        };
        match self.role {
            Role::Server => {
                let parsed =
                    rustls::server::ParsedCertificate::try_from(end_entity).map_err(chain_err)?;
                rustls::client::verify_server_cert_signed_by_trust_anchor(
                    &parsed,
                    &roots,
                    intermediates,
                    now,
                    self.algs.all,
                )
                .map_err(chain_err)?;
            }
            Role::Client => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    roots,
                    self.provider.clone(),
                )
                .build()
                .map_err(|e| chain_err(rustls::Error::General(e.to_string())))?;
                verifier
                    .verify_client_cert(end_entity, intermediates, now)
                    .map_err(chain_err)?;
            }
        }
        self.policy.check(&id)?;
        Ok(id)
    }

    fn verify_logged(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        match self.verify(end_entity, intermediates, now) {
            Ok(id) => {
                tracing::debug!(
                    peer = id.as_str(),
                    role = self.role.name(),
                    "peer SVID verified"
                );
                Ok(())
            }
            Err(e) => {
                // rustls gives a verifier no peer address. On the server side the accept loop
                // (`transport::tls_incoming`) logs the refusal with it, so this line is only
                // detail; the agent has a single peer and logs it here.
                match self.role {
                    Role::Client => tracing::debug!("refused TLS client: {e}"),
                    Role::Server => tracing::warn!("refused TLS server: {e}"),
                }
                Err(to_rustls(e))
            }
        }
    }
}

/// Keeps rustls' own certificate errors (so the right TLS alert, e.g. certificate_expired, is
/// sent) and wraps ours.
fn to_rustls(e: TlsError) -> rustls::Error {
    match e {
        TlsError::Chain { cause, .. } => cause,
        other => rustls::Error::InvalidCertificate(rustls::CertificateError::Other(
            rustls::OtherError(Arc::new(other)),
        )),
    }
}

impl fmt::Debug for SpiffeVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeVerifier")
            .field("role", &self.role)
            .field("policy", &self.policy)
            .finish()
    }
}

impl ClientCertVerifier for SpiffeVerifier {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Bundles change at runtime; clients pick their only SVID anyway.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verify_logged(end_entity, intermediates, now)?;
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}

impl ServerCertVerifier for SpiffeVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The server is identified by its SPIFFE ID (the policy), not by a DNS name.
        self.verify_logged(end_entity, intermediates, now)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
    }
}
