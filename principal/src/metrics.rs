//! Prometheus metrics of the principal, and the `/metrics` + `/healthz` HTTP endpoint.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_domain::ResourceKind;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `argocd_principal_events_received_total` and
/// `argocd_principal_events_sent_total` (ours: upstream's `principal_events_received` and
/// `principal_events_sent` have no labels).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The agent (bounded, see [`AgentLabels`]).
    pub agent: String,
    /// The event type's verb: `create`, `spec-update`, `status-update`, `ping`, ...
    pub r#type: String,
    /// The agent's tenant; empty for an agent of no tenant (see [`Metrics::set_tenant`]).
    pub tenant: String,
}

/// Labels of the counters by reason alone: `argocd_principal_auth_failures_total` (one of
/// [`AUTH_FAILURE_REASONS`]) and `argocd_principal_sessions_deferred_total`.
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
    /// One of [`REFUSAL_REASONS`].
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
    /// See [`resource_type`].
    pub resource_type: String,
}

/// Labels of upstream's `principal_errors`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceTypeLabels {
    /// See [`resource_type`].
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
    /// See [`resource_type`].
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
    /// One of `argocd_agent_identity::listener::CLOSE_REASONS`, or the Redis proxy's own
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

/// The `resource_type` label value of `kind`: upstream's event target names.
pub fn resource_type(kind: ResourceKind) -> &'static str {
    match kind {
        ResourceKind::Application => "application",
        ResourceKind::AppProject => "appproject",
        ResourceKind::Repository => "repository",
        ResourceKind::GpgKeys => "gpgkey",
    }
}

/// Bounds per-agent label values: the first `max` agents seen get their own series, later
/// ones share `other`, so 10,000 agents never mean 10,000 series per metric.
pub struct AgentLabels {
    max: usize,
    seen: Mutex<HashSet<String>>,
}

/// Label value for agents beyond the per-agent limit.
pub const OTHER_AGENTS: &str = "other";

