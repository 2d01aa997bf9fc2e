//! Prometheus metrics of the principal, and the `/metrics` + `/healthz` HTTP endpoint.

use std::net::SocketAddr;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    pub agent: String,
    pub r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentReasonLabels {
    pub agent: String,
    pub reason: String,
}

/// All metrics of the principal.
#[derive(Clone)]
pub struct Metrics {
    pub connected_agents: Gauge,
    pub events_received: Family<EventLabels, Counter>,
    pub events_sent: Family<EventLabels, Counter>,
    /// Streams refused before a session existed (unmapped ID, no client certificate, ...).
    pub auth_failures: Family<ReasonLabels, Counter>,
    /// Inbound events refused by authorization or validation.
    pub events_refused: Family<AgentReasonLabels, Counter>,
    /// Hub writes that failed.
    pub hub_write_errors: Counter,
    /// Events dropped because an agent's queue was full.
    pub queue_full: Counter,
    registry: Arc<Registry>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let connected_agents = Gauge::default();
        let events_received = Family::<EventLabels, Counter>::default();
        let events_sent = Family::<EventLabels, Counter>::default();
        let auth_failures = Family::<ReasonLabels, Counter>::default();
        let events_refused = Family::<AgentReasonLabels, Counter>::default();
        let hub_write_errors = Counter::default();
        let queue_full = Counter::default();
        let mut r = Registry::with_prefix("argocd_agent_principal");
        r.register(
            "connected_agents",
            "Agents with an open stream",
            connected_agents.clone(),
        );
        r.register(
            "events_received",
            "Events received from agents",
            events_received.clone(),
        );
        r.register("events_sent", "Events sent to agents", events_sent.clone());
        r.register(
            "auth_failures",
            "Streams refused at authentication",
            auth_failures.clone(),
        );
        r.register(
            "events_refused",
            "Inbound events refused",
            events_refused.clone(),
        );
        r.register(
            "hub_write_errors",
            "Failed writes to the hub cluster",
            hub_write_errors.clone(),
        );
        r.register(
            "queue_full",
            "Events dropped on a full agent queue",
            queue_full.clone(),
        );
        Metrics {
            connected_agents,
            events_received,
            events_sent,
            auth_failures,
            events_refused,
            hub_write_errors,
            queue_full,
            registry: Arc::new(r),
        }
    }

    /// Text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub fn refused(&self, agent: &argocd_agent_identity::AgentName, reason: &str) {
        self.events_refused
            .get_or_create(&AgentReasonLabels {
                agent: agent.to_string(),
                reason: reason.into(),
            })
            .inc();
    }

    pub fn auth_failed(&self, reason: &str) {
        self.auth_failures
            .get_or_create(&ReasonLabels {
                reason: reason.into(),
            })
            .inc();
    }
}

/// Serves `/metrics`, `/healthz` (liveness: the process serves HTTP) and `/readyz` (503
/// until `ready` says the principal can serve agents) until `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    metrics: Metrics,
    ready: tokio::sync::watch::Receiver<bool>,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            http::header::CONTENT_TYPE,
                            "application/openmetrics-text; version=1.0.0; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let ready = *ready.borrow();
                async move {
                    if ready {
                        (http::StatusCode::OK, "ready")
                    } else {
                        (
                            http::StatusCode::SERVICE_UNAVAILABLE,
                            "not ready: hub watch not synced or gRPC listener not serving",
                        )
                    }
                }
            }),
        );
    tasks.spawn(async move {
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
        {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

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
            Metrics::new(),
            rx,
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
}
