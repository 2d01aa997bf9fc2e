//! The minimum interval between the HTTP/2 PINGs an agent may send
//! (`--keepalive-min-interval`, upstream's keepalive enforcement policy).
//!
//! h2, hyper and tonic answer every PING and expose no hook to count or refuse them, so the
//! rule is applied under h2: [`PingGuard`] wraps each accepted connection (after TLS, where
//! the bytes are HTTP/2 frames), reads the frame headers going both ways, and applies the
//! rule gRPC servers apply. A PING that comes sooner than the minimum after the previous one
//! is a strike; a strike count above [`MAX_PING_STRIKES`] gets the connection a GOAWAY with
//! `ENHANCE_YOUR_CALM` and the debug data `too_many_pings`, then it is closed. A DATA or
//! HEADERS frame the principal sends forgives the strikes (the next PING is not counted), as
//! a PING after real traffic is not abuse (gRPC-Go's `resetPingStrikes`, set on every data
//! and header write, checked in `handlePing`).
//!
//! Unlike gRPC-Go, that forgiveness is granted at most once per minimum interval. The
//! principal answers what the agent sends (a `pong` for every `ping` event, acknowledgements),
//! so with gRPC-Go's rule alone a client alternating an event with a PING has every PING
//! forgiven by the answer it provoked, and pings without limit. With the budget such a
//! client strikes from its second PING in an interval. Pings of a connection without streams
//! are held to the same minimum (gRPC-Go holds them to two hours unless told otherwise); an
//! agent always has its event stream open.

