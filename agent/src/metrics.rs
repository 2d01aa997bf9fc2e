//! Prometheus metrics of the agent. Names follow upstream argocd-agent where it has the
//! metric (counters carry the OpenMetrics `_total` suffix), `argocd_agent_*` otherwise.

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of `agent_events_received_total` and `agent_events_sent_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TypeLabels {
    /// The event type's verb (`create`, `spec-update`, `ping`, ...).
    pub r#type: String,
}

/// Labels of `agent_event_processing_time`, as upstream.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcessingLabels {
    /// `success`, or `failure` when the agent answered the event with an error.
    pub status: String,
    /// The resource kind (`Application`, `AppProject`, `Repository`, `GPGKeys`).
    pub resource_type: String,
}

/// Labels of `agent_event_propagation_latency_seconds`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceTypeLabels {
    /// The resource kind (`Application`, `AppProject`, `Repository`, `GPGKeys`).
    pub resource_type: String,
}

/// Labels of `argocd_agent_resource_proxy_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProxyLabels {
    /// `get`, `list`, `create`, `patch`, `delete`, `log`, `exec`, `update` or `other`.
    pub verb: String,
    /// `allowed`, `forbidden` or `error`.
    pub outcome: String,
}

/// Labels of `argocd_agent_applications_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusedLabels {
    /// `namespace_not_permitted`, `namespace_missing`, `name_collision` or `name_too_long`.
    pub reason: String,
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
    /// `argocd_agent_applications_refused_total{reason}`: Applications the agent would not
    /// take or publish because of their namespace or name (see [`crate::namespaces`]).
    pub applications_refused: Family<RefusedLabels, Counter>,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero, registered for [`Metrics::encode`] (with the span counters).
    pub fn new() -> Metrics {
        let mut r = Registry::default();
        r.register_collector(Box::new(argocd_agent_runtime::telemetry::SpanCollector {
            prefix: "argocd_agent",
        }));
        let mut m = Metrics {
            events_received: Family::default(),
            events_sent: Family::default(),
            event_processing: Family::new_with_constructor(seconds_histogram),
            propagation_latency: Family::new_with_constructor(seconds_histogram),
            connection_status: Gauge::default(),
            connection_start: Gauge::default(),
            connections: Counter::default(),
            auth_failures: Counter::default(),
            events_discarded: Counter::default(),
            svid_expiry: Gauge::default(),
            svid_rotations: Counter::default(),
            queue_depth: Gauge::default(),
            resends: Counter::default(),
            resource_proxy_requests: Family::default(),
            applications_refused: Family::default(),
            registry: Arc::default(),
        };
        // Families are registered (and so exposed) in this order.
        m.register_event_metrics(&mut r);
        m.register_connection_metrics(&mut r);
        m.register_svid_metrics(&mut r);
        m.register_ack_metrics(&mut r);
        m.register_proxy_metrics(&mut r);
        m.register_refusal_metrics(&mut r);
        m.registry = Arc::new(r);
        m
    }

    /// Events exchanged with the principal: counts, processing time, propagation latency.
    fn register_event_metrics(&self, r: &mut Registry) {
        r.register(
            "agent_events_received",
            "Events received from the principal",
            self.events_received.clone(),
        );
        r.register(
            "agent_events_sent",
            "Events sent to the principal",
            self.events_sent.clone(),
        );
        r.register(
            "agent_event_processing_time",
            "Time to apply an event from the principal, in seconds",
            self.event_processing.clone(),
        );
        r.register(
            "agent_event_propagation_latency_seconds",
            "Time from the principal queueing an event to the agent having applied it",
            self.propagation_latency.clone(),
        );
    }

    /// The connection to the principal: its state, refused streams, events it dropped.
    fn register_connection_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_agent_connection_status",
            "Whether the agent is connected to the principal (1) or not (0)",
            self.connection_status.clone(),
        );
        r.register(
            "argocd_agent_connection_start_timestamp_seconds",
            "When the current connection to the principal was established (Unix seconds)",
            self.connection_start.clone(),
        );
        r.register(
            "argocd_agent_connections",
            "Connections established to the principal",
            self.connections.clone(),
        );
        r.register(
            "argocd_agent_auth_failures",
            "Streams the principal refused (unauthenticated or permission denied)",
            self.auth_failures.clone(),
        );
        r.register(
            "argocd_agent_event_writer_events_discarded",
            "Events to the principal dropped on a full queue",
            self.events_discarded.clone(),
        );
    }

    /// The agent's SVID: its expiry and rotations.
    fn register_svid_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_agent_svid_expiry_timestamp_seconds",
            "notAfter of the agent's X.509-SVID (Unix seconds)",
            self.svid_expiry.clone(),
        );
        r.register(
            "argocd_agent_svid_rotations",
            "X.509-SVID updates received",
            self.svid_rotations.clone(),
        );
    }

    /// Events waiting for an acknowledgement, and those sent again for lack of one.
    fn register_ack_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_agent_queue_depth",
            "Events to the principal queued or waiting for an acknowledgement",
            self.queue_depth.clone(),
        );
        r.register(
            "argocd_agent_event_resends",
            "Events sent again because no acknowledgement came in time",
            self.resends.clone(),
        );
    }

    /// Resource proxy requests from the principal.
    fn register_proxy_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_agent_resource_proxy_requests",
            "Resource proxy requests from the principal, by verb and outcome (allowed, forbidden, error)",
            self.resource_proxy_requests.clone(),
        );
    }

    /// Applications refused for their namespace or name.
    fn register_refusal_metrics(&self, r: &mut Registry) {
        r.register(
            "argocd_agent_applications_refused",
            "Applications refused for their namespace or name, by reason (namespace_not_permitted, namespace_missing, name_collision, name_too_long)",
            self.applications_refused.clone(),
        );
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

    /// Counts one Application refused for `reason` (see [`RefusedLabels`]).
    pub fn refused(&self, reason: &str) {
        self.applications_refused
            .get_or_create(&RefusedLabels {
                reason: reason.into(),
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
