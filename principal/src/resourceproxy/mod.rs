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
pub mod tls;

use argocd_agent_identity::text::{self, quoted};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use argocd_agent_domain::AgentName;
use argocd_agent_domain::rpc::RpcError;
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::{ResourceRequest, ResourceResponse};
use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::sessions::Sessions;
use crate::tunnel::Tunnels;
use argocd_agent_domain::rpc::AgentLink;
use credentials::ProxyKeys;

/// Default listen address (upstream's port).
pub const DEFAULT_ADDRESS: &str = "0.0.0.0:9090";
/// URL path prefix naming the agent.
pub const AGENT_PREFIX: &str = "/agents/";

/// Bytes of request bodies the proxy buffers at once by default: sixteen bodies of the
/// default 4 MiB maximum.
pub const DEFAULT_MAX_BUFFERED_BODIES: usize = 64 << 20;

/// Bytes taken from the buffered-bodies budget at a time when a body's length is not
/// declared.
const BODY_CHUNK: usize = 64 << 10;

/// Resource proxy settings.
#[derive(Debug, Clone)]
pub struct ResourceProxyConfig {
    /// Where the proxy listens (upstream's default: [`DEFAULT_ADDRESS`]).
    pub listen: SocketAddr,
    /// Base URL clients reach the proxy at (cluster secrets hold `<url>/agents/<agent>`).
    pub url: String,
    /// This replica's own URL, which other replicas forward to (published on its replica
    /// Lease); empty: `https://$POD_IP:<port>`, else the bound address.
    pub replica_url: String,
    /// Names of the issued serving certificate (DNS names or IPs); the URL's host is added.
    pub hostnames: Vec<String>,
    /// Which certificate the proxy serves (default [`tls::ServingMode::Auto`]).
    pub tls: tls::ServingMode,
    /// Lifetime of an issued serving certificate.
    pub cert_lifetime: Duration,
    /// Lifetime of the per-agent tokens in cluster secrets (renewed at two thirds).
    pub token_ttl: Duration,
    /// How long an agent has to answer a request (504 after).
    pub request_timeout: Duration,
    /// Largest request body accepted (413 above).
    pub max_body: usize,
    /// Requests, log streams and terminal sessions at once per agent (429 above).
    pub max_in_flight_per_agent: usize,
    /// A terminal session with no traffic either way for this long is closed.
    pub terminal_idle_timeout: Duration,
    /// A terminal session is closed after this long in any case.
    pub terminal_max_duration: Duration,
    /// How long a followed log waits for its agent to come back.
    pub log_resume_timeout: Duration,
    /// Create (and keep current) each agent's Argo CD cluster secret on connect.
    pub self_cluster_registration: bool,
    /// Connections, handshakes, header and idle timeouts of the listener.
    pub limits: argocd_agent_identity::listener::Limits,
    /// How long a client may take to send a request body (408 after); the body is read
    /// before the request takes one of its agent's slots.
    pub body_timeout: Duration,
    /// Bytes of request bodies buffered at once across all requests
    /// (`--resource-proxy-max-buffered-bodies`, default 64 MiB); at least `max_body`.
    pub max_buffered_bodies: usize,
    /// How long a request waits for room among the buffered bodies before it is answered
    /// 429 (`--resource-proxy-body-wait`).
    pub body_wait: Duration,
}

impl ResourceProxyConfig {
    /// Defaults listening on `listen`, reachable at `url`.
    pub fn new(listen: SocketAddr, url: String) -> Self {
        ResourceProxyConfig {
            listen,
            url,
            replica_url: String::new(),
            hostnames: Vec::new(),
            tls: tls::ServingMode::Auto,
            cert_lifetime: Duration::from_secs(30 * 24 * 3600),
            token_ttl: Duration::from_secs(24 * 3600),
            request_timeout: Duration::from_secs(30),
            max_body: 4 << 20,
            max_in_flight_per_agent: 32,
            terminal_idle_timeout: Duration::from_secs(30 * 60),
            terminal_max_duration: Duration::from_secs(4 * 3600),
            log_resume_timeout: Duration::from_secs(60),
            self_cluster_registration: false,
            limits: argocd_agent_identity::listener::Limits::default(),
            body_timeout: Duration::from_secs(30),
            max_buffered_bodies: DEFAULT_MAX_BUFFERED_BODIES,
            body_wait: Duration::from_secs(2),
        }
    }

