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
    /// A session with the principal is up (`/healthz` answers 503 while not).
    pub connected: Arc<AtomicBool>,
    /// The local caches have listed once.
    pub ready: watch::Receiver<bool>,
    /// With SVID mTLS: the agent's SVID source (ready only with an unexpired SVID).
    pub svid: Option<argocd_agent_identity::source::SvidSource>,
    /// What `/metrics` serves.
    pub metrics: crate::metrics::Metrics,
}

impl HealthState {
    /// `Ok`, or every reason the agent is not ready.
    pub fn readiness(&self) -> Result<(), NotReady> {
        let mut reasons = Vec::new();
        if !*self.ready.borrow() {
            reasons.push("local caches (Applications, AppProjects, repositories, GPG keys) have not listed yet".to_owned());
        }
        if let Some(Err(e)) = self.svid.as_ref().map(|s| s.readiness()) {
            reasons.push(e.to_string());
        }
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(NotReady(reasons))
        }
    }
}

/// Every reason the agent is not ready (not empty).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not ready: {}", .0.join("; "))]
pub struct NotReady(pub Vec<String>);

/// Binds `addr` and serves `/healthz`, `/readyz` and (with `with_metrics`) `/metrics` until
/// `shutdown`: the endpoint both binaries share, with the agent's verdicts.
pub async fn serve(
    addr: SocketAddr,
    state: HealthState,
    with_metrics: bool,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    use argocd_agent_runtime::health::{self, Endpoints};
    let connected = state.connected.clone();
    let metrics = state.metrics.clone();
    let endpoints = Endpoints {
        live: Arc::new(move || {
            if connected.load(Ordering::Relaxed) {
                Ok(())
            } else {
                Err("not connected to principal".into())
            }
        }),
        ready: Arc::new(move || state.readiness().map_err(Into::into)),
        metrics: with_metrics.then(|| Arc::new(move || metrics.encode()) as health::Scrape),
        on_close: Arc::new(|reason| {
            tracing::debug!(reason, "metrics listener closed a connection");
        }),
    };
    health::serve(addr, endpoints, tasks, shutdown).await
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
        let why = state.readiness().unwrap_err().to_string();
        assert!(why.starts_with("not ready: local caches"), "{why}");
        tx.send_replace(true);
        assert!(state.readiness().is_ok());
    }
}
