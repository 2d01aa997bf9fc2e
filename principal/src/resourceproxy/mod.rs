//! The resource proxy: an HTTPS endpoint shaped like a Kubernetes API server that the hub's
//! argocd-server (and kubectl, with `argocd-agentctl agent kubeconfig`) uses as each spoke's
//! cluster. A request for `/agents/<agent>/<kubernetes path>` must carry that agent's
//! bearer token (from its cluster secret); it goes to that agent as a `resource-request` on
//! its event stream, the agent performs it against its own cluster under its own rules
//! (only objects Argo CD manages there), and its answer comes back. Container logs and
//! exec sessions travel on streams the agent opens ([`crate::tunnel`]).
//!
//! Every request, log stream and terminal session is bound to exactly one agent: the
//! token's agent must be the URL's agent, a tunnel is accepted only from the agent the
//! request went to, and a session id is single-use.
//!
//! Answers: 401 without a valid token; 403 for a token of another agent, a watch, a method
//! or path the proxy does not serve, or the agent's refusal; 413 for a body over the limit;
//! 429 beyond the per-agent concurrency limit; 502 while the agent is offline; 504 when it
//! does not answer in time.
//!
//! With several replicas (`--ha`), a request for an agent another live replica serves is
//! forwarded there ([`forward`]).

// A refusal is the HTTP response to send; it is built once and moved, not worth a box.
#![allow(clippy::result_large_err)]

pub mod credentials;
mod exec;
pub mod forward;
mod logs;
mod response;
mod settings;
mod state;
pub mod tls;

use argocd_agent_identity::text::{self, quoted};
use std::net::SocketAddr;
use std::sync::Arc;

use argocd_agent_domain::AgentName;
use argocd_agent_domain::rpc::AgentLink;
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::ResourceRequest;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use response::{Body, status};
use response::{error_of, from_agent, offline, rpc_failure, with_error};
pub use settings::{
    AGENT_PREFIX, DEFAULT_ADDRESS, DEFAULT_MAX_BUFFERED_BODIES, ResourceProxyConfig,
};
use state::{Admitted, Permit};
pub use state::{ResourceProxy, ResourceProxyParts};

/// Bytes taken from the buffered-bodies budget at a time when a body's length is not
/// declared.
const BODY_CHUNK: usize = 64 << 10;

/// What a request asks for, after the proxy's own checks.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// An API call the agent performs.
    Api,
    Log {
        namespace: String,
        pod: String,
    },
    Exec {
        namespace: String,
        pod: String,
    },
}

impl Route {
    /// The `kind` label of the proxy's metrics: `request`, `log` or `exec`.
    fn kind(&self) -> &'static str {
        match self {
            Route::Api => "request",
            Route::Log { .. } => "log",
            Route::Exec { .. } => "exec",
        }
    }
}

/// Why the proxy's coarse rules refuse a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Refused {
    /// A method other than get, list, create, patch and delete.
    #[error("{0} is not served by the resource proxy (get, list, create, patch, delete only)")]
    Method(Method),
    /// A watch.
    #[error("watch is not served by the resource proxy")]
    Watch,
    /// A path outside the API.
    #[error("path {} is not served by the resource proxy", quoted(.0))]
    Path(String),
    /// A subresource the proxy does not serve.
    #[error("subresource {} is not served by the resource proxy", text::quoted(.0))]
    Subresource(String),
}

/// The proxy's coarse rules (the agent applies its own, finer ones).
fn route(method: &Method, path: &str, query: &str) -> Result<Route, Refused> {
    if ![Method::GET, Method::POST, Method::PATCH, Method::DELETE].contains(method) {
        return Err(Refused::Method(method.clone()));
    }
    if argocd_agent_domain::proxy::is_watch(query) {
        return Err(Refused::Watch);
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if !path.starts_with('/')
        || segments
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == ".." || s.contains('%'))
            && path != "/"
    {
        return Err(Refused::Path(path.to_owned()));
    }
    match segments.as_slice() {
        ["api" | "apis" | "version" | "openapi", ..] => {}
        _ => {
            return Err(Refused::Path(path.to_owned()));
        }
    }
    if segments.contains(&"watch") && segments.len() > 2 {
        return Err(Refused::Watch);
    }
    match segments.as_slice() {
        ["api", "v1", "namespaces", ns, "pods", pod, "log"] if method == Method::GET => {
            Ok(Route::Log {
                namespace: ns.to_string(),
                pod: pod.to_string(),
            })
        }
        ["api", "v1", "namespaces", ns, "pods", pod, "exec"]
            if matches!(*method, Method::GET | Method::POST) =>
        {
            Ok(Route::Exec {
                namespace: ns.to_string(),
                pod: pod.to_string(),
            })
        }
        [
            ..,
            "attach" | "portforward" | "proxy" | "log" | "exec" | "eviction",
        ] => Err(Refused::Subresource(
            segments.last().unwrap_or(&"").to_string(),
        )),
        _ => Ok(Route::Api),
    }
}

