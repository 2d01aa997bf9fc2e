//! The agent's connection over a WebSocket (`--enable-websocket`), for paths without HTTP/2:
//! proxies and load balancers that speak HTTP/1.1 only.
//!
//! What runs where, outermost first:
//!
//! ```text
//! TCP  ->  HTTP/1.1 Upgrade: websocket (subprotocol SUBPROTOCOL)  ->  binary messages
//!      ->  TLS 1.3/1.2 with both SVIDs (the same rustls configs as the direct listener)
//!      ->  HTTP/2  ->  gRPC (EventStream, Tunnel, ...)
//! ```
//!
//! The WebSocket is only a byte pipe: [`WsIo`] turns its binary messages into an
//! `AsyncRead + AsyncWrite` stream, and the same TLS, the same peer verification and the same
//! gRPC server run on it as on a direct TCP connection. A proxy in the path sees an HTTP/1.1
//! upgrade and then opaque bytes; it cannot read or alter the stream, and the principal reads
//! the caller from the TLS peer certificate exactly as on the direct listener.
//!
//! Limits: the upgrade request is read within [`UPGRADE_TIMEOUT`] and at most 64 KiB
//! (tungstenite's own cap on handshake bytes); each WebSocket frame and message is at most
//! [`WsOptions::max_message`]; the TLS handshake and the HTTP/2 preface then have their usual
//! timeouts ([`crate::transport`]), all under the listener's cap on handshakes in progress.
//! Each side pings every [`WsOptions::ping_interval`] (so idle proxies see traffic), and a
//! side that hears nothing from its peer for `ping_interval + timeout` closes the connection.

use crate::text;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use futures::{Sink, Stream};
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::{self, Message};

use crate::transport::{ChannelOptions, SvidHandshake, TransportError, VerifiedStream};
use argocd_agent_listener::{Bounded, H2Connection, IncomingOptions, Refused};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The WebSocket subprotocol both sides require: the messages carry a TLS connection.
pub const SUBPROTOCOL: &str = "argocd-agent.tls";

/// How long a client may take to send its upgrade request (and the server to answer one).
pub const UPGRADE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS handshake record: what tells a direct TLS client from an
/// HTTP/1.1 upgrade on a listener that takes both.
const TLS_HANDSHAKE: u8 = 0x16;

/// Control frames (pings, pongs, empty messages) a peer may send in a burst; one more is
/// allowed each [`CONTROL_REFILL`]. A legitimate peer pings every
/// [`WsOptions::ping_interval`]; a peer over the budget (before its TLS handshake, pings
/// cost the principal CPU unauthenticated) has its connection closed.
const CONTROL_BURST: u32 = 16;

/// How often one more control frame is allowed (see [`CONTROL_BURST`]).
const CONTROL_REFILL: Duration = Duration::from_secs(1);

/// The largest message [`WsIo`] writes: TLS records are at most ~16.6 KiB, so a write
/// holds one or two of them.
const WRITE_CHUNK: usize = 32 * 1024;

/// WebSocket limits and keepalive.
#[derive(Debug, Clone)]
pub struct WsOptions {
    /// Interval between WebSocket pings this side sends.
    pub ping_interval: Duration,
    /// How long past `ping_interval` the peer may stay silent before the connection is
    /// closed.
    pub timeout: Duration,
    /// The largest frame and message accepted (bytes); a larger one closes the connection.
    pub max_message: usize,
}

impl Default for WsOptions {
    fn default() -> Self {
        WsOptions {
            ping_interval: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
            max_message: 64 * 1024,
        }
    }
}

impl WsOptions {
    fn config(&self) -> WebSocketConfig {
        WebSocketConfig::default()
            .max_message_size(Some(self.max_message))
            .max_frame_size(Some(self.max_message))
            .read_buffer_size(self.max_message.clamp(4096, 128 * 1024))
            .write_buffer_size(WRITE_CHUNK)
            .max_write_buffer_size(4 * WRITE_CHUNK.max(self.max_message))
    }
}