    /// The URL's host (what the serving certificate must name).
    pub fn host(&self) -> String {
        url_host(&self.url)
    }

    /// The replica URL's host.
    pub fn replica_host(&self) -> String {
        url_host(&self.replica_url)
    }
}

/// A URL's host (without IPv6 brackets); `localhost` when it has none.
fn url_host(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_owned()))
        .unwrap_or_else(|| "localhost".into())
}

impl ResourceProxyConfig {
    /// The cluster URL of `agent`.
    pub fn agent_url(&self, agent: &AgentName) -> String {
        format!(
            "{}{AGENT_PREFIX}{}",
            self.url.trim_end_matches('/'),
            agent.as_str()
        )
    }
}

/// Response body of the proxy.
pub type Body = BoxBody<Bytes, std::io::Error>;

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).map_err(|e| match e {}).boxed()
}

/// A Kubernetes `Status` answer.
pub fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response<Body> {
    let message = message.into();
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code.as_u16(),
    });
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = code;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The failure an answer stands for, as upstream's `reason` of
/// `argocd_principal_resource_proxy_errors_total` (`agent_disconnected`, `timeout`,
/// `agent_error`); carried as an extension of the response until it is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ProxyError(pub &'static str);

fn with_error(mut r: Response<Body>, reason: &'static str) -> Response<Body> {
    r.extensions_mut().insert(ProxyError(reason));
    r
}

/// The upstream failure reason `r` was marked with, if any.
pub(crate) fn error_of(r: &Response<Body>) -> Option<&'static str> {
    r.extensions().get::<ProxyError>().map(|e| e.0)
}

/// The answer an agent sent for a request (an agent error unless it is a success).
pub(crate) fn from_agent(answer: &ResourceResponse) -> Response<Body> {
    let code = u16::try_from(answer.status)
        .ok()
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::BAD_GATEWAY);
    let mut r = Response::new(full(answer.body.clone()));
    *r.status_mut() = code;
    if let Ok(ct) = HeaderValue::from_str(&answer.content_type)
        && !answer.content_type.is_empty()
    {
        r.headers_mut().insert(header::CONTENT_TYPE, ct);
    }
    if code.is_success() || code == StatusCode::SWITCHING_PROTOCOLS {
        r
    } else {
        with_error(r, "agent_error")
    }
}

/// The failure of a request the agent did not answer.
pub(crate) fn rpc_failure(agent: &AgentName, e: RpcError) -> Response<Body> {
    match e {
        RpcError::Timeout(t) => with_error(
            status(
                StatusCode::GATEWAY_TIMEOUT,
                "Timeout",
                format!(
                    "agent {agent} did not answer within {t}",
                    t = text::duration(t)
                ),
            ),
            "timeout",
        ),
        RpcError::TooMany { limit } => status(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyRequests",
            format!("agent {agent} has {limit} requests in flight"),
        ),
        RpcError::Disconnected => offline(agent),
    }
}

pub(crate) fn offline(agent: &AgentName) -> Response<Body> {
    with_error(
        status(
            StatusCode::BAD_GATEWAY,
            "ServiceUnavailable",
            format!("agent {agent} is not connected"),
        ),
        "agent_disconnected",
    )
}

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

