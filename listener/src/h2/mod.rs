//! The HTTP/2 connection a gRPC listener hands to the server ([`H2Connection`]): its client
//! preface read before (a client that never speaks HTTP/2 holds no connection for long) and
//! replayed, then, under the connection's policy ([`H2Policy`]), its client's PINGs held to a
//! minimum interval ([`pings`]) and the connection closed once no stream has been open for
//! the idle timeout ([`streams`]).
//!
//! h2, hyper and tonic answer every PING, expose no hook to count or refuse them, and have no
//! idle timeout for a server connection, so both rules are applied under h2: the connection
//! reads the frame headers going both ways (after TLS, where the bytes are HTTP/2 frames).
//! A rule broken gets the client a GOAWAY (after the frame the server is writing), then the
//! connection ends.

mod frames;
pub mod pings;
mod streams;

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::caps::Admission;
use frames::{ACK, ENHANCE_YOUR_CALM, FrameScanner, NO_ERROR, PING, goaway};
pub use pings::{MAX_PING_STRIKES, TOO_MANY_PINGS};
use streams::Streams;

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The debug data of the GOAWAY sent to a connection idle for too long.
pub const MAX_IDLE: &[u8] = b"max_idle";

/// Reads the HTTP/2 client preface from `r`: fails on the first byte that differs, or if
/// the connection ends first.
pub async fn read_h2_preface<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<()> {
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

/// What a gRPC listener holds its connections to, past the handshake and the preface.
/// Zero turns a rule off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct H2Policy {
    /// The shortest interval between a client's PINGs ([`pings`]; the principal's
    /// `--keepalive-min-interval`).
    pub min_ping_interval: Duration,
    /// How long a connection may stay open with no stream open (gRPC's
    /// `MaxConnectionIdle`; the principal's `--max-connection-idle`).
    pub max_idle: Duration,
}

impl H2Policy {
    fn is_off(&self) -> bool {
        self.min_ping_interval.is_zero() && self.max_idle.is_zero()
    }
}

/// Why the listener closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Close {
    TooManyPings,
    Idle,
}

impl Close {
    /// The reason counted (the principal's `listener_connections_closed_total`).
    fn reason(self) -> &'static str {
        match self {
            Close::TooManyPings => "TooManyPings",
            Close::Idle => "IdleTimeout",
        }
    }

    fn goaway(self, last_stream: u32) -> Vec<u8> {
        match self {
            Close::TooManyPings => goaway(last_stream, ENHANCE_YOUR_CALM, TOO_MANY_PINGS),
            Close::Idle => goaway(last_stream, NO_ERROR, MAX_IDLE),
        }
    }

    fn error(self) -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            match self {
                Close::TooManyPings => {
                    "connection closed: the client sent HTTP/2 PINGs more often than --keepalive-min-interval"
                }
                Close::Idle => "connection closed: no stream open for --max-connection-idle",
            },
        )
    }
}

#[derive(Debug)]
enum State {
    Open,
    /// A rule is broken: the GOAWAY goes out at the next frame boundary of what we write.
    Violated(Close),
    /// Writing the GOAWAY (bytes, how many are written).
    Closing(Close, Vec<u8>, usize),
    /// The GOAWAY is out: reads end, writes fail.
    Closed(Close),
}

/// The idle timer: armed while no stream is open.
#[derive(Debug)]
struct Idle {
    max: Duration,
    timer: Pin<Box<tokio::time::Sleep>>,
}

/// What a connection under a policy keeps: the frames seen both ways and the rules' state.
struct Guard {
    peer: Option<SocketAddr>,
    pings: Option<pings::Strikes>,
    idle: Option<Idle>,
    streams: Streams,
    read: FrameScanner,
    write: FrameScanner,
    state: State,
    on_close: Option<OnClose>,
}

