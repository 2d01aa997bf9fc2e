//! tonic over our rustls configs. tonic's built-in TLS cannot take a custom rustls config, so
//! the server is fed a stream of already-handshaken TLS streams (`serve_with_incoming`) and
//! the client dials through a connector that does TLS itself (`connect_with_connector`).
//!
//! Each accepted connection carries its verified client identity ([`VerifiedPeer`]) into
//! every request made on it, so handlers never parse certificates again.

use crate::text::{self, quoted};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::net::SocketAddr;

use futures::Stream;
use hyper_util::rt::TokioIo;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;

use crate::listener::{Admission, Caps, ClientLimit, RefusalLog};
pub use crate::peer::{
    PeerError, VerifiedPeer, fingerprint, not_after_from_chain, peer_certs, peer_spiffe_id,
    spiffe_id_from_chain, verified_peer,
};

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take, after its TLS handshake, to send the HTTP/2 client preface.
/// Authorization runs at the first RPC, so without this limit any certificate from the bundle
/// could hold a connection open forever without ever speaking HTTP/2.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Default cap on TLS handshakes in progress at once: a reconnect storm of thousands of
/// agents queues at the accept loop instead of starving established sessions of CPU.
pub const DEFAULT_MAX_CONCURRENT_HANDSHAKES: usize = 256;

/// Default share of one client address in the handshakes (and, on a plaintext listener,
/// the connections waiting for their HTTP/2 preface) in progress: an eighth of
/// [`DEFAULT_MAX_CONCURRENT_HANDSHAKES`], so one address cannot stall everyone's connects.
pub const DEFAULT_MAX_HANDSHAKES_PER_CLIENT: usize = 32;

/// Default cap on the agent listener's connections open at once (each agent holds one).
pub const DEFAULT_MAX_CONNECTIONS: usize = 16_384;

/// Default share of one client address in [`DEFAULT_MAX_CONNECTIONS`]: a sixteenth.
/// Agents behind one NAT address, or a mesh sidecar or ingress in front of the listener,
/// come from one address: raise it (`--max-connections-per-client`) for more than that.
pub const DEFAULT_MAX_CONNECTIONS_PER_CLIENT: usize = 1024;

/// A server-side TLS connection whose client presented a verified SVID (and sent the HTTP/2
/// client preface, which reads replay first). `IO` is what the TLS runs on: TCP, or the
/// WebSocket tunnel of [`crate::websocket`].
pub struct VerifiedStream<IO = TcpStream> {
    /// The TLS stream, with the HTTP/2 preface replayed once it has been read.
    inner: PrefaceReplay<tokio_rustls::server::TlsStream<IO>>,
    peer: VerifiedPeer,
    /// The connection's place under the listener's connection caps.
    _admission: Option<Admission>,
}

impl<IO: AsyncRead + AsyncWrite + Unpin> VerifiedStream<IO> {
    /// Reads the client's identity from a completed handshake; `None` if the session has no
    /// verified client certificate or its leaf is not an SVID (the verifier should already
    /// have refused such a client).
    fn new(
        inner: tokio_rustls::server::TlsStream<IO>,
        remote_addr: SocketAddr,
    ) -> Result<Self, PeerError> {
        let chain: Vec<CertificateDer<'static>> = inner
            .get_ref()
            .1
            .peer_certificates()
            .map(|c| c.iter().map(|c| c.clone().into_owned()).collect())
            .unwrap_or_default();
        Ok(Self {
            inner: PrefaceReplay::unread(inner),
            peer: VerifiedPeer::from_chain(remote_addr, chain)?,
            _admission: None,
        })
    }

    /// Reads the HTTP/2 client preface and keeps it for the server to read again. Fails on
    /// the first byte that differs, or if the connection ends first.
    async fn read_preface(&mut self) -> io::Result<()> {
        read_h2_preface(&mut self.inner.inner).await?;
        self.inner.replayed = 0;
        Ok(())
    }

    /// The verified client.
    pub fn peer(&self) -> &VerifiedPeer {
        &self.peer
    }
}

/// Reads the HTTP/2 client preface from `r`: fails on the first byte that differs, or if
/// the connection ends first.
async fn read_h2_preface<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<()> {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut filled = 0;
    while filled < buf.len() {
        let n = r.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed after {filled} bytes of the HTTP/2 preface"),
            ));
        }
        if buf[filled..filled + n] != H2_PREFACE[filled..filled + n] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an HTTP/2 client preface",
            ));
        }
        filled += n;
    }
    Ok(())
}

