//! Serving HTTP (1.1 and 2, plaintext or TLS) with the limits every listener of this
//! project keeps (docs/reliability.md, "Every listener"): a cap on connections, on
//! connections from one client address and on TLS handshakes in progress; a timeout on the
//! handshake, on request headers, and on an idle connection (no request in progress and no
//! response still streaming). The resource proxy and the metrics and health listeners of
//! principal and agent are served through it. (hyper has the header timeout; the caps and
//! the idle timeout across HTTP/1.1 and HTTP/2 are not in hyper or hyper-util.)

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Limits of one listener.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Connections open at once from one client IP address.
    pub max_per_client: usize,
    /// TLS handshakes in progress at once.
    pub max_handshakes: usize,
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// How long a client may take to send a request's headers (HTTP/1.1).
    pub header_timeout: Duration,
    /// A connection with no request in progress for this long is closed (HTTP/1.1 and 2).
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_per_client: 256,
            max_handshakes: 256,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

impl Limits {
    /// For the metrics and health listeners: a scraper and a kubelet, a few connections.
    pub fn metrics() -> Limits {
        Limits {
            max_connections: 64,
            max_per_client: 16,
            max_handshakes: 16,
            idle_timeout: Duration::from_secs(60),
            ..Limits::default()
        }
    }
}

/// Why a connection was refused or closed by the listener (metric label values).
pub const CLOSE_REASONS: [&str; 5] = [
    "TooManyConnections",
    "TooManyFromClient",
    "HandshakeTimeout",
    "HandshakeFailed",
    "IdleTimeout",
];

