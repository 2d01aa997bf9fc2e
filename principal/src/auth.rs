//! How the caller of a stream is authenticated, decided once per listener from the
//! configuration ([`AuthConfig`]): the verified client SVID carried with the TLS connection, a
//! JWT-SVID bearer token, or a header set by a trusted mesh sidecar. Every method yields the
//! same [`Caller`]: the typed [`ClientIdentity`] and, on the mTLS listener, the verified peer it
//! was read from (read once per request; its fingerprint was taken once at the handshake).
//! [`identify_agent`] takes a caller on to its agent: blocklist, mapping and partition.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::ClientIdentity;
use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_identity::jwt::JwtValidator;
use argocd_agent_identity::source::{SvidConfig, SvidSource};
use argocd_agent_identity::transport::VerifiedPeer;
use argocd_agent_identity::{SpiffeId, TrustDomain, text};
use argocd_agent_mesh::guard::{self, HeaderListenerPolicy, ListenAddr};
use argocd_agent_mesh::header::HeaderAuth;
use std::net::SocketAddr;
use tonic::metadata::MetadataMap;
use tonic::{Request, Status};

use crate::error::PrincipalError;
use crate::metrics::Metrics;
use crate::sessions::Sessions;

/// How long start-up waits for the principal's own SVID.
const SVID_TIMEOUT: Duration = Duration::from_secs(30);

/// Who called: the identity, and the verified TLS peer on the mTLS listener.
#[derive(Debug, Clone)]
pub struct Caller {
    /// The caller's identity, before mapping to an agent.
    pub client: ClientIdentity,
    /// The verified TLS client (address, SPIFFE ID, certificate fingerprint and chain).
    pub peer: Option<VerifiedPeer>,
}

impl Caller {
    /// SHA-256 of the caller's client certificate, when it presented one.
    pub fn fingerprint(&self) -> Option<&str> {
        self.peer.as_ref().map(|p| p.fingerprint.as_str())
    }
}

impl From<ClientIdentity> for Caller {
    fn from(client: ClientIdentity) -> Self {
        Caller { client, peer: None }
    }
}

/// How callers are identified on the principal's listener.
#[derive(Clone)]
pub enum Authenticator {
    /// The verified client SVID, read once per connection at the TLS handshake.
    Mtls,
    /// A header set by a trusted sidecar/proxy, on a plaintext loopback listener.
    Header {
        /// Which header carries the identity, and how it is read.
        auth: Arc<HeaderAuth>,
        /// Which peers may set the header (loopback, plus any trusted proxies).
        policy: Arc<HeaderListenerPolicy>,
    },
    /// A JWT-SVID bearer token whose audience is the principal's SPIFFE ID, validated
    /// against the JWT bundles of the principal's own Workload API (for ingresses that
    /// terminate TLS and cannot forward client certificates).
    Jwt {
        /// Checks a token's signature and expiry against the Workload API's JWT bundles.
        validator: Arc<JwtValidator>,
        /// The audience a token must carry (the principal's own SPIFFE ID by default).
        audience: SpiffeId,
    },
}

/// A refused caller: the gRPC status to answer and a stable reason for the metric.
#[derive(Debug)]
pub struct AuthFailure {
    /// What the caller is answered (`UNAUTHENTICATED` or `PERMISSION_DENIED`).
    pub status: Status,
    /// One of [`crate::metrics::AUTH_FAILURE_REASONS`].
    pub reason: &'static str,
}

impl AuthFailure {
    fn new(reason: &'static str, status: Status) -> Self {
        Self { status, reason }
    }
}

/// What the listener needs: the authenticator and, for mTLS, the principal's SVID source.
pub struct ListenerAuth {
    /// How each request's caller is identified.
    pub authenticator: Authenticator,
    /// The principal's own SVID, to serve TLS with (mTLS only; `None` otherwise).
    pub svid: Option<SvidSource>,
}

