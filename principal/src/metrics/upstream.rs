//! Upstream argocd-agent's principal series, under upstream's names, types, labels and
//! histogram buckets.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::ResourceKind;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::labels::{
    AgentNameLabels, AgentNameReasonLabels, DiscardLabels, HubWrite, ProcessingLabels,
    RedisAgentLabels, ResourceTypeLabels,
};

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
    pub(super) hub_writes: Arc<HashMap<(ResourceKind, HubWrite), Counter>>,
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
    pub(super) fn new() -> Upstream {
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
    pub(super) fn register(&mut self, r: &mut Registry) {
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
