//! The gRPC services: `EventStream` (one session per authenticated, mapped agent) and
//! `Version`.

use argocd_agent_identity::text;
use std::sync::Arc;

use argocd_agent_domain::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::event_stream_server::EventStream;
use argocd_agent_proto::version::version_server::Version;
use argocd_agent_proto::version::{VersionRequest, VersionResponse};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status, Streaming};

use crate::auth::{Authenticator, identify_agent};
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
            &self.sessions.hub.shared.sessions,
            &self.sessions.hub.shared.metrics,
            &request,
        )?;
        let slot = admit_to_tenant(
            &self.sessions.hub.shared.sessions,
            &self.sessions.hub.shared.metrics,
            &identity,
        )?;
        let (inbound, outbound) = stream_compression(request.metadata());
        if inbound != IDENTITY || outbound != IDENTITY {
            tracing::info!(agent = %identity.agent, %inbound, %outbound, "agent stream compressed");
        }
        let peer = caller.peer.as_ref();
        let info = SessionInfo {
            remote_addr: peer
                .map(|p| p.remote_addr)
                .or_else(|| request.remote_addr()),
            svid_expiry: peer.and_then(|p| p.not_after),
            fingerprint: caller.fingerprint().map(str::to_owned),
            handshake: peer.and_then(|p| p.handshake),
            ..SessionInfo::default()
        };
        let rx = session::start(&self.sessions, identity, info, request.into_inner(), slot);
        Ok(Response::new(rx))
    }
}

/// Admits an agent's session under its tenant's `agents` quota (with `--ha`, counted
/// across replicas); a refusal is logged, counted as auth failure `TenantAgentQuota` and in
/// `argocd_principal_tenant_quota_refused_total`, and answered `ResourceExhausted`.
fn admit_to_tenant(
    sessions: &Sessions,
    metrics: &Metrics,
    identity: &argocd_agent_domain::AgentIdentity,
) -> Result<crate::tenant_limits::AgentSlot, Status> {
    sessions.tenancy.admit_agent(identity).map_err(|refusal| {
        metrics.auth_failed(crate::refusals::TENANT_AGENT_QUOTA);
        tracing::warn!(client = %identity.client, agent = %identity.agent,
            tenant = %text::or_dash(identity.tenant.as_ref()), reason = %refusal,
            "stream refused: tenant agents quota");
        Status::resource_exhausted(refusal.to_string())
    })
}

/// The gRPC encodings the agent listener decodes, and may answer in.
pub const ENCODINGS: [CompressionEncoding; 2] =
    [CompressionEncoding::Gzip, CompressionEncoding::Zstd];

/// The names of [`ENCODINGS`] in `grpc-encoding`.
pub const ENCODING_NAMES: [&str; 2] = ["gzip", "zstd"];

/// The name of no compression in `grpc-encoding`.
pub const IDENTITY: &str = "identity";

const ENCODING: &str = "grpc-encoding";
const ACCEPT_ENCODING: &str = "grpc-accept-encoding";

/// Whether the principal compresses what it sends on a stream, decided per request before
/// tonic reads it. tonic answers in the first encoding of the client's
/// `grpc-accept-encoding` it knows, so the rule is applied by rewriting that header:
/// with `--enable-compression` it is left as the client sent it; without, it keeps only the
/// encoding the client compresses its own messages in (gRPC servers answer in the request's
/// encoding, upstream's principal included), and goes when the client does not compress.
#[derive(Debug, Clone, Copy)]
pub struct AnswerCompression {
    /// `--enable-compression`.
    pub enabled: bool,
}

impl AnswerCompression {
    /// Rewrites `request`'s `grpc-accept-encoding` by the rule above.
    pub fn apply<B>(self, mut request: http::Request<B>) -> http::Request<B> {
        if self.enabled {
            return request;
        }
        let headers = request.headers_mut();
        let sent_in = headers
            .get(ENCODING)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|e| *e != IDENTITY)
            .map(str::to_owned);
        let accepted = headers
            .get(ACCEPT_ENCODING)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|list| {
                sent_in
                    .as_deref()
                    .is_some_and(|e| list.split(',').any(|a| a.trim() == e))
            });
        match sent_in {
            Some(e) if accepted => {
                if let Ok(v) = http::HeaderValue::from_str(&e) {
                    headers.insert(ACCEPT_ENCODING, v);
                }
            }
            _ => {
                headers.remove(ACCEPT_ENCODING);
            }
        }
        request
    }
}

