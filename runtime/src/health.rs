//! The HTTP endpoint both binaries serve for the kubelet and Prometheus: `/healthz`
//! (liveness), `/readyz` (readiness) and, when given, `/metrics` (text exposition
//! format 0.0.4, as upstream serves it; see [`crate::exposition`]), on the
//! bounded listener every endpoint of ours uses (`argocd_agent_listener`: connection caps,
//! per-stage timeouts).
//! When its connections are taken (64, 8 per client address), 16 more (4 per address) are
//! reserved for `/healthz` and `/readyz`: one request each, headers within 2 s, anything
//! else answered 503; the liveness probe is not starved by a full metrics listener.

use std::net::SocketAddr;
use std::sync::Arc;

use argocd_agent_listener::{self as listener, Limits, OnClose};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Why a probe fails: the caller's own error, shown as the body of the 503 answer.
pub type ProbeError = Box<dyn std::error::Error + Send + Sync>;

/// A probe: `Ok`, or why not.
pub type Probe = Arc<dyn Fn() -> Result<(), ProbeError> + Send + Sync>;

/// The OpenMetrics text of a registry, taken at each scrape (served as text 0.0.4).
pub type Scrape = Arc<dyn Fn() -> String + Send + Sync>;

/// What one endpoint answers.
#[derive(Clone)]
pub struct Endpoints {
    /// `/healthz`: 200 `ok`, or 503 with the reason.
    pub live: Probe,
    /// `/readyz`: 200 `ready`, or 503 with every reason the process is not ready.
    pub ready: Probe,
    /// `/metrics`, when this endpoint serves metrics.
    pub metrics: Option<Scrape>,
    /// Told why the listener closed a connection (timeouts, caps), for a metric or a log line.
    pub on_close: OnClose,
}

impl Endpoints {
    /// A liveness probe that always passes: the process answers HTTP.
    pub fn always_live() -> Probe {
        Arc::new(|| Ok(()))
    }
}

/// Binds `addr` and serves `endpoints` on it until `shutdown`; connections are tasks on
/// `tasks`. Returns the bound address (`addr` may ask for port 0).
pub async fn serve(
    addr: SocketAddr,
    endpoints: Endpoints,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let tcp = tokio::net::TcpListener::bind(addr).await?;
    let local = tcp.local_addr()?;
    let on_close = endpoints.on_close.clone();
    let app = router(endpoints);
    let handler = move |req: http::Request<hyper::body::Incoming>, _peer: SocketAddr| {
        let app = app.clone();
        async move {
            use tower::ServiceExt;
            if let Some(busy) = busy_for(&req) {
                return busy;
            }
            match app.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
    };
    listener::serve(
        tcp,
        None,
        Limits::metrics(),
        handler,
        on_close,
        tasks,
        shutdown,
    );
    Ok(local)
}

/// On a connection taken from the pool reserved for the probes (the shared one was full):
/// 503 for anything but `/healthz` and `/readyz`.
fn busy_for(
    req: &http::Request<hyper::body::Incoming>,
) -> Option<http::Response<axum::body::Body>> {
    let reserved = req
        .extensions()
        .get::<listener::ReservedConnection>()
        .is_some();
    if !reserved || matches!(req.uri().path(), "/healthz" | "/readyz") {
        return None;
    }
    let mut busy = http::Response::new(axum::body::Body::from(
        "listener full: only /healthz and /readyz are answered on this connection\n",
    ));
    *busy.status_mut() = http::StatusCode::SERVICE_UNAVAILABLE;
    Some(busy)
}

/// The routes of `endpoints`.
fn router(endpoints: Endpoints) -> axum::Router {
    use axum::routing::get;
    let (live, ready) = (endpoints.live, endpoints.ready);
    let app = axum::Router::new()
        .route("/healthz", get(move || answer(live(), "ok")))
        .route("/readyz", get(move || answer(ready(), "ready")));
    match endpoints.metrics {
        None => app,
        Some(scrape) => app.route(
            "/metrics",
            get(move || {
                let body = crate::exposition::openmetrics_to_text(&scrape());
                async move { exposition(body) }
            }),
        ),
    }
}

/// 200 with the text exposition, or 500 with why the registry's text could not be rewritten.
fn exposition(
    body: Result<String, crate::exposition::ExpositionError>,
) -> (
    http::StatusCode,
    [(http::HeaderName, &'static str); 1],
    String,
) {
    let ct = http::header::CONTENT_TYPE;
    match body {
        Ok(text) => (
            http::StatusCode::OK,
            [(ct, crate::exposition::TEXT_CONTENT_TYPE)],
            text,
        ),
        Err(e) => (
            http::StatusCode::INTERNAL_SERVER_ERROR,
            [(ct, "text/plain; charset=utf-8")],
            e.to_string(),
        ),
    }
}

/// 200 with `ok`, or 503 with the reason.
async fn answer(verdict: Result<(), ProbeError>, ok: &'static str) -> (http::StatusCode, String) {
    match verdict {
        Ok(()) => (http::StatusCode::OK, ok.to_owned()),
        Err(why) => (http::StatusCode::SERVICE_UNAVAILABLE, why.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        (status, body)
    }

    /// The `content-type` header of the answer to `path`.
    async fn content_type(addr: SocketAddr, path: &str) -> String {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        out.lines()
            .find_map(|l| l.strip_prefix("content-type: "))
            .unwrap_or_default()
            .to_owned()
    }

    #[tokio::test]
    async fn probes_answer_their_verdicts_and_metrics_only_when_given() {
        let up = Arc::new(AtomicBool::new(false));
        let flag = up.clone();
        let endpoints = Endpoints {
            live: Endpoints::always_live(),
            ready: Arc::new(move || {
                if flag.load(Ordering::Relaxed) {
                    Ok(())
                } else {
                    Err("not ready: caches".into())
                }
            }),
            metrics: None,
            on_close: Arc::new(|_| {}),
        };
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            endpoints.clone(),
            &tasks,
            stop.clone(),
        )
        .await
        .unwrap();
        assert_eq!(get(addr, "/healthz").await, (200, "ok".into()));
        assert_eq!(
            get(addr, "/readyz").await,
            (503, "not ready: caches".into())
        );
        up.store(true, Ordering::Relaxed);
        assert_eq!(get(addr, "/readyz").await, (200, "ready".into()));
        assert_eq!(get(addr, "/metrics").await.0, 404);

        let with_metrics = Endpoints {
            metrics: Some(Arc::new(|| "# TYPE c counter\nc_total 1\n# EOF\n".into())),
            ..endpoints.clone()
        };
        let addr = serve(
            "127.0.0.1:0".parse().unwrap(),
            with_metrics,
            &tasks,
            stop.clone(),
        )
        .await
        .unwrap();
        assert_eq!(
            get(addr, "/metrics").await,
            (200, "# TYPE c counter\nc 1\n".into())
        );
        assert_eq!(
            content_type(addr, "/metrics").await,
            crate::exposition::TEXT_CONTENT_TYPE
        );

        // A registry text that cannot be rewritten is a 500 saying why, not an empty scrape.
        let broken = Endpoints {
            metrics: Some(Arc::new(|| "# TYPE c counter\nc_total 1\n".into())),
            ..endpoints
        };
        let addr = serve("127.0.0.1:0".parse().unwrap(), broken, &tasks, stop.clone())
            .await
            .unwrap();
        let (code, body) = get(addr, "/metrics").await;
        assert_eq!(code, 500);
        assert!(body.contains("no # EOF"), "{body}");
        stop.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