/// A WebSocket as a byte stream: what is written goes out in binary messages, what comes in
/// binary messages is read; pings keep it alive and find a dead peer (see the module
/// documentation). A text message is an error; a close ends the reads.
pub struct WsIo<S> {
    ws: WebSocketStream<S>,
    pending: Bytes,
    ping: Pin<Box<Sleep>>,
    deadline: Pin<Box<Sleep>>,
    opts: WsOptions,
    eof: bool,
    /// Control frames still allowed now, and when the budget was last refilled.
    controls: (u32, Instant),
}

impl<S: AsyncRead + AsyncWrite + Unpin> WsIo<S> {
    /// Wraps an upgraded WebSocket.
    pub fn new(ws: WebSocketStream<S>, opts: WsOptions) -> Self {
        let now = Instant::now();
        WsIo {
            ws,
            pending: Bytes::new(),
            ping: Box::pin(tokio::time::sleep_until(now + opts.ping_interval)),
            deadline: Box::pin(tokio::time::sleep_until(
                now + opts.ping_interval + opts.timeout,
            )),
            opts,
            eof: false,
            controls: (CONTROL_BURST, now),
        }
    }

    /// Takes one control frame from the peer's budget; fails when it is spent.
    fn control_frame(&mut self) -> io::Result<()> {
        let (left, since) = &mut self.controls;
        let refills = since.elapsed().as_millis() / CONTROL_REFILL.as_millis().max(1);
        if refills > 0 {
            let add = u32::try_from(refills).unwrap_or(u32::MAX);
            *left = left.saturating_add(add).min(CONTROL_BURST);
            *since = Instant::now();
        }
        if *left == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "more than {CONTROL_BURST} WebSocket control frames (pings, pongs, empty messages) in a burst, or more than one per {CONTROL_REFILL}",
                    CONTROL_REFILL = text::duration(CONTROL_REFILL)
                ),
            ));
        }
        *left -= 1;
        Ok(())
    }

    /// Something came from the peer: it is alive.
    fn heard(&mut self) {
        let at = Instant::now() + self.opts.ping_interval + self.opts.timeout;
        self.deadline.as_mut().reset(at);
    }

    /// Sends a ping when one is due; fails when the peer has been silent too long.
    fn poll_keepalive(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "nothing from the WebSocket peer for {}",
                    text::duration(self.opts.ping_interval + self.opts.timeout)
                ),
            ));
        }
        if self.ping.as_mut().poll(cx).is_ready() {
            let mut ws = Pin::new(&mut self.ws);
            // A write side that is busy is traffic enough; the ping waits for the next turn.
            if let Poll::Ready(ready) = ws.as_mut().poll_ready(cx) {
                ready.map_err(to_io)?;
                ws.as_mut()
                    .start_send(Message::Ping(Bytes::new()))
                    .map_err(to_io)?;
                if let Poll::Ready(Err(e)) = ws.poll_flush(cx) {
                    return Err(to_io(e));
                }
            }
            let next = Instant::now() + self.opts.ping_interval;
            self.ping.as_mut().reset(next);
            // Registers the timer's waker again.
            let _ = self.ping.as_mut().poll(cx);
        }
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for WsIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.pending.is_empty() {
                let n = this.pending.len().min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            this.poll_keepalive(cx)?;
            match ready!(Pin::new(&mut this.ws).poll_next(cx)) {
                Some(Ok(Message::Binary(bytes))) => {
                    this.heard();
                    if bytes.is_empty() {
                        this.control_frame()?;
                    }
                    this.pending = bytes;
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => {
                    this.heard();
                    this.control_frame()?;
                }
                Some(Ok(Message::Text(_))) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "text message on a binary WebSocket tunnel",
                    )));
                }
                Some(Ok(Message::Close(_))) | None => this.eof = true,
                Some(Err(
                    tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed,
                )) => this.eof = true,
                Some(Err(e)) => return Poll::Ready(Err(to_io(e))),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for WsIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let mut ws = Pin::new(&mut self.ws);
        ready!(ws.as_mut().poll_ready(cx)).map_err(to_io)?;
        let n = buf.len().min(WRITE_CHUNK);
        ws.start_send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
            .map_err(to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.ws).poll_flush(cx).map_err(to_io)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match ready!(Pin::new(&mut self.ws).poll_close(cx)) {
            Ok(())
            | Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                Poll::Ready(Ok(()))
            }
            Err(e) => Poll::Ready(Err(to_io(e))),
        }
    }
}

