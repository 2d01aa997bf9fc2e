//! The agent's HTTP endpoint: `/healthz` (503 while disconnected from the principal, as
//! upstream), `/readyz` (503 until the agent has its SVID and its local cache is synced) and
//! `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// What the endpoint reports.
#[derive(Clone)]
pub struct HealthState {
    pub connected: Arc<AtomicBool>,
    /// The local caches have listed once.
    pub ready: watch::Receiver<bool>,
    /// With SVID mTLS: the agent's SVID source (ready only with an unexpired SVID).
    pub svid: Option<argocd_agent_identity::source::SvidSource>,
    pub metrics: crate::metrics::Metrics,
}

impl HealthState {
    /// `Ok`, or every reason the agent is not ready.
    pub fn readiness(&self) -> Result<(), String> {
        let mut reasons = Vec::new();
        if !*self.ready.borrow() {
            reasons.push("local caches (Applications, AppProjects, repositories, GPG keys) have not listed yet".to_owned());
        }
        if let Some(Err(e)) = self.svid.as_ref().map(|s| s.readiness()) {
            reasons.push(e);
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(format!("not ready: {}", reasons.join("; ")))
        }
    }
}

/// Binds `addr` and serves `/healthz`, `/readyz` and (with `with_metrics`) `/metrics` until
/// `shutdown`.
pub async fn serve(
    addr: SocketAddr,
    state: HealthState,
    with_metrics: bool,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = probe_routes(&state);
    let app = if !with_metrics {
        app
    } else {
        metrics_route(app, state.metrics.clone())
    };
    let handler = move |req: http::Request<hyper::body::Incoming>, _peer: SocketAddr| {
        let app = app.clone();
        async move {
            use tower::ServiceExt;
            match app.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
    };
    let on_close: argocd_agent_identity::listener::OnClose = Arc::new(|reason| {
        tracing::debug!(reason, "metrics listener closed a connection");
    });
    argocd_agent_identity::listener::serve(
        listener,
        None,
        argocd_agent_identity::listener::Limits::metrics(),
        handler,
        on_close,
        tasks,
        shutdown,
    );
    Ok(local)
}

/// `/healthz` (the connection to the principal) and `/readyz` ([`HealthState::readiness`]).
fn probe_routes(state: &HealthState) -> axum::Router {
    use axum::routing::get;
    let (connected, ready) = (state.connected.clone(), state.clone());
    axum::Router::new()
        .route(
            "/healthz",
            get(move || {
                let up = connected.load(Ordering::Relaxed);
                async move {
                    if up {
                        (http::StatusCode::OK, "ok")
                    } else {
                        (
                            http::StatusCode::SERVICE_UNAVAILABLE,
                            "not connected to principal",
                        )
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let verdict = ready.readiness();
                async move {
                    match verdict {
                        Ok(()) => (http::StatusCode::OK, "ready".to_owned()),
                        Err(why) => (http::StatusCode::SERVICE_UNAVAILABLE, why),
                    }
                }
            }),
        )
}

/// `app` with `/metrics`, the OpenMetrics text of `metrics`.
fn metrics_route(app: axum::Router, metrics: crate::metrics::Metrics) -> axum::Router {
    use axum::routing::get;
    app.route(
        "/metrics",
        get(move || {
            let body = metrics.encode();
            async move {
                (
                    [(
                        http::header::CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                )
            }
        }),
    )
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
    async fn readyz_follows_the_cache_and_healthz_the_connection() {
        let (tx, rx) = watch::channel(false);
        let connected = Arc::new(AtomicBool::new(false));
        let tasks = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let state = HealthState {
            connected: connected.clone(),
            ready: rx,
            svid: None,
            metrics: crate::metrics::Metrics::new(),
        };
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            state,
            true,
            &tasks,
            shutdown.clone(),
        )
        .await
        .unwrap();
        assert_eq!(status(addr, "/readyz").await, 503);
        assert_eq!(status(addr, "/healthz").await, 503);
        tx.send_replace(true);
        connected.store(true, Ordering::Relaxed);
        assert_eq!(status(addr, "/readyz").await, 200);
        assert_eq!(status(addr, "/healthz").await, 200);
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
    }

    #[test]
    fn readiness_says_why_not() {
        let (tx, rx) = watch::channel(false);
        let state = HealthState {
            connected: Arc::new(AtomicBool::new(true)),
            ready: rx,
            svid: None,
            metrics: crate::metrics::Metrics::new(),
        };
        let why = state.readiness().unwrap_err();
        assert!(why.starts_with("not ready: local caches"), "{why}");
        tx.send_replace(true);
        assert!(state.readiness().is_ok());
    }
}
