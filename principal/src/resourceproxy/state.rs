//! The resource proxy's shared state and the admission of a request: its token, its
//! agent's link, and the agent's and tenant's permits.

use argocd_agent_identity::text::{self, quoted};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use argocd_agent_domain::AgentName;
use argocd_agent_domain::rpc::AgentLink;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use super::credentials::ProxyKeys;
use super::forward;
use super::response::{Body, offline, status, with_error};
use super::settings::{AGENT_PREFIX, ResourceProxyConfig};
use crate::metrics::Metrics;
use crate::sessions::Sessions;
use crate::tunnel::Tunnels;

/// The proxy's shared state: what it was built from, and what it counts.
pub struct ResourceProxy {
    /// Its agents, metrics, keys, tunnels, settings, forwarder and tasks.
    pub parts: ResourceProxyParts,
    pub(super) limits: Mutex<HashMap<AgentName, Arc<Semaphore>>>,
    /// The bytes of request bodies buffered at once ([`ResourceProxyConfig::max_buffered_bodies`]).
    pub(super) body_bytes: Arc<Semaphore>,
    /// Log lines of requests refused for want of room among the buffered bodies.
    pub(super) body_refusals: argocd_agent_listener::RefusalLog,
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

/// Everything [`ResourceProxy::new`] needs; the proxy keeps it as [`ResourceProxy::parts`].
pub struct ResourceProxyParts {
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
}

impl ResourceProxy {
    /// The proxy's state, with no agent's requests counted yet.
    pub fn new(parts: ResourceProxyParts) -> Arc<ResourceProxy> {
        let budget = parts
            .config
            .max_buffered_bodies
            .max(parts.config.max_body)
            .clamp(1, Semaphore::MAX_PERMITS.min(u32::MAX as usize));
        Arc::new(ResourceProxy {
            parts,
            limits: Mutex::new(HashMap::new()),
            body_bytes: Arc::new(Semaphore::new(budget)),
            body_refusals: argocd_agent_listener::RefusalLog::new(
                "resource proxy (request bodies)",
            ),
        })
    }

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

    /// The agent a request is for, from its token and URL; the rest of the path.
    pub(super) fn authenticate<'p>(
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
            .parts
            .keys
            .verify_claims(token, SystemTime::now())
            .map_err(|e| {
                self.parts.metrics.auth_failed("ProxyCredential");
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
    fn check_token_tenant(
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