fn to_io(e: tungstenite::Error) -> io::Error {
    match e {
        tungstenite::Error::Io(e) => e,
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            io::Error::new(io::ErrorKind::BrokenPipe, "WebSocket closed")
        }
        tungstenite::Error::Capacity(e) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("WebSocket message over the limit: {e}"),
        ),
        e => io::Error::other(format!("WebSocket: {e}")),
    }
}

/// Whether an upgrade request offers [`SUBPROTOCOL`].
fn offers_subprotocol(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim() == SUBPROTOCOL)
}

/// Why the server side of an upgrade failed.
#[derive(Debug, thiserror::Error)]
pub enum UpgradeError {
    /// The request was not a WebSocket upgrade we take (no subprotocol, bad HTTP). The
    /// message carries the cause, so it is no `source`.
    #[error("WebSocket upgrade refused: {0}")]
    Refused(Box<tungstenite::Error>),
    /// The request did not arrive within [`UPGRADE_TIMEOUT`].
    #[error("no WebSocket upgrade within {}", text::duration(UPGRADE_TIMEOUT))]
    Timeout,
}

/// The server side of the upgrade: reads the request (within [`UPGRADE_TIMEOUT`]), refuses
/// one without [`SUBPROTOCOL`] (HTTP 400), and answers with it.
// The callback's error type is tungstenite's (an HTTP response).
#[allow(clippy::result_large_err)]
pub async fn accept<S>(stream: S, opts: &WsOptions) -> Result<WsIo<S>, UpgradeError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let callback = |request: &Request, mut response: Response| {
        if !offers_subprotocol(request.headers()) {
            let mut refusal = ErrorResponse::new(Some(format!(
                "this endpoint carries the argocd-agent TLS tunnel: WebSocket subprotocol {SUBPROTOCOL} required\n"
            )));
            *refusal.status_mut() = http::StatusCode::BAD_REQUEST;
            return Err(refusal);
        }
        response.headers_mut().insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            http::HeaderValue::from_static(SUBPROTOCOL),
        );
        Ok(response)
    };
    let upgrade =
        tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(opts.config()));
    match tokio::time::timeout(UPGRADE_TIMEOUT, upgrade).await {
        Ok(Ok(ws)) => Ok(WsIo::new(ws, opts.clone())),
        Ok(Err(e)) => Err(UpgradeError::Refused(Box::new(e))),
        Err(_) => Err(UpgradeError::Timeout),
    }
}

/// What the TLS of one agent connection runs on, on a listener that takes both.
pub enum Carrier {
    /// TLS straight on TCP (agents without `--enable-websocket`).
    Tcp(TcpStream),
    /// TLS inside a WebSocket.
    WebSocket(Box<WsIo<TcpStream>>),
}

/// Tells a direct TLS client from a WebSocket upgrade by the first byte, and upgrades the
/// latter; the refusal reasons are [`crate::transport::REFUSED_REASONS`]. The first byte
/// and the whole upgrade come within one [`UPGRADE_TIMEOUT`] from the accept: a client
/// dribbling its request holds its handshake slot no longer than that.
pub async fn tcp_or_websocket(tcp: TcpStream, opts: &WsOptions) -> Result<Carrier, Refused> {
    let deadline = Instant::now() + UPGRADE_TIMEOUT;
    let mut first = [0u8; 1];
    let timed_out = || {
        Refused::new(
            "HandshakeTimeout",
            format!(
                "no TLS handshake or WebSocket upgrade within {UPGRADE_TIMEOUT}",
                UPGRADE_TIMEOUT = text::duration(UPGRADE_TIMEOUT)
            ),
        )
    };
    match tokio::time::timeout_at(deadline, tcp.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == TLS_HANDSHAKE => Ok(Carrier::Tcp(tcp)),
        Ok(Ok(1)) => match tokio::time::timeout_at(deadline, accept(tcp, opts)).await {
            Ok(upgraded) => upgraded
                .map(|ws| Carrier::WebSocket(Box::new(ws)))
                .map_err(|e| Refused::new("WebSocketRefused", e.to_string())),
            Err(_) => Err(timed_out()),
        },
        Ok(Ok(_)) => Err(Refused::new(
            "HandshakeFailed",
            "closed before sending anything",
        )),
        Ok(Err(e)) => Err(Refused::new("HandshakeFailed", e.to_string())),
        Err(_) => Err(timed_out()),
    }
}