/// Counts a refused or closed connection by reason (one of [`CLOSE_REASONS`]).
pub type OnClose = Arc<dyn Fn(&'static str) + Send + Sync>;

/// Connections per client address.
#[derive(Default)]
pub struct ClientLimit {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection counted against its client address (released when dropped).
pub struct ClientSlot {
    clients: Arc<ClientLimit>,
    ip: IpAddr,
}

impl ClientLimit {
    /// A slot for one more connection from `ip`, unless it has `max` already.
    pub fn take(self: &Arc<Self>, ip: IpAddr, max: usize) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            clients: Arc::clone(self),
            ip,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Requests in progress on one connection (a response counts until its body has been
/// sent) and when the last one ended.
struct Activity {
    active: AtomicUsize,
    since: Mutex<Instant>,
}

struct Busy(Arc<Activity>);

impl Activity {
    fn enter(self: &Arc<Self>) -> Busy {
        self.active.fetch_add(1, Ordering::SeqCst);
        Busy(self.clone())
    }

    /// Idle for longer than `limit`.
    fn idle_for(&self, limit: Duration) -> bool {
        self.active.load(Ordering::SeqCst) == 0
            && self
                .since
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .elapsed()
                >= limit
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        *self.0.since.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A response body that keeps its connection busy until it has been sent (or dropped).
pub struct Tracked<B> {
    inner: B,
    _busy: Busy,
}

impl<B: Body + Unpin> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What answers one request of a listener: a clonable async function of the request and
/// the client's address (implemented for every such closure).
pub trait Handler:
    Fn(Request<Incoming>, SocketAddr) -> Self::Reply + Clone + Send + Sync + 'static
{
    /// The response body.
    type Body: Body<Data: Send, Error: Into<Box<dyn std::error::Error + Send + Sync>>>
        + Unpin
        + Send
        + 'static;
    /// The answer in progress.
    type Reply: Future<Output = Response<Self::Body>> + Send + 'static;
}

impl<H, F, B> Handler for H
where
    H: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Body = B;
    type Reply = F;
}

/// Serves `handler` on `listener` until `shutdown`: over TLS when `tls` is given, with
/// upgrades (the resource proxy's exec sessions). Each connection runs on `tasks`.
pub fn serve<H: Handler>(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    limits: Limits,
    handler: H,
    on_close: OnClose,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) {
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let handshakes = Arc::new(Semaphore::new(limits.max_handshakes.max(1)));
    let clients = Arc::new(ClientLimit::default());
    let conns = tasks.clone();
    tasks.spawn(async move {
        loop {
            let (tcp, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                accepted = listener.accept() => match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of file descriptors, typically: wait, do not spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let Ok(permit) = connections.clone().try_acquire_owned() else {
                on_close("TooManyConnections");
                tracing::warn!(%peer, limit = limits.max_connections, "connection refused: too many connections");
                continue;
            };
            let Some(slot) = clients.take(peer.ip(), limits.max_per_client.max(1)) else {
                on_close("TooManyFromClient");
                tracing::warn!(%peer, limit = limits.max_per_client, "connection refused: too many connections from this client");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let conn = Connection {
                limits: limits.clone(),
                on_close: on_close.clone(),
                handshakes: handshakes.clone(),
                shutdown: shutdown.clone(),
                peer,
            };
            let (tls, handler) = (tls.clone(), handler.clone());
            conns.spawn(async move {
                conn.run(tcp, tls, handler, permit, slot).await;
            });
        }
    });
}

struct Connection {
    limits: Limits,
    on_close: OnClose,
    handshakes: Arc<Semaphore>,
    shutdown: CancellationToken,
    peer: SocketAddr,
}

impl Connection {
    async fn run<H: Handler>(
        self,
        tcp: tokio::net::TcpStream,
        tls: Option<tokio_rustls::TlsAcceptor>,
        handler: H,
        _permit: OwnedSemaphorePermit,
        _slot: ClientSlot,
    ) {
        let peer = self.peer;
        match tls {
            None => self.http(TokioIo::new(tcp), handler).await,
            Some(acceptor) => {
                let Ok(_handshake) = self.handshakes.clone().try_acquire_owned() else {
                    (self.on_close)("TooManyConnections");
                    tracing::warn!(%peer, "connection refused: too many TLS handshakes in progress");
                    return;
                };
                let stream =
                    match tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(tcp))
                        .await
                    {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            (self.on_close)("HandshakeFailed");
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            (self.on_close)("HandshakeTimeout");
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                drop(_handshake);
                self.http(TokioIo::new(stream), handler).await
            }
        }
    }

    async fn http<I, H: Handler>(self, io: TokioIo<I>, handler: H)
    where
        I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let peer = self.peer;
        let activity = Arc::new(Activity {
            active: AtomicUsize::new(0),
            since: Mutex::new(Instant::now()),
        });
        let busy = activity.clone();
        let service = hyper::service::service_fn(move |req: Request<Incoming>| {
            let guard = busy.enter();
            let response = handler(req, peer);
            async move {
                let response = response.await;
                Ok::<_, Infallible>(response.map(|inner| Tracked {
                    inner,
                    _busy: guard,
                }))
            }
        });
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.limits.header_timeout);
        builder.http2().timer(TokioTimer::new());
        let conn = builder.serve_connection_with_upgrades(io, service);
        let idle = self.limits.idle_timeout;
        let watch = async {
            let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
            loop {
                tokio::time::sleep(tick).await;
                if activity.idle_for(idle) {
                    return;
                }
            }
        };
        tokio::select! {
            _ = self.shutdown.cancelled() => {}
            r = conn => if let Err(e) = r {
                tracing::debug!(%peer, error = %e, "connection ended");
            },
            _ = watch => {
                (self.on_close)("IdleTimeout");
                tracing::debug!(%peer, ?idle, "idle connection closed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    type Counts = Arc<Mutex<HashMap<&'static str, usize>>>;

    /// Serves a handler that answers `/slow` with a body streamed over 600 ms and
    /// everything else at once, with `limits`; the closes counted by reason.
    async fn start(limits: Limits) -> (SocketAddr, Counts, CancellationToken) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let counts: Counts = Arc::default();
        let c = counts.clone();
        let on_close: OnClose = Arc::new(move |r| {
            *c.lock().unwrap().entry(r).or_default() += 1;
        });
        let handler = |req: Request<Incoming>, _peer: SocketAddr| async move {
            if req.uri().path() == "/slow" {
                let (tx, rx) =
                    tokio::sync::mpsc::channel::<Result<Frame<bytes::Bytes>, Infallible>>(1);
                tokio::spawn(async move {
                    for _ in 0..6 {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        let _ = tx
                            .send(Ok(Frame::data(bytes::Bytes::from_static(b"x"))))
                            .await;
                    }
                });
                let body = http_body_util::StreamBody::new(
                    tokio_stream::wrappers::ReceiverStream::new(rx),
                );
                Response::new(http_body_util::combinators::BoxBody::new(body))
            } else {
                let body = http_body_util::Full::new(bytes::Bytes::from_static(b"ok"));
                Response::new(http_body_util::combinators::BoxBody::new(body))
            }
        };
        let stop = CancellationToken::new();
        serve(
            listener,
            None,
            limits,
            handler,
            on_close,
            &TaskTracker::new(),
            stop.clone(),
        );
        (addr, counts, stop)
    }

    /// Reads until the server closes the connection; how long that took.
    async fn closed_after(mut s: TcpStream) -> Duration {
        let t = Instant::now();
        let mut buf = [0u8; 1024];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return t.elapsed(),
                Ok(_) => {}
            }
        }
    }

    #[tokio::test]
    async fn connections_over_the_caps_are_closed_at_once() {
        let limits = Limits {
            max_connections: 3,
            max_per_client: 2,
            ..Limits::default()
        };
        let (addr, counts, _stop) = start(limits).await;
        let a = TcpStream::connect(addr).await.unwrap();
        let b = TcpStream::connect(addr).await.unwrap();
        // A third from the same address is over the per-client cap.
        let c = TcpStream::connect(addr).await.unwrap();
        assert!(closed_after(c).await < Duration::from_secs(2));
        assert_eq!(counts.lock().unwrap().get("TooManyFromClient"), Some(&1));
        drop((a, b));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _held: Vec<TcpStream> = vec![
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        assert_eq!(
            counts.lock().unwrap().get("TooManyFromClient"),
            Some(&1),
            "released slots are reused"
        );
    }

    #[tokio::test]
    async fn slow_headers_and_idle_connections_are_closed() {
        let limits = Limits {
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(400),
            ..Limits::default()
        };
        let (addr, counts, _stop) = start(limits).await;
        // Headers started and never finished.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .unwrap();
        assert!(closed_after(slow).await < Duration::from_secs(3));
        // A connection that never sends anything.
        let idle = TcpStream::connect(addr).await.unwrap();
        let took = closed_after(idle).await;
        assert!(took < Duration::from_secs(3), "{took:?}");
        // A keep-alive connection after its request.
        let mut kept = TcpStream::connect(addr).await.unwrap();
        kept.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let took = closed_after(kept).await;
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(3),
            "{took:?}"
        );
        assert!(
            counts
                .lock()
                .unwrap()
                .get("IdleTimeout")
                .copied()
                .unwrap_or(0)
                >= 1
        );
    }

    #[tokio::test]
    async fn a_response_still_streaming_keeps_its_connection() {
        let limits = Limits {
            idle_timeout: Duration::from_millis(250),
            ..Limits::default()
        };
        let (addr, _counts, _stop) = start(limits).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let received = Arc::new(AtomicU64::new(0));
        let mut buf = [0u8; 4096];
        let mut text = Vec::new();
        let t = Instant::now();
        loop {
            match tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                Ok(Ok(n)) => {
                    received.fetch_add(n as u64, Ordering::SeqCst);
                    text.extend_from_slice(&buf[..n]);
                    if text.ends_with(b"0\r\n\r\n") {
                        break;
                    }
                }
            }
        }
        let body = String::from_utf8_lossy(&text);
        assert_eq!(
            body.matches("\r\nx\r\n").count(),
            6,
            "all six chunks arrived: {body}"
        );
        assert!(t.elapsed() >= Duration::from_millis(500));
    }
}
