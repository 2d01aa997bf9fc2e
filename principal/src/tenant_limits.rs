//! Tenants at the principal: the quotas a tenant's agents share at run time (connected agents,
//! events per second, resource-proxy requests in flight; docs/tenancy.md).
//!
//! The tenants and their quotas come from the mapping rules file and follow its live
//! reloads: every decision reads the rules in force at that moment. Each tenant has its own
//! counters, bucket and lock, so one tenant at its limit never waits on another's.
//!
//! | quota | counted | over it |
//! |---|---|---|
//! | `agents` | the tenant's agents with a live session (with `--ha`: on any replica, from the agent Leases) | the session is refused at admission, `ResourceExhausted`, auth failure reason [`TENANT_AGENT_QUOTA`](crate::refusals::TENANT_AGENT_QUOTA) |
//! | `eventsPerSecond` / `eventsBurst` | limited events of all the tenant's agents (one token bucket) | the event is refused with `TooManyRequests`, refusal reason [`TENANT_RATE_LIMITED`](crate::refusals::TENANT_RATE_LIMITED) |
//! | `proxyRequestsInFlight` | resource-proxy requests, log streams and terminals open for the tenant's agents (per replica) | HTTP 429, reason [`TENANT_PROXY_QUOTA`] |
//!
//! Every refusal is counted in `argocd_principal_tenant_quota_refused_total{tenant,quota}`
//! (and the stream, event or proxy metric it belongs to) and logged. Agents of no tenant are
//! never counted here: without tenants nothing changes. A lowered quota applies to new
//! sessions and requests; what is open stays open.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_domain::tenant::{Claim, Quotas};
use argocd_agent_domain::{AgentIdentity, AgentName, TenantName};

use crate::metrics::Metrics;
use crate::ratelimit::{EventLimiter, EventRate, Verdict};

/// Reason of the HTTP 429 the resource proxy answers over a tenant's
/// `proxyRequestsInFlight` (also its `argocd_principal_resource_proxy_errors_total` reason).
pub const TENANT_PROXY_QUOTA: &str = "TenantProxyQuota";

/// The `quota` label values of `argocd_principal_tenant_quota_refused_total`.
pub const QUOTA_NAMES: [&str; 3] = ["agents", "eventsPerSecond", "proxyRequestsInFlight"];

/// Agents whose live session another principal replica serves (with `--ha`: from the agent
/// Leases), so the `agents` quota counts across replicas.
pub trait Census: Send + Sync {
    /// Each such agent with its hub namespace (which tells its tenant).
    fn elsewhere(&self) -> Vec<(AgentName, String)>;
}

/// Why a tenant's quota refused a session or a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuotaRefusal {
    /// `quotas.agents` reached.
    #[error(
        "tenant \"{tenant}\" already has {connected} agents connected, its quota (quotas.agents: {limit}): agent {agent} refused until one disconnects"
    )]
    Agents {
        /// The tenant.
        tenant: TenantName,
        /// The agent refused.
        agent: AgentName,
        /// The tenant's other agents connected.
        connected: usize,
        /// The quota.
        limit: u32,
    },
    /// `quotas.proxyRequestsInFlight` reached.
    #[error(
        "tenant \"{tenant}\" already has {limit} resource proxy requests in flight, its quota (quotas.proxyRequestsInFlight): retry later"
    )]
    ProxyInFlight {
        /// The tenant.
        tenant: TenantName,
        /// The quota.
        limit: u32,
    },
}

impl QuotaRefusal {
    /// The quota's name, as in the rules file (the metric's `quota` label).
    pub fn quota(&self) -> &'static str {
        match self {
            QuotaRefusal::Agents { .. } => "agents",
            QuotaRefusal::ProxyInFlight { .. } => "proxyRequestsInFlight",
        }
    }
}

/// One tenant's counters, behind its own lock.
#[derive(Default)]
struct TenantState {
    /// Agents with a session here -> sessions holding a slot (a reconnect overlaps).
    agents: HashMap<AgentName, usize>,
    bucket: Option<EventLimiter>,
    proxy_in_flight: u32,
    refused: HashMap<&'static str, u64>,
}

/// What a tenant uses now, for the operator API.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Usage {
    /// Agents with a session on this replica.
    pub local_agents: Vec<AgentName>,
    /// Agents of the tenant connected on any replica (this one included).
    pub agents_connected: usize,
    /// Resource proxy requests in flight on this replica.
    pub proxy_in_flight: u32,
    /// Refusals on this replica since it started, by quota.
    pub refused: HashMap<&'static str, u64>,
}