/// [`crate::transport::tls_incoming_with_options`] that also takes agents over a WebSocket
/// on the same port: each connection is direct TLS or a WebSocket upgrade, told apart by its
/// first byte ([`tcp_or_websocket`]), then the same TLS, peer verification and preface.
/// Accepted on `tasks` until `shutdown`.
pub fn tls_incoming_websocket(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    opts: IncomingOptions,
    ws: WsOptions,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<H2Connection<VerifiedStream<Carrier>>, io::Error>> + Send + 'static {
    let ws = Arc::new(ws);
    let name = crate::transport::listener_name(&listener);
    let prepare = move |tcp: TcpStream, _remote: Option<SocketAddr>| {
        let ws = ws.clone();
        async move { tcp_or_websocket(tcp, &ws).await }
    };
    Bounded::with_prepare(listener, &opts, &name, prepare, SvidHandshake::new(config))
        .incoming(tasks, shutdown)
}

macro_rules! carrier {
    ($self:ident, $io:ident => $e:expr) => {
        match $self.get_mut() {
            Carrier::Tcp($io) => {
                let $io = Pin::new($io);
                $e
            }
            Carrier::WebSocket($io) => {
                let $io = Pin::new($io.as_mut());
                $e
            }
        }
    };
}

impl AsyncRead for Carrier {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        carrier!(self, io => io.poll_read(cx, buf))
    }
}

impl AsyncWrite for Carrier {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        carrier!(self, io => io.poll_write(cx, buf))
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        carrier!(self, io => io.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        carrier!(self, io => io.poll_shutdown(cx))
    }
}

/// The client side: dials TCP, upgrades to a WebSocket offering [`SUBPROTOCOL`] (the
/// request goes to `ws://host:port/`), and runs the TLS handshake inside it; for
/// `Endpoint::connect_with_connector`.
#[derive(Clone)]
pub struct WsSvidConnector {
    tls: TlsConnector,
    server_name: ServerName<'static>,
    opts: WsOptions,
}

impl WsSvidConnector {
    /// A connector presenting `config`'s SVID and verifying the principal by its policy;
    /// `server_name` is the SNI only (as [`crate::transport::connector`]).
    pub fn new(config: Arc<rustls::ClientConfig>, server_name: &str, opts: WsOptions) -> Self {
        let server_name = ServerName::try_from(server_name.to_string()).unwrap_or_else(|_| {
            ServerName::try_from("localhost").expect("localhost is a valid DNS name")
        });
        WsSvidConnector {
            tls: TlsConnector::from(config),
            server_name,
            opts,
        }
    }
}

/// The upgrade request for `uri`'s authority, offering [`SUBPROTOCOL`].
fn upgrade_request(uri: &http::Uri) -> io::Result<tungstenite::handshake::client::Request> {
    use tungstenite::client::IntoClientRequest as _;
    let authority = uri
        .authority()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
    let mut request = format!("ws://{authority}/")
        .into_client_request()
        .map_err(to_io)?;
    request.headers_mut().insert(
        http::header::SEC_WEBSOCKET_PROTOCOL,
        http::HeaderValue::from_static(SUBPROTOCOL),
    );
    Ok(request)
}

