//! Prometheus metrics of the agent: upstream argocd-agent's series under upstream's names,
//! types, labels and buckets ([`Upstream`], from upstream's `internal/metrics/metrics.go`),
//! then ours (`argocd_agent_*`). Each is registered under the name `/metrics` exposes it with
//! (see [`argocd_agent_runtime::exposition`]): our counters end in `_total`.

use std::sync::Arc;

use argocd_agent_domain::{AgentMode, ResourceKind};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of `argocd_agent_events_received_total` and `argocd_agent_events_sent_total`
/// (ours: upstream's `agent_events_received` and `agent_events_sent` have no labels).
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
    /// `managed` or `autonomous`.
    pub agent_mode: String,
    /// See [`argocd_agent_domain::ResourceKind::target_name`].
    pub resource_type: String,
}

/// Labels of upstream's `agent_event_propagation_latency_seconds` and `agent_errors`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceTypeLabels {
    /// See [`argocd_agent_domain::ResourceKind::target_name`].
    pub resource_type: String,
}

/// Labels of upstream's `argocd_agent_event_writer_events_discarded_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DiscardLabels {
    /// The event type's verb.
    pub event_type: String,
    /// See [`argocd_agent_domain::ResourceKind::target_name`].
    pub resource_type: String,
}

/// Labels of upstream's `argocd_agent_redis_proxy_requests_total` and
/// `argocd_agent_redis_proxy_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CommandLabels {
    /// `get` or `subscribe`.
    pub command: String,
}

/// Labels of `argocd_agent_resource_proxy_responses_total`.
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

/// Labels of `argocd_agent_guard_refused_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardLabels {
    /// What was refused: `Application`, `AppProject`, `Repository`, `GPGKeys`, `Operation`.
    pub kind: String,
    /// The guard rule that refused it (see [`crate::guard::Refusal::rule`]).
    pub rule: String,
}

/// Labels of `argocd_agent_guard_reload_errors_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GuardSourceLabels {
    /// `file` or `configmap`.
    pub source: String,
}

/// Upstream's histograms: Go's default buckets.
fn go_histogram() -> Histogram {
    Histogram::new(argocd_agent_runtime::exposition::GO_DEFAULT_BUCKETS)
}

/// Upstream argocd-agent's agent series.
#[derive(Clone)]
pub struct Upstream {
    /// `agent_events_received`.
    pub events_received: Counter,
    /// `agent_events_sent`.
    pub events_sent: Counter,
    /// `agent_event_processing_time{status,agent_mode,resource_type}` (seconds).
    pub event_processing: Family<ProcessingLabels, Histogram>,
    /// `agent_event_propagation_latency_seconds{resource_type}`: from the event's `time`
    /// (set when the principal queued it) to the agent having applied it.
    pub propagation_latency: Family<ResourceTypeLabels, Histogram>,
    /// `argocd_agent_event_writer_events_discarded_total{event_type,resource_type}`: events
    /// to the principal dropped on a full queue (resync repairs them).
    pub events_discarded: Family<DiscardLabels, Counter>,
    /// `agent_errors{resource_type}`: events from the principal that failed to apply.
    pub errors: Family<ResourceTypeLabels, Counter>,
    /// `argocd_agent_connection_status` (1 connected, 0 not).
    pub connection_status: Gauge,
    /// `argocd_agent_connection_start_timestamp_seconds`.
    pub connection_start: Gauge,
    /// `argocd_agent_connections_total`.
    pub connections: Counter,
    /// `argocd_agent_auth_failures_total`: streams the principal refused (unauthenticated
    /// or permission denied).
    pub auth_failures: Counter,
    /// `argocd_agent_resource_proxy_requests_total`.
    pub resource_proxy_requests: Counter,
    /// `argocd_agent_resource_proxy_errors_total`.
    pub resource_proxy_errors: Counter,
    /// `argocd_agent_redis_proxy_requests_total{command}`.
    pub redis_proxy_requests: Family<CommandLabels, Counter>,
    /// `argocd_agent_redis_proxy_errors_total{command}`.
    pub redis_proxy_errors: Family<CommandLabels, Counter>,
}