impl ListenerAuth {
    /// Builds the authenticator for `config`, checking what must hold before serving
    /// (header auth only on loopback unless overridden, an SVID to serve with).
    pub async fn from_config(
        config: &AuthConfig,
        listen: SocketAddr,
    ) -> Result<Self, PrincipalError> {
        match config {
            AuthConfig::Mtls { svid, .. } => Ok(ListenerAuth {
                authenticator: Authenticator::Mtls,
                svid: Some(
                    svid.load(SVID_TIMEOUT)
                        .await
                        .map_err(PrincipalError::Svid)?,
                ),
            }),
            AuthConfig::Header { auth, policy } => {
                let parsed = HeaderAuth::parse(auth).map_err(PrincipalError::Header)?;
                if let Some(warning) = guard::check_listen_addr(&ListenAddr::Tcp(listen), policy)
                    .map_err(PrincipalError::Guard)?
                {
                    tracing::warn!(%warning, "header authentication on a non-loopback listener");
                }
                Ok(ListenerAuth {
                    authenticator: Authenticator::Header {
                        auth: Arc::new(parsed),
                        policy: Arc::new(policy.clone()),
                    },
                    svid: None,
                })
            }
            AuthConfig::Jwt { endpoint, audience } => {
                let audience = match audience {
                    Some(a) => a.clone(),
                    None => {
                        let own = SvidConfig::WorkloadApi {
                            endpoint: endpoint.clone(),
                        }
                        .load(SVID_TIMEOUT)
                        .await
                        .map_err(PrincipalError::Svid)?;
                        own.current()
                            .map(|s| s.svid.spiffe_id().clone())
                            .ok_or(PrincipalError::NoAudience)?
                    }
                };
                let validator = JwtValidator::workload_api(endpoint.clone())
                    .await
                    .map_err(PrincipalError::Jwt)?;
                tracing::info!(%audience, "accepting JWT-SVID bearer tokens");
                Ok(ListenerAuth {
                    authenticator: Authenticator::Jwt {
                        validator: Arc::new(validator),
                        audience,
                    },
                    svid: None,
                })
            }
        }
    }
}

impl Authenticator {
    /// Who the caller of `req` is. The request's metadata is read in place, never copied,
    /// except the one identity header the header listener reads.
    pub fn identify<T>(&self, req: &Request<T>) -> Result<Caller, AuthFailure> {
        match self {
            Authenticator::Mtls => identify_mtls(req),
            Authenticator::Jwt {
                validator,
                audience,
            } => identify_jwt(req.metadata(), validator, audience),
            Authenticator::Header { auth, policy } => identify_header(req, auth, policy),
        }
    }
}

/// The first mesh identity header (`x-forwarded-client-cert`, `l5d-client-id`) `metadata`
/// carries: on the mTLS and JWT-SVID listeners the identity comes from the certificate or
/// the token, so such a header is a misrouted mesh request or an attempt to be taken for
/// someone else; it is refused visibly rather than ignored.
fn identity_header(metadata: &MetadataMap) -> Option<&'static str> {
    argocd_agent_mesh::IDENTITY_HEADERS
        .iter()
        .copied()
        .find(|name| metadata.contains_key(*name))
}

/// The caller of a request on the mTLS listener: the verified peer of its connection.
fn identify_mtls<T>(req: &Request<T>) -> Result<Caller, AuthFailure> {
    if let Some(name) = identity_header(req.metadata()) {
        return Err(AuthFailure::new(
            "IdentityHeaderOnMtls",
            Status::permission_denied(format!(
                "request on the mTLS listener carries identity header {name}; identity headers are only accepted on the header-auth listener behind a mesh proxy"
            )),
        ));
    }
    argocd_agent_identity::transport::verified_peer(req)
        .map(|peer| Caller {
            client: ClientIdentity::Spiffe(peer.id.clone()),
            peer: Some(peer.clone()),
        })
        .ok_or_else(|| {
            AuthFailure::new(
                "NoPeerIdentity",
                Status::unauthenticated("no verified client SVID on this connection"),
            )
        })
}