/// The tenants' quotas and counters of one principal replica.
pub struct Tenancy {
    rules: Option<Arc<LiveRules>>,
    census: RwLock<Option<Arc<dyn Census>>>,
    tenants: RwLock<HashMap<TenantName, Arc<Mutex<TenantState>>>>,
    metrics: Option<Metrics>,
}

use argocd_agent_domain::sync::lock;

impl Tenancy {
    /// No tenants, no quotas (tests and principals without rules).
    pub fn disabled() -> Arc<Tenancy> {
        Arc::new(Tenancy {
            rules: None,
            census: RwLock::new(None),
            tenants: RwLock::default(),
            metrics: None,
        })
    }

    /// Quotas of the tenants `rules` declare (read live), counted in `metrics`.
    pub fn new(rules: Arc<LiveRules>, metrics: Metrics) -> Arc<Tenancy> {
        let t = Tenancy {
            rules: Some(rules),
            census: RwLock::new(None),
            tenants: RwLock::default(),
            metrics: Some(metrics),
        };
        // Every declared tenant's series from the start, at zero.
        if let Some(rules) = &t.rules {
            for tenant in rules.current().tenants().iter() {
                t.state(&tenant.name);
            }
        }
        Arc::new(t)
    }

    /// Counts agents served by other replicas too (`--ha`).
    pub fn set_census(&self, census: Arc<dyn Census>) {
        *self.census.write().unwrap_or_else(|p| p.into_inner()) = Some(census);
    }

    /// The quotas of `tenant` in force now (`None`: the tenant is no longer declared).
    pub fn quotas(&self, tenant: &TenantName) -> Option<Quotas> {
        let rules = self.rules.as_ref()?.current();
        rules.tenants().get(tenant).map(|t| t.quotas.clone())
    }

    fn state(&self, tenant: &TenantName) -> Arc<Mutex<TenantState>> {
        if let Some(s) = self
            .tenants
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
        {
            return s.clone();
        }
        let mut all = self.tenants.write().unwrap_or_else(|p| p.into_inner());
        all.entry(tenant.clone())
            .or_insert_with(|| {
                if let Some(m) = &self.metrics {
                    m.tenant_declared(tenant.as_str(), &QUOTA_NAMES);
                }
                Arc::default()
            })
            .clone()
    }

    /// Agents of `tenant` connected to other replicas, by the rules in force now.
    fn elsewhere(&self, tenant: &TenantName) -> HashSet<AgentName> {
        let census = self
            .census
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let (Some(census), Some(rules)) = (census, self.rules.as_ref()) else {
            return HashSet::new();
        };
        let rules = rules.current();
        census
            .elsewhere()
            .into_iter()
            .filter(|(_, ns)| rules.tenants().owner(Claim::Namespace, ns) == Some(tenant))
            .map(|(agent, _)| agent)
            .collect()
    }

    fn count_refusal(&self, tenant: &TenantName, state: &mut TenantState, quota: &'static str) {
        *state.refused.entry(quota).or_default() += 1;
        if let Some(m) = &self.metrics {
            m.tenant_quota_refused(tenant.as_str(), quota);
        }
    }

    /// Admits a session of `identity` under its tenant's `agents` quota; the slot is held
    /// for the session's life. An agent already connected (a reconnect replacing its
    /// session) is never refused.
    pub fn admit_agent(
        self: &Arc<Self>,
        identity: &AgentIdentity,
    ) -> Result<AgentSlot, QuotaRefusal> {
        let Some(tenant) = identity.tenant.clone() else {
            return Ok(AgentSlot { held: None });
        };
        let limit = self.quotas(&tenant).and_then(|q| q.agents);
        let state = self.state(&tenant);
        let mut s = lock(&state);
        if let Some(limit) = limit
            && !s.agents.contains_key(&identity.agent)
        {
            let mut others: HashSet<AgentName> = s.agents.keys().cloned().collect();
            others.extend(self.elsewhere(&tenant));
            others.remove(&identity.agent);
            if others.len() >= limit as usize {
                self.count_refusal(&tenant, &mut s, "agents");
                return Err(QuotaRefusal::Agents {
                    tenant,
                    agent: identity.agent.clone(),
                    connected: others.len(),
                    limit,
                });
            }
        }
        *s.agents.entry(identity.agent.clone()).or_default() += 1;
        if let Some(m) = &self.metrics {
            m.tenant_agents_connected(tenant.as_str(), s.agents.len());
        }
        Ok(AgentSlot {
            held: Some((self.clone(), tenant, identity.agent.clone())),
        })
    }

