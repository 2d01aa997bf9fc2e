//! Prometheus metrics of the principal, and the `/metrics` + `/healthz` HTTP endpoint.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use argocd_agent_domain::ResourceKind;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of `principal_events_received_total` and `principal_events_sent_total`, as
/// upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// The agent (bounded, see [`AgentLabels`]).
    pub agent: String,
    /// The event type's verb: `create`, `spec-update`, `status-update`, `ping`, ...
    pub r#type: String,
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
}

/// Labels of `argocd_principal_agent_connections_total`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentNameLabels {
    /// The agent (bounded, see [`AgentLabels`]).
    pub agent_name: String,
}

/// Labels of `principal_event_processing_time`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessingLabels {
    /// `success`, or `failure` when the event was answered with an error event.
    pub status: String,
    /// The agent that sent the event (bounded, see [`AgentLabels`]).
    pub agent_name: String,
    /// The kind the event is about: `Application`, `AppProject`, `Repository`, `GPGKeys`.
    pub resource_type: String,
}

/// Labels of `argocd_principal_resource_proxy_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceProxyLabels {
    /// The agent the request was for (bounded like every agent label).
    pub agent: String,
    /// `request` (a Kubernetes API call), `log` or `exec`.
    pub kind: String,
    /// The HTTP status answered (101 for an exec session that was opened).
    pub code: String,
}

/// Labels of `argocd_principal_listener_connections_closed_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabels {
    /// `resource-proxy`, `redis-proxy`, `metrics`.
    pub listener: String,
    /// One of `argocd_agent_identity::listener::CLOSE_REASONS`, or the Redis proxy's own
    /// (`AuthTimeout`, `Unauthenticated`).
    pub reason: String,
}

/// Labels of `argocd_principal_redis_proxy_requests_total`.
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
pub const AUTH_FAILURE_REASONS: [&str; 17] = [
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
    // Connections dropped before their first request (argocd_agent_identity::transport).
    "HandshakeTimeout",
    "HandshakeFailed",
    "NoUsableSvid",
    "NoPreface",
];

/// Reasons inbound events are refused (`argocd_principal_events_refused`), exported at zero
/// for each agent when it first connects.
pub const REFUSAL_REASONS: [&str; 14] = [
    "WrongNamespace",
    "NotOwner",
    "ModeForbids",
    "ModeNotAllowed",
    "NotDestination",
    "Malformed",
    "Invalid",
    "UnexpectedEvent",
    crate::ratelimit::RATE_LIMITED,
    "NotFound",
    crate::session::HELLO_TIMEOUT,
    crate::session::TOO_LARGE,
    crate::session::UNDECODABLE,
    crate::session::NOT_READING,
];

/// Default of `--metrics-max-agent-labels`.
pub const DEFAULT_MAX_AGENT_LABELS: usize = 100;

/// All metrics of the principal. Names follow upstream argocd-agent where it has the
/// metric (counters carry the OpenMetrics `_total` suffix), `argocd_principal_*` otherwise.
#[derive(Clone)]
pub struct Metrics {
    /// `argocd_principal_connected_agents`.
    pub connected_agents: Gauge,
    /// `principal_events_received_total{agent,type}`.
    pub events_received: Family<EventLabels, Counter>,
    /// `principal_events_sent_total{agent,type}`.
    pub events_sent: Family<EventLabels, Counter>,
    /// `principal_event_processing_time{status,agent_name,resource_type}` (seconds).
    pub event_processing: Family<ProcessingLabels, Histogram>,
    /// `argocd_principal_agent_connections_total{agent_name}`.
    pub agent_connections: Family<AgentNameLabels, Counter>,
    /// Streams refused before a session existed (unmapped ID, no client certificate, ...):
    /// `argocd_principal_auth_failures_total{reason}`.
    pub auth_failures: Family<ReasonLabels, Counter>,
    /// Inbound events refused by authorization or validation:
    /// `argocd_principal_events_refused_total{agent,reason}`.
    pub events_refused: Family<AgentReasonLabels, Counter>,
    /// `argocd_principal_hub_write_errors_total`.
    pub hub_write_errors: Counter,
    /// Events dropped because an agent's queue was full:
    /// `argocd_principal_event_writer_events_discarded_total`.
    pub queue_full: Counter,
    /// `argocd_principal_resync_duration_seconds{mode}`.
    pub resync_duration: Family<ModeLabels, Histogram>,
    /// `argocd_principal_svid_expiry_timestamp_seconds`: notAfter of the serving SVID.
    pub svid_expiry: Gauge,
    /// `argocd_principal_svid_rotations_total`.
    pub svid_rotations: Counter,
    /// `argocd_principal_queue_depth`: events queued or unacknowledged, all agents.
    pub queue_depth: Gauge,
    /// `argocd_principal_event_resends_total`: events sent again for lack of an ack.
    pub resends: Counter,
    /// `argocd_principal_redis_proxy_requests_total{route,result}`: commands the Redis proxy
    /// handled.
    pub redis_proxy_requests: Family<RedisProxyLabels, Counter>,
    /// `argocd_principal_resource_proxy_requests_total{agent,kind,code}`: requests the
    /// resource proxy answered.
    pub resource_proxy_requests: Family<ResourceProxyLabels, Counter>,
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
    /// proxies and the metrics listener refused or closed (caps, handshake, idle timeouts).
    pub listener_closed: Family<ListenerLabels, Counter>,
    hub_writes: Arc<HashMap<(ResourceKind, HubWrite), Counter>>,
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

impl Metrics {
    /// Metrics whose per-agent labels are limited to [`DEFAULT_MAX_AGENT_LABELS`] agents.
    pub fn new() -> Metrics {
        Self::with_agent_label_limit(DEFAULT_MAX_AGENT_LABELS)
    }