/// The caller of a request on the header listener: from a trusted peer, the identity header
/// (only that header is copied out of the metadata for the mesh crate to read).
fn identify_header<T>(
    req: &Request<T>,
    auth: &HeaderAuth,
    policy: &HeaderListenerPolicy,
) -> Result<Caller, AuthFailure> {
    guard::check_peer(req.remote_addr(), policy).map_err(|e| {
        AuthFailure::new("UntrustedProxy", Status::permission_denied(e.to_string()))
    })?;
    let name = auth.header_name();
    let mut only = http::HeaderMap::new();
    for value in req.metadata().get_all(name.as_str()) {
        if let Ok(value) = http::HeaderValue::from_bytes(value.as_encoded_bytes()) {
            only.append(name.clone(), value);
        }
    }
    auth.identity_from_headers(&only)
        .map(Caller::from)
        .map_err(|e| AuthFailure::new("BadHeaderIdentity", Status::unauthenticated(e.to_string())))
}

/// The caller of a request on the JWT-SVID listener: exactly one bearer token, valid for
/// `audience`, and no identity header (which only the header listener accepts).
fn identify_jwt(
    metadata: &MetadataMap,
    validator: &JwtValidator,
    audience: &SpiffeId,
) -> Result<Caller, AuthFailure> {
    if let Some(name) = identity_header(metadata) {
        return Err(AuthFailure::new(
            "IdentityHeaderOnJwt",
            Status::permission_denied(format!(
                "request on the JWT-SVID listener carries identity header {name}; identity headers are only accepted on the header-auth listener behind a mesh proxy"
            )),
        ));
    }
    // Which of several tokens an intermediary added or checked is unknowable.
    let count = metadata.get_all("authorization").iter().count();
    if count > 1 {
        return Err(AuthFailure::new(
            "InvalidToken",
            Status::unauthenticated(format!(
                "request has {count} authorization headers; exactly one is accepted"
            )),
        ));
    }
    let token = metadata
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(crate::resourceproxy::credentials::bearer)
        .ok_or_else(|| {
            AuthFailure::new(
                "NoToken",
                Status::unauthenticated("missing authorization: Bearer <JWT-SVID>"),
            )
        })?;
    validator
        .validate(token, audience)
        .map(|id| ClientIdentity::Spiffe(id).into())
        .map_err(|e| {
            AuthFailure::new(
                "InvalidToken",
                Status::unauthenticated(format!("JWT-SVID refused: {e}")),
            )
        })
}

/// How agents authenticate.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    /// SVID mutual TLS on the listener.
    Mtls {
        /// Where the principal's own X.509-SVID (served to agents) comes from.
        svid: SvidConfig,
        /// Client SVIDs are accepted only from these trust domains (empty: any trust domain
        /// the principal has a bundle for).
        trust_domains: Vec<TrustDomain>,
    },
    /// Identity forwarded by a mesh sidecar in a header, on a plaintext loopback listener.
    Header {
        /// The `--auth` value naming the header: `header:istio`, `header:envoy`,
        /// `header:linkerd` or `header:<name>:<regex>`; checked at start.
        auth: String,
        /// Which peers may send the header, and whether a non-loopback listener is allowed.
        policy: HeaderListenerPolicy,
    },
    /// JWT-SVID bearer tokens (audience = `audience`, or the principal's own X.509-SVID ID),
    /// validated against the JWT bundles from the Workload API at `endpoint`. The listener is
    /// plaintext: TLS is terminated by the ingress in front of it.
    Jwt {
        /// The Workload API's address (`None`: `SPIFFE_ENDPOINT_SOCKET`).
        endpoint: Option<String>,
        /// The audience tokens must carry (`None`: the principal's own X.509-SVID ID).
        audience: Option<argocd_agent_identity::SpiffeId>,
    },
}

