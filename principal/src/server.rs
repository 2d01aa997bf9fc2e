//! The gRPC services (`EventStream`, `Version`) and how a stream's caller is identified:
//! from the verified client certificate (SVID mTLS), or from a mesh-forwarded header on a
//! listener only the sidecar can reach.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::mapping::{AgentIdentity, LiveRules};
use argocd_agent_identity::names::{AgentName, AllowedModes, Namespace};
use argocd_agent_mesh::guard::{self, HeaderListenerPolicy};
use argocd_agent_mesh::header::{HeaderAuth, HeaderIdentity};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_server::EventStream;
use argocd_agent_proto::version::version_server::Version;
use argocd_agent_proto::version::{VersionRequest, VersionResponse};
use argocd_agent_sync::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::hub::Hub;
use crate::session;

/// How callers are identified on a listener.
#[derive(Clone)]
pub enum Authenticator {
    /// The verified client SVID (rustls already checked chain, expiry and trust domain).
    Mtls,
    /// A header set by a trusted sidecar/proxy, on a plaintext loopback listener.
    Header {
        auth: Arc<HeaderAuth>,
        policy: Arc<HeaderListenerPolicy>,
    },
    /// A JWT-SVID bearer token whose audience is the principal's SPIFFE ID, validated
    /// against the JWT bundles of the principal's own Workload API (for ingresses that
    /// terminate TLS and cannot forward client certificates).
    Jwt {
        validator: Arc<argocd_agent_identity::jwt::JwtValidator>,
        audience: SpiffeId,
    },
}

impl Authenticator {
    fn identify<T>(&self, req: &Request<T>) -> Result<Caller, (Status, &'static str)> {
        let headers = req.metadata().clone().into_headers();
        match self {
            Authenticator::Mtls => {
                // A header identity on the mTLS listener is an attack or a misconfiguration:
                // refuse it loudly rather than ignore it.
                if let Err(e) = argocd_agent_mesh::reject_identity_headers(&headers) {
                    return Err((
                        Status::permission_denied(e.to_string()),
                        "IdentityHeaderOnMtls",
                    ));
                }
                argocd_agent_identity::peer::peer_spiffe_id(req)
                    .map(Caller::Spiffe)
                    .map_err(|e| (Status::unauthenticated(e.to_string()), "NoPeerIdentity"))
            }
            Authenticator::Jwt {
                validator,
                audience,
            } => {
                let value = headers
                    .get(http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or((
                        Status::unauthenticated("missing authorization: Bearer <JWT-SVID>"),
                        "NoToken",
                    ))?;
                let token = value.strip_prefix("Bearer ").ok_or((
                    Status::unauthenticated("authorization is not a Bearer token"),
                    "NoToken",
                ))?;
                validator
                    .validate(token.trim(), audience)
                    .map(Caller::Spiffe)
                    .map_err(|e| {
                        (
                            Status::unauthenticated(format!("JWT-SVID refused: {e}")),
                            "InvalidToken",
                        )
                    })
            }
            Authenticator::Header { auth, policy } => {
                if let Err(e) = guard::check_peer(req.remote_addr(), policy) {
                    return Err((Status::permission_denied(e.to_string()), "UntrustedProxy"));
                }
                match auth.identity_from_headers(&headers) {
                    Ok(HeaderIdentity::Spiffe(id)) => Ok(Caller::Spiffe(id)),
                    Ok(HeaderIdentity::Name(name)) => Ok(Caller::Name(name)),
                    Err(e) => Err((Status::unauthenticated(e.to_string()), "BadHeaderIdentity")),
                }
            }
        }
    }
}

/// Who a stream's caller is, before mapping.
enum Caller {
    Spiffe(SpiffeId),
    /// An agent name from an upstream-style `header:<name>:<regex>` capture.
    Name(String),
}

/// Upstream-compatible identity from a header regex capturing an agent name: the name must
/// be a DNS-1123 label and is used as agent name and hub namespace; no SPIFFE rule applies.
/// The SPIFFE ID recorded for logs is synthetic (`spiffe://header-identity.invalid/agent/<n>`).
fn name_identity(name: &str) -> Result<AgentIdentity, Status> {
    let bad = |e: argocd_agent_identity::IdError| {
        Status::unauthenticated(format!(
            "header identity {name:?} is not a valid agent name: {e}"
        ))
    };
    let agent = AgentName::new(name).map_err(bad)?;
    let namespace = Namespace::new(name).map_err(bad)?;
    let spiffe_id = SpiffeId::parse(&format!("spiffe://header-identity.invalid/agent/{name}"))
        .map_err(|e| Status::unauthenticated(e.to_string()))?;
    Ok(AgentIdentity {
        spiffe_id,
        agent,
        namespace,
        allowed_modes: AllowedModes::Both,
        rule: "header-name".into(),
    })
}

/// `EventStream` implementation.
pub struct EventStreamService {
    pub hub: Arc<Hub>,
    pub rules: Arc<LiveRules>,
    pub auth: Authenticator,
    pub idle_timeout: Duration,
}

#[tonic::async_trait]
impl EventStream for EventStreamService {
    type SubscribeStream = ReceiverStream<Result<CloudEvent, Status>>;

    async fn subscribe(
        &self,
        request: Request<Streaming<CloudEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let id = match self.auth.identify(&request) {
            Ok(Caller::Spiffe(id)) => id,
            Ok(Caller::Name(name)) => {
                let identity = name_identity(&name).inspect_err(|s| {
                    self.hub.metrics.auth_failed("BadHeaderIdentity");
                    tracing::warn!(message = s.message(), "stream refused");
                })?;
                let rx = session::start(
                    self.hub.clone(),
                    identity,
                    request.into_inner(),
                    self.idle_timeout,
                );
                return Ok(Response::new(ReceiverStream::new(rx)));
            }
            Err((status, reason)) => {
                self.hub.metrics.auth_failed(reason);
                tracing::warn!(reason, message = status.message(), peer = ?request.remote_addr(), "stream refused");
                return Err(status);
            }
        };
        let identity = match self.rules.current().map(&id) {
            Ok(identity) => identity,
            Err(denied) => {
                self.hub.metrics.auth_failed("Unmapped");
                tracing::warn!(spiffe_id = %id, reason = %denied, "stream refused: identity does not map to an agent");
                return Err(Status::permission_denied(denied.to_string()));
            }
        };
        let rx = session::start(
            self.hub.clone(),
            identity,
            request.into_inner(),
            self.idle_timeout,
        );
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// `Version` implementation.
pub struct VersionService;

#[tonic::async_trait]
impl Version for VersionService {
    async fn version(
        &self,
        _: Request<VersionRequest>,
    ) -> Result<Response<VersionResponse>, Status> {
        Ok(Response::new(VersionResponse {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_min: PROTOCOL_MIN,
            protocol_max: PROTOCOL_VERSION,
        }))
    }
}