impl<IO> tonic::transport::server::Connected for VerifiedStream<IO> {
    type ConnectInfo = VerifiedPeer;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.peer.clone()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for VerifiedStream<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for VerifiedStream<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.inner.is_write_vectored()
    }
}

/// A stream that replays the HTTP/2 client preface, already read from it to decide on the
/// connection, before the rest of its bytes (the TLS listener's and the plaintext one's).
struct PrefaceReplay<IO> {
    inner: IO,
    /// Bytes of [`H2_PREFACE`] already returned by reads ([`H2_PREFACE`]'s length: none left).
    replayed: usize,
}

impl<IO> PrefaceReplay<IO> {
    /// Nothing to replay until the preface is read.
    fn unread(inner: IO) -> Self {
        PrefaceReplay {
            inner,
            replayed: H2_PREFACE.len(),
        }
    }

    /// The preface was read from `inner`: reads return it first.
    fn read(inner: IO) -> Self {
        PrefaceReplay { inner, replayed: 0 }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for PrefaceReplay<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let pending = &H2_PREFACE[this.replayed..];
        if !pending.is_empty() {
            let n = pending.len().min(buf.remaining());
            buf.put_slice(&pending[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for PrefaceReplay<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Dialing failures.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `host:port` could not become an `http://` URI.
    #[error("invalid principal address {addr}: {reason}", addr = quoted(.addr))]
    InvalidAddress {
        /// The address given.
        addr: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The TLS server name is not a DNS name or IP address.
    #[error("invalid TLS server name {q0}", q0 = quoted(.0))]
    InvalidServerName(String),
    /// TCP connect, TLS handshake or HTTP/2 setup failed. The message carries the cause's
    /// whole chain, so it is no `source` (a chain would print it twice).
    #[error("cannot connect to {addr}: {}", text::error_chain(.cause))]
    Connect {
        /// The address dialed.
        addr: String,
        /// The failure.
        cause: tonic::transport::Error,
    },
}

/// HTTP/2 channel settings. Keepalive pings keep mesh and ingress idle timeouts from killing
/// quiet streams and detect dead peers.
#[derive(Clone, Debug)]
pub struct ChannelOptions {
    /// Interval between HTTP/2 PINGs.
    pub keepalive_interval: Duration,
    /// How long to wait for a PING acknowledgement before closing the connection.
    pub keepalive_timeout: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Accepts TCP connections and runs each TLS handshake in its own task, yielding only
/// completed handshakes whose client presented a verified SVID and then sent the HTTP/2
/// client preface within [`PREFACE_TIMEOUT`]: a slow or failed handshake neither blocks
/// others nor ends the server (failures are logged with the peer address). At most
/// [`DEFAULT_MAX_CONCURRENT_HANDSHAKES`] handshakes run at once. Feed the result to
/// `Server::serve_with_incoming`; handlers find the [`VerifiedPeer`] in request extensions.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl Stream<Item = Result<VerifiedStream, io::Error>> + Send + 'static {
    tls_incoming_with_limit(listener, config, DEFAULT_MAX_CONCURRENT_HANDSHAKES)
}

/// [`tls_incoming`] with an explicit cap on concurrent handshakes (at least 1).
pub fn tls_incoming_with_limit(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    max_handshakes: usize,
) -> impl Stream<Item = Result<VerifiedStream, io::Error>> + Send + 'static {
    tls_incoming_with_options(
        listener,
        config,
        IncomingOptions {
            max_handshakes,
            ..IncomingOptions::default()
        },
    )
}

/// Limits of [`tls_incoming_with_options`].
#[derive(Clone, Debug)]
pub struct IncomingOptions {
    /// TLS handshakes in progress at once (at least 1).
    pub max_handshakes: usize,
    /// Of `max_handshakes`, how many one client address may hold; more from it are closed
    /// at once.
    pub max_handshakes_per_client: usize,
    /// Connections open at once, from the accept to their end; more are closed at once.
    pub max_connections: usize,
    /// Of `max_connections`, how many one client address may hold.
    pub max_connections_per_client: usize,
    /// How long a client may take after its handshake to send the HTTP/2 client preface.
    pub preface_timeout: Duration,
    /// Told the reason of each connection dropped before it could carry a request (for a
    /// metric): one of [`REFUSED_REASONS`].
    pub on_refused: Option<RefusedHook>,
    /// Asked at each accepted connection whether the server is ready for new clients; while
    /// it says no, connections are closed as soon as they are accepted, before any TLS
    /// (reason `NotReady`, logged at most once a second with a count). Connections already
    /// accepted are not touched. `None`: always ready.
    pub ready: Option<ReadyHook>,
}

/// Reasons [`IncomingOptions::on_refused`] is called with: the TLS handshake took longer
/// than [`HANDSHAKE_TIMEOUT`], failed, gave no usable SVID, or no HTTP/2 client preface
/// followed in time; or (with `--enable-websocket`) the WebSocket upgrade the TLS runs in
/// failed or took too long.
/// `TooManyConnections` and `TooManyFromClient` are the listener's caps
/// ([`IncomingOptions::max_connections`], [`IncomingOptions::max_handshakes_per_client`],
/// [`IncomingOptions::max_connections_per_client`]). `NotReady`: the server was not ready
/// ([`IncomingOptions::ready`]) and the connection was closed before its TLS handshake.
pub const REFUSED_REASONS: [&str; 8] = [
    "HandshakeTimeout",
    "HandshakeFailed",
    "NoUsableSvid",
    "NoPreface",
    "WebSocketRefused",
    "TooManyConnections",
    "TooManyFromClient",
    "NotReady",
];

/// A callback told why a connection was dropped before its first request.
#[derive(Clone)]
pub struct RefusedHook(pub Arc<dyn Fn(&'static str) + Send + Sync>);

impl std::fmt::Debug for RefusedHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RefusedHook")
    }
}

/// Whether the server behind a listener is ready for new connections
/// ([`IncomingOptions::ready`]): asked at every accept, so it must be cheap.
#[derive(Clone)]
pub struct ReadyHook(pub Arc<dyn Fn() -> bool + Send + Sync>);

impl ReadyHook {
    /// Ready while `rx` holds `true`.
    pub fn from_watch(rx: tokio::sync::watch::Receiver<bool>) -> ReadyHook {
        ReadyHook(Arc::new(move || *rx.borrow()))
    }
}

impl std::fmt::Debug for ReadyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadyHook")
    }
}

/// How often the refusals of a listener that is not ready are logged at most.
const NOT_READY_LOG_EVERY: Duration = Duration::from_secs(1);

impl Default for IncomingOptions {
    fn default() -> Self {
        Self {
            max_handshakes: DEFAULT_MAX_CONCURRENT_HANDSHAKES,
            max_handshakes_per_client: DEFAULT_MAX_HANDSHAKES_PER_CLIENT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            preface_timeout: PREFACE_TIMEOUT,
            on_refused: None,
            ready: None,
        }
    }
}

/// [`tls_incoming`] with explicit limits.
pub fn tls_incoming_with_options(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    opts: IncomingOptions,
) -> impl Stream<Item = Result<VerifiedStream, io::Error>> + Send + 'static {
    incoming_with(
        listener,
        config,
        opts,
        |tcp, _remote| async move { Ok(tcp) },
    )
}

/// What a connection is turned into before its TLS handshake: the byte stream the TLS runs
/// on, or the refusal reason (for [`IncomingOptions::on_refused`]) and a message.
pub type Prepared<IO> = Result<IO, (&'static str, String)>;

/// A listening socket the accept loops below take connections from: TCP (the client's
/// address known) or a Unix socket (no address: counted in the totals only).
pub trait Accept: Send + Sync + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and its client's address.
    fn accept_one(&self)
    -> impl Future<Output = io::Result<(Self::Io, Option<SocketAddr>)>> + Send;
}

impl Accept for TcpListener {
    type Io = TcpStream;
    async fn accept_one(&self) -> io::Result<(TcpStream, Option<SocketAddr>)> {
        let (tcp, remote) = self.accept().await?;
        let _ = tcp.set_nodelay(true);
        Ok((tcp, Some(remote)))
    }
}

impl Accept for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;
    async fn accept_one(&self) -> io::Result<(tokio::net::UnixStream, Option<SocketAddr>)> {
        Ok((self.accept().await?.0, None))
    }
}