/// An API request whose body has been read.
struct ReadRequest {
    method: String,
    content_type: String,
    accept: String,
    body: Vec<u8>,
    /// The body's bytes under [`ResourceProxyConfig::max_buffered_bodies`], given back
    /// when the request has been answered.
    _bytes: Option<OwnedSemaphorePermit>,
}

/// A routed request waiting for one of its agent's slots.
enum Pending {
    Api(ReadRequest),
    Log {
        namespace: String,
        pod: String,
    },
    Exec {
        namespace: String,
        pod: String,
        req: Box<Request<Incoming>>,
    },
}

impl ResourceProxy {
    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let (agent, rest) = match self.authenticate(req.headers(), &path) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let query = req.uri().query().unwrap_or("").to_owned();
        let route = match route(req.method(), rest, &query) {
            Ok(r) => r,
            Err(why) => {
                tracing::warn!(agent = %agent, method = %req.method(), path = %text::quoted(rest), "resource proxy request refused: {why}");
                self.parts
                    .metrics
                    .resource_proxy(agent.as_str(), "request", 403, None);
                return status(StatusCode::FORBIDDEN, "Forbidden", why.to_string());
            }
        };
        let kind = route.kind();
        let req = match self.forward_elsewhere(&agent, kind, req).await {
            Ok(req) => req,
            Err(answered) => return answered,
        };
        // An API request's body is read before it takes one of the agent's slots, within
        // the body timeout: a slow client cannot hold the slots its agent's other requests
        // need.
        let read = match route {
            Route::Api => match self.read_request(req).await {
                Ok(read) => Pending::Api(read),
                Err(refused) => {
                    self.count(&agent, kind, &refused);
                    return refused;
                }
            },
            Route::Log { namespace, pod } => Pending::Log { namespace, pod },
            Route::Exec { namespace, pod } => Pending::Exec {
                namespace,
                pod,
                req: Box::new(req),
            },
        };
        let admitted = match self.admit(&agent) {
            Ok(a) => a,
            Err(r) => {
                self.count(&agent, kind, &r);
                return r;
            }
        };
        let response = match read {
            Pending::Api(read) => self.api(admitted, read, rest.to_owned(), query).await,
            Pending::Log { namespace, pod } => {
                logs::serve(self.clone(), admitted, namespace, pod, &query).await
            }
            Pending::Exec {
                namespace,
                pod,
                req,
            } => exec::serve(self.clone(), admitted, namespace, pod, *req).await,
        };
        self.count(&agent, kind, &response);
        response
    }

    /// The agent a request is for, from its token ([`ProxyKeys::authenticate`]) and URL
    /// (`/agents/<name>/...` must name the token's agent), and the rest of the path; a
    /// refusal is counted, logged and answered.
    fn authenticate<'p>(
        &self,
        headers: &http::HeaderMap,
        path: &'p str,
    ) -> Result<(AgentName, &'p str), Response<Body>> {
        use credentials::CredentialRefused;
        let verified = match self
            .parts
            .keys
            .authenticate(headers, std::time::SystemTime::now())
        {
            Ok(v) => v,
            Err(e @ CredentialRefused::Missing) => {
                return Err(status(
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized",
                    e.to_string(),
                ));
            }
            Err(e @ CredentialRefused::Token(_)) => {
                self.parts.metrics.auth_failed("ProxyCredential");
                tracing::warn!(error = %e, "resource proxy request refused: bad token");
                return Err(status(
                    StatusCode::UNAUTHORIZED,
                    "Unauthorized",
                    e.to_string(),
                ));
            }
        };
        let agent = verified.agent;
        self.check_token_tenant(&agent, verified.tenant.as_ref())?;
        let Some(rest) = path.strip_prefix(AGENT_PREFIX) else {
            return Ok((agent, path));
        };
        let (named, rest) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if named != agent.as_str() {
            self.parts.metrics.auth_failed("WrongAgent");
            tracing::warn!(token_agent = %agent, url_agent = %text::quoted(named),
                "resource proxy request refused: the token is for another agent");
            return Err(status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                format!(
                    "this credential is for agent {agent}, not {named}",
                    named = quoted(&named)
                ),
            ));
        }
        Ok((agent, rest))
    }

    /// Counts the answer `r` to a request of `kind` for `agent`, with the failure it stands for.
    fn count(&self, agent: &AgentName, kind: &str, r: &Response<Body>) {
        self.parts
            .metrics
            .resource_proxy(agent.as_str(), kind, r.status().as_u16(), error_of(r));
    }

    /// With replicas: forwards the request to the replica serving `agent` when it is not
    /// connected here (and the request was not already forwarded to us); `Err` is that
    /// replica's answer or the failure to reach it, `Ok` gives the request back to serve here.
    async fn forward_elsewhere(
        &self,
        agent: &AgentName,
        kind: &'static str,
        req: Request<Incoming>,
    ) -> Result<Request<Incoming>, Response<Body>> {
        let Some(forwarder) = &self.parts.forwarder else {
            return Ok(req);
        };
        if self.link(agent).is_some() {
            return Ok(req);
        }
        if let Some(by) = req.headers().get(forward::FORWARDED_BY) {
            tracing::debug!(agent = %agent, forwarded_by = %text::quoted(&String::from_utf8_lossy(by.as_bytes())),
                "resource proxy: forwarded request for an agent not connected here");
            return Ok(req);
        }
        match forwarder.target(agent) {
            Ok(Some((holder, url))) => Err(self
                .forward(forwarder, agent.clone(), kind, holder, url, req)
                .await),
            Ok(None) => Ok(req),
            Err(why) => {
                tracing::warn!(agent = %agent, kind, "resource proxy: not forwarded: {why}");
                self.parts
                    .metrics
                    .resource_proxy_forwarded(agent.as_str(), kind, 502);
                self.parts
                    .metrics
                    .resource_proxy(agent.as_str(), kind, 502, None);
                Err(status(
                    StatusCode::BAD_GATEWAY,
                    "ServiceUnavailable",
                    why.to_string(),
                ))
            }
        }
    }

    /// Forwards a request to the replica (`holder`, at `url`) serving its agent.
    async fn forward(
        &self,
        forwarder: &forward::Forwarder,
        agent: AgentName,
        kind: &'static str,
        holder: String,
        url: String,
        req: Request<Incoming>,
    ) -> Response<Body> {
        let replica = crate::ha::replica_of(&holder).to_owned();
        tracing::debug!(agent = %agent, kind, %replica, %url, method = %req.method(),
            path = req.uri().path(), "resource proxy: forwarding to the replica serving the agent");
        let response = match forwarder.forward(req, &url).await {
            Ok(r) => r,
            Err(why) => {
                tracing::warn!(agent = %agent, kind, %replica, %url, error = %why,
                    "resource proxy: forwarding failed");
                forward::failed(&agent, &replica, &why.to_string())
            }
        };
        let code = response.status().as_u16();
        self.parts
            .metrics
            .resource_proxy_forwarded(agent.as_str(), kind, code);
        self.parts
            .metrics
            .resource_proxy(agent.as_str(), kind, code, None);
        response
    }

    /// Reads an API request's headers of interest and its body, up to the size limit and
    /// within the body timeout, under the budget of buffered bodies.
    async fn read_request(&self, req: Request<Incoming>) -> Result<ReadRequest, Response<Body>> {
        let header = |h: header::HeaderName| {
            req.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let (content_type, accept) = (header(header::CONTENT_TYPE), header(header::ACCEPT));
        let declared = header(header::CONTENT_LENGTH).parse::<usize>().ok();
        let method = req.method().to_string();
        let read = self.read_body(req.into_body(), declared);
        let (body, bytes) = match tokio::time::timeout(self.parts.config.body_timeout, read).await {
            Ok(read) => read?,
            Err(_) => {
                tracing::warn!(timeout = %text::duration(self.parts.config.body_timeout), "resource proxy: request body not received in time");
                return Err(status(
                    StatusCode::REQUEST_TIMEOUT,
                    "Timeout",
                    format!(
                        "request body not received within {}",
                        text::duration(self.parts.config.body_timeout)
                    ),
                ));
            }
        };
        Ok(ReadRequest {
            method,
            content_type,
            accept,
            body,
            _bytes: bytes,
        })
    }

    /// Reads a body of at most `max_body` bytes (413 above), taking its bytes from the
    /// buffered-bodies budget first (its declared length at once, else in chunks) and
    /// answering 429 when no room frees within the body wait.
    async fn read_body(
        &self,
        mut body: Incoming,
        declared: Option<usize>,
    ) -> Result<(Vec<u8>, Option<OwnedSemaphorePermit>), Response<Body>> {
        let limit = self.parts.config.max_body;
        let too_large = || {
            status(
                StatusCode::PAYLOAD_TOO_LARGE,
                "RequestEntityTooLarge",
                format!("request body larger than {limit} bytes (or unreadable)"),
            )
        };
        if declared.is_some_and(|n| n > limit) {
            return Err(too_large());
        }
        let mut held: Option<OwnedSemaphorePermit> = None;
        let mut buf = Vec::new();
        if let Some(n) = declared.filter(|n| *n > 0) {
            self.more_bytes(&mut held, n).await?;
            buf.reserve_exact(n);
        }
        while let Some(frame) = body.frame().await {
            let Ok(data) = frame.map_err(|_| too_large())?.into_data() else {
                continue;
            };
            let need = buf.len() + data.len();
            if need > limit {
                return Err(too_large());
            }
            let have = held.as_ref().map_or(0, |p| p.num_permits());
            if need > have {
                let more = (need - have)
                    .max(BODY_CHUNK)
                    .min(limit.saturating_sub(have));
                self.more_bytes(&mut held, more.max(need - have)).await?;
            }
            buf.extend_from_slice(&data);
        }
        Ok((buf, held))
    }

    /// Adds `n` bytes of the buffered-bodies budget to `held`, waiting at most the body wait.
    async fn more_bytes(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        n: usize,
    ) -> Result<(), Response<Body>> {
        let budget = self
            .parts
            .config
            .max_buffered_bodies
            .max(self.parts.config.max_body);
        let want = u32::try_from(n).unwrap_or(u32::MAX);
        let acquire = self.body_bytes.clone().acquire_many_owned(want);
        match tokio::time::timeout(self.parts.config.body_wait, acquire).await {
            Ok(Ok(permit)) => {
                match held {
                    Some(h) => h.merge(permit),
                    None => *held = Some(permit),
                }
                Ok(())
            }
            _ => {
                self.body_refusals.refused(None, "BodyBudgetFull", budget);
                let mut r = status(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    format!(
                        "the resource proxy buffers at most {budget} bytes of request bodies at once and had no room for {n} more within {}; retry",
                        text::duration(self.parts.config.body_wait)
                    ),
                );
                r.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
                Err(r)
            }
        }
    }

    async fn api(
        &self,
        admitted: Admitted,
        read: ReadRequest,
        path: String,
        query: String,
    ) -> Response<Body> {
        let ReadRequest {
            method,
            content_type,
            accept,
            body,
            _bytes,
        } = read;
        let event = Event::new(
            &self.parts.source,
            EventType::ResourceRequest,
            Payload::ResourceRequest(ResourceRequest {
                method,
                path,
                query,
                content_type,
                accept,
                body,
            }),
        );
        let Admitted {
            agent,
            link,
            permit: _permit,
        } = admitted;
        let mut ticket = match link.request(event, None).await {
            Ok(t) => t,
            Err(e) => return rpc_failure(&agent, e),
        };
        match ticket.answer(self.parts.config.request_timeout).await {
            Ok(Event {
                payload: Payload::ResourceResponse(r),
                ..
            }) => from_agent(&r),
            Ok(other) => status(
                StatusCode::BAD_GATEWAY,
                "InternalError",
                format!("agent {agent} answered with a {} event", other.ty),
            ),
            Err(e) => rpc_failure(&agent, e),
        }
    }
}