/// The byte stream of [`WsSvidConnector`]: TLS inside a WebSocket over TCP.
pub type WsTlsStream = tokio_rustls::client::TlsStream<WsIo<TcpStream>>;

impl tower::Service<http::Uri> for WsSvidConnector {
    type Response = TokioIo<WsTlsStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let request = upgrade_request(&uri)?;
            let host = uri.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            let tcp = TcpStream::connect((host, uri.port_u16().unwrap_or(80))).await?;
            let _ = tcp.set_nodelay(true);
            let upgrade =
                tokio_tungstenite::client_async_with_config(request, tcp, Some(this.opts.config()));
            let (ws, _) = tokio::time::timeout(UPGRADE_TIMEOUT, upgrade)
                .await
                .map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!(
                            "no WebSocket upgrade within {UPGRADE_TIMEOUT}",
                            UPGRADE_TIMEOUT = text::duration(UPGRADE_TIMEOUT)
                        ),
                    )
                })?
                .map_err(|e| match e {
                    tungstenite::Error::Io(e) => e,
                    e => io::Error::other(format!("WebSocket upgrade failed: {e}")),
                })?;
            let io = WsIo::new(ws, this.opts.clone());
            let handshake = this.tls.connect(this.server_name.clone(), io);
            let stream = tokio::time::timeout(argocd_agent_listener::HANDSHAKE_TIMEOUT, handshake)
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out")
                })??;
            Ok(TokioIo::new(stream))
        })
    }
}