/// The caps an accept loop admits connections with: handshakes (or, plaintext, connections
/// waiting for their preface) in total and per client address, and connections in total
/// and per client address. Refusals are counted through the hook and logged without a
/// storm.
struct Gate {
    handshakes: Arc<Semaphore>,
    handshake_clients: Arc<ClientLimit>,
    handshakes_per_client: usize,
    max_handshakes: usize,
    connections: Caps,
    log: RefusalLog,
    on_refused: Option<RefusedHook>,
    /// Whether new connections are taken ([`IncomingOptions::ready`]).
    ready: Option<ReadyHook>,
    /// The `NotReady` refusals' own log (once a second), apart from the caps'.
    not_ready_log: RefusalLog,
    /// Wait for a handshake slot before accepting (TLS: a reconnect storm waits in the
    /// kernel's backlog instead of taking CPU); otherwise (plaintext, where waiting for a
    /// preface costs nothing but a socket) a connection finding no slot is refused.
    queue: bool,
}

/// A connection's places: for its whole life, and for its handshake only.
struct Admitted {
    connection: Admission,
    handshake: (
        tokio::sync::OwnedSemaphorePermit,
        Option<crate::listener::ClientSlot>,
    ),
}

impl Gate {
    fn new(opts: &IncomingOptions, name: &str, queue: bool) -> Gate {
        Gate {
            handshakes: Arc::new(Semaphore::new(opts.max_handshakes.max(1))),
            handshake_clients: Arc::new(ClientLimit::default()),
            handshakes_per_client: opts.max_handshakes_per_client.max(1),
            max_handshakes: opts.max_handshakes.max(1),
            connections: Caps::new(opts.max_connections, opts.max_connections_per_client),
            log: RefusalLog::new(name),
            on_refused: opts.on_refused.clone(),
            ready: opts.ready.clone(),
            not_ready_log: RefusalLog::every(name, NOT_READY_LOG_EVERY),
            queue,
        }
    }