impl Upstream {
    fn new() -> Upstream {
        Upstream {
            events_received: Counter::default(),
            events_sent: Counter::default(),
            event_processing: Family::new_with_constructor(go_histogram),
            propagation_latency: Family::new_with_constructor(go_histogram),
            events_discarded: Family::default(),
            errors: Family::default(),
            connection_status: Gauge::default(),
            connection_start: Gauge::default(),
            connections: Counter::default(),
            auth_failures: Counter::default(),
            resource_proxy_requests: Counter::default(),
            resource_proxy_errors: Counter::default(),
            redis_proxy_requests: Family::default(),
            redis_proxy_errors: Family::default(),
        }
    }

    /// Registers upstream's series in upstream's order (`NewAgentMetrics`).
    fn register(&self, r: &mut Registry) {
        let help = "The total number of events received by agent";
        r.register("agent_events_received", help, self.events_received.clone());
        let help = "The total number of events sent by agent";
        r.register("agent_events_sent", help, self.events_sent.clone());
        let help = "Histogram of time taken to process events (in seconds)";
        r.register(
            "agent_event_processing_time",
            help,
            self.event_processing.clone(),
        );
        let help = "Histogram of time from principal send to agent processing (in seconds)";
        let latency = self.propagation_latency.clone();
        r.register("agent_event_propagation_latency_seconds", help, latency);
        let help = "Events to the principal dropped on a full queue (resync repairs them)";
        let discarded = self.events_discarded.clone();
        r.register(
            "argocd_agent_event_writer_events_discarded_total",
            help,
            discarded,
        );
        let help = "The total number of errors occurred in agent";
        r.register("agent_errors", help, self.errors.clone());
        let help = "Whether the agent is connected to the principal (1) or not (0)";
        r.register(
            "argocd_agent_connection_status",
            help,
            self.connection_status.clone(),
        );
        let help = "When the current connection to the principal was established (Unix seconds)";
        let start = self.connection_start.clone();
        r.register(
            "argocd_agent_connection_start_timestamp_seconds",
            help,
            start,
        );
        let help = "Connections established to the principal";
        r.register(
            "argocd_agent_connections_total",
            help,
            self.connections.clone(),
        );
        let help = "Streams the principal refused (unauthenticated or permission denied)";
        r.register(
            "argocd_agent_auth_failures_total",
            help,
            self.auth_failures.clone(),
        );
        let help = "The total number of resource proxy requests processed by the agent";
        let requests = self.resource_proxy_requests.clone();
        r.register("argocd_agent_resource_proxy_requests_total", help, requests);
        let help = "The total number of resource proxy request failures on the agent";
        let errors = self.resource_proxy_errors.clone();
        r.register("argocd_agent_resource_proxy_errors_total", help, errors);
        let help = "The total number of Redis proxy requests processed by the agent";
        let requests = self.redis_proxy_requests.clone();
        r.register("argocd_agent_redis_proxy_requests_total", help, requests);
        let help = "The total number of Redis proxy request failures on the agent";
        let errors = self.redis_proxy_errors.clone();
        r.register("argocd_agent_redis_proxy_errors_total", help, errors);
        argocd_agent_runtime::exposition::register_build_info(r);
    }
}