/// The proxy's coarse rules (the agent applies its own, finer ones).
fn route(method: &Method, path: &str, query: &str) -> Result<Route, String> {
    if ![Method::GET, Method::POST, Method::PATCH, Method::DELETE].contains(method) {
        return Err(format!(
            "{method} is not served by the resource proxy (get, list, create, patch, delete only)"
        ));
    }
    if argocd_agent_domain::proxy::is_watch(query) {
        return Err("watch is not served by the resource proxy".into());
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    if !path.starts_with('/')
        || segments
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == ".." || s.contains('%'))
            && path != "/"
    {
        return Err(format!(
            "path {path} is not served by the resource proxy",
            path = quoted(&path)
        ));
    }
    match segments.as_slice() {
        ["api" | "apis" | "version" | "openapi", ..] => {}
        _ => {
            return Err(format!(
                "path {path} is not served by the resource proxy",
                path = quoted(&path)
            ));
        }
    }
    if segments.contains(&"watch") && segments.len() > 2 {
        return Err("watch is not served by the resource proxy".into());
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
        ] => Err(format!(
            "subresource {} is not served by the resource proxy",
            text::quoted(segments.last().unwrap_or(&""))
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

/// The proxy's shared state.
pub struct Proxy {
    /// The agents and their request links.
    pub sessions: Arc<Sessions>,
    /// Where answers, forwarded requests and refused tokens are counted.
    pub metrics: Metrics,
    /// CloudEvents `source` of our requests.
    pub source: String,
    /// Verifies the bearer tokens of requests (those of the agents' cluster secrets).
    pub keys: Arc<ProxyKeys>,
    /// The log and terminal tunnels agents open back to the principal.
    pub tunnels: Arc<Tunnels>,
    /// The proxy's settings.
    pub config: ResourceProxyConfig,
    /// With replicas: forwards requests for agents served elsewhere.
    pub forwarder: Option<forward::Forwarder>,
    /// Where terminal and log streams run (drained on shutdown).
    pub tasks: TaskTracker,
    limits: Mutex<HashMap<AgentName, Arc<Semaphore>>>,
    /// The bytes of request bodies buffered at once ([`ResourceProxyConfig::max_buffered_bodies`]).
    body_bytes: Arc<Semaphore>,
    /// Log lines of requests refused for want of room among the buffered bodies.
    body_refusals: argocd_agent_identity::listener::RefusalLog,
}

/// A connected agent's link and one of its concurrency permits.
pub(crate) struct Admitted {
    pub agent: AgentName,
    pub link: Arc<AgentLink>,
    pub permit: Permit,
}

/// What a request holds while it is open (a log stream or terminal: until it ends): one of
/// the agent's requests in flight and, for an agent of a tenant, one of the tenant's.
pub(crate) struct Permit {
    _agent: OwnedSemaphorePermit,
    _tenant: Option<crate::tenant_limits::ProxyPermit>,
}

/// Everything [`Proxy::new`] needs.
pub struct ProxyParts {
    /// See [`Proxy::sessions`].
    pub sessions: Arc<Sessions>,
    /// See [`Proxy::metrics`].
    pub metrics: Metrics,
    /// See [`Proxy::source`].
    pub source: String,
    /// See [`Proxy::keys`].
    pub keys: Arc<ProxyKeys>,
    /// See [`Proxy::tunnels`].
    pub tunnels: Arc<Tunnels>,
    /// See [`Proxy::config`].
    pub config: ResourceProxyConfig,
    /// See [`Proxy::forwarder`].
    pub forwarder: Option<forward::Forwarder>,
    /// See [`Proxy::tasks`].
    pub tasks: TaskTracker,
}

impl Proxy {
    /// The proxy's state, with no agent's requests counted yet.
    pub fn new(parts: ProxyParts) -> Arc<Proxy> {
        let ProxyParts {
            sessions,
            metrics,
            source,
            keys,
            tunnels,
            config,
            forwarder,
            tasks,
        } = parts;
        let budget = config
            .max_buffered_bodies
            .max(config.max_body)
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Arc::new(Proxy {
            sessions,
            metrics,
            source,
            keys,
            tunnels,
            config,
            forwarder,
            tasks,
            limits: Mutex::new(HashMap::new()),
            body_bytes: Arc::new(Semaphore::new(budget)),
            body_refusals: argocd_agent_identity::listener::RefusalLog::new(
                "resource proxy (request bodies)",
            ),
        })
    }

    /// The agent's current link, if it is connected and serves the proxy.
    pub(crate) fn link(&self, agent: &AgentName) -> Option<Arc<AgentLink>> {
        self.sessions
            .agent(agent)
            .and_then(|s| s.link())
            .filter(|l| l.has(argocd_agent_domain::proxy::CAPABILITY))
    }

    fn permit(&self, agent: &AgentName) -> Option<OwnedSemaphorePermit> {
        let sem = self
            .limits
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(agent.clone())
            .or_insert_with(|| Arc::new(Semaphore::new(self.config.max_in_flight_per_agent)))
            .clone();
        sem.try_acquire_owned().ok()
    }

    /// The agent a request is for, from its token and URL; the rest of the path.
    fn authenticate<'p>(
        &self,
        req: &Request<Incoming>,
        path: &'p str,
    ) -> Result<(AgentName, &'p str), Response<Body>> {
        let token = crate::auth::bearer_token(req.headers());
        let Some(token) = token else {
            return Err(status(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "a bearer token from the agent's cluster secret is required",
            ));
        };
        let verified = self
            .keys
            .verify_claims(token, SystemTime::now())
            .map_err(|e| {
                self.metrics.auth_failed("ProxyCredential");
                tracing::warn!(error = %e, "resource proxy request refused: bad token");
                status(StatusCode::UNAUTHORIZED, "Unauthorized", e.to_string())
            })?;
        let agent = verified.agent;
        self.check_token_tenant(&agent, verified.tenant.as_ref())?;
        let Some(rest) = path.strip_prefix(AGENT_PREFIX) else {
            // Upstream-style cluster URLs (`?agentName=` is dropped by client-go): the
            // token alone names the agent.
            return Ok((agent, path));
        };
        let (named, rest) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if named != agent.as_str() {
            self.metrics.auth_failed("WrongAgent");
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
                    self.config.max_in_flight_per_agent
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
        let tenant = self.sessions.agent(agent).and_then(|s| s.identity().tenant);
        self.sessions
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
    fn check_token_tenant(
        &self,
        agent: &AgentName,
        claimed: Option<&argocd_agent_domain::TenantName>,
    ) -> Result<(), Response<Body>> {
        let Some(claimed) = claimed else {
            return Ok(());
        };
        let Some(now) = self.sessions.agent(agent).map(|s| s.identity().tenant) else {
            return Ok(()); // not served here: the replica serving it checks
        };
        if now.as_ref() == Some(claimed) {
            return Ok(());
        }
        self.metrics.auth_failed("WrongAgent");
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

    async fn handle(self: Arc<Self>, req: Request<Incoming>) -> Response<Body> {
        let path = req.uri().path().to_owned();
        let (agent, rest) = match self.authenticate(&req, &path) {
            Ok(a) => a,
            Err(r) => return r,
        };
        let query = req.uri().query().unwrap_or("").to_owned();
        let route = match route(req.method(), rest, &query) {
            Ok(r) => r,
            Err(why) => {
                tracing::warn!(agent = %agent, method = %req.method(), path = %text::quoted(rest), "resource proxy request refused: {why}");
                self.metrics
                    .resource_proxy(agent.as_str(), "request", 403, None);
                return status(StatusCode::FORBIDDEN, "Forbidden", why);
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

    /// Counts the answer `r` to a request of `kind` for `agent`, with the failure it stands for.
    fn count(&self, agent: &AgentName, kind: &str, r: &Response<Body>) {
        self.metrics
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
        let Some(forwarder) = &self.forwarder else {
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
                self.metrics
                    .resource_proxy_forwarded(agent.as_str(), kind, 502);
                self.metrics.resource_proxy(agent.as_str(), kind, 502, None);
                Err(status(StatusCode::BAD_GATEWAY, "ServiceUnavailable", why))
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
                forward::failed(&agent, &replica, &why)
            }
        };
        let code = response.status().as_u16();
        self.metrics
            .resource_proxy_forwarded(agent.as_str(), kind, code);
        self.metrics
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
        let (body, bytes) = match tokio::time::timeout(self.config.body_timeout, read).await {
            Ok(read) => read?,
            Err(_) => {
                tracing::warn!(timeout = %text::duration(self.config.body_timeout), "resource proxy: request body not received in time");
                return Err(status(
                    StatusCode::REQUEST_TIMEOUT,
                    "Timeout",
                    format!(
                        "request body not received within {}",
                        text::duration(self.config.body_timeout)
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
        let limit = self.config.max_body;
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
        let budget = self.config.max_buffered_bodies.max(self.config.max_body);
        let want = u32::try_from(n).unwrap_or(u32::MAX);
        let acquire = self.body_bytes.clone().acquire_many_owned(want);
        match tokio::time::timeout(self.config.body_wait, acquire).await {
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
                        text::duration(self.config.body_wait)
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
            &self.source,
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
        match ticket.answer(self.config.request_timeout).await {
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
    proxy: Arc<Proxy>,
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let limits = proxy.config.limits.clone();
    let metrics = proxy.metrics.clone();
    let on_close: argocd_agent_identity::listener::OnClose =
        Arc::new(move |reason| metrics.listener_closed("resource-proxy", reason));
    let handler = move |req: Request<Incoming>, _peer: SocketAddr| {
        let proxy = proxy.clone();
        async move { proxy.handle(req).await }
    };
    argocd_agent_identity::listener::serve(
        listener,
        Some(acceptor),
        limits,
        handler,
        on_close,
        tasks,
        shutdown,
    );
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
                Err("watch is not served by the resource proxy".into()),
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
