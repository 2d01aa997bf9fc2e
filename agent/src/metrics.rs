//! Prometheus metrics of the agent. Names follow upstream argocd-agent where it has the
//! metric (counters carry the OpenMetrics `_total` suffix), `argocd_agent_*` otherwise.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessingLabels {
    pub status: String,
    pub resource_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceTypeLabels {
    pub resource_type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    pub verb: String,
    pub outcome: String,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

/// All metrics of the agent.
#[derive(Clone)]
pub struct Metrics {
    /// `agent_events_received_total{type}`.
    pub events_received: Family<TypeLabels, Counter>,
    /// `agent_events_sent_total{type}`.
    pub events_sent: Family<TypeLabels, Counter>,
    /// `agent_event_processing_time{status,resource_type}` (seconds).
    pub event_processing: Family<ProcessingLabels, Histogram>,
    /// `agent_event_propagation_latency_seconds{resource_type}`: from the event's `time`
    /// (set when the principal queued it) to the agent having applied it.
    pub propagation_latency: Family<ResourceTypeLabels, Histogram>,
    /// `argocd_agent_connection_status` (1 connected, 0 not).
    pub connection_status: Gauge,
    /// `argocd_agent_connection_start_timestamp_seconds`.
    pub connection_start: Gauge,
    /// `argocd_agent_connections_total`.
    pub connections: Counter,
    /// `argocd_agent_auth_failures_total`: streams the principal refused (unauthenticated
    /// or permission denied).
    pub auth_failures: Counter,
    /// `argocd_agent_event_writer_events_discarded_total`: events to the principal dropped
    /// on a full queue (resync repairs them).
    pub events_discarded: Counter,
    /// `argocd_agent_svid_expiry_timestamp_seconds`.
    pub svid_expiry: Gauge,
    /// `argocd_agent_svid_rotations_total`.
    pub svid_rotations: Counter,
    /// `argocd_agent_queue_depth`: events to the principal queued or unacknowledged.
    pub queue_depth: Gauge,
    /// `argocd_agent_event_resends_total`.
    pub resends: Counter,
    /// `argocd_agent_resource_proxy_requests_total{verb,outcome}`: resource proxy requests
    /// (verbs get, list, create, patch, delete, log, exec, update, other) by outcome
    /// (allowed, forbidden, error).
    pub resource_proxy_requests: Family<ProxyLabels, Counter>,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        r.register_collector(Box::new(argocd_agent_domain::trace::SpanCollector {
            prefix: "argocd_agent",
        }));
        let events_received = Family::<TypeLabels, Counter>::default();
        r.register(
            "agent_events_received",
            "Events received from the principal",
            events_received.clone(),
        );
        let events_sent = Family::<TypeLabels, Counter>::default();
        r.register(
            "agent_events_sent",
            "Events sent to the principal",
            events_sent.clone(),
        );
        let event_processing = Family::<ProcessingLabels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        r.register(
            "agent_event_processing_time",
            "Time to apply an event from the principal, in seconds",
            event_processing.clone(),
        );
        let propagation_latency = Family::<ResourceTypeLabels, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        r.register(
            "agent_event_propagation_latency_seconds",
            "Time from the principal queueing an event to the agent having applied it",
            propagation_latency.clone(),
        );
        let connection_status = Gauge::default();
        r.register(
            "argocd_agent_connection_status",
            "Whether the agent is connected to the principal (1) or not (0)",
            connection_status.clone(),
        );
        let connection_start = Gauge::default();
        r.register(
            "argocd_agent_connection_start_timestamp_seconds",
            "When the current connection to the principal was established (Unix seconds)",
            connection_start.clone(),
        );
        let connections = Counter::default();
        r.register(
            "argocd_agent_connections",
            "Connections established to the principal",
            connections.clone(),
        );
        let auth_failures = Counter::default();
        r.register(
            "argocd_agent_auth_failures",
            "Streams the principal refused (unauthenticated or permission denied)",
            auth_failures.clone(),
        );
        let events_discarded = Counter::default();
        r.register(
            "argocd_agent_event_writer_events_discarded",
            "Events to the principal dropped on a full queue",
            events_discarded.clone(),
        );
        let svid_expiry = Gauge::default();
        r.register(
            "argocd_agent_svid_expiry_timestamp_seconds",
            "notAfter of the agent's X.509-SVID (Unix seconds)",
            svid_expiry.clone(),
        );
        let svid_rotations = Counter::default();
        r.register(
            "argocd_agent_svid_rotations",
            "X.509-SVID updates received",
            svid_rotations.clone(),
        );
        let queue_depth = Gauge::default();
        r.register(
            "argocd_agent_queue_depth",
            "Events to the principal queued or waiting for an acknowledgement",
            queue_depth.clone(),
        );
        let resends = Counter::default();
        r.register(
            "argocd_agent_event_resends",
            "Events sent again because no acknowledgement came in time",
            resends.clone(),
        );
        let resource_proxy_requests = Family::<ProxyLabels, Counter>::default();
        r.register(
            "argocd_agent_resource_proxy_requests",
            "Resource proxy requests from the principal, by verb and outcome (allowed, forbidden, error)",
            resource_proxy_requests.clone(),
        );
        Metrics {
            resource_proxy_requests,
            queue_depth,
            resends,
            events_received,
            events_sent,
            event_processing,
            propagation_latency,
            connection_status,
            connection_start,
            connections,
            auth_failures,
            events_discarded,
            svid_expiry,
            svid_rotations,
            registry: Arc::new(r),
        }
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts an event sent to (`sent`) or received from the principal.
    pub fn event(&self, sent: bool, ty: &str) {
        let family = if sent {
            &self.events_sent
        } else {
            &self.events_received
        };
        family
            .get_or_create(&TypeLabels { r#type: ty.into() })
            .inc();
    }

    /// Counts one resource proxy request.
    pub fn resource_proxy(&self, verb: &str, outcome: &str) {
        self.resource_proxy_requests
            .get_or_create(&ProxyLabels {
                verb: verb.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Records one applied event from the principal.
    pub fn applied(&self, resource_type: &str, ok: bool, seconds: f64, since_queued: Option<f64>) {
        self.event_processing
            .get_or_create(&ProcessingLabels {
                status: if ok { "success" } else { "failure" }.into(),
                resource_type: resource_type.into(),
            })
            .observe(seconds);
        if let Some(latency) = since_queued.filter(|l| *l >= 0.0) {
            self.propagation_latency
                .get_or_create(&ResourceTypeLabels {
                    resource_type: resource_type.into(),
                })
                .observe(latency);
        }
    }

    /// Copies the queue's depth and resend total into the metrics.
    pub fn sample_queue(&self, queue: &argocd_agent_domain::SendQueue) {
        self.queue_depth
            .set(i64::try_from(queue.len()).unwrap_or(i64::MAX));
        let total = queue.resends();
        let counted = self.resends.get();
        self.resends.inc_by(total.saturating_sub(counted));
    }

    /// The connection came up (`true`) or went down.
    pub fn connection(&self, up: bool) {
        self.connection_status.set(up as i64);
        if up {
            self.connections.inc();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            self.connection_start.set(now);
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