/// Told why the connection was closed (`TooManyPings`, `IdleTimeout`): the listener's
/// refusal hook.
pub type OnClose = std::sync::Arc<dyn Fn(&'static str) + Send + Sync>;

/// A connection whose client sent the HTTP/2 client preface in time (which reads replay
/// first), holding its place under the listener's caps until it ends, its PINGs and idle
/// time held to the listener's [`H2Policy`]: what the bounded accept streams hand to
/// `Server::serve_with_incoming`. `IO` is what the handshake made of the connection: the TCP
/// or Unix stream itself (plaintext), or a verified TLS stream.
pub struct H2Connection<IO> {
    inner: IO,
    /// Bytes of [`H2_PREFACE`] already returned by reads ([`H2_PREFACE`]'s length: none left).
    replayed: usize,
    _admission: Admission,
    /// `None`: no rule on, bytes pass through.
    guard: Option<Box<Guard>>,
}

impl<IO> H2Connection<IO> {
    /// `inner` from `peer`, whose preface has been read: reads return it first. Needs a
    /// Tokio runtime when `policy` has an idle timeout (the timer).
    pub(crate) fn new(
        inner: IO,
        admission: Admission,
        peer: Option<SocketAddr>,
        policy: H2Policy,
        on_close: Option<OnClose>,
    ) -> Self {
        let guard = (!policy.is_off()).then(|| {
            Box::new(Guard {
                peer,
                pings: (!policy.min_ping_interval.is_zero())
                    .then(|| pings::Strikes::new(policy.min_ping_interval)),
                idle: (!policy.max_idle.is_zero()).then(|| Idle {
                    max: policy.max_idle,
                    timer: Box::pin(tokio::time::sleep(policy.max_idle)),
                }),
                streams: Streams::default(),
                read: FrameScanner::default(),
                write: FrameScanner::default(),
                state: State::Open,
                on_close,
            })
        });
        H2Connection {
            inner,
            replayed: 0,
            _admission: admission,
            guard,
        }
    }

    /// The connection under the replay (e.g. the verified TLS stream and its peer).
    pub fn get_ref(&self) -> &IO {
        &self.inner
    }
}

impl Guard {
    /// A rule is broken: logged, counted, and the GOAWAY started.
    fn violate(&mut self, close: Close) {
        if !matches!(self.state, State::Open) {
            return;
        }
        let peer = self.peer.map_or_else(|| "-".to_owned(), |p| p.to_string());
        match (close, &self.pings, &self.idle) {
            (Close::TooManyPings, Some(p), _) => tracing::warn!(%peer,
                min_interval = %crate::text::duration(p.min_interval), strikes = p.strikes,
                "client sends HTTP/2 PINGs more often than --keepalive-min-interval: GOAWAY ENHANCE_YOUR_CALM (too_many_pings), closing the connection"),
            (_, _, Some(i)) => tracing::debug!(%peer, idle = %crate::text::duration(i.max),
                "no stream open for --max-connection-idle: GOAWAY NO_ERROR (max_idle), closing the connection"),
            _ => {}
        }
        if let Some(hook) = &self.on_close {
            hook(close.reason());
        }
        self.state = State::Violated(close);
    }

    /// Whether the idle timer ran out (polled only while no stream is open).
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        match &mut self.idle {
            Some(idle) if self.streams.idle() => idle.timer.as_mut().poll(cx).is_ready(),
            _ => false,
        }
    }

    /// The last stream closed: the idle time counts from now.
    fn rearm(&mut self, cx: &mut Context<'_>) {
        if let Some(idle) = &mut self.idle {
            let deadline = tokio::time::Instant::now() + idle.max;
            idle.timer.as_mut().reset(deadline);
            // The read side polls the timer; make sure it looks at the new deadline.
            cx.waker().wake_by_ref();
        }
    }

    /// Starts the GOAWAY when the write side is between frames, and writes it out.
    fn poll_goaway<IO: AsyncWrite + Unpin>(
        &mut self,
        inner: &mut IO,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        if let State::Violated(close) = self.state
            && self.write.to_boundary() == 0
        {
            self.state = State::Closing(close, close.goaway(self.streams.last_opened), 0);
        }
        if let State::Closing(close, frame, written) = &mut self.state {
            while *written < frame.len() {
                let n = ready!(Pin::new(&mut *inner).poll_write(cx, &frame[*written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *written += n;
            }
            ready!(Pin::new(&mut *inner).poll_flush(cx))?;
            self.state = State::Closed(*close);
            // A read waiting on a quiet client ends now.
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    /// Follows the frames the client sent in `bytes`.
    fn on_read(&mut self, bytes: &[u8], cx: &mut Context<'_>) {
        let was_idle = self.streams.idle();
        let now = Instant::now();
        let (streams, pings) = (&mut self.streams, &mut self.pings);
        let mut too_many = false;
        self.read.scan(bytes, |h| {
            streams.client_sent(h);
            if h.kind == PING
                && h.flags & ACK == 0
                && let Some(p) = pings.as_mut()
            {
                too_many |= p.ping(now);
            }
        });
        if !was_idle && self.streams.idle() {
            self.rearm(cx);
        }
        if too_many {
            self.violate(Close::TooManyPings);
        }
    }

    /// Follows the frames the server wrote in `bytes`.
    fn on_write(&mut self, bytes: &[u8], cx: &mut Context<'_>) {
        let was_idle = self.streams.idle();
        let (streams, pings) = (&mut self.streams, &mut self.pings);
        self.write.scan(bytes, |h| {
            streams.server_sent(h);
            if matches!(h.kind, frames::DATA | frames::HEADERS)
                && let Some(p) = pings.as_mut()
            {
                p.forgiven = true;
            }
        });
        if !was_idle && self.streams.idle() {
            self.rearm(cx);
        }
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for H2Connection<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for H2Connection<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let pending = &H2_PREFACE[this.replayed..];
        if !pending.is_empty() {
            let n = pending.len().min(buf.remaining());
            buf.put_slice(&pending[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        let Some(guard) = this.guard.as_deref_mut() else {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        };
        if matches!(guard.state, State::Open) && guard.idle_expired(cx) {
            guard.violate(Close::Idle);
        }
        if !matches!(guard.state, State::Open) {
            // Sent now if our side is between frames; else after the frame in progress.
            ready!(guard.poll_goaway(&mut this.inner, cx))?;
        }
        if matches!(guard.state, State::Closed(_)) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        guard.on_read(&buf.filled()[before..], cx);
        if matches!(guard.state, State::Violated(_)) {
            ready!(guard.poll_goaway(&mut this.inner, cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for H2Connection<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let Some(guard) = this.guard.as_deref_mut() else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        ready!(guard.poll_goaway(&mut this.inner, cx))?;
        let buf = match guard.state {
            State::Closed(close) => return Poll::Ready(Err(close.error())),
            // Only up to the end of the frame in progress: the GOAWAY goes after it.
            State::Violated(_) => &buf[..buf.len().min(guard.write.to_boundary())],
            _ => buf,
        };
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        guard.on_write(&buf[..n], cx);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(guard) = this.guard.as_deref_mut() {
            ready!(guard.poll_goaway(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(guard) = this.guard.as_deref_mut() {
            ready!(guard.poll_goaway(&mut this.inner, cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