/// Serves the proxy on `listener` until `shutdown`, with the listener limits of
/// [`ResourceProxyConfig::limits`] (connections, handshakes, header and idle timeouts).
pub fn serve(
    proxy: Arc<ResourceProxy>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let limits = proxy.parts.config.limits.clone();
    let metrics = proxy.parts.metrics.clone();
    let on_close: argocd_agent_listener::OnClose =
        Arc::new(move |reason| metrics.listener_closed("resource-proxy", reason));
    let handler = move |req: Request<Incoming>, _peer: SocketAddr| {
        let proxy = proxy.clone();
        async move { proxy.handle(req).await }
    };
    argocd_agent_listener::serve(
        listener,
        Some(acceptor),
        limits,
        handler,
        on_close,
        tasks,
        shutdown,
    );
}

// The admission of a request: its agent's link, and the agent's and tenant's permits.
impl ResourceProxy {
    /// The agent's current link, if it is connected and serves the proxy.
    pub(crate) fn link(&self, agent: &AgentName) -> Option<Arc<AgentLink>> {
        self.parts
            .sessions
            .agent(agent)
            .and_then(|s| s.link())
            .filter(|l| l.has(argocd_agent_domain::proxy::CAPABILITY))
    }

    pub(super) fn permit(&self, agent: &AgentName) -> Option<OwnedSemaphorePermit> {
        let sem = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(agent.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.parts.config.max_in_flight_per_agent)))
            .clone();
        sem.try_acquire_owned().ok()
    }

    /// Admits a request for `agent`: connected, serving the proxy, under its limit.
    pub(crate) fn admit(&self, agent: &AgentName) -> Result<Admitted, Response<Body>> {
        let link = self.link(agent).ok_or_else(|| offline(agent))?;
        let tenant = self.tenant_permit(agent)?;
        let permit = self.permit(agent).ok_or_else(|| {
            status(
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!(
                    "agent {agent} already has {} proxied requests in flight",
                    self.parts.config.max_in_flight_per_agent
                ),
            )
        })?;
        Ok(Admitted {
            agent: agent.clone(),
            link,
            permit: Permit {
                _agent: permit,
                _tenant: tenant,
            },
        })
    }

    /// One of the agent's tenant's `proxyRequestsInFlight` (none for an agent of no
    /// tenant); over the quota, 429 `TenantProxyQuota`, counted and logged.
    fn tenant_permit(
        &self,
        agent: &AgentName,
    ) -> Result<Option<crate::tenant_limits::ProxyPermit>, Response<Body>> {
        let tenant = self
            .parts
            .sessions
            .agent(agent)
            .and_then(|s| s.identity().tenant);
        self.parts
            .sessions
            .tenancy
            .proxy_permit(tenant.as_ref())
            .map_err(|refusal| {
                tracing::warn!(agent = %agent, tenant = %text::or_dash(tenant.as_ref()),
                    "resource proxy request refused: {refusal}");
                with_error(
                    status(
                        StatusCode::TOO_MANY_REQUESTS,
                        crate::tenant_limits::TENANT_PROXY_QUOTA,
                        refusal.to_string(),
                    ),
                    crate::tenant_limits::TENANT_PROXY_QUOTA,
                )
            })
    }

    /// Refuses a token issued under a tenant once its agent (as this replica last saw it)
    /// belongs to another tenant or to none.
    pub(super) fn check_token_tenant(
        &self,
        agent: &AgentName,
        claimed: Option<&argocd_agent_domain::TenantName>,
    ) -> Result<(), Response<Body>> {
        let Some(claimed) = claimed else {
            return Ok(());
        };
        let Some(now) = self
            .parts
            .sessions
            .agent(agent)
            .map(|s| s.identity().tenant)
        else {
            return Ok(()); // not served here: the replica serving it checks
        };
        if now.as_ref() == Some(claimed) {
            return Ok(());
        }
        self.parts.metrics.auth_failed("WrongAgent");
        tracing::warn!(agent = %agent, token_tenant = %claimed, tenant = %text::or_dash(now.as_ref()),
            "resource proxy request refused: the token was issued under another tenant");
        Err(status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "this credential was issued for agent {agent} of tenant {claimed}; the agent no longer belongs to it"
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_serves_reads_writes_logs_and_exec_only() {
        let ok = |m: Method, p: &str, q: &str| route(&m, p, q);
        assert_eq!(
            ok(Method::GET, "/api/v1/namespaces/a/pods", ""),
            Ok(Route::Api)
        );
        assert_eq!(ok(Method::GET, "/apis", ""), Ok(Route::Api));
        assert_eq!(ok(Method::GET, "/version", ""), Ok(Route::Api));
        assert_eq!(
            ok(
                Method::PATCH,
                "/apis/apps/v1/namespaces/a/deployments/d",
                ""
            ),
            Ok(Route::Api)
        );
        assert_eq!(
            ok(
                Method::GET,
                "/api/v1/namespaces/a/pods/p/log",
                "follow=true"
            ),
            Ok(Route::Log {
                namespace: "a".into(),
                pod: "p".into()
            })
        );
        assert_eq!(
            ok(
                Method::POST,
                "/api/v1/namespaces/a/pods/p/exec",
                "command=pwd"
            ),
            Ok(Route::Exec {
                namespace: "a".into(),
                pod: "p".into()
            })
        );
        for (m, p, q) in [
            (Method::PUT, "/api/v1/namespaces/a/configmaps/c", ""),
            (Method::GET, "/api/v1/namespaces/a/pods", "watch=true"),
            (Method::GET, "/api/v1/namespaces/a/pods", "watch=1&x=y"),
            (Method::GET, "/api/v1/watch/namespaces/a/pods", ""),
            (Method::GET, "/api/v1/namespaces/a/pods/p/portforward", ""),
            (Method::GET, "/api/v1/namespaces/a/pods/p/attach", ""),
            (Method::GET, "/api/v1/namespaces/a/services/s/proxy", ""),
            (Method::GET, "/api/v1/namespaces/../secrets", ""),
            (Method::GET, "/api/v1/namespaces/a%2Fb/secrets", ""),
            (Method::GET, "/api//v1", ""),
            (Method::GET, "/healthz", ""),
            (Method::GET, "/logs", ""),
            (Method::POST, "/api/v1/namespaces/a/pods/p/log", ""),
        ] {
            assert!(route(&m, p, q).is_err(), "{m} {p}?{q}");
        }
    }

    /// The API server reads a present `watch` as true unless it is `0` or `false` (any
    /// case): `watch=f`, `watch=` and a bare `watch` are watches and never reach an agent.
    #[test]
    fn every_value_the_api_server_reads_as_a_watch_is_refused() {
        for q in [
            "watch",
            "watch=",
            "watch=f",
            "watch=F",
            "watch=yes",
            "w%61tch=1",
            "watch=0&watch=on",
        ] {
            assert_eq!(
                route(&Method::GET, "/api/v1/namespaces/a/pods", q),
                Err(Refused::Watch),
                "{q:?}"
            );
        }
        for q in ["watch=0", "watch=false", "watch=False", "watch=FaLsE"] {
            assert_eq!(
                route(&Method::GET, "/api/v1/namespaces/a/pods", q),
                Ok(Route::Api),
                "{q:?}"
            );
        }
    }

    #[test]
    fn agent_urls_carry_the_agent_prefix() {
        let c = ResourceProxyConfig::new(
            "127.0.0.1:9090".parse().unwrap(),
            "https://proxy.argocd.svc:9090/".into(),
        );
        assert_eq!(
            c.agent_url(&AgentName::new("edge-1").unwrap()),
            "https://proxy.argocd.svc:9090/agents/edge-1"
        );
        assert_eq!(c.host(), "proxy.argocd.svc");
        let v6 =
            ResourceProxyConfig::new("[::1]:9090".parse().unwrap(), "https://[::1]:9090".into());
        assert_eq!(v6.host(), "::1");
    }
}