/// Dials `addr` (`host:port`, the principal or the HTTP/1.1 proxy in front of it) over a
/// WebSocket with mutual TLS inside it, and returns a connected channel.
pub async fn connect(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    opts: ChannelOptions,
    ws: WsOptions,
) -> Result<tonic::transport::Channel, TransportError> {
    crate::transport::endpoint(addr, &opts)?
        .connect_with_connector(WsSvidConnector::new(config, server_name, ws))
        .await
        .map_err(|cause| TransportError::Connect {
            addr: addr.to_string(),
            cause,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair(
        server_opts: WsOptions,
        client_opts: WsOptions,
    ) -> (WsIo<tokio::io::DuplexStream>, WsIo<tokio::io::DuplexStream>) {
        let (a, b) = tokio::io::duplex(256 * 1024);
        let server = tokio::spawn(async move { accept(b, &server_opts).await });
        let request = upgrade_request(&"http://p:1".parse().unwrap()).unwrap();
        let (ws, response) =
            tokio_tungstenite::client_async_with_config(request, a, Some(client_opts.config()))
                .await
                .unwrap();
        assert_eq!(
            response.headers()[http::header::SEC_WEBSOCKET_PROTOCOL],
            SUBPROTOCOL
        );
        (server.await.unwrap().unwrap(), WsIo::new(ws, client_opts))
    }

    #[tokio::test]
    async fn bytes_cross_both_ways_in_pieces_larger_than_a_message() {
        let (mut server, mut client) = pair(WsOptions::default(), WsOptions::default()).await;
        let big: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let sent = big.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&sent).await.unwrap();
            client.flush().await.unwrap();
            client
        });
        let mut got = vec![0u8; big.len()];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, big);
        let mut client = writer.await.unwrap();
        server.write_all(b"answer").await.unwrap();
        server.flush().await.unwrap();
        let mut answer = [0u8; 6];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"answer");
        // A close ends the other side's reads.
        client.shutdown().await.unwrap();
        let mut rest = Vec::new();
        assert_eq!(server.read_to_end(&mut rest).await.unwrap(), 0);
    }

    #[tokio::test]
    async fn a_ping_flood_before_any_data_ends_the_connection() {
        let (mut server, client) = pair(WsOptions::default(), WsOptions::default()).await;
        let mut ws = client.ws;
        use futures::SinkExt as _;
        let flood = tokio::spawn(async move {
            for _ in 0..CONTROL_BURST + 8 {
                if ws.send(Message::Ping(Bytes::new())).await.is_err() {
                    break;
                }
            }
            ws
        });
        let mut buf = [0u8; 16];
        let read = tokio::time::timeout(Duration::from_secs(5), server.read(&mut buf))
            .await
            .expect("the server gives up on a ping flood at once");
        let e = read.expect_err("a ping flood is an error, not data");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("control frames"), "{e}");
        drop(flood.await);
    }

    #[tokio::test]
    async fn pings_within_the_budget_are_answered_and_data_still_flows() {
        let (mut server, client) = pair(WsOptions::default(), WsOptions::default()).await;
        let mut ws = client.ws;
        use futures::SinkExt as _;
        for _ in 0..CONTROL_BURST - 1 {
            ws.send(Message::Ping(Bytes::new())).await.unwrap();
        }
        ws.send(Message::Binary(Bytes::from_static(b"hello")))
            .await
            .unwrap();
        let mut got = [0u8; 5];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"hello");
    }

    #[tokio::test]
    async fn an_upgrade_without_the_subprotocol_is_refused() {
        let (a, b) = tokio::io::duplex(64 * 1024);
        let server = tokio::spawn(async move { accept(b, &WsOptions::default()).await });
        let mut request = upgrade_request(&"http://p:1".parse().unwrap()).unwrap();
        request.headers_mut().insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            "chat".parse().unwrap(),
        );
        let client = tokio_tungstenite::client_async(request, a).await;
        match client {
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status(), http::StatusCode::BAD_REQUEST)
            }
            other => panic!("expected an HTTP 400, got {:?}", other.map(|_| ())),
        }
        let refused = server.await.unwrap().err().unwrap().to_string();
        assert!(refused.contains("refused"), "{refused}");
    }

    #[tokio::test]
    async fn an_oversized_message_ends_the_connection_with_an_error() {
        let small = WsOptions {
            max_message: 1024,
            ..WsOptions::default()
        };
        let (mut server, client) = pair(small, WsOptions::default()).await;
        let mut ws = client.ws;
        use futures::SinkExt as _;
        ws.send(Message::Binary(Bytes::from(vec![7u8; 4096])))
            .await
            .unwrap();
        let mut buf = [0u8; 16];
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }

    #[tokio::test]
    async fn a_text_message_is_an_error() {
        let (mut server, client) = pair(WsOptions::default(), WsOptions::default()).await;
        let mut ws = client.ws;
        use futures::SinkExt as _;
        ws.send(Message::text("hello")).await.unwrap();
        let mut buf = [0u8; 16];
        let err = server.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[tokio::test(start_paused = true)]
    async fn pings_keep_a_quiet_connection_up_and_a_silent_peer_is_dropped() {
        let opts = WsOptions {
            ping_interval: Duration::from_secs(5),
            timeout: Duration::from_secs(2),
            ..WsOptions::default()
        };
        let (mut server, mut client) = pair(opts.clone(), opts).await;
        // Both sides read (and so ping and answer pings) for a minute of quiet: still up.
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 1];
            let n = server.read(&mut buf).await;
            (n.map(|n| buf[..n].to_vec()), server)
        });
        let mut buf = [0u8; 1];
        let quiet = tokio::time::timeout(Duration::from_secs(60), client.read(&mut buf)).await;
        assert!(quiet.is_err(), "the client's read ended: {quiet:?}");
        client.write_all(b"x").await.unwrap();
        client.flush().await.unwrap();
        let (got, server) = reader.await.unwrap();
        assert_eq!(got.unwrap(), b"x");
        // A client that stops reading never answers pings: the server gives up on it.
        let mut server = server;
        let started = Instant::now();
        let err = server.read(&mut [0u8; 1]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(
            started.elapsed() <= Duration::from_secs(8),
            "{:?}",
            started.elapsed()
        );
        drop(client);
    }

    #[test]
    fn the_subprotocol_is_found_in_a_list() {
        let mut h = http::HeaderMap::new();
        assert!(!offers_subprotocol(&h));
        h.insert(
            http::header::SEC_WEBSOCKET_PROTOCOL,
            format!("chat, {SUBPROTOCOL}").parse().unwrap(),
        );
        assert!(offers_subprotocol(&h));
    }
}