    fn refused(&self, reason: &'static str) {
        if let Some(hook) = &self.on_refused {
            (hook.0)(reason);
        }
    }

    /// Whether a new connection is taken now: the server is ready (or has no say).
    fn accepting(&self) -> bool {
        self.ready.as_ref().is_none_or(|ready| (ready.0)())
    }

    /// Closes a connection accepted while the server is not ready: counted, and logged at
    /// most once a second with how many were closed in between.
    fn refuse_not_ready(&self, remote: Option<SocketAddr>) {
        self.refused("NotReady");
        if let Some(held) = self.not_ready_log.due() {
            let peer = remote.map_or_else(|| "-".to_owned(), |p| p.to_string());
            tracing::warn!(
                listener = %self.not_ready_log.listener(),
                %peer,
                reason = "NotReady",
                not_logged_since_last = held,
                "connection refused before TLS: not ready yet (further such refusals logged at most every {})",
                text::duration(NOT_READY_LOG_EVERY)
            );
        }
    }

    /// The next connection with its places; connections over a cap, or accepted while the
    /// server is not ready, are closed (counted and logged) and the next one is taken.
    /// `None` when `closed` ends first.
    async fn next<L: Accept>(
        &self,
        listener: &L,
        closed: impl Future<Output = ()>,
    ) -> Option<(L::Io, Option<SocketAddr>, Admitted)> {
        tokio::pin!(closed);
        loop {
            // TLS: wait for a handshake slot before accepting: excess connections wait in
            // the kernel's backlog.
            let queued = if self.queue {
                tokio::select! {
                    _ = &mut closed => return None,
                    p = self.handshakes.clone().acquire_owned() => Some(p.ok()?),
                }
            } else {
                None
            };
            let accepted = tokio::select! {
                _ = &mut closed => return None,
                accepted = listener.accept_one() => accepted,
            };
            let (io, remote) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Not ready: close before any TLS, so a crowd of dialing clients cannot take
            // the CPU the server needs to get ready. Dropping `io` closes it.
            if !self.accepting() {
                self.refuse_not_ready(remote);
                continue;
            }
            let permit = match queued {
                Some(p) => Ok(p),
                None => self.handshakes.clone().try_acquire_owned(),
            };
            let Ok(permit) = permit else {
                self.refused("TooManyConnections");
                self.log
                    .refused(remote, "TooManyConnections", self.max_handshakes);
                continue;
            };
            match self.admit(remote, permit) {
                Ok(admitted) => return Some((io, remote, admitted)),
                Err((reason, limit)) => {
                    self.refused(reason);
                    self.log.refused(remote, reason, limit);
                }
            }
        }
    }