/// How the startup line names the agents' authentication: `spiffe mTLS (Workload API
/// unix:///run/spire/agent.sock)`, `mesh header header:istio`, `JWT-SVID (Workload API at
/// SPIFFE_ENDPOINT_SOCKET, audience: the principal's SPIFFE ID)`.
impl std::fmt::Display for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuthConfig::Mtls {
                svid,
                trust_domains,
            } => {
                write!(f, "spiffe mTLS ({svid}")?;
                if !trust_domains.is_empty() {
                    let names: Vec<String> =
                        trust_domains.iter().map(ToString::to_string).collect();
                    write!(f, "; client trust domains {}", names.join(", "))?;
                }
                f.write_str(")")
            }
            AuthConfig::Header { auth, .. } => write!(f, "mesh header {auth}"),
            AuthConfig::Jwt { endpoint, audience } => {
                match endpoint {
                    Some(e) => write!(f, "JWT-SVID (Workload API {e}")?,
                    None => f.write_str("JWT-SVID (Workload API at SPIFFE_ENDPOINT_SOCKET")?,
                }
                match audience {
                    Some(a) => write!(f, ", audience {a})"),
                    None => f.write_str(", audience: the principal's SPIFFE ID)"),
                }
            }
        }
    }
}

/// Authenticates the caller of an agent RPC, refuses identities on the blocklist, and maps
/// it to its agent with the live rules (the event stream and the tunnels the agent opens);
/// refusals are logged and counted. Returns the agent with the caller it was mapped from.
pub fn identify_agent<T>(
    auth: &Authenticator,
    rules: &LiveRules,
    sessions: &Sessions,
    metrics: &Metrics,
    request: &Request<T>,
) -> Result<(argocd_agent_domain::AgentIdentity, Caller), Status> {
    let caller = auth.identify(request).map_err(|failure| {
        metrics.auth_failed(failure.reason);
        tracing::warn!(reason = failure.reason, message = failure.status.message(), peer = %text::or_dash(request.remote_addr()), "stream refused");
        failure.status
    })?;
    let client = &caller.client;
    if let Some(why) = sessions
        .blocklist
        .current()
        .denies(client, caller.fingerprint())
    {
        metrics.auth_failed("Blocked");
        tracing::warn!(%client, peer = %text::or_dash(request.remote_addr()), reason = %why, "stream refused: identity blocked");
        return Err(Status::permission_denied(format!(
            "identity blocked: {why}"
        )));
    }
    let identity = rules.current().map_client(client).map_err(|denied| {
        metrics.auth_failed("Unmapped");
        tracing::warn!(%client, reason = %denied, "stream refused: identity does not map to an agent");
        Status::permission_denied(denied.to_string())
    })?;
    if let Err(outside) = sessions.partition.admit(&identity) {
        metrics.auth_failed("OutsidePartition");
        tracing::warn!(%client, agent = %identity.agent, namespace = %identity.namespace,
            "stream refused: agent outside this principal's partition");
        return Err(Status::permission_denied(outside.to_string()));
    }
    Ok((identity, caller))
}

#[cfg(test)]
mod display_tests {
    use super::AuthConfig;
    use argocd_agent_identity::source::SvidConfig;