use argocd_agent_identity::text;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Strikes tolerated before the connection is closed (gRPC's value).
pub const MAX_PING_STRIKES: u32 = 2;

/// The debug data of the GOAWAY (what gRPC clients recognise to slow their pings down).
pub const TOO_MANY_PINGS: &[u8] = b"too_many_pings";

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// One HTTP/2 frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHeader {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

/// Follows frame boundaries in a byte stream seen in pieces.
#[derive(Debug, Default)]
struct FrameScanner {
    /// Bytes of the client preface still to skip.
    skip: usize,
    header: [u8; FRAME_HEADER_LEN],
    have: usize,
    payload_left: usize,
}

impl FrameScanner {
    /// Scans `bytes`, calling `on_header` for every frame header completed in them.
    fn scan(&mut self, mut bytes: &[u8], mut on_header: impl FnMut(FrameHeader)) {
        while !bytes.is_empty() {
            let n = if self.skip > 0 {
                let n = self.skip.min(bytes.len());
                self.skip -= n;
                n
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                self.payload_left -= n;
                n
            } else {
                let n = (FRAME_HEADER_LEN - self.have).min(bytes.len());
                self.header[self.have..self.have + n].copy_from_slice(&bytes[..n]);
                self.have += n;
                if self.have == FRAME_HEADER_LEN {
                    self.have = 0;
                    let h = &self.header;
                    let header = FrameHeader {
                        len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
                        kind: h[3],
                        flags: h[4],
                        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                    };
                    self.payload_left = header.len;
                    on_header(header);
                }
                n
            };
            bytes = &bytes[n..];
        }
    }

    /// Bytes until the current frame ends (0: between frames).
    fn to_boundary(&self) -> usize {
        if self.have > 0 {
            // Inside a header: its length is not known yet; finish the header first.
            FRAME_HEADER_LEN - self.have
        } else {
            self.skip + self.payload_left
        }
    }
}

/// The strike count of one connection.
#[derive(Debug)]
struct Strikes {
    min_interval: Duration,
    last_ping: Option<Instant>,
    strikes: u32,
    /// The principal sent DATA or HEADERS since the last PING.
    forgiven: bool,
    /// When a PING was last forgiven (at most one per `min_interval`).
    last_forgiven: Option<Instant>,
}

impl Strikes {
    fn new(min_interval: Duration) -> Strikes {
        Strikes {
            min_interval,
            last_ping: None,
            strikes: 0,
            forgiven: false,
            last_forgiven: None,
        }
    }

    /// Counts a PING received at `now`; true once the connection has too many strikes.
    fn ping(&mut self, now: Instant) -> bool {
        let last = self.last_ping.replace(now);
        let budget = self
            .last_forgiven
            .is_none_or(|at| now.saturating_duration_since(at) >= self.min_interval);
        if std::mem::take(&mut self.forgiven) && budget {
            self.last_forgiven = Some(now);
            self.strikes = 0;
            return false;
        }
        if last.is_some_and(|last| now.saturating_duration_since(last) < self.min_interval) {
            self.strikes += 1;
        }
        self.strikes > MAX_PING_STRIKES
    }
}

/// The GOAWAY frame sent to a client that pings too often.
fn goaway(last_stream: u32) -> Vec<u8> {
    let len = 8 + TOO_MANY_PINGS.len();
    let mut f = Vec::with_capacity(FRAME_HEADER_LEN + len);
    f.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    f.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    f.extend_from_slice(&last_stream.to_be_bytes());
    f.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
    f.extend_from_slice(TOO_MANY_PINGS);
    f
}

#[derive(Debug)]
enum State {
    Open,
    /// Too many strikes: the GOAWAY goes out at the next frame boundary of what we write.
    Violated,
    /// Writing the GOAWAY (bytes, how many are written).
    Closing(Vec<u8>, usize),
    /// The GOAWAY is out: reads end, writes fail.
    Closed,
}

/// A server connection whose client's HTTP/2 PINGs are held to a minimum interval (see the
/// module documentation). Without a minimum it only passes bytes through.
#[derive(Debug)]
pub struct PingGuard<S> {
    inner: S,
    peer: Option<SocketAddr>,
    strikes: Option<Strikes>,
    read: FrameScanner,
    write: FrameScanner,
    last_stream: u32,
    state: State,
}

impl<S> PingGuard<S> {
    /// Guards a connection accepted from `peer` (for the log); `min_interval` zero: no
    /// minimum.
    pub fn new(inner: S, peer: Option<SocketAddr>, min_interval: Duration) -> PingGuard<S> {
        PingGuard {
            inner,
            peer,
            strikes: (!min_interval.is_zero()).then(|| Strikes::new(min_interval)),
            read: FrameScanner {
                skip: PREFACE_LEN,
                ..FrameScanner::default()
            },
            write: FrameScanner::default(),
            last_stream: 0,
            state: State::Open,
        }
    }

    fn closed() -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "connection closed: the client sent HTTP/2 PINGs more often than --keepalive-min-interval",
        )
    }
}

