//! Prometheus metrics of the principal: the families it registers (`/metrics` serves them,
//! see [`crate::health`]) and what each recorded event counts. A leaf: the modules that count
//! pass it plain values, and the refusal reasons it exports come from [`crate::refusals`].

mod labels;
mod upstream;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use argocd_agent_domain::ResourceKind;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub use self::labels::{
    AgentLabels, AgentNameLabels, AgentNameReasonLabels, AgentReasonLabels, DiscardLabels,
    EventLabels, FormLabels, HubWrite, LeaseWriteLabels, ListenerLabels, ModeLabels, OTHER_AGENTS,
    Processing, ProcessingLabels, QuotaLabels, ReasonLabels, RedisAgentLabels, RedisProxyLabels,
    ResourceProxyLabels, ResourceTypeLabels, TenantLabels, TenantQuotaLabels,
};
pub use self::upstream::{Upstream, average_minutes};

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
    crate::refusals::TENANT_AGENT_QUOTA,
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
    crate::refusals::RATE_LIMITED,
    crate::refusals::TENANT_RATE_LIMITED,
    "NotFound",
    crate::refusals::HELLO_TIMEOUT,
    crate::refusals::TOO_LARGE,
    crate::refusals::UNDECODABLE,
    crate::refusals::NOT_READING,
    crate::refusals::OBJECT_TOO_LARGE,
    crate::refusals::TOO_MANY_APPLICATIONS,
    crate::refusals::AGENT_BYTES_EXCEEDED,
    crate::refusals::PARENT_NOT_FOUND,
    crate::refusals::PARENT_NOT_HELD,
    crate::refusals::CHILD_NOT_TRACKED,
    crate::refusals::PROJECT_NOT_ALLOWED,
    crate::refusals::AGENT_APPLICATION_QUOTA,
    crate::refusals::TENANT_APPLICATION_QUOTA,
];

/// Auth failure reason of an admin call by a tenant's operator about an agent, identity or
/// tenant outside its tenant.
pub const OUTSIDE_TENANT: &str = "OutsideTenant";

/// Default of `--metrics-max-agent-labels`.
pub const DEFAULT_MAX_AGENT_LABELS: usize = 100;

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
    pub quota: QuotaMetrics,
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
    /// `argocd_principal_cached_objects{form}`: Applications in the watch cache, decoded
    /// or kept as JSON (`--ha` keeps only the served agents' decoded).
    pub cached_objects: Family<FormLabels, Gauge>,
    /// `argocd_principal_event_resends_total`: events sent again for lack of an ack.
    pub resends: Counter,
    /// `argocd_principal_ack_timeout_seconds`: the resend timeout learned over every
    /// agent's acknowledgements, which a queue starts from before it has its own (0 before
    /// the first acknowledgement).
    pub ack_timeout: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `argocd_principal_queue_events_released_total`: queued events dropped because
    /// another replica serves their agent now (its next session here starts with a resync).
    pub queue_released: Counter,
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

/// The quota metrics (tenants are few: declared in the rules file, so the labels are
/// bounded by it).
#[derive(Clone, Default)]
pub struct QuotaMetrics {
    /// `argocd_principal_applications_held_back_total{tenant,quota}`.
    pub held_back: Family<QuotaLabels, Counter>,
    /// `argocd_principal_applications_over_quota{tenant}`.
    pub over_quota: Family<TenantLabels, Gauge>,
}

impl QuotaMetrics {
    /// Registers the families.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_applications_held_back_total",
            "Hub-authored Applications held back from their agent by a tenant's quota, by tenant and quota",
            self.held_back.clone(),
        );
        r.register(
            "argocd_principal_applications_over_quota",
            "Hub-authored Applications held back by a quota now (agents connected to this replica), by tenant",
            self.over_quota.clone(),
        );
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
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
            cached_objects: Family::default(),
            resends: Counter::default(),
            ack_timeout: Gauge::default(),
            queue_released: Counter::default(),
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
            "argocd_principal_cached_objects",
            "Applications in the watch cache, by form: decoded, or compact (kept as JSON)",
            self.cached_objects.clone(),
        );
        r.register(
            "argocd_principal_event_resends_total",
            "Events sent again because no acknowledgement came in time",
            self.resends.clone(),
        );
        r.register(
            "argocd_principal_ack_timeout_seconds",
            "Resend timeout learned from every agent's acknowledgement round trips (SRTT + 4 RTTVAR), where a new agent's queue starts (at least 2 s)",
            self.ack_timeout.clone(),
        );
        r.register(
            "argocd_principal_queue_events_released_total",
            "Queued events dropped because another principal replica serves their agent now",
            self.queue_released.clone(),
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
        let resource_type = kind.target_name().to_owned();
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
                resource_type: kind.map_or("unknown", ResourceKind::target_name).into(),
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
        argocd_agent_runtime::svid::follow_svid(source, &self.svid_expiry, &self.svid_rotations);
    }
}

use argocd_agent_domain::sync::lock;

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn transport_refusals_are_exported_auth_failure_reasons() {
        // The listener's caps are counted as closed connections (`wiring::incoming_options`),
        // and so are connections closed while not ready; everything else as an auth failure.
        for reason in argocd_agent_identity::transport::REFUSED_REASONS {
            match reason {
                "NotReady" | "Busy" => {}
                "TooManyConnections" | "TooManyFromClient" => assert!(
                    argocd_agent_listener::CLOSE_REASONS.contains(&reason),
                    "{reason}"
                ),
                _ => assert!(AUTH_FAILURE_REASONS.contains(&reason), "{reason}"),
            }
        }
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
