//! The gRPC services: `EventStream` (one session per authenticated, mapped agent) and
//! `Version`.

use std::sync::Arc;

use argocd_agent_domain::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_server::EventStream;
use argocd_agent_proto::version::version_server::Version;
use argocd_agent_proto::version::{VersionRequest, VersionResponse};
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Authenticator, Caller};
use crate::metrics::Metrics;
use crate::session::{self, SessionContext};
use crate::sessions::{SessionInfo, Sessions};

/// `EventStream` implementation.
pub struct EventStreamService {
    /// Where each accepted stream's session runs.
    pub sessions: SessionContext,
    /// The mapping rules that make a caller an agent.
    pub rules: Arc<LiveRules>,
    /// Identifies each stream's caller.
    pub auth: Authenticator,
}

#[tonic::async_trait]
impl EventStream for EventStreamService {
    type SubscribeStream = session::OutboundStream;

    async fn subscribe(
        &self,
        request: Request<Streaming<CloudEvent>>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let (identity, caller) = identify_agent(
            &self.auth,
            &self.rules,
            &self.sessions.hub.sessions,
            &self.sessions.hub.metrics,
            &request,
        )?;
        let peer = caller.peer.as_ref();
        let info = SessionInfo {
            remote_addr: peer
                .map(|p| p.remote_addr)
                .or_else(|| request.remote_addr()),
            svid_expiry: peer
                .and_then(|p| argocd_agent_identity::transport::not_after_from_chain(&p.chain)),
            fingerprint: caller.fingerprint().map(str::to_owned),
            ..SessionInfo::default()
        };
        let rx = session::start(&self.sessions, identity, info, request.into_inner());
        Ok(Response::new(rx))
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
        tracing::warn!(reason = failure.reason, message = failure.status.message(), peer = ?request.remote_addr(), "stream refused");
        failure.status
    })?;
    let client = &caller.client;
    if let Some(why) = sessions
        .blocklist
        .current()
        .denies(client, caller.fingerprint())
    {
        metrics.auth_failed("Blocked");
        tracing::warn!(%client, peer = ?request.remote_addr(), reason = %why, "stream refused: identity blocked");
        return Err(Status::permission_denied(format!(
            "identity blocked: {why}"
        )));
    }
    let identity = rules.current().map_client(client).map_err(|denied| {
        metrics.auth_failed("Unmapped");
        tracing::warn!(%client, reason = %denied, "stream refused: identity does not map to an agent");
        Status::permission_denied(denied.to_string())
    })?;
    Ok((identity, caller))
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
