//! The label sets of the principal's metric families, and the label values they take.

use std::collections::HashSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;

/// Labels of `argocd_principal_events_received_total` and
/// `argocd_principal_events_sent_total` (ours: upstream's `principal_events_received` and
/// `principal_events_sent` have no labels).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The agent (bounded, see [`AgentLabels`]).
    pub agent: String,
    /// The event type's verb: `create`, `spec-update`, `status-update`, `ping`, ...
    pub r#type: String,
    /// The agent's tenant; empty for an agent of no tenant (see
    /// [`Metrics::set_tenant`](super::Metrics::set_tenant)).
    pub tenant: String,
}

/// Labels of the counters by reason alone: `argocd_principal_auth_failures_total` (one of
/// [`AUTH_FAILURE_REASONS`](super::AUTH_FAILURE_REASONS)) and
/// `argocd_principal_sessions_deferred_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why the stream, call or session was refused or deferred.
    pub reason: String,
}

/// Labels of `argocd_principal_events_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentReasonLabels {
    /// The agent that sent the event (bounded, see [`AgentLabels`]).
    pub agent: String,
    /// One of [`REFUSAL_REASONS`](super::REFUSAL_REASONS).
    pub reason: String,
    /// The agent's tenant; empty for an agent of no tenant.
    pub tenant: String,
}

/// Labels of the per-tenant gauges (`argocd_principal_tenant_agents_connected`,
/// `argocd_principal_tenant_proxy_requests_in_flight`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    /// The tenant's name (declared tenants only: bounded by the rules file).
    pub tenant: String,
}

/// Labels of `argocd_principal_tenant_quota_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantQuotaLabels {
    /// The tenant's name.
    pub tenant: String,
    /// One of [`crate::tenant_limits::QUOTA_NAMES`].
    pub quota: String,
}

/// Labels of upstream's `argocd_principal_agent_connections_total` and
/// `argocd_principal_resource_proxy_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentNameLabels {
    /// The agent (bounded, see [`AgentLabels`]).
    pub agent_name: String,
}

/// Labels of upstream's `principal_event_writer_send_errors_total` and
/// `argocd_principal_resource_proxy_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentNameReasonLabels {
    /// The agent (bounded, see [`AgentLabels`]).
    pub agent_name: String,
    /// Upstream's reason values (see the callers).
    pub reason: String,
}

/// Labels of upstream's `argocd_principal_event_writer_events_discarded_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiscardLabels {
    /// The agent whose queue was full (bounded, see [`AgentLabels`]).
    pub agent_name: String,
    /// The event type's verb (`create`, `spec-update`, ...).
    pub event_type: String,
    /// See [`argocd_agent_domain::ResourceKind::target_name`].
    pub resource_type: String,
}

/// Labels of upstream's `principal_errors`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceTypeLabels {
    /// See [`argocd_agent_domain::ResourceKind::target_name`].
    pub resource_type: String,
}

/// Labels of upstream's `argocd_principal_redis_proxy_requests_total` and
/// `argocd_principal_redis_proxy_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RedisAgentLabels {
    /// The agent the command was answered through (bounded, see [`AgentLabels`]).
    pub agent_name: String,
    /// `get` or `subscribe`, as upstream.
    pub command: String,
}

/// Labels of `principal_event_processing_time`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessingLabels {
    /// See [`Processing`].
    pub status: String,
    /// The agent that sent the event (bounded, see [`AgentLabels`]).
    pub agent_name: String,
    /// See [`argocd_agent_domain::ResourceKind::target_name`].
    pub resource_type: String,
}

/// Labels of `argocd_principal_resource_proxy_responses_total` and
/// `argocd_principal_resource_proxy_forwarded_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceProxyLabels {
    /// The agent the request was for (bounded like every agent label).
    pub agent: String,
    /// `request` (a Kubernetes API call), `log` or `exec`.
    pub kind: String,
    /// The HTTP status answered (101 for an exec session that was opened).
    pub code: String,
    /// The agent's tenant; empty for an agent of no tenant.
    pub tenant: String,
}

/// Labels of `argocd_principal_listener_connections_closed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// `grpc` (the agent listener's caps), `admin`, `resource-proxy`, `redis-proxy`,
    /// `metrics`.
    pub listener: String,
    /// One of `argocd_agent_listener::CLOSE_REASONS`, or the Redis proxy's own
    /// (`AuthTimeout`, `Unauthenticated`).
    pub reason: String,
}

/// Labels of `argocd_principal_redis_proxy_commands_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RedisProxyLabels {
    /// `agent` (an Application's key, answered through its agent) or `hub` (passed through).
    pub route: String,
    /// `forwarded`, `nil` (no owner), `refused` (agent offline, limit, key not served),
    /// `error` (agent or connection failure).
    pub result: String,
}

/// Labels of `argocd_principal_lease_writes_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseWriteLabels {
    /// `agent` (one agent's session) or `replica` (a replica's liveness).
    pub lease: String,
    /// `create`, `acquire`, `renew`, `takeover-request`, `handover` or `release`.
    pub op: String,
    /// `ok`, `conflict` or `error`.
    pub result: String,
}

/// Labels of `argocd_principal_resync_duration_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    /// The agent's mode: `managed` or `autonomous`.
    pub mode: String,
}

/// A write the principal made to the hub, counted per kind as upstream does
/// (`principal_applications_created`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HubWrite {
    /// An object created (`principal_<kind>_created`).
    Created,
    /// An object updated (`principal_<kind>_updated`).
    Updated,
    /// An object deleted (`principal_<kind>_deleted`).
    Deleted,
}

/// What became of an inbound event: the `status` label of `principal_event_processing_time`,
/// with upstream's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processing {
    /// `success`: applied (or nothing to do).
    Success,
    /// `failure`: applying it failed (also counted in `principal_errors`).
    Failure,
    /// `not-allowed`: refused by authorization or validation.
    NotAllowed,
}

impl Processing {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Processing::Success => "success",
            Processing::Failure => "failure",
            Processing::NotAllowed => "not-allowed",
        }
    }
}

/// Bounds per-agent label values: the first `max` agents seen get their own series, later
/// ones share `other`, so 10,000 agents never mean 10,000 series per metric.
pub struct AgentLabels {
    pub(super) max: usize,
    pub(super) seen: Mutex<HashSet<String>>,
}

/// Label value for agents beyond the per-agent limit.
pub const OTHER_AGENTS: &str = "other";

impl AgentLabels {
    pub(super) fn label(&self, agent: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.contains(agent) {
            return agent.to_owned();
        }
        if seen.len() < self.max {
            seen.insert(agent.to_owned());
            return agent.to_owned();
        }
        OTHER_AGENTS.to_owned()
    }
}

/// Labels of the quota metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QuotaLabels {
    /// The tenant.
    pub tenant: String,
    /// `applications` or `applicationsPerAgent`.
    pub quota: String,
}

/// Labels of `argocd_principal_cached_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FormLabels {
    /// `decoded` (the served agents' Applications, or all without sharding) or `compact`
    /// (kept as JSON).
    pub form: String,
}
