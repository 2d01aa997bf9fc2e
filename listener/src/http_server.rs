//! Serving HTTP (1.1 and 2, plaintext or TLS) with the limits every listener of this
//! project keeps (docs/reliability.md, "Every listener"): a cap on connections, on
//! connections from one client address and on TLS handshakes in progress; a timeout on the
//! handshake, on request headers, and on an idle connection (no request in progress and no
//! response still streaming). The resource proxy and the metrics and health listeners of
//! principal and agent are served through it. (hyper has the header timeout; the caps and
//! the idle timeout across HTTP/1.1 and HTTP/2 are not in hyper or hyper-util.)

use crate::caps::{Admission, Caps};
use crate::refusal::RefusalLog;
use crate::text;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::{Request, Response};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Limits of one listener.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections open at once; more are closed as soon as they are accepted.
    pub max_connections: usize,
    /// Connections open at once from one client IP address: well below
    /// `max_connections`, so one address cannot fill the listener for everyone.
    pub max_per_client: usize,
    /// TLS handshakes in progress at once.
    pub max_handshakes: usize,
    /// TLS handshakes in progress at once from one client IP address (below
    /// `max_handshakes`).
    pub max_handshakes_per_client: usize,
    /// How long a TLS handshake may take.
    pub handshake_timeout: Duration,
    /// How long a client may take to send a request's headers (HTTP/1.1).
    pub header_timeout: Duration,
    /// A connection with no request in progress for this long is closed (HTTP/1.1 and 2).
    pub idle_timeout: Duration,
    /// Connections taken beyond the caps above for the requests the handler marks as
    /// vital (the health probes): `None`, none.
    pub reserved: Option<Reserved>,
}

/// A small pool of connections taken when a listener's shared caps are full, so that its
/// vital requests (`/healthz`, `/readyz`) still get through a listener filled by others.
/// Requests on such a connection carry [`ReservedConnection`] in their extensions; the
/// handler answers only the vital ones. One request per connection, headers within
/// `header_timeout`.
#[derive(Debug, Clone)]
pub struct Reserved {
    /// Reserved connections open at once.
    pub max_connections: usize,
    /// Reserved connections open at once from one client IP address.
    pub max_per_client: usize,
    /// How long a client may take to send its request's headers on a reserved connection.
    pub header_timeout: Duration,
}

/// Marks a request that came on a [`Reserved`] connection (in its extensions).
#[derive(Debug, Clone, Copy)]
pub struct ReservedConnection;

impl Default for Limits {
    /// 1,024 connections, 64 per client address; 256 handshakes, 32 per client address:
    /// one address holds at most a sixteenth of the connections and an eighth of the
    /// handshakes, so it takes 16 addresses to fill the listener and 8 to stall its
    /// handshakes (each for at most the handshake timeout).
    fn default() -> Self {
        Limits {
            max_connections: 1024,
            max_per_client: 64,
            max_handshakes: 256,
            max_handshakes_per_client: 32,
            handshake_timeout: Duration::from_secs(10),
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            reserved: None,
        }
    }
}

impl Limits {
    /// For the metrics and health listeners: a scraper and a kubelet, a few connections
    /// each: 64 connections, 8 per client address, and 16 more (4 per address) reserved
    /// for the health probes.
    pub fn metrics() -> Limits {
        Limits {
            max_connections: 64,
            max_per_client: 8,
            max_handshakes: 16,
            max_handshakes_per_client: 4,
            idle_timeout: Duration::from_secs(60),
            reserved: Some(Reserved {
                max_connections: 16,
                max_per_client: 4,
                header_timeout: Duration::from_secs(2),
            }),
            ..Limits::default()
        }
    }
}

/// Why a connection was refused or closed by the listener (metric label values).
pub const CLOSE_REASONS: [&str; 6] = [
    "TooManyConnections",
    "TooManyFromClient",
    "HandshakeTimeout",
    "HandshakeFailed",
    "IdleTimeout",
    "TooManyPings",
];