    /// The places of a connection from `remote`, or the cap it is over.
    fn admit(
        &self,
        remote: Option<SocketAddr>,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) -> Result<Admitted, (&'static str, usize)> {
        let ip = remote.map(|r| r.ip());
        let connection = self.connections.admit(ip).map_err(|reason| {
            let limit = if reason == "TooManyFromClient" {
                self.connections.per_client()
            } else {
                self.connections.max_total()
            };
            (reason, limit)
        })?;
        let slot = match ip {
            Some(ip) => Some(
                self.handshake_clients
                    .take(ip, self.handshakes_per_client)
                    .ok_or(("TooManyFromClient", self.handshakes_per_client))?,
            ),
            None => None,
        };
        Ok(Admitted {
            connection,
            handshake: (permit, slot),
        })
    }
}

/// The accept loop of [`tls_incoming_with_options`], with a step between the TCP accept and
/// the TLS handshake (`prepare`: e.g. a WebSocket upgrade the TLS then runs inside). The
/// handshake slot (and the client address's share of them) is held from the accept through
/// `prepare` and the TLS handshake; the connection's place under the connection caps for
/// its whole life. `prepare` must bound its own time.
pub fn incoming_with<IO, F, Fut>(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    opts: IncomingOptions,
    prepare: F,
) -> impl Stream<Item = Result<VerifiedStream<IO>, io::Error>> + Send + 'static
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    F: Fn(TcpStream, SocketAddr) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Prepared<IO>> + Send + 'static,
{
    let name = listener.local_addr().map_or_else(
        |_| "agent listener".to_owned(),
        |a| format!("agent listener {a}"),
    );
    let gate = Arc::new(Gate::new(&opts, &name, true));
    let preface_timeout = opts.preface_timeout;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let prepare = Arc::new(prepare);
    tokio::spawn(async move {
        while let Some((tcp, remote, admitted)) = gate.next(&listener, tx.closed()).await {
            let Some(remote) = remote else { continue };
            let (acceptor, tx, gate, prepare) =
                (acceptor.clone(), tx.clone(), gate.clone(), prepare.clone());
            tokio::spawn(async move {
                let refused = |reason| gate.refused(reason);
                let io = match prepare(tcp, remote).await {
                    Ok(io) => io,
                    Err((reason, message)) => {
                        tracing::warn!(remote = %remote, error = %message, "connection refused before TLS");
                        refused(reason);
                        return;
                    }
                };
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(io)).await;
                let Admitted {
                    connection,
                    handshake: slot,
                } = admitted;
                // The slot is for the handshake only, not for waiting on the client.
                drop(slot);
                if let Some(mut stream) = verify(handshake, remote, preface_timeout, &refused).await
                {
                    stream._admission = Some(connection);
                    let _ = tx.send(Ok(stream)).await;
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// A plaintext connection whose client sent the HTTP/2 client preface in time (which reads
/// replay first), holding its place under the listener's caps until it ends: the agent
/// listener without TLS (JWT-SVID or a mesh in front) and the local admin listener.
pub struct Prefaced<IO> {
    inner: PrefaceReplay<IO>,
    _admission: Admission,
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Prefaced<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.inner.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefaced<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefaced<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.inner.is_write_vectored()
    }
}

/// The connections of a plaintext HTTP/2 listener (TCP or a Unix socket) for
/// `Server::serve_with_incoming`, under the caps of `opts`: at most `max_connections` open
/// (`max_connections_per_client` from one address), at most `max_handshakes` waiting for
/// their HTTP/2 client preface (`max_handshakes_per_client` from one address), and each
/// closed unless its preface arrives within `preface_timeout`. Refusals are counted
/// through `opts.on_refused` (`TooManyConnections`, `TooManyFromClient`, `NoPreface`) and
/// logged (rate-limited) under `name`.
pub fn plain_incoming<L: Accept>(
    listener: L,
    opts: IncomingOptions,
    name: &str,
) -> impl Stream<Item = Result<Prefaced<L::Io>, io::Error>> + Send + 'static {
    let gate = Arc::new(Gate::new(&opts, name, false));
    let preface_timeout = opts.preface_timeout;
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        while let Some((mut io, remote, admitted)) = gate.next(&listener, tx.closed()).await {
            let (tx, gate) = (tx.clone(), gate.clone());
            tokio::spawn(async move {
                let read = tokio::time::timeout(preface_timeout, read_h2_preface(&mut io)).await;
                let Admitted {
                    connection,
                    handshake,
                } = admitted;
                drop(handshake);
                let error = match read {
                    Ok(Ok(())) => {
                        let stream = Prefaced {
                            inner: PrefaceReplay::read(io),
                            _admission: connection,
                        };
                        let _ = tx.send(Ok(stream)).await;
                        return;
                    }
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!(
                        "no HTTP/2 client preface within {preface_timeout}",
                        preface_timeout = text::duration(preface_timeout)
                    ),
                };
                gate.refused("NoPreface");
                tracing::debug!(remote = %text::or_dash(remote), %error, "plaintext connection closed before its first request");
                let secs = usize::try_from(preface_timeout.as_secs()).unwrap_or(usize::MAX);
                gate.log.refused(remote, "NoPreface", secs);
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The client of a finished handshake, then its HTTP/2 client preface within
/// `preface_timeout`; `None` (logged, and counted through `refused`) when either is missing.
async fn verify<IO: AsyncRead + AsyncWrite + Unpin>(
    handshake: Result<io::Result<tokio_rustls::server::TlsStream<IO>>, tokio::time::error::Elapsed>,
    remote: SocketAddr,
    preface_timeout: Duration,
    refused: &impl Fn(&'static str),
) -> Option<VerifiedStream<IO>> {
    let mut stream = match handshake {
        Ok(Ok(tls)) => match VerifiedStream::new(tls, remote) {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(remote = %remote, error = %e, "TLS client without a usable SVID dropped");
                refused("NoUsableSvid");
                return None;
            }
        },
        Ok(Err(e)) => {
            tracing::warn!(remote = %remote, error = %e, "TLS handshake failed");
            refused("HandshakeFailed");
            return None;
        }
        Err(_) => {
            tracing::warn!(remote = %remote, "TLS handshake timed out after {HANDSHAKE_TIMEOUT}", HANDSHAKE_TIMEOUT = text::duration(HANDSHAKE_TIMEOUT));
            refused("HandshakeTimeout");
            return None;
        }
    };
    // The client's ID is verified by now; dropping the stream closes the connection.
    match tokio::time::timeout(preface_timeout, stream.read_preface()).await {
        Ok(Ok(())) => Some(stream),
        Ok(Err(e)) => {
            tracing::warn!(remote = %remote, client = %stream.peer.id, error = %e, "TLS client closed: no HTTP/2 client preface");
            refused("NoPreface");
            None
        }
        Err(_) => {
            tracing::warn!(remote = %remote, client = %stream.peer.id, "TLS client closed: no HTTP/2 client preface within {preface_timeout}", preface_timeout = text::duration(preface_timeout));
            refused("NoPreface");
            None
        }
    }
}

/// A tower connector that dials TCP to the URI's host and port and runs the TLS handshake
/// with `config`, for `Endpoint::connect_with_connector(_lazy)` (the endpoint URI is
/// `http://host:port`; TLS is done here).
#[derive(Clone)]
pub struct SvidConnector {
    tls: TlsConnector,
    server_name: ServerName<'static>,
}

/// Builds a [`SvidConnector`]. `server_name` is sent as SNI; the server is authenticated by its
/// SPIFFE ID (the config's policy), not by this name. Falls back to `localhost` if the name is
/// not a valid DNS name or IP address.
pub fn connector(config: Arc<rustls::ClientConfig>, server_name: String) -> SvidConnector {
    let server_name = ServerName::try_from(server_name.clone()).unwrap_or_else(|_| {
        tracing::warn!(name = %server_name, "TLS server name is not a DNS name or IP; sending \"localhost\"");
        ServerName::try_from("localhost").expect("localhost is a valid DNS name")
    });
    SvidConnector {
        tls: TlsConnector::from(config),
        server_name,
    }
}

impl tower::Service<http::Uri> for SvidConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        let name = self.server_name.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}"))
                })?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let stream = tls.connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

pub(crate) fn endpoint(
    addr: &str,
    opts: &ChannelOptions,
) -> Result<tonic::transport::Endpoint, TransportError> {
    let invalid = |reason: String| TransportError::InvalidAddress {
        addr: addr.to_string(),
        reason,
    };
    if addr.contains("://") {
        return Err(invalid("expected host:port without a scheme".into()));
    }
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(opts.connect_timeout)
            .http2_keep_alive_interval(opts.keepalive_interval)
            .keep_alive_timeout(opts.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true),
    )
}

/// Dials `addr` (`host:port`) over TLS with `config` and returns a connected channel. With TLS
/// 1.3 a server that refuses our certificate is only noticed on the first RPC.
pub async fn connect(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    opts: ChannelOptions,
) -> Result<tonic::transport::Channel, TransportError> {
    endpoint(addr, &opts)?
        .connect_with_connector(connector(config, server_name.to_string()))
        .await
        .map_err(|cause| TransportError::Connect {
            addr: addr.to_string(),
            cause,
        })
}

/// Like [`connect`] but dials on first use (and redials after failures).
pub fn connect_lazy(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    opts: ChannelOptions,
) -> Result<tonic::transport::Channel, TransportError> {
    Ok(endpoint(addr, &opts)?
        .connect_with_connector_lazy(connector(config, server_name.to_string())))
}

/// Whether a gRPC status only says the connection went away (the peer process exited, the
/// network or a proxy cut it) rather than that the peer refused something: logs then say
/// "connection lost" instead of blaming the peer.
pub fn is_connection_loss(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    if !matches!(
        status.code(),
        tonic::Code::Unknown
            | tonic::Code::Unavailable
            | tonic::Code::Cancelled
            | tonic::Code::Internal
    ) {
        return false;
    }
    let mut text = status.message().to_ascii_lowercase();
    let mut cur = status.source();
    while let Some(e) = cur {
        text.push(' ');
        text.push_str(&e.to_string().to_ascii_lowercase());
        cur = e.source();
    }
    [
        "h2 protocol error",
        "connection reset",
        "broken pipe",
        "transport error",
        "connection closed",
        "error reading a body from connection",
        "stream no longer needed",
        "unexpected eof",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

#[cfg(test)]
mod plain_tests {
    use super::*;
    use futures::StreamExt as _;
    use std::sync::Mutex;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn plaintext_connections_need_a_preface_in_time_and_keep_to_their_share() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reasons: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let seen = reasons.clone();
        let opts = IncomingOptions {
            max_handshakes: 4,
            max_handshakes_per_client: 2,
            max_connections: 8,
            max_connections_per_client: 3,
            preface_timeout: Duration::from_secs(1),
            on_refused: Some(RefusedHook(Arc::new(move |r| seen.lock().unwrap().push(r)))),
            ready: None,
        };
        let mut incoming = Box::pin(plain_incoming(listener, opts, "test"));
        let silent = [
            TcpStream::connect(addr).await.unwrap(),
            TcpStream::connect(addr).await.unwrap(),
        ];
        // A third connection waiting for its preface from the same address is over its
        // share and closed at once.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 8];
        let n = tokio::time::timeout(Duration::from_millis(700), third.read(&mut buf)).await;
        assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
        // The silent ones are closed after the preface timeout.
        for mut s in silent {
            let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
            assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
        }
        // A client sending the preface is handed over, preface replayed.
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(H2_PREFACE).await.unwrap();
        let mut stream = incoming.next().await.unwrap().unwrap();
        let mut replay = [0u8; 24];
        stream.read_exact(&mut replay).await.unwrap();
        assert_eq!(&replay, H2_PREFACE);
        let reasons = reasons.lock().unwrap().clone();
        assert_eq!(reasons, vec!["TooManyFromClient", "NoPreface", "NoPreface"]);
    }

    #[test]
    fn the_accept_decision_follows_readiness() {
        use std::sync::atomic::{AtomicBool, Ordering};
        // No hook: always taking connections.
        assert!(Gate::new(&IncomingOptions::default(), "test", true).accepting());
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let opts = IncomingOptions {
            ready: Some(ReadyHook(Arc::new(move || flag.load(Ordering::SeqCst)))),
            ..IncomingOptions::default()
        };
        let gate = Gate::new(&opts, "test", true);
        assert!(!gate.accepting());
        ready.store(true, Ordering::SeqCst);
        assert!(gate.accepting(), "ready again: taken at once");
        ready.store(false, Ordering::SeqCst);
        assert!(!gate.accepting());
        // A watch channel works as the signal too.
        let (tx, rx) = tokio::sync::watch::channel(false);
        let hook = ReadyHook::from_watch(rx);
        assert!(!(hook.0)());
        tx.send_replace(true);
        assert!((hook.0)());
    }

    #[tokio::test]
    async fn connections_are_closed_at_once_while_not_ready_and_taken_once_ready() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reasons: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let seen = reasons.clone();
        let ready = Arc::new(AtomicBool::new(false));
        let flag = ready.clone();
        let opts = IncomingOptions {
            preface_timeout: Duration::from_secs(5),
            on_refused: Some(RefusedHook(Arc::new(move |r| seen.lock().unwrap().push(r)))),
            ready: Some(ReadyHook(Arc::new(move || flag.load(Ordering::SeqCst)))),
            ..IncomingOptions::default()
        };
        let mut incoming = Box::pin(plain_incoming(listener, opts, "test"));
        // Not ready: closed at once (well before the preface timeout), even with a
        // preface sent, and never handed over.
        let mut buf = [0u8; 8];
        for _ in 0..3 {
            let mut early = TcpStream::connect(addr).await.unwrap();
            let _ = early.write_all(H2_PREFACE).await;
            let n = tokio::time::timeout(Duration::from_secs(2), early.read(&mut buf)).await;
            assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
        }
        assert!(
            tokio::time::timeout(Duration::from_millis(100), incoming.next())
                .await
                .is_err()
        );
        // An established connection is not touched when readiness goes away.
        ready.store(true, Ordering::SeqCst);
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(H2_PREFACE).await.unwrap();
        let mut stream = incoming.next().await.unwrap().unwrap();
        ready.store(false, Ordering::SeqCst);
        good.write_all(b"more").await.unwrap();
        let mut replay = [0u8; 28];
        stream.read_exact(&mut replay).await.unwrap();
        assert_eq!(&replay[24..], b"more");
        let reasons = reasons.lock().unwrap().clone();
        assert_eq!(reasons, vec!["NotReady"; 3]);
    }
}

#[cfg(test)]
mod connection_loss_tests {
    use super::is_connection_loss;

    #[test]
    fn transport_failures_are_connection_loss_and_refusals_are_not() {
        assert!(is_connection_loss(&tonic::Status::unknown(
            "h2 protocol error: error reading a body from connection"
        )));
        assert!(is_connection_loss(&tonic::Status::unavailable(
            "transport error"
        )));
        assert!(!is_connection_loss(&tonic::Status::permission_denied(
            "h2 protocol error"
        )));
        assert!(!is_connection_loss(&tonic::Status::unavailable(
            "principal shutting down"
        )));
    }
}

#[cfg(test)]
mod peer_tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

    fn cert(uris: &[&str], ca: bool) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(u.to_string().try_into().unwrap()))
            .collect();
        params.is_ca = if ca {
            IsCa::Ca(BasicConstraints::Unconstrained)
        } else {
            IsCa::ExplicitNoCa
        };
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn single_spiffe_uri_san_is_the_peer_id() {
        let id = spiffe_id_from_chain(&[cert(&["spiffe://example.org/agent"], false)]).unwrap();
        assert_eq!(id.as_str(), "spiffe://example.org/agent");
    }

    #[test]
    fn not_after_is_read_from_the_leaf() {
        // rcgen's default validity ends on 4096-01-01T00:00:00Z.
        let t = not_after_from_chain(&[cert(&["spiffe://example.org/agent"], false)]).unwrap();
        let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 67_090_118_400);
        assert_eq!(not_after_from_chain(&[]), None);
        assert_eq!(
            not_after_from_chain(&[CertificateDer::from(vec![1, 2, 3])]),
            None
        );
    }

    #[test]
    fn leaf_with_zero_or_two_uri_sans_is_refused() {
        assert_eq!(
            spiffe_id_from_chain(&[cert(&[], false)]),
            Err(PeerError::UriSanCount(0))
        );
        assert_eq!(
            spiffe_id_from_chain(&[cert(
                &["spiffe://example.org/a", "spiffe://example.org/b"],
                false
            )]),
            Err(PeerError::UriSanCount(2))
        );
    }

    #[test]
    fn non_spiffe_uri_and_ca_leaf_are_refused() {
        assert!(matches!(
            spiffe_id_from_chain(&[cert(&["https://example.org/agent"], false)]),
            Err(PeerError::NotSpiffe { .. })
        ));
        assert_eq!(
            spiffe_id_from_chain(&[cert(&["spiffe://example.org/agent"], true)]),
            Err(PeerError::LeafIsCa("spiffe://example.org/agent".into()))
        );
        assert_eq!(spiffe_id_from_chain(&[]), Err(PeerError::NoCertificate));
        assert!(matches!(
            spiffe_id_from_chain(&[CertificateDer::from(vec![1, 2, 3])]),
            Err(PeerError::Unparsable(_))
        ));
    }

    #[test]
    fn request_without_tls_info_has_no_peer_id() {
        let request = tonic::Request::new(());
        assert_eq!(peer_spiffe_id(&request), Err(PeerError::NoCertificate));
    }
}