    fn release_agent(&self, tenant: &TenantName, agent: &AgentName) {
        let state = self.state(tenant);
        let mut s = lock(&state);
        if let Some(n) = s.agents.get_mut(agent) {
            *n -= 1;
            if *n == 0 {
                s.agents.remove(agent);
            }
        }
        if let Some(m) = &self.metrics {
            m.tenant_agents_connected(tenant.as_str(), s.agents.len());
        }
    }

    /// The tenant's event rate now: `eventsPerSecond` with `eventsBurst` (default: one
    /// second's worth); `None` without a limit.
    fn event_rate(&self, tenant: &TenantName) -> Option<EventRate> {
        let q = self.quotas(tenant)?;
        let rate = q.events_per_second?;
        let burst = q
            .events_burst
            .unwrap_or_else(|| rate.ceil().clamp(1.0, f64::from(u32::MAX)) as u32);
        Some(EventRate { rate, burst })
    }

    /// Takes one token of `tenant`'s event bucket (shared by all its agents). A reload that
    /// changes the rate starts a full bucket at the new rate.
    pub fn check_events(&self, tenant: &TenantName) -> (Verdict, Option<EventRate>) {
        let Some(limit) = self.event_rate(tenant) else {
            return (Verdict::Allowed, None);
        };
        let state = self.state(tenant);
        let mut s = lock(&state);
        let now = Instant::now();
        if s.bucket.as_ref().is_none_or(|b| b.limit() != limit) {
            s.bucket = Some(EventLimiter::new(limit, now));
        }
        let verdict = match s.bucket.as_mut() {
            Some(b) => b.check(now),
            None => Verdict::Allowed,
        };
        if verdict != Verdict::Allowed {
            self.count_refusal(tenant, &mut s, "eventsPerSecond");
        }
        (verdict, Some(limit))
    }

    /// One of `tenant`'s `proxyRequestsInFlight`, held while the request (log stream,
    /// terminal) is open. Agents of no tenant take none.
    pub fn proxy_permit(
        self: &Arc<Self>,
        tenant: Option<&TenantName>,
    ) -> Result<Option<ProxyPermit>, QuotaRefusal> {
        let Some(tenant) = tenant else {
            return Ok(None);
        };
        let limit = self.quotas(tenant).and_then(|q| q.proxy_requests_in_flight);
        let state = self.state(tenant);
        let mut s = lock(&state);
        if let Some(limit) = limit
            && s.proxy_in_flight >= limit
        {
            self.count_refusal(tenant, &mut s, "proxyRequestsInFlight");
            return Err(QuotaRefusal::ProxyInFlight {
                tenant: tenant.clone(),
                limit,
            });
        }
        s.proxy_in_flight += 1;
        if let Some(m) = &self.metrics {
            m.tenant_proxy_in_flight(tenant.as_str(), s.proxy_in_flight);
        }
        Ok(Some(ProxyPermit {
            tenancy: self.clone(),
            tenant: tenant.clone(),
        }))
    }

    fn release_proxy(&self, tenant: &TenantName) {
        let state = self.state(tenant);
        let mut s = lock(&state);
        s.proxy_in_flight = s.proxy_in_flight.saturating_sub(1);
        if let Some(m) = &self.metrics {
            m.tenant_proxy_in_flight(tenant.as_str(), s.proxy_in_flight);
        }
    }

    /// What `tenant` uses now.
    pub fn usage(&self, tenant: &TenantName) -> Usage {
        let elsewhere = self.elsewhere(tenant);
        let state = self.state(tenant);
        let s = lock(&state);
        let mut local_agents: Vec<AgentName> = s.agents.keys().cloned().collect();
        local_agents.sort();
        let mut all: HashSet<AgentName> = elsewhere;
        all.extend(local_agents.iter().cloned());
        Usage {
            agents_connected: all.len(),
            local_agents,
            proxy_in_flight: s.proxy_in_flight,
            refused: s.refused.clone(),
        }
    }
}

/// A session's place in its tenant's `agents` quota; given back when dropped.
pub struct AgentSlot {
    held: Option<(Arc<Tenancy>, TenantName, AgentName)>,
}

impl Drop for AgentSlot {
    fn drop(&mut self) {
        if let Some((tenancy, tenant, agent)) = self.held.take() {
            tenancy.release_agent(&tenant, &agent);
        }
    }
}

/// One of a tenant's `proxyRequestsInFlight`; given back when dropped.
pub struct ProxyPermit {
    tenancy: Arc<Tenancy>,
    tenant: TenantName,
}

impl Drop for ProxyPermit {
    fn drop(&mut self) {
        self.tenancy.release_proxy(&self.tenant);
    }
}

#[cfg(test)]
mod tests;