/// All metrics of the agent.
#[derive(Clone)]
pub struct Metrics {
    /// Upstream's series.
    pub upstream: Upstream,
    /// `argocd_agent_events_received_total{type}`.
    pub events_received: Family<TypeLabels, Counter>,
    /// `argocd_agent_events_sent_total{type}`.
    pub events_sent: Family<TypeLabels, Counter>,
    /// `argocd_agent_svid_expiry_timestamp_seconds`.
    pub svid_expiry: Gauge,
    /// `argocd_agent_svid_rotations_total`.
    pub svid_rotations: Counter,
    /// `argocd_agent_queue_depth`: events to the principal queued or unacknowledged.
    pub queue_depth: Gauge,
    /// `argocd_agent_event_resends_total`.
    pub resends: Counter,
    /// `argocd_agent_resource_proxy_responses_total{verb,outcome}`: resource proxy requests
    /// (verbs get, list, create, patch, delete, log, exec, update, other) by outcome
    /// (allowed, forbidden, error).
    pub resource_proxy_responses: Family<ProxyLabels, Counter>,
    /// `argocd_agent_applications_refused_total{reason}`: Applications the agent would not
    /// take or publish because of their namespace or name (see [`crate::namespaces`]).
    pub applications_refused: Family<RefusedLabels, Counter>,
    /// `argocd_agent_guard_refused_total{kind,rule}`: what the hub sent that the spoke
    /// guard refused (see [`crate::guard`]).
    pub guard_refused: Family<GuardLabels, Counter>,
    /// `argocd_agent_guard_reload_errors_total{source}`: live guard updates refused (the
    /// last good policy stayed in force).
    pub guard_reload_errors: Family<GuardSourceLabels, Counter>,
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
        let mut m = Metrics {
            upstream: Upstream::new(),
            events_received: Family::default(),
            events_sent: Family::default(),
            svid_expiry: Gauge::default(),
            svid_rotations: Counter::default(),
            queue_depth: Gauge::default(),
            resends: Counter::default(),
            resource_proxy_responses: Family::default(),
            applications_refused: Family::default(),
            guard_refused: Family::default(),
            guard_reload_errors: Family::default(),
            registry: Arc::default(),
        };
        // Families are registered (and so exposed) in this order: upstream's first.
        m.upstream.register(&mut r);
        r.register_collector(Box::new(argocd_agent_runtime::telemetry::SpanCollector {
            prefix: "argocd_agent",
        }));
        m.register_ours(&mut r);
        m.registry = Arc::new(r);
        m
    }

    /// Our series: events by type, the SVID, acknowledgements, resource proxy outcomes.
    fn register_ours(&self, r: &mut Registry) {
        let help = "Events received from the principal, by type";
        r.register(
            "argocd_agent_events_received_total",
            help,
            self.events_received.clone(),
        );
        let help = "Events sent to the principal, by type";
        r.register(
            "argocd_agent_events_sent_total",
            help,
            self.events_sent.clone(),
        );
        let help = "notAfter of the agent's X.509-SVID (Unix seconds)";
        r.register(
            "argocd_agent_svid_expiry_timestamp_seconds",
            help,
            self.svid_expiry.clone(),
        );
        let help = "X.509-SVID updates received";
        r.register(
            "argocd_agent_svid_rotations_total",
            help,
            self.svid_rotations.clone(),
        );
        let help = "Events to the principal queued or waiting for an acknowledgement";
        r.register("argocd_agent_queue_depth", help, self.queue_depth.clone());
        let help = "Events sent again because no acknowledgement came in time";
        r.register(
            "argocd_agent_event_resends_total",
            help,
            self.resends.clone(),
        );
        let help = "Resource proxy requests from the principal, by verb and outcome (allowed, forbidden, error)";
        let responses = self.resource_proxy_responses.clone();
        r.register(
            "argocd_agent_resource_proxy_responses_total",
            help,
            responses,
        );
        let help = "Applications refused for their namespace or name, by reason (namespace_not_permitted, namespace_missing, name_collision, name_too_long)";
        r.register(
            "argocd_agent_applications_refused_total",
            help,
            self.applications_refused.clone(),
        );
        let help =
            "Objects and operations from the hub refused by the spoke guard, by kind and rule";
        r.register(
            "argocd_agent_guard_refused_total",
            help,
            self.guard_refused.clone(),
        );
        let help = "Spoke guard updates refused (the last good policy stayed in force), by source (file, configmap)";
        r.register(
            "argocd_agent_guard_reload_errors_total",
            help,
            self.guard_reload_errors.clone(),
        );
    }

    /// Counts one thing of `kind` the spoke guard refused by `rule`.
    pub fn guard_refused(&self, kind: &str, rule: &str) {
        self.guard_refused
            .get_or_create(&GuardLabels {
                kind: kind.into(),
                rule: rule.into(),
            })
            .inc();
    }

    /// Counts one refused live update of the guard's `source`.
    pub fn guard_reload_error(&self, source: &str) {
        self.guard_reload_errors
            .get_or_create(&GuardSourceLabels {
                source: source.into(),
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

    /// The registry's OpenMetrics text (`/metrics` serves it as text 0.0.4, see
    /// [`argocd_agent_runtime::exposition`]).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Counts an event sent to (`sent`) or received from the principal.
    pub fn event(&self, sent: bool, ty: &str) {
        let (upstream, ours) = if sent {
            (&self.upstream.events_sent, &self.events_sent)
        } else {
            (&self.upstream.events_received, &self.events_received)
        };
        upstream.inc();
        ours.get_or_create(&TypeLabels { r#type: ty.into() }).inc();
    }

    /// Counts one resource proxy request and its outcome (`error` counts as upstream's
    /// failure).
    pub fn resource_proxy(&self, verb: &str, outcome: &str) {
        self.upstream.resource_proxy_requests.inc();
        if outcome == "error" {
            self.upstream.resource_proxy_errors.inc();
        }
        self.resource_proxy_responses
            .get_or_create(&ProxyLabels {
                verb: verb.into(),
                outcome: outcome.into(),
            })
            .inc();
    }

    /// Counts one Redis request of the principal (`get`, `subscribe`), or (`failed`) one
    /// answered with an error.
    pub fn redis_proxy(&self, command: &str, failed: bool) {
        let family = if failed {
            &self.upstream.redis_proxy_errors
        } else {
            &self.upstream.redis_proxy_requests
        };
        family
            .get_or_create(&CommandLabels {
                command: command.into(),
            })
            .inc();
    }

    /// Counts an event to the principal dropped on a full queue.
    pub fn discarded(&self, event_type: &str, kind: Option<ResourceKind>) {
        self.upstream
            .events_discarded
            .get_or_create(&DiscardLabels {
                event_type: event_type.into(),
                resource_type: kind.map_or("unknown", ResourceKind::target_name).into(),
            })
            .inc();
    }

    /// Records one applied event from the principal (a failure also in `agent_errors`).
    pub fn applied(
        &self,
        kind: ResourceKind,
        mode: AgentMode,
        ok: bool,
        seconds: f64,
        since_queued: Option<f64>,
    ) {
        let resource_type = kind.target_name().to_owned();
        if !ok {
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
                status: if ok { "success" } else { "failure" }.into(),
                agent_mode: mode.as_str().into(),
                resource_type: resource_type.clone(),
            })
            .observe(seconds);
        if let Some(latency) = since_queued.filter(|l| *l >= 0.0) {
            self.upstream
                .propagation_latency
                .get_or_create(&ResourceTypeLabels { resource_type })
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
        self.upstream.connection_status.set(up as i64);
        if up {
            self.upstream.connections.inc();
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs() as i64)
                .unwrap_or(0);
            self.upstream.connection_start.set(now);
        }
    }

    /// Follows an SVID source: expiry gauge and rotation counter.
    pub fn follow_svid(&self, source: &argocd_agent_identity::source::SvidSource) {
        argocd_agent_runtime::svid::follow_svid(source, &self.svid_expiry, &self.svid_rotations);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_series_are_exposed_under_upstreams_names() {
        let m = Metrics::new();
        m.event(false, "spec-update");
        m.applied(
            ResourceKind::Application,
            AgentMode::Managed,
            false,
            0.3,
            Some(0.02),
        );
        m.discarded("status-update", Some(ResourceKind::Application));
        m.resource_proxy("get", "error");
        m.redis_proxy("get", false);
        m.connection(true);
        let text = argocd_agent_runtime::exposition::openmetrics_to_text(&m.encode()).unwrap();
        for line in [
            "agent_events_received 1",
            "argocd_agent_events_received_total{type=\"spec-update\"} 1",
            "agent_errors{resource_type=\"application\"} 1",
            "agent_event_processing_time_count{status=\"failure\",agent_mode=\"managed\",resource_type=\"application\"} 1",
            "agent_event_propagation_latency_seconds_bucket{le=\"0.025\",resource_type=\"application\"} 1",
            "argocd_agent_event_writer_events_discarded_total{event_type=\"status-update\",resource_type=\"application\"} 1",
            "argocd_agent_resource_proxy_requests_total 1",
            "argocd_agent_resource_proxy_errors_total 1",
            "argocd_agent_resource_proxy_responses_total{verb=\"get\",outcome=\"error\"} 1",
            "argocd_agent_redis_proxy_requests_total{command=\"get\"} 1",
            "argocd_agent_connections_total 1",
            "argocd_agent_connection_status 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
        assert!(!text.contains("_total_total"), "{text}");
    }
}