impl<S: AsyncWrite + Unpin> PingGuard<S> {
    /// Starts the GOAWAY when the write side is between frames, and writes it out.
    fn poll_goaway(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if matches!(self.state, State::Violated) && self.write.to_boundary() == 0 {
            self.state = State::Closing(goaway(self.last_stream), 0);
        }
        if let State::Closing(frame, written) = &mut self.state {
            while *written < frame.len() {
                let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &frame[*written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *written += n;
            }
            ready!(Pin::new(&mut self.inner).poll_flush(cx))?;
            self.state = State::Closed;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PingGuard<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if matches!(this.state, State::Closed) {
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let Some(strikes) = this.strikes.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let (mut too_many, mut last_stream) = (false, this.last_stream);
        this.read.scan(&buf.filled()[before..], |h| match h.kind {
            HEADERS if h.stream % 2 == 1 => last_stream = last_stream.max(h.stream),
            PING if h.flags & ACK == 0 => too_many |= strikes.ping(Instant::now()),
            _ => {}
        });
        this.last_stream = last_stream;
        if too_many && matches!(this.state, State::Open) {
            tracing::warn!(peer = %text::or_dash(this.peer), min_interval = %text::duration(strikes.min_interval), strikes = strikes.strikes,
                "client sends HTTP/2 PINGs more often than --keepalive-min-interval: GOAWAY ENHANCE_YOUR_CALM (too_many_pings), closing the connection");
            this.state = State::Violated;
            // Sent now if our side is between frames; else after the frame in progress.
            if let Poll::Ready(Err(e)) = this.poll_goaway(cx) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PingGuard<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.strikes.is_none() {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        }
        ready!(this.poll_goaway(cx))?;
        let buf = match this.state {
            State::Closed => return Poll::Ready(Err(Self::closed())),
            // Only up to the end of the frame in progress: the GOAWAY goes after it.
            State::Violated => &buf[..buf.len().min(this.write.to_boundary())],
            _ => buf,
        };
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        if let Some(strikes) = this.strikes.as_mut() {
            this.write.scan(&buf[..n], |h| {
                if matches!(h.kind, DATA | HEADERS) {
                    strikes.forgiven = true;
                }
            });
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.strikes.is_some() {
            ready!(this.poll_goaway(cx))?;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.strikes.is_some() {
            ready!(this.poll_goaway(cx))?;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for PingGuard<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    fn ping() -> Vec<u8> {
        frame(PING, 0, 0, &[7; 8])
    }

    #[test]
    fn scanner_finds_headers_split_anywhere() {
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, 4, 1, &[1, 2, 3]));
        bytes.extend(ping());
        bytes.extend(frame(DATA, 0, 3, &[0; 300]));
        for cut in 1..bytes.len() {
            let mut s = FrameScanner {
                skip: PREFACE_LEN,
                ..FrameScanner::default()
            };
            let mut seen = Vec::new();
            for piece in bytes.chunks(cut) {
                s.scan(piece, |h| seen.push((h.kind, h.stream, h.len)));
            }
            assert_eq!(
                seen,
                vec![(HEADERS, 1, 3), (PING, 0, 8), (DATA, 3, 300)],
                "{cut}"
            );
            assert_eq!(s.to_boundary(), 0);
        }
    }

    #[test]
    fn strikes_follow_the_grpc_rule() {
        let t0 = Instant::now();
        let mut s = Strikes::new(Duration::from_secs(10));
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // Spaced pings never strike.
        assert!(!s.ping(at(0)));
        assert!(!s.ping(at(10)));
        assert!(!s.ping(at(25)));
        assert_eq!(s.strikes, 0);
        // Two quick ones are tolerated, the third closes.
        assert!(!s.ping(at(26)));
        assert!(!s.ping(at(27)));
        assert!(s.ping(at(28)));
        // Traffic from the server forgives: the next ping is not counted and clears them.
        s.strikes = 2;
        s.forgiven = true;
        assert!(!s.ping(at(29)));
        assert_eq!(s.strikes, 0);
        // But only once per minimum interval: traffic a client provokes buys no more.
        s.forgiven = true;
        assert!(!s.ping(at(30)), "a first strike");
        assert_eq!(s.strikes, 1);
        s.forgiven = true;
        assert!(!s.ping(at(31)));
        s.forgiven = true;
        assert!(s.ping(at(32)), "the third strike closes");
        // A quiet interval later, forgiveness is back.
        let mut s = Strikes::new(Duration::from_secs(10));
        s.forgiven = true;
        assert!(!s.ping(at(0)));
        s.strikes = 2;
        s.forgiven = true;
        assert!(!s.ping(at(10)));
        assert_eq!(s.strikes, 0);
    }

    /// The probe's bypass: the client alternates an application-level `ping` event (a DATA
    /// frame on its stream) with an HTTP/2 PING, and the principal answers every event with
    /// a `pong` (a DATA frame). Each answer used to forgive the next PING.
    #[tokio::test]
    async fn answers_to_the_clients_own_events_do_not_buy_unlimited_pings() {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (mut client_r, mut client_w) = tokio::io::split(client);
        let mut guard = PingGuard::new(server, None, Duration::from_secs(1));
        let mut opening = PREFACE.to_vec();
        opening.extend(frame(HEADERS, 4, 1, &[0; 4]));
        client_w.write_all(&opening).await.unwrap();
        let mut buf = vec![0; opening.len()];
        guard.read_exact(&mut buf).await.unwrap();
        let event = frame(DATA, 0, 1, &[0; 20]);
        let pong = frame(DATA, 0, 1, &[1; 30]);
        let mut pings = 0;
        let closed = loop {
            if pings == 300 {
                break false;
            }
            client_w.write_all(&event).await.unwrap();
            let mut e = vec![0; event.len()];
            if guard.read_exact(&mut e).await.is_err() || guard.write_all(&pong).await.is_err() {
                break true;
            }
            client_w.write_all(&ping()).await.unwrap();
            pings += 1;
            let mut p = [0; 17];
            if guard.read_exact(&mut p).await.is_err() {
                break true;
            }
        };
        assert!(closed, "300 PINGs in a burst were all forgiven");
        assert!(
            pings <= MAX_PING_STRIKES as usize + 2,
            "closed only after {pings} PINGs"
        );
        // The client got the answers it provoked, then the GOAWAY.
        drop(guard);
        let mut out = Vec::new();
        client_r.read_to_end(&mut out).await.unwrap();
        assert!(out.ends_with(TOO_MANY_PINGS), "GOAWAY too_many_pings");
        let goaway_at = out.len() - goaway(1).len();
        assert_eq!(&out[goaway_at..], &goaway(1)[..]);
    }

    #[tokio::test]
    async fn goaway_after_the_frame_in_progress_then_closed() {
        let (client, server) = tokio::io::duplex(1 << 16);
        let (mut client_r, mut client_w) = tokio::io::split(client);
        let mut guard = PingGuard::new(server, None, Duration::from_secs(60));
        let mut input = PREFACE.to_vec();
        input.extend(frame(HEADERS, 4, 5, &[0; 4]));
        for _ in 0..=MAX_PING_STRIKES + 1 {
            input.extend(ping());
        }
        client_w.write_all(&input).await.unwrap();
        // Our side is in the middle of a DATA frame when the pings arrive.
        let data = frame(DATA, 0, 5, &[9; 100]);
        guard.write_all(&data[..50]).await.unwrap();
        let mut buf = vec![0; input.len()];
        guard.read_exact(&mut buf).await.unwrap();
        // The rest of the frame goes out, then the GOAWAY; more frames are refused.
        guard.write_all(&data[50..]).await.unwrap();
        let err = guard.write_all(&ping()).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        assert_eq!(guard.read(&mut buf).await.unwrap(), 0, "reads end");
        let expected = goaway(5);
        let mut out = vec![0; data.len() + expected.len()];
        client_r.read_exact(&mut out).await.unwrap();
        assert_eq!(&out[..data.len()], &data[..]);
        assert_eq!(&out[data.len()..], &expected[..]);
        assert_eq!(&expected[3..5], &[GOAWAY, 0]);
        assert_eq!(&expected[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert!(expected.ends_with(TOO_MANY_PINGS));
    }

    #[tokio::test]
    async fn spaced_or_unguarded_pings_pass() {
        for min in [Duration::ZERO, Duration::from_millis(1)] {
            let (client, server) = tokio::io::duplex(1 << 16);
            let (mut client_r, mut client_w) = tokio::io::split(client);
            let mut guard = PingGuard::new(server, None, min);
            let mut input = PREFACE.to_vec();
            input.extend(frame(HEADERS, 4, 1, &[]));
            client_w.write_all(&input).await.unwrap();
            let mut buf = vec![0; input.len()];
            guard.read_exact(&mut buf).await.unwrap();
            for _ in 0..10 {
                tokio::time::sleep(Duration::from_millis(3)).await;
                client_w.write_all(&ping()).await.unwrap();
                let mut p = [0; 17];
                guard.read_exact(&mut p).await.unwrap();
                guard
                    .write_all(&frame(PING, ACK, 0, &[7; 8]))
                    .await
                    .unwrap();
                client_r.read_exact(&mut p).await.unwrap();
                assert_eq!(p[4], ACK);
            }
        }
    }
}