impl<S> tower::Layer<S> for AnswerCompression {
    type Service = Answering<S>;
    fn layer(&self, inner: S) -> Answering<S> {
        Answering { inner, rule: *self }
    }
}

/// The agent listener's services behind [`AnswerCompression`].
#[derive(Debug, Clone)]
pub struct Answering<S> {
    inner: S,
    rule: AnswerCompression,
}

impl<S, B> tower::Service<http::Request<B>> for Answering<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        self.inner.call(self.rule.apply(request))
    }
}

/// A stream's compression as tonic applies it: the encoding of the client's messages and
/// the one the principal answers in (the first of the client's accepted encodings the
/// listener knows, after [`AnswerCompression`]); [`IDENTITY`] for none.
pub fn stream_compression(metadata: &tonic::metadata::MetadataMap) -> (&str, &str) {
    let known = |e: &str| ENCODING_NAMES.contains(&e);
    let inbound = metadata
        .get(ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|e| known(e))
        .unwrap_or(IDENTITY);
    let outbound = metadata
        .get(ACCEPT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .and_then(|list| list.split(',').map(str::trim).find(|e| known(e)))
        .unwrap_or(IDENTITY);
    (inbound, outbound)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn request(encoding: Option<&str>, accept: Option<&str>) -> http::Request<()> {
        let mut r = http::Request::new(());
        if let Some(e) = encoding {
            r.headers_mut().insert(ENCODING, e.parse().unwrap());
        }
        if let Some(a) = accept {
            r.headers_mut().insert(ACCEPT_ENCODING, a.parse().unwrap());
        }
        r
    }

    fn answer(enabled: bool, encoding: Option<&str>, accept: Option<&str>) -> String {
        let r = AnswerCompression { enabled }.apply(request(encoding, accept));
        let metadata = tonic::metadata::MetadataMap::from_headers(r.headers().clone());
        let (inbound, outbound) = stream_compression(&metadata);
        format!("{inbound}>{outbound}")
    }

    #[test]
    fn encoding_names_match_tonic() {
        for (enc, name) in ENCODINGS.iter().zip(ENCODING_NAMES) {
            assert_eq!(enc.to_string(), name);
        }
    }

    #[test]
    fn answers_compressed_when_enabled_or_when_the_agent_compresses() {
        // Enabled: the agent's first known accepted encoding, whatever it sends in.
        assert_eq!(
            answer(true, None, Some("zstd,gzip,identity")),
            "identity>zstd"
        );
        assert_eq!(answer(true, Some("gzip"), Some("gzip,zstd")), "gzip>gzip");
        assert_eq!(answer(true, None, Some("br, gzip")), "identity>gzip");
        // A client that accepts nothing (upstream's agent without compression) gets none.
        assert_eq!(answer(true, None, None), "identity>identity");
        assert_eq!(answer(true, None, Some("identity")), "identity>identity");
        // Off: answers mirror the agent's own encoding (as gRPC-Go's servers do) ...
        assert_eq!(
            answer(false, Some("zstd"), Some("zstd,gzip,identity")),
            "zstd>zstd"
        );
        assert_eq!(answer(false, Some("gzip"), Some("zstd,gzip")), "gzip>gzip");
        // ... and are plain when it does not compress, or does not accept its encoding.
        assert_eq!(
            answer(false, None, Some("zstd,gzip,identity")),
            "identity>identity"
        );
        assert_eq!(
            answer(false, Some("identity"), Some("gzip")),
            "identity>identity"
        );
        assert_eq!(answer(false, Some("gzip"), Some("zstd")), "gzip>identity");
        assert_eq!(answer(false, Some("gzip"), None), "gzip>identity");
    }
}