    #[test]
    fn the_auth_config_reads_as_a_sentence() {
        let mtls = AuthConfig::Mtls {
            svid: SvidConfig::WorkloadApi {
                endpoint: Some("unix:///run/spire/agent.sock".into()),
            },
            trust_domains: vec![],
        };
        assert_eq!(
            mtls.to_string(),
            "spiffe mTLS (Workload API unix:///run/spire/agent.sock)"
        );
        let files = AuthConfig::Mtls {
            svid: SvidConfig::Files {
                cert: "/svid/tls.crt".into(),
                key: "/svid/tls.key".into(),
                bundles: vec![],
            },
            trust_domains: vec!["a.example".parse().unwrap(), "b.example".parse().unwrap()],
        };
        assert_eq!(
            files.to_string(),
            "spiffe mTLS (PEM files /svid/tls.crt, /svid/tls.key; client trust domains a.example, b.example)"
        );
        let jwt = AuthConfig::Jwt {
            endpoint: None,
            audience: None,
        };
        assert_eq!(
            jwt.to_string(),
            "JWT-SVID (Workload API at SPIFFE_ENDPOINT_SOCKET, audience: the principal's SPIFFE ID)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtls_without_a_verified_peer_is_refused() {
        let req = Request::new(());
        let err = Authenticator::Mtls.identify(&req).unwrap_err();
        assert_eq!(err.reason, "NoPeerIdentity");
        assert_eq!(err.status.code(), tonic::Code::Unauthenticated);
    }

    #[test]
    fn identity_headers_on_the_mtls_listener_are_refused() {
        let mut req = Request::new(());
        req.metadata_mut().insert(
            "x-forwarded-client-cert",
            "URI=spiffe://example.org/a".parse().unwrap(),
        );
        let err = Authenticator::Mtls.identify(&req).unwrap_err();
        assert_eq!(err.reason, "IdentityHeaderOnMtls");
        assert_eq!(err.status.code(), tonic::Code::PermissionDenied);
    }

    /// A JWT authenticator whose bundles hold no key: a request never gets as far as a valid
    /// token, so each test sees the refusal that comes first.
    fn jwt_authenticator() -> Authenticator {
        Authenticator::Jwt {
            validator: Arc::new(JwtValidator::from_bundles(Default::default())),
            audience: SpiffeId::parse("spiffe://example.org/principal").unwrap(),
        }
    }

    #[test]
    fn two_authorization_headers_on_the_jwt_listener_are_refused() {
        let auth = jwt_authenticator();
        let mut req = Request::new(());
        req.metadata_mut()
            .append("authorization", "Bearer a.b.c".parse().unwrap());
        assert_eq!(auth.identify(&req).unwrap_err().reason, "InvalidToken");
        req.metadata_mut()
            .append("authorization", "Bearer d.e.f".parse().unwrap());
        let err = auth.identify(&req).unwrap_err();
        assert_eq!(err.reason, "InvalidToken");
        assert_eq!(err.status.code(), tonic::Code::Unauthenticated);
        assert!(
            err.status.message().contains("2 authorization headers"),
            "{}",
            err.status.message()
        );
    }

    #[test]
    fn identity_headers_on_the_jwt_listener_are_refused() {
        let auth = jwt_authenticator();
        for (name, value) in [
            ("x-forwarded-client-cert", "URI=spiffe://example.org/a"),
            (
                "l5d-client-id",
                "a.ns.serviceaccount.identity.linkerd.cluster.local",
            ),
        ] {
            let mut req = Request::new(());
            req.metadata_mut()
                .insert("authorization", "Bearer a.b.c".parse().unwrap());
            req.metadata_mut().insert(name, value.parse().unwrap());
            let err = auth.identify(&req).unwrap_err();
            assert_eq!(err.reason, "IdentityHeaderOnJwt", "{name}");
            assert_eq!(err.status.code(), tonic::Code::PermissionDenied);
            assert!(err.status.message().contains(name));
        }
        // Without one, the token itself is what fails.
        let mut req = Request::new(());
        req.metadata_mut()
            .insert("authorization", "Bearer a.b.c".parse().unwrap());
        assert_eq!(auth.identify(&req).unwrap_err().reason, "InvalidToken");
        assert_eq!(
            auth.identify(&Request::new(())).unwrap_err().reason,
            "NoToken"
        );
    }

    #[test]
    fn header_identity_from_an_untrusted_peer_is_refused() {
        let auth = Authenticator::Header {
            auth: Arc::new(HeaderAuth::parse("header:envoy").unwrap()),
            policy: Arc::new(HeaderListenerPolicy {
                trusted_proxies: Vec::new(),
                allow_non_loopback: false,
            }),
        };
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("10.0.0.9:5000".parse().unwrap()),
            });
        req.metadata_mut().insert(
            "x-forwarded-client-cert",
            "URI=spiffe://example.org/a".parse().unwrap(),
        );
        assert_eq!(auth.identify(&req).unwrap_err().reason, "UntrustedProxy");
    }
}
