//! The resource proxy's shared state: what it was built from, and what it counts (each
//! agent's requests in flight, the buffered bodies).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_domain::AgentName;
use argocd_agent_domain::rpc::AgentLink;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::task::TaskTracker;

use super::credentials::ProxyKeys;
use super::forward;
use super::settings::ResourceProxyConfig;
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
    pub(super) _agent: OwnedSemaphorePermit,
    pub(super) _tenant: Option<crate::tenant_limits::ProxyPermit>,
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
}
