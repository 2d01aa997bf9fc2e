//! The principal's `/healthz` and `/readyz` (with `/metrics`): what readiness means for the
//! principal, and the endpoint that serves it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::metrics::Metrics;

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
    pub fn check(&self) -> Result<(), NotReady> {
        let mut reasons = Vec::new();
        if !*self.synced.borrow() {
            reasons.push(
                "hub watches (Applications, AppProjects, repository Secrets, ConfigMaps) have not listed yet"
                    .to_owned(),
            );
        }
        if let Some(Err(e)) = self.svid.as_ref().map(|s| s.readiness()) {
            reasons.push(e.to_string());
        }
        reasons.extend(
            self.checks
                .iter()
                .filter_map(|check| check().err().map(|e| e.to_string())),
        );
        if reasons.is_empty() {
            Ok(())
        } else {
            Err(NotReady(reasons))
        }
    }
}

/// Why the principal is not ready: every reason, in order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not ready: {}", .0.join("; "))]
pub struct NotReady(pub Vec<String>);

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
    let on_close: argocd_agent_listener::OnClose = match &metrics {
        Some(m) => {
            let m = m.clone();
            Arc::new(move |reason| m.listener_closed("metrics", reason))
        }
        None => Arc::new(|_| {}),
    };
    let endpoints = Endpoints {
        live: Endpoints::always_live(),
        ready: Arc::new(move || ready.check().map_err(Into::into)),
        metrics: metrics.map(|m| Arc::new(move || m.encode()) as health::Scrape),
        on_close,
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
        let why = r.check().unwrap_err().to_string();
        assert!(why.starts_with("not ready: hub watches"), "{why}");
        assert!(why.ends_with("; replica Lease not renewed"), "{why}");
        tx.send_replace(true);
        assert_eq!(
            r.check().unwrap_err().to_string(),
            "not ready: replica Lease not renewed"
        );
        lease.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(r.check().is_ok());
    }
}