/// Counts a refused or closed connection by reason (one of [`CLOSE_REASONS`]).
pub type OnClose = Arc<dyn Fn(&'static str) + Send + Sync>;

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

/// The pools of one listener built from its [`Limits`].
struct Pools {
    connections: Caps,
    handshakes: Caps,
    reserved: Option<Caps>,
    log: RefusalLog,
    on_close: OnClose,
}

/// Where an accepted connection found its place.
enum Place {
    Shared(#[allow(dead_code)] Admission),
    Reserved(#[allow(dead_code)] Admission),
}

impl Pools {
    fn new(limits: &Limits, on_close: OnClose, name: String) -> Pools {
        Pools {
            connections: Caps::new(limits.max_connections, limits.max_per_client),
            handshakes: Caps::new(limits.max_handshakes, limits.max_handshakes_per_client),
            reserved: limits
                .reserved
                .as_ref()
                .map(|r| Caps::new(r.max_connections, r.max_per_client)),
            log: RefusalLog::new(name),
            on_close,
        }
    }

    /// A place for a connection from `peer`: in the shared pool, else in the reserved one;
    /// `None` (counted and logged) when neither has room.
    fn place(&self, peer: SocketAddr) -> Option<Place> {
        let reason = match self.connections.admit(Some(peer.ip())) {
            Ok(a) => return Some(Place::Shared(a)),
            Err(reason) => reason,
        };
        if let Some(Ok(a)) = self.reserved.as_ref().map(|r| r.admit(Some(peer.ip()))) {
            return Some(Place::Reserved(a));
        }
        self.refused(peer, reason, &self.connections);
        None
    }

    /// Counts and logs a connection refused by `caps`.
    fn refused(&self, peer: SocketAddr, reason: &'static str, caps: &Caps) {
        (self.on_close)(reason);
        let limit = if reason == "TooManyFromClient" {
            caps.per_client()
        } else {
            caps.max_total()
        };
        self.log.refused(Some(peer), reason, limit);
    }
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
    let name = listener
        .local_addr()
        .map_or_else(|_| "listener".to_owned(), |a| a.to_string());
    let pools = Arc::new(Pools::new(&limits, on_close, name));
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
            let Some(place) = pools.place(peer) else {
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let conn = Connection {
                limits: limits.clone(),
                pools: pools.clone(),
                shutdown: shutdown.clone(),
                peer,
                reserved: matches!(place, Place::Reserved(_)),
            };
            let (tls, handler) = (tls.clone(), handler.clone());
            conns.spawn(async move {
                conn.run(tcp, tls, handler, place).await;
            });
        }
    });
}

struct Connection {
    limits: Limits,
    pools: Arc<Pools>,
    shutdown: CancellationToken,
    peer: SocketAddr,
    /// On a [`Reserved`] connection: one request, vital ones only.
    reserved: bool,
}

impl Connection {
    async fn run<H: Handler>(
        self,
        tcp: tokio::net::TcpStream,
        tls: Option<tokio_rustls::TlsAcceptor>,
        handler: H,
        _place: Place,
    ) {
        let peer = self.peer;
        let Some(acceptor) = tls else {
            return self.http(TokioIo::new(tcp), handler).await;
        };
        let handshake = match self.pools.handshakes.admit(Some(peer.ip())) {
            Ok(h) => h,
            Err(reason) => {
                self.pools.refused(peer, reason, &self.pools.handshakes);
                return;
            }
        };
        let on_close = &self.pools.on_close;
        let stream =
            match tokio::time::timeout(self.limits.handshake_timeout, acceptor.accept(tcp)).await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    on_close("HandshakeFailed");
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    on_close("HandshakeTimeout");
                    tracing::debug!(%peer, "TLS handshake timed out");
                    return;
                }
            };
        drop(handshake);
        self.http(TokioIo::new(stream), handler).await
    }

    /// The HTTP/1.1 and HTTP/2 settings of this connection.
    fn builder(&self) -> hyper_util::server::conn::auto::Builder<TokioExecutor> {
        let header_timeout = match (&self.limits.reserved, self.reserved) {
            (Some(r), true) => r.header_timeout,
            _ => self.limits.header_timeout,
        };
        let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(header_timeout)
            .keep_alive(!self.reserved);
        builder.http2().timer(TokioTimer::new());
        if self.reserved {
            builder.http2().max_concurrent_streams(1);
        }
        builder
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
        let reserved = self.reserved;
        let service = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let guard = busy.enter();
            if reserved {
                req.extensions_mut().insert(ReservedConnection);
            }
            let response = handler(req, peer);
            async move {
                let response = response.await;
                Ok::<_, Infallible>(response.map(|inner| Tracked {
                    inner,
                    _busy: guard,
                }))
            }
        });
        let builder = self.builder();
        let conn = builder.serve_connection_with_upgrades(io, service);
        let idle = match (&self.limits.reserved, reserved) {
            (Some(r), true) => r.header_timeout,
            _ => self.limits.idle_timeout,
        };
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
                (self.pools.on_close)("IdleTimeout");
                tracing::debug!(%peer, idle = %text::duration(idle), "idle connection closed");
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
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
            if req.extensions().get::<ReservedConnection>().is_some() {
                let body = http_body_util::Full::new(bytes::Bytes::from_static(b"reserved"));
                Response::new(http_body_util::combinators::BoxBody::new(body))
            } else if req.uri().path() == "/slow" {
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

    /// One request on a fresh connection; the answer's text.
    async fn get(addr: SocketAddr) -> String {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).into_owned()
    }

    #[tokio::test]
    async fn a_full_listener_keeps_reserved_connections_for_one_request_each() {
        let limits = Limits {
            max_connections: 2,
            max_per_client: 2,
            reserved: Some(Reserved {
                max_connections: 1,
                max_per_client: 1,
                header_timeout: Duration::from_secs(1),
            }),
            ..Limits::default()
        };
        let (addr, counts, _stop) = start(limits).await;
        let _full = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        // The shared pool is full: a request comes on a reserved connection, marked, and
        // the connection ends with its answer (HTTP/1.1 keep-alive off).
        let answer = get(addr).await;
        assert!(answer.ends_with("reserved"), "{answer}");
        assert!(answer.contains("connection: close"), "{answer}");
        // A silent reserved connection is closed after the reserved header timeout; while
        // it is open, one more finds no room at all.
        let silent = TcpStream::connect(addr).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let refused = TcpStream::connect(addr).await.unwrap();
        assert!(closed_after(refused).await < Duration::from_millis(700));
        assert_eq!(counts.lock().unwrap().get("TooManyFromClient"), Some(&1));
        assert!(closed_after(silent).await < Duration::from_secs(3));
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