    /// Metrics whose per-agent labels are limited to `max_agent_labels` agents.
    pub fn with_agent_label_limit(max_agent_labels: usize) -> Metrics {
        let mut r = Registry::default();
        r.register_collector(Box::new(argocd_agent_runtime::telemetry::SpanCollector {
            prefix: "argocd_principal",
        }));
        let mut m = Metrics {
            connected_agents: Gauge::default(),
            events_received: Family::default(),
            events_sent: Family::default(),
            event_processing: Family::new_with_constructor(seconds_histogram),
            agent_connections: Family::default(),
            auth_failures: Family::default(),
            events_refused: Family::default(),
            hub_write_errors: Counter::default(),
            queue_full: Counter::default(),
            resync_duration: Family::new_with_constructor(seconds_histogram),
            svid_expiry: Gauge::default(),
            svid_rotations: Counter::default(),
            queue_depth: Gauge::default(),
            resends: Counter::default(),
            redis_proxy_requests: Family::default(),
            resource_proxy_requests: Family::default(),
            resource_proxy_forwarded: Family::default(),
            lease_writes: Family::default(),
            sessions_deferred: Family::default(),
            listener_closed: Family::default(),
            hub_writes: Arc::default(),
            agent_labels: Arc::new(AgentLabels {
                max: max_agent_labels,
                seen: Mutex::new(HashSet::new()),
            }),
            registry: Arc::default(),
        };
        // Families are registered (and so exposed) in this order.
        m.register_event_metrics(&mut r);
        m.register_admission_metrics(&mut r);
        m.register_sync_metrics(&mut r);
        m.register_svid_metrics(&mut r);
        m.register_ack_metrics(&mut r);
        m.hub_writes = Arc::new(hub_write_counters(&mut r));
        m.register_proxy_metrics(&mut r);
        m.register_replica_metrics(&mut r);
        m.register_listener_metrics(&mut r);
        m.registry = Arc::new(r);
        m
    }