impl AgentLabels {
    fn label(&self, agent: &str) -> String {
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

/// Reasons streams (and admin calls: `NotAdmin`) are refused at authentication or mapping
/// (`argocd_principal_auth_failures`),
/// exported at zero from the start so rates and alerts work before the first failure.
pub const AUTH_FAILURE_REASONS: [&str; 21] = [
    "NoPeerIdentity",
    "IdentityHeaderOnMtls",
    "IdentityHeaderOnJwt",
    "NoToken",
    "InvalidToken",
    "UntrustedProxy",
    "BadHeaderIdentity",
    "Unmapped",
    "ModeNotAllowed",
    "NotAdmin",
    "WrongAgent",
    "ProxyCredential",
    "Blocked",
    // An agent whose hub namespace is outside --allowed-namespaces (crate::partition).
    "OutsidePartition",
    // A session over its tenant's `agents` quota (crate::tenancy).
    crate::tenant_limits::TENANT_AGENT_QUOTA,
    // A tenant's operator calling the admin API about an agent outside its tenant.
    OUTSIDE_TENANT,
    // Connections dropped before their first request (argocd_agent_identity::transport).
    "HandshakeTimeout",
    "HandshakeFailed",
    "NoUsableSvid",
    "NoPreface",
    "WebSocketRefused",
];

/// Reasons inbound events are refused (`argocd_principal_events_refused`), exported at zero
/// for each agent when it first connects.
pub const REFUSAL_REASONS: [&str; 24] = [
    "WrongNamespace",
    "NotOwner",
    "ModeForbids",
    "ModeNotAllowed",
    "NotDestination",
    "Malformed",
    "Invalid",
    "UnexpectedEvent",
    crate::ratelimit::RATE_LIMITED,
    crate::tenant_limits::TENANT_RATE_LIMITED,
    "NotFound",
    crate::session::HELLO_TIMEOUT,
    crate::session::TOO_LARGE,
    crate::session::UNDECODABLE,
    crate::session::NOT_READING,
    crate::bounds::OBJECT_TOO_LARGE,
    crate::bounds::TOO_MANY_APPLICATIONS,
    crate::bounds::AGENT_BYTES_EXCEEDED,
    crate::bounds::PARENT_NOT_FOUND,
    crate::bounds::PARENT_NOT_HELD,
    crate::bounds::CHILD_NOT_TRACKED,
    crate::bounds::PROJECT_NOT_ALLOWED,
    crate::quotas::AGENT_APPLICATION_QUOTA,
    crate::quotas::TENANT_APPLICATION_QUOTA,
];

/// Auth failure reason of an admin call by a tenant's operator about an agent, identity or
/// tenant outside its tenant.
pub const OUTSIDE_TENANT: &str = "OutsideTenant";

/// Default of `--metrics-max-agent-labels`.
pub const DEFAULT_MAX_AGENT_LABELS: usize = 100;

/// Upstream argocd-agent's principal series (`internal/metrics/metrics.go`), with its names,
/// types, labels and histogram buckets.
#[derive(Clone)]
pub struct Upstream {
    /// `principal_agent_avg_connection_time` (minutes), set at each scrape.
    pub avg_connection_time: Gauge,
    /// `argocd_principal_gpg_keys_count`: entries of the hub's `argocd-gpg-keys-cm`.
    pub gpg_keys: Gauge,
    /// `principal_events_received`.
    pub events_received: Counter,
    /// `principal_events_sent`.
    pub events_sent: Counter,
    /// `principal_event_processing_time{status,agent_name,resource_type}` (seconds).
    pub event_processing: Family<ProcessingLabels, Histogram>,
    /// `principal_event_writer_send_errors_total{agent_name,reason}`.
    pub send_errors: Family<AgentNameReasonLabels, Counter>,
    /// `argocd_principal_event_writer_events_discarded_total{agent_name,event_type,resource_type}`:
    /// events dropped because an agent's queue was full.
    pub events_discarded: Family<DiscardLabels, Counter>,
    /// `principal_errors{resource_type}`: inbound events that failed to apply.
    pub errors: Family<ResourceTypeLabels, Counter>,
    /// `argocd_principal_agent_connections_total{agent_name}`.
    pub agent_connections: Family<AgentNameLabels, Counter>,
    /// `argocd_principal_resource_proxy_requests_total{agent_name}`.
    pub resource_proxy_requests: Family<AgentNameLabels, Counter>,
    /// `argocd_principal_resource_proxy_errors_total{agent_name,reason}`.
    pub resource_proxy_errors: Family<AgentNameReasonLabels, Counter>,
    /// `argocd_principal_redis_proxy_requests_total{agent_name,command}`: commands answered
    /// through an agent.
    pub redis_proxy_requests: Family<RedisAgentLabels, Counter>,
    /// `argocd_principal_redis_proxy_errors_total{agent_name,command}`.
    pub redis_proxy_errors: Family<RedisAgentLabels, Counter>,
    hub_writes: Arc<HashMap<(ResourceKind, HubWrite), Counter>>,
}

/// All metrics of the principal: upstream's ([`Upstream`], exposed under upstream's names),
/// then ours (`argocd_principal_*`). Each is registered under the name `/metrics` exposes it
/// with (see [`argocd_agent_runtime::exposition`]): our counters end in `_total`.
#[derive(Clone)]
pub struct Metrics {
    /// `argocd_principal_connected_agents` (upstream's).
    pub connected_agents: Gauge,
    /// Upstream's other series.
    pub upstream: Upstream,
    /// `argocd_principal_events_received_total{agent,type}`.
    pub events_received: Family<EventLabels, Counter>,
    /// `argocd_principal_events_sent_total{agent,type}`.
    pub events_sent: Family<EventLabels, Counter>,
    /// Streams refused before a session existed (unmapped ID, no client certificate, ...):
    /// `argocd_principal_auth_failures_total{reason}`.
    pub auth_failures: Family<ReasonLabels, Counter>,
    /// Inbound events refused by authorization or validation:
    /// `argocd_principal_events_refused_total{agent,reason}`.
    pub events_refused: Family<AgentReasonLabels, Counter>,
    /// `argocd_principal_hub_write_errors_total`.
    pub hub_write_errors: Counter,
    /// Tenants' Application quotas (see [`crate::quotas`]).
    pub quota: crate::quotas::QuotaMetrics,
    /// `argocd_principal_resync_duration_seconds{mode}`.
    pub resync_duration: Family<ModeLabels, Histogram>,
    /// `argocd_principal_config_fanout_agents`: managed agents that re-evaluated their
    /// configuration objects after one hub AppProject, repository or GPG keys change.
    pub config_fanout: Histogram,
    /// `argocd_principal_svid_expiry_timestamp_seconds`: notAfter of the serving SVID.
    pub svid_expiry: Gauge,
    /// `argocd_principal_svid_rotations_total`.
    pub svid_rotations: Counter,
    /// `argocd_principal_queue_depth`: events queued or unacknowledged, all agents.
    pub queue_depth: Gauge,
    /// `argocd_principal_event_resends_total`: events sent again for lack of an ack.
    pub resends: Counter,
    /// `argocd_principal_redis_proxy_commands_total{route,result}`: commands the Redis proxy
    /// handled.
    pub redis_proxy_commands: Family<RedisProxyLabels, Counter>,
    /// `argocd_principal_resource_proxy_responses_total{agent,kind,code}`: requests the
    /// resource proxy answered.
    pub resource_proxy_responses: Family<ResourceProxyLabels, Counter>,
    /// `argocd_principal_resource_proxy_forwarded_total{agent,kind,code}`: requests the
    /// resource proxy forwarded to the replica serving the agent (replicas only), by the
    /// status that replica answered (502 when it could not be reached).
    pub resource_proxy_forwarded: Family<ResourceProxyLabels, Counter>,
    /// `argocd_principal_lease_writes_total{lease,op,result}`: writes to the hub's Leases
    /// (replicas only).
    pub lease_writes: Family<LeaseWriteLabels, Counter>,
    /// `argocd_principal_sessions_deferred_total{reason}`: sessions this replica turned away
    /// or closed so another replica serves them (`HeldElsewhere`, `Rebalance`, `LeaseLost`,
    /// `Fenced`, `HandedOver`).
    pub sessions_deferred: Family<ReasonLabels, Counter>,
    /// `argocd_principal_listener_connections_closed_total{listener,reason}`: connections the
    /// listeners refused or closed (caps in total and per client address, handshake,
    /// preface and idle timeouts).
    pub listener_closed: Family<ListenerLabels, Counter>,
    /// `argocd_principal_tenant_agents_connected{tenant}`: the tenant's agents with a
    /// session on this replica.
    pub tenant_agents_connected: Family<TenantLabels, Gauge>,
    /// `argocd_principal_tenant_proxy_requests_in_flight{tenant}`: resource proxy requests,
    /// log streams and terminals open for the tenant's agents on this replica.
    pub tenant_proxy_in_flight: Family<TenantLabels, Gauge>,
    /// `argocd_principal_tenant_quota_refused_total{tenant,quota}`: sessions, events and
    /// proxy requests refused by a tenant's quota.
    pub tenant_quota_refused: Family<TenantQuotaLabels, Counter>,
    /// Agent -> its tenant's name, for the `tenant` label of the per-agent series.
    agent_tenants: Arc<Mutex<HashMap<String, String>>>,
    connected_since: Arc<Mutex<HashMap<String, Instant>>>,
    agent_labels: Arc<AgentLabels>,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// Upstream's histograms: Go's default buckets.
fn go_histogram() -> Histogram {
    Histogram::new(argocd_agent_runtime::exposition::GO_DEFAULT_BUCKETS)
}

/// One counter per kind and operation of the principal's hub writes
/// (`principal_applications_created`, ...), registered in `r`.
fn hub_write_counters(r: &mut Registry) -> HashMap<(ResourceKind, HubWrite), Counter> {
    let mut hub_writes = HashMap::new();
    for (kind, plural) in [
        (ResourceKind::Application, "applications"),
        (ResourceKind::AppProject, "app_projects"),
        (ResourceKind::Repository, "repositories"),
    ] {
        for (op, verb) in [
            (HubWrite::Created, "created"),
            (HubWrite::Updated, "updated"),
            (HubWrite::Deleted, "deleted"),
        ] {
            let c = Counter::default();
            r.register(
                format!("principal_{plural}_{verb}"),
                format!("{} {verb} on the hub by the principal", kind.as_str()),
                c.clone(),
            );
            hub_writes.insert((kind, op), c);
        }
    }
    hub_writes
}

/// Upstream's average connection time: each connected agent's time rounded to the minute,
/// summed, divided by the number of agents in whole minutes (0 without agents).
pub fn average_minutes(connected_for: impl IntoIterator<Item = Duration>) -> i64 {
    let (mut total, mut n) = (0i64, 0i64);
    for d in connected_for {
        // Go's Duration.Round(time.Minute): halves round away from zero.
        total += ((d.as_secs_f64() / 60.0).round()) as i64;
        n += 1;
    }
    if n == 0 { 0 } else { total / n }
}

impl Upstream {
    fn new() -> Upstream {
        Upstream {
            avg_connection_time: Gauge::default(),
            gpg_keys: Gauge::default(),
            events_received: Counter::default(),
            events_sent: Counter::default(),
            event_processing: Family::new_with_constructor(go_histogram),
            send_errors: Family::default(),
            events_discarded: Family::default(),
            errors: Family::default(),
            agent_connections: Family::default(),
            resource_proxy_requests: Family::default(),
            resource_proxy_errors: Family::default(),
            redis_proxy_requests: Family::default(),
            redis_proxy_errors: Family::default(),
            hub_writes: Arc::default(),
        }
    }

    /// Registers upstream's series in upstream's order (`NewPrincipalMetrics`).
    fn register(&mut self, r: &mut Registry) {
        let help = "The average time all agents are connected for (in minutes)";
        r.register(
            "principal_agent_avg_connection_time",
            help,
            self.avg_connection_time.clone(),
        );
        self.hub_writes = Arc::new(hub_write_counters(r));
        let help = "The current number of GPG keys on the control plane";
        r.register(
            "argocd_principal_gpg_keys_count",
            help,
            self.gpg_keys.clone(),
        );
        let help = "The total number of events received by principal";
        r.register(
            "principal_events_received",
            help,
            self.events_received.clone(),
        );
        let help = "The total number of events sent by principal";
        r.register("principal_events_sent", help, self.events_sent.clone());
        let help = "Histogram of time taken to process events (in seconds)";
        r.register(
            "principal_event_processing_time",
            help,
            self.event_processing.clone(),
        );
        let help = "The total number of EventWriter send errors observed by principal";
        r.register(
            "principal_event_writer_send_errors_total",
            help,
            self.send_errors.clone(),
        );
        let help = "Events dropped on a full agent queue (resync repairs them)";
        let discarded = self.events_discarded.clone();
        r.register(
            "argocd_principal_event_writer_events_discarded_total",
            help,
            discarded,
        );
        let help = "The total number of errors occurred in principal";
        r.register("principal_errors", help, self.errors.clone());
        let help = "The total number of successful connections from each agent to the principal";
        let connections = self.agent_connections.clone();
        r.register(
            "argocd_principal_agent_connections_total",
            help,
            connections,
        );
        let help = "The total number of resource proxy requests received";
        let requests = self.resource_proxy_requests.clone();
        r.register(
            "argocd_principal_resource_proxy_requests_total",
            help,
            requests,
        );
        let help = "The total number of resource proxy request failures";
        let errors = self.resource_proxy_errors.clone();
        r.register("argocd_principal_resource_proxy_errors_total", help, errors);
        let help = "The total number of Redis proxy requests forwarded to agents";
        let requests = self.redis_proxy_requests.clone();
        r.register(
            "argocd_principal_redis_proxy_requests_total",
            help,
            requests,
        );
        let help = "The total number of Redis proxy request failures";
        let errors = self.redis_proxy_errors.clone();
        r.register("argocd_principal_redis_proxy_errors_total", help, errors);
        argocd_agent_runtime::exposition::register_build_info(r);
    }
}

impl Metrics {
    /// Metrics whose per-agent labels are limited to [`DEFAULT_MAX_AGENT_LABELS`] agents.
    pub fn new() -> Metrics {
        Self::with_agent_label_limit(DEFAULT_MAX_AGENT_LABELS)
    }

    /// Metrics whose per-agent labels are limited to `max_agent_labels` agents.
    pub fn with_agent_label_limit(max_agent_labels: usize) -> Metrics {
        let mut r = Registry::default();
        let mut m = Metrics {
            connected_agents: Gauge::default(),
            upstream: Upstream::new(),
            events_received: Family::default(),
            events_sent: Family::default(),
            auth_failures: Family::default(),
            events_refused: Family::default(),
            hub_write_errors: Counter::default(),
            quota: Default::default(),
            resync_duration: Family::new_with_constructor(seconds_histogram),
            config_fanout: Histogram::new(exponential_buckets(1.0, 4.0, 9)),
            svid_expiry: Gauge::default(),
            svid_rotations: Counter::default(),
            queue_depth: Gauge::default(),
            resends: Counter::default(),
            redis_proxy_commands: Family::default(),
            resource_proxy_responses: Family::default(),
            resource_proxy_forwarded: Family::default(),
            lease_writes: Family::default(),
            sessions_deferred: Family::default(),
            listener_closed: Family::default(),
            tenant_agents_connected: Family::default(),
            tenant_proxy_in_flight: Family::default(),
            tenant_quota_refused: Family::default(),
            agent_tenants: Arc::default(),
            connected_since: Arc::default(),
            agent_labels: Arc::new(AgentLabels {
                max: max_agent_labels,
                seen: Mutex::new(HashSet::new()),
            }),
            registry: Arc::default(),
        };
        // Families are registered (and so exposed) in this order: upstream's first.
        r.register(
            "argocd_principal_connected_agents",
            "The total number of agents connected with principal",
            m.connected_agents.clone(),
        );
        m.upstream.register(&mut r);
        r.register_collector(Box::new(argocd_agent_runtime::telemetry::SpanCollector {
            prefix: "argocd_principal",
        }));
        m.register_event_metrics(&mut r);
        m.register_admission_metrics(&mut r);
        m.register_sync_metrics(&mut r);
        m.register_svid_metrics(&mut r);
        m.register_ack_metrics(&mut r);
        m.register_proxy_metrics(&mut r);
        m.register_replica_metrics(&mut r);
        m.register_listener_metrics(&mut r);
        m.register_tenant_metrics(&mut r);
        m.quota.register(&mut r);
        m.registry = Arc::new(r);
        m
    }

    /// Events exchanged with the agents, by agent and type.
    fn register_event_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_events_received_total",
            "Events received from agents, by agent and type",
            self.events_received.clone(),
        );
        r.register(
            "argocd_principal_events_sent_total",
            "Events sent to agents, by agent and type",
            self.events_sent.clone(),
        );
    }

    /// Streams and events refused (auth failures exported at zero).
    fn register_admission_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_auth_failures_total",
            "Streams refused at authentication or mapping, by reason",
            self.auth_failures.clone(),
        );
        r.register(
            "argocd_principal_events_refused_total",
            "Inbound events refused, by agent and reason",
            self.events_refused.clone(),
        );
        for reason in AUTH_FAILURE_REASONS {
            let _ = self.auth_failures.get_or_create(&ReasonLabels {
                reason: reason.into(),
            });
        }
    }

    /// Keeping the hub and the agents in step: failed hub writes, resync time.
    fn register_sync_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_hub_write_errors_total",
            "Failed writes to the hub cluster",
            self.hub_write_errors.clone(),
        );
        r.register(
            "argocd_principal_resync_duration_seconds",
            "Time from hello to the resync plan queued, in seconds",
            self.resync_duration.clone(),
        );
        r.register(
            "argocd_principal_config_fanout_agents",
            "Managed agents that re-evaluated their configuration objects after one hub configuration change",
            self.config_fanout.clone(),
        );
    }

    /// The serving SVID: its expiry and rotations.
    fn register_svid_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_svid_expiry_timestamp_seconds",
            "notAfter of the principal's X.509-SVID (Unix seconds)",
            self.svid_expiry.clone(),
        );
        r.register(
            "argocd_principal_svid_rotations_total",
            "X.509-SVID updates received",
            self.svid_rotations.clone(),
        );
    }

    /// Events waiting for an acknowledgement, and those sent again for lack of one.
    fn register_ack_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_queue_depth",
            "Events queued or waiting for an acknowledgement, all agents",
            self.queue_depth.clone(),
        );
        r.register(
            "argocd_principal_event_resends_total",
            "Events sent again because no acknowledgement came in time",
            self.resends.clone(),
        );
    }

    /// Requests the Redis and resource proxies handled or forwarded.
    fn register_proxy_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_redis_proxy_commands_total",
            "Commands handled by the Redis proxy, by route (agent, hub) and result",
            self.redis_proxy_commands.clone(),
        );
        r.register(
            "argocd_principal_resource_proxy_responses_total",
            "Requests the resource proxy answered, by agent, kind (request, log, exec) and HTTP status",
            self.resource_proxy_responses.clone(),
        );
        r.register(
            "argocd_principal_resource_proxy_forwarded_total",
            "Resource proxy requests forwarded to the replica serving the agent, by agent, kind and HTTP status",
            self.resource_proxy_forwarded.clone(),
        );
    }

    /// Replicas: Lease writes and sessions left to another replica.
    fn register_replica_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_lease_writes_total",
            "Writes to the hub's coordination.k8s.io Leases, by lease (agent, replica), operation and result",
            self.lease_writes.clone(),
        );
        r.register(
            "argocd_principal_sessions_deferred_total",
            "Sessions turned away or closed so that another replica serves the agent, by reason",
            self.sessions_deferred.clone(),
        );
    }

    /// Connections the proxies' and the metrics listeners refused or closed.
    fn register_listener_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_listener_connections_closed_total",
            "Connections the listeners (agent gRPC, admin, proxies, metrics) refused or closed by a cap or a timeout, by listener and reason",
            self.listener_closed.clone(),
        );
    }

    /// Tenants' use of their quotas, and refusals by quota.
    fn register_tenant_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_tenant_agents_connected",
            "Agents of the tenant with a session on this principal replica",
            self.tenant_agents_connected.clone(),
        );
        r.register(
            "argocd_principal_tenant_proxy_requests_in_flight",
            "Resource proxy requests, log streams and terminals open for the tenant's agents on this replica",
            self.tenant_proxy_in_flight.clone(),
        );
        r.register(
            "argocd_principal_tenant_quota_refused_total",
            "Sessions, events and resource proxy requests refused by a tenant's quota, by tenant and quota",
            self.tenant_quota_refused.clone(),
        );
    }

    /// Exports a declared tenant's series at zero (`quotas`: its refusal counters).
    pub fn tenant_declared(&self, tenant: &str, quotas: &[&str]) {
        let labels = TenantLabels {
            tenant: tenant.into(),
        };
        let _ = self.tenant_agents_connected.get_or_create(&labels);
        let _ = self.tenant_proxy_in_flight.get_or_create(&labels);
        for quota in quotas {
            let _ = self.tenant_quota_refused.get_or_create(&TenantQuotaLabels {
                tenant: tenant.into(),
                quota: (*quota).into(),
            });
        }
    }

    /// Counts one refusal by `tenant`'s `quota`.
    pub fn tenant_quota_refused(&self, tenant: &str, quota: &str) {
        self.tenant_quota_refused
            .get_or_create(&TenantQuotaLabels {
                tenant: tenant.into(),
                quota: quota.into(),
            })
            .inc();
    }

    /// Sets the number of `tenant`'s agents connected here.
    pub fn tenant_agents_connected(&self, tenant: &str, n: usize) {
        self.tenant_agents_connected
            .get_or_create(&TenantLabels {
                tenant: tenant.into(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Sets `tenant`'s resource proxy requests in flight here.
    pub fn tenant_proxy_in_flight(&self, tenant: &str, n: u32) {
        self.tenant_proxy_in_flight
            .get_or_create(&TenantLabels {
                tenant: tenant.into(),
            })
            .set(i64::from(n));
    }

    /// Records `agent`'s tenant (at each session's start): the `tenant` label of its
    /// per-agent series from now on. An agent never connected here, or of no tenant, is
    /// labelled `tenant=""`.
    pub fn set_tenant(&self, agent: &str, tenant: Option<&argocd_agent_domain::TenantName>) {
        let mut map = lock(&self.agent_tenants);
        match tenant {
            Some(t) => {
                map.insert(agent.to_owned(), t.to_string());
            }
            None => {
                map.remove(agent);
            }
        }
    }

    /// The `tenant` label value of `agent`'s series.
    pub fn tenant_label(&self, agent: &str) -> String {
        lock(&self.agent_tenants)
            .get(agent)
            .cloned()
            .unwrap_or_default()
    }

    /// Counts one request forwarded to another replica's resource proxy.
    pub fn resource_proxy_forwarded(&self, agent: &str, kind: &str, code: u16) {
        self.resource_proxy_forwarded
            .get_or_create(&ResourceProxyLabels {
                agent: self.agent_label(agent),
                kind: kind.into(),
                code: code.to_string(),
                tenant: self.tenant_label(agent),
            })
            .inc();
    }

    /// Counts one request of the resource proxy for `agent`, answered with `code`, and the
    /// failure `error` (upstream's reasons: `agent_disconnected`, `timeout`, `agent_error`).
    pub fn resource_proxy(&self, agent: &str, kind: &str, code: u16, error: Option<&str>) {
        let agent_name = self.agent_label(agent);
        self.resource_proxy_responses
            .get_or_create(&ResourceProxyLabels {
                agent: agent_name.clone(),
                kind: kind.into(),
                code: code.to_string(),
                tenant: self.tenant_label(agent),
            })
            .inc();
        self.upstream
            .resource_proxy_requests
            .get_or_create(&AgentNameLabels {
                agent_name: agent_name.clone(),
            })
            .inc();
        if let Some(reason) = error {
            self.upstream
                .resource_proxy_errors
                .get_or_create(&AgentNameReasonLabels {
                    agent_name,
                    reason: reason.into(),
                })
                .inc();
        }
    }

    /// Counts one write to a Lease.
    pub fn lease_write(&self, lease: &str, op: &str, result: &str) {
        self.lease_writes
            .get_or_create(&LeaseWriteLabels {
                lease: lease.into(),
                op: op.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts a session another replica is left to serve.
    pub fn deferred(&self, reason: &str) {
        self.sessions_deferred
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts a connection a listener refused or closed.
    pub fn listener_closed(&self, listener: &str, reason: &str) {
        self.listener_closed
            .get_or_create(&ListenerLabels {
                listener: listener.into(),
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts one command of the Redis proxy.
    pub fn redis_proxy(&self, route: &str, result: &str) {
        self.redis_proxy_commands
            .get_or_create(&RedisProxyLabels {
                route: route.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Counts one command (`get` or `subscribe`) sent to `agent`, as upstream counts them;
    /// `failed`: one that failed after it was sent (upstream's errors counter).
    pub fn redis_proxy_agent(&self, agent: &str, command: &str, failed: bool) {
        let labels = RedisAgentLabels {
            agent_name: self.agent_label(agent),
            command: command.into(),
        };
        let family = if failed {
            &self.upstream.redis_proxy_errors
        } else {
            &self.upstream.redis_proxy_requests
        };
        family.get_or_create(&labels).inc();
    }

    /// The registry's OpenMetrics text (`/metrics` serves it as text 0.0.4, see
    /// [`argocd_agent_runtime::exposition`]), with the average connection time taken now.
    pub fn encode(&self) -> String {
        let now = Instant::now();
        let avg = average_minutes(
            lock(&self.connected_since)
                .values()
                .map(|since| now.saturating_duration_since(*since)),
        );
        self.upstream.avg_connection_time.set(avg);
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The label value for `agent` (bounded, see [`AgentLabels`]).
    pub fn agent_label(&self, agent: &str) -> String {
        self.agent_labels.label(agent)
    }

    /// Counts an inbound event of `agent` refused for `reason` (one of [`REFUSAL_REASONS`]).
    pub fn refused(&self, agent: &argocd_agent_domain::AgentName, reason: &str) {
        self.events_refused
            .get_or_create(&AgentReasonLabels {
                agent: self.agent_label(agent.as_str()),
                reason: reason.into(),
                tenant: self.tenant_label(agent.as_str()),
            })
            .inc();
    }

    /// Counts a stream, tunnel, admin call or connection refused for `reason` (one of
    /// [`AUTH_FAILURE_REASONS`]).
    pub fn auth_failed(&self, reason: &str) {
        self.auth_failures
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts an event received from or sent to `agent`.
    pub fn event(&self, sent: bool, agent: &str, ty: &str) {
        let labels = EventLabels {
            agent: self.agent_label(agent),
            r#type: ty.into(),
            tenant: self.tenant_label(agent),
        };
        let (upstream, ours) = if sent {
            (&self.upstream.events_sent, &self.events_sent)
        } else {
            (&self.upstream.events_received, &self.events_received)
        };
        upstream.inc();
        ours.get_or_create(&labels).inc();
    }

    /// Records how long one inbound event about `kind` took, and counts a failure in
    /// `principal_errors`.
    pub fn processed(&self, agent: &str, kind: ResourceKind, status: Processing, seconds: f64) {
        let resource_type = resource_type(kind).to_owned();
        if status == Processing::Failure {
            self.upstream
                .errors
                .get_or_create(&ResourceTypeLabels {
                    resource_type: resource_type.clone(),
                })
                .inc();
        }
        self.upstream
            .event_processing
            .get_or_create(&ProcessingLabels {
                status: status.as_str().into(),
                agent_name: self.agent_label(agent),
                resource_type,
            })
            .observe(seconds);
    }

    /// Counts an event that could not be written to `agent`'s stream (upstream's reasons:
    /// `context-canceled`, `transport-closing`, `other`).
    pub fn send_error(&self, agent: &str, reason: &str) {
        self.upstream
            .send_errors
            .get_or_create(&AgentNameReasonLabels {
                agent_name: self.agent_label(agent),
                reason: reason.into(),
            })
            .inc();
    }

    /// Counts an event for `agent` dropped on its full queue.
    pub fn discarded(&self, agent: &str, event_type: &str, kind: Option<ResourceKind>) {
        self.upstream
            .events_discarded
            .get_or_create(&DiscardLabels {
                agent_name: self.agent_label(agent),
                event_type: event_type.into(),
                resource_type: kind.map_or("unknown", resource_type).into(),
            })
            .inc();
    }

    /// Counts a session opened by `agent` (and exports its refusal counters at zero); its
    /// connection time counts in the average from now.
    pub fn connected(&self, agent: &str) {
        lock(&self.connected_since).insert(agent.to_owned(), Instant::now());
        let label = self.agent_label(agent);
        let tenant = self.tenant_label(agent);
        for reason in REFUSAL_REASONS {
            let _ = self.events_refused.get_or_create(&AgentReasonLabels {
                agent: label.clone(),
                reason: reason.into(),
                tenant: tenant.clone(),
            });
        }
        self.upstream
            .agent_connections
            .get_or_create(&AgentNameLabels { agent_name: label })
            .inc();
    }

    /// `agent` has no session any more: it leaves the average connection time.
    pub fn disconnected(&self, agent: &str) {
        lock(&self.connected_since).remove(agent);
    }

    /// Sets `argocd_principal_gpg_keys_count` to the keys of the hub's GPG ConfigMap.
    pub fn gpg_keys(&self, keys: usize) {
        self.upstream
            .gpg_keys
            .set(i64::try_from(keys).unwrap_or(i64::MAX));
    }

    /// Counts a write the principal made to the hub.
    pub fn hub_write(&self, kind: ResourceKind, op: HubWrite) {
        if let Some(c) = self.upstream.hub_writes.get(&(kind, op)) {
            c.inc();
        }
    }

    /// Follows an SVID source: expiry gauge and rotation counter.
    pub fn follow_svid(&self, source: &argocd_agent_identity::source::SvidSource) {
        let (expiry, rotations) = (self.svid_expiry.clone(), self.svid_rotations.clone());
        source.on_update(move |state| {
            let t = state
                .svid
                .not_after()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            expiry.set(t);
            rotations.inc();
        });
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves `/metrics`, `/healthz` (liveness: the process serves HTTP) and `/readyz` (503
/// until `ready` says the principal can serve agents) until `shutdown`.
/// What `/readyz` checks: the hub watches have listed (`synced`) and, with SVID mTLS, the
/// principal has an unexpired SVID to serve handshakes with.
#[derive(Clone)]
pub struct Readiness {
    /// `true` once the hub watches have listed.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// The serving SVID (SVID mTLS only): not ready while it is missing or expired.
    pub svid: Option<argocd_agent_identity::source::SvidSource>,
    /// The optional features' own checks (replicas: the replica Lease must be fresh).
    pub checks: Vec<argocd_agent_runtime::health::Probe>,
}

impl Readiness {
    /// Whether the principal is ready, without the reasons (the agent listener asks at
    /// every accepted connection: `check` without building its text).
    pub fn is_ready(&self) -> bool {
        *self.synced.borrow()
            && self.svid.as_ref().is_none_or(|s| s.readiness().is_ok())
            && self.checks.iter().all(|check| check().is_ok())
    }

    /// `Ok`, or every reason the principal is not ready.
    pub fn check(&self) -> Result<(), String> {
        let mut reasons = Vec::new();
        if !*self.synced.borrow() {
            reasons.push(
                "hub watches (Applications, AppProjects, repository Secrets, ConfigMaps) have not listed yet"
                    .to_owned(),
            );
        }
        if let Some(Err(e)) = self.svid.as_ref().map(|s| s.readiness()) {
            reasons.push(e);
        }
        reasons.extend(self.checks.iter().filter_map(|check| check().err()));
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(format!("not ready: {}", reasons.join("; ")))
        }
    }
}

/// Serves `/metrics` (when `metrics` is given), `/healthz` and `/readyz` on `addr`: the
/// endpoint both binaries share, with the principal's verdicts.
pub async fn serve(
    addr: SocketAddr,
    metrics: Option<Metrics>,
    ready: Readiness,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<SocketAddr> {
    use argocd_agent_runtime::health::{self, Endpoints};
    let on_close: argocd_agent_identity::listener::OnClose = match &metrics {
        Some(m) => {
            let m = m.clone();
            Arc::new(move |reason| m.listener_closed("metrics", reason))
        }
        None => Arc::new(|_| {}),
    };
    let endpoints = Endpoints {
        live: Endpoints::always_live(),
        ready: Arc::new(move || ready.check()),
        metrics: metrics.map(|m| Arc::new(move || m.encode()) as health::Scrape),
        on_close,
    };
    health::serve(addr, endpoints, tasks, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn transport_refusals_are_exported_auth_failure_reasons() {
        // The listener's caps are counted as closed connections (`wiring::incoming_options`),
        // and so are connections closed while not ready; everything else as an auth failure.
        for reason in argocd_agent_identity::transport::REFUSED_REASONS {
            match reason {
                "NotReady" => {}
                "TooManyConnections" | "TooManyFromClient" => assert!(
                    argocd_agent_identity::listener::CLOSE_REASONS.contains(&reason),
                    "{reason}"
                ),
                _ => assert!(AUTH_FAILURE_REASONS.contains(&reason), "{reason}"),
            }
        }
    }

    async fn status(addr: SocketAddr, path: &str) -> u16 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[tokio::test]
    async fn readyz_follows_readiness_while_healthz_stays_up() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let tasks = tokio_util::task::TaskTracker::new();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            Some(Metrics::new()),
            Readiness {
                synced: rx,
                svid: None,
                checks: Vec::new(),
            },
            &tasks,
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert_eq!(status(addr, "/readyz").await, 503);
        assert_eq!(status(addr, "/healthz").await, 200);
        tx.send_replace(true);
        assert_eq!(status(addr, "/readyz").await, 200);
        assert_eq!(status(addr, "/metrics").await, 200);
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
    }

    #[test]
    fn readiness_names_every_reason() {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let lease = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let fresh = lease.clone();
        let r = Readiness {
            synced: rx,
            svid: None,
            checks: vec![Arc::new(move || {
                if fresh.load(std::sync::atomic::Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("replica Lease not renewed".into())
                }
            })],
        };
        let why = r.check().unwrap_err();
        assert!(why.starts_with("not ready: hub watches"), "{why}");
        assert!(why.ends_with("; replica Lease not renewed"), "{why}");
        tx.send_replace(true);
        assert_eq!(
            r.check().unwrap_err(),
            "not ready: replica Lease not renewed"
        );
        lease.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(r.check().is_ok());
    }

    #[test]
    fn per_agent_series_carry_the_agents_tenant() {
        let m = Metrics::new();
        let team = argocd_agent_domain::TenantName::new("team-a").unwrap();
        m.set_tenant("edge-1", Some(&team));
        m.event(false, "edge-1", "create");
        m.event(false, "edge-2", "create");
        m.refused(
            &argocd_agent_domain::AgentName::new("edge-1").unwrap(),
            "NotOwner",
        );
        m.resource_proxy("edge-1", "log", 200, None);
        let text = argocd_agent_runtime::exposition::openmetrics_to_text(&m.encode()).unwrap();
        for line in [
            "argocd_principal_events_received_total{agent=\"edge-1\",type=\"create\",tenant=\"team-a\"} 1",
            "argocd_principal_events_received_total{agent=\"edge-2\",type=\"create\",tenant=\"\"} 1",
            "argocd_principal_events_refused_total{agent=\"edge-1\",reason=\"NotOwner\",tenant=\"team-a\"} 1",
            "argocd_principal_resource_proxy_responses_total{agent=\"edge-1\",kind=\"log\",code=\"200\",tenant=\"team-a\"} 1",
            // Upstream's families keep their labels.
            "argocd_principal_resource_proxy_requests_total{agent_name=\"edge-1\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        // Back to no tenant (a rules change moved the agent out).
        m.set_tenant("edge-1", None);
        m.event(false, "edge-1", "create");
        let text = argocd_agent_runtime::exposition::openmetrics_to_text(&m.encode()).unwrap();
        assert!(text.contains(
            "argocd_principal_events_received_total{agent=\"edge-1\",type=\"create\",tenant=\"\"} 1"
        ));
    }

    #[test]
    fn per_agent_labels_are_bounded() {
        let m = Metrics::with_agent_label_limit(2);
        assert_eq!(m.agent_label("a"), "a");
        assert_eq!(m.agent_label("b"), "b");
        assert_eq!(m.agent_label("c"), OTHER_AGENTS);
        assert_eq!(m.agent_label("a"), "a");
        m.event(true, "c", "spec-update");
        m.event(true, "d", "spec-update");
        let text = argocd_agent_runtime::exposition::openmetrics_to_text(&m.encode()).unwrap();
        assert!(
            text.contains(
                "argocd_principal_events_sent_total{agent=\"other\",type=\"spec-update\",tenant=\"\"} 2"
            ),
            "{text}"
        );
        // Upstream's series has no labels.
        assert!(
            text.lines().any(|l| l == "principal_events_sent 2"),
            "{text}"
        );
    }

    #[test]
    fn average_connection_time_is_upstreams() {
        let min = |m: u64, s: u64| Duration::from_secs(m * 60 + s);
        assert_eq!(average_minutes([]), 0);
        assert_eq!(average_minutes([min(0, 20)]), 0);
        // Each rounded to the minute (halves up), then the whole-minute average.
        assert_eq!(average_minutes([min(0, 30), min(2, 29)]), 1);
        assert_eq!(average_minutes([min(10, 0), min(5, 0), min(0, 0)]), 5);
        assert_eq!(average_minutes([min(1, 0), min(2, 0)]), 1);
    }

    #[test]
    fn upstream_series_are_exposed_under_upstreams_names() {
        let m = Metrics::new();
        m.connected("a");
        m.processed("a", ResourceKind::Application, Processing::Failure, 0.2);
        m.processed("a", ResourceKind::AppProject, Processing::NotAllowed, 0.01);
        m.discarded("a", "spec-update", Some(ResourceKind::Repository));
        m.send_error("a", "other");
        m.resource_proxy("a", "request", 502, Some("agent_disconnected"));
        m.redis_proxy_agent("a", "get", false);
        m.gpg_keys(3);
        let text = argocd_agent_runtime::exposition::openmetrics_to_text(&m.encode()).unwrap();
        for line in [
            "argocd_principal_connected_agents 0",
            "principal_agent_avg_connection_time 0",
            "argocd_principal_gpg_keys_count 3",
            "principal_applications_created 0",
            "principal_errors{resource_type=\"application\"} 1",
            "principal_event_processing_time_count{status=\"not-allowed\",agent_name=\"a\",resource_type=\"appproject\"} 1",
            "principal_event_processing_time_bucket{le=\"0.25\",status=\"failure\",agent_name=\"a\",resource_type=\"application\"} 1",
            "argocd_principal_event_writer_events_discarded_total{agent_name=\"a\",event_type=\"spec-update\",resource_type=\"repository\"} 1",
            "principal_event_writer_send_errors_total{agent_name=\"a\",reason=\"other\"} 1",
            "argocd_principal_agent_connections_total{agent_name=\"a\"} 1",
            "argocd_principal_resource_proxy_requests_total{agent_name=\"a\"} 1",
            "argocd_principal_resource_proxy_errors_total{agent_name=\"a\",reason=\"agent_disconnected\"} 1",
            "argocd_principal_resource_proxy_responses_total{agent=\"a\",kind=\"request\",code=\"502\",tenant=\"\"} 1",
            "argocd_principal_redis_proxy_requests_total{agent_name=\"a\",command=\"get\"} 1",
            "argocd_principal_auth_failures_total{reason=\"Unmapped\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(text.contains("# TYPE principal_events_received counter"));
        assert!(!text.contains("_total_total"), "{text}");
    }
}