    /// Agents connected and the events exchanged with them.
    fn register_event_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_connected_agents",
            "Agents with an open stream",
            self.connected_agents.clone(),
        );
        r.register(
            "principal_events_received",
            "Events received from agents",
            self.events_received.clone(),
        );
        r.register(
            "principal_events_sent",
            "Events sent to agents",
            self.events_sent.clone(),
        );
        r.register(
            "principal_event_processing_time",
            "Time to process an inbound event, in seconds",
            self.event_processing.clone(),
        );
    }

    /// Sessions opened, and streams and events refused (auth failures exported at zero).
    fn register_admission_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_agent_connections",
            "Sessions opened, per agent",
            self.agent_connections.clone(),
        );
        r.register(
            "argocd_principal_auth_failures",
            "Streams refused at authentication or mapping, by reason",
            self.auth_failures.clone(),
        );
        r.register(
            "argocd_principal_events_refused",
            "Inbound events refused, by agent and reason",
            self.events_refused.clone(),
        );
        for reason in AUTH_FAILURE_REASONS {
            let _ = self.auth_failures.get_or_create(&ReasonLabels {
                reason: reason.into(),
            });
        }
    }

    /// Keeping the hub and the agents in step: failed hub writes, events dropped on a full
    /// queue, resync time.
    fn register_sync_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_hub_write_errors",
            "Failed writes to the hub cluster",
            self.hub_write_errors.clone(),
        );
        r.register(
            "argocd_principal_event_writer_events_discarded",
            "Events dropped on a full agent queue (resync repairs them)",
            self.queue_full.clone(),
        );
        r.register(
            "argocd_principal_resync_duration_seconds",
            "Time from hello to the resync plan queued, in seconds",
            self.resync_duration.clone(),
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
            "argocd_principal_svid_rotations",
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
            "argocd_principal_event_resends",
            "Events sent again because no acknowledgement came in time",
            self.resends.clone(),
        );
    }

    /// Requests the Redis and resource proxies handled or forwarded.
    fn register_proxy_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_redis_proxy_requests",
            "Commands handled by the Redis proxy, by route (agent, hub) and result",
            self.redis_proxy_requests.clone(),
        );
        r.register(
            "argocd_principal_resource_proxy_requests",
            "Requests the resource proxy answered, by agent, kind (request, log, exec) and HTTP status",
            self.resource_proxy_requests.clone(),
        );
        r.register(
            "argocd_principal_resource_proxy_forwarded",
            "Resource proxy requests forwarded to the replica serving the agent, by agent, kind and HTTP status",
            self.resource_proxy_forwarded.clone(),
        );
    }

    /// Replicas: Lease writes and sessions left to another replica.
    fn register_replica_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_lease_writes",
            "Writes to the hub's coordination.k8s.io Leases, by lease (agent, replica), operation and result",
            self.lease_writes.clone(),
        );
        r.register(
            "argocd_principal_sessions_deferred",
            "Sessions turned away or closed so that another replica serves the agent, by reason",
            self.sessions_deferred.clone(),
        );
    }

    /// Connections the proxies' and the metrics listeners refused or closed.
    fn register_listener_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_principal_listener_connections_closed",
            "Connections of the proxies and the metrics listener refused or closed by a cap or a timeout, by listener and reason",
            self.listener_closed.clone(),
        );
    }

    /// Counts one request forwarded to another replica's resource proxy.
    pub fn resource_proxy_forwarded(&self, agent: &str, kind: &str, code: u16) {
        self.resource_proxy_forwarded
            .get_or_create(&ResourceProxyLabels {
                agent: self.agent_label(agent),
                kind: kind.into(),
                code: code.to_string(),
            })
            .inc();
    }

    /// Counts one answer of the resource proxy.
    pub fn resource_proxy(&self, agent: &str, kind: &str, code: u16) {
        self.resource_proxy_requests
            .get_or_create(&ResourceProxyLabels {
                agent: self.agent_label(agent),
                kind: kind.into(),
                code: code.to_string(),
            })
            .inc();
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
        self.redis_proxy_requests
            .get_or_create(&RedisProxyLabels {
                route: route.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
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
        };
        let family = if sent {
            &self.events_sent
        } else {
            &self.events_received
        };
        family.get_or_create(&labels).inc();
    }

    /// Records how long one inbound event took.
    pub fn processed(&self, agent: &str, resource_type: &str, ok: bool, seconds: f64) {
        self.event_processing
            .get_or_create(&ProcessingLabels {
                status: if ok { "success" } else { "failure" }.into(),
                agent_name: self.agent_label(agent),
                resource_type: resource_type.into(),
            })
            .observe(seconds);
    }

    /// Counts a session opened by `agent` (and exports its refusal counters at zero).
    pub fn connected(&self, agent: &str) {
        let label = self.agent_label(agent);
        for reason in REFUSAL_REASONS {
            let _ = self.events_refused.get_or_create(&AgentReasonLabels {
                agent: label.clone(),
                reason: reason.into(),
            });
        }
        self.agent_connections
            .get_or_create(&AgentNameLabels { agent_name: label })
            .inc();
    }

    /// Counts a write the principal made to the hub.
    pub fn hub_write(&self, kind: ResourceKind, op: HubWrite) {
        if let Some(c) = self.hub_writes.get(&(kind, op)) {
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
        for reason in argocd_agent_identity::transport::REFUSED_REASONS {
            assert!(AUTH_FAILURE_REASONS.contains(&reason), "{reason}");
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
    fn per_agent_labels_are_bounded() {
        let m = Metrics::with_agent_label_limit(2);
        assert_eq!(m.agent_label("a"), "a");
        assert_eq!(m.agent_label("b"), "b");
        assert_eq!(m.agent_label("c"), OTHER_AGENTS);
        assert_eq!(m.agent_label("a"), "a");
        m.event(true, "c", "spec-update");
        m.event(true, "d", "spec-update");
        let text = m.encode();
        assert!(
            text.contains("principal_events_sent_total{agent=\"other\",type=\"spec-update\"} 2"),
            "{text}"
        );
    }
}
