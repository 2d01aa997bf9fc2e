//! The bounded accept loop every gRPC endpoint (and the Redis proxy) takes its connections
//! from: the caps of [`IncomingOptions`] and the server's readiness at the accept
//! ([`crate::gate`]), then per connection, in its own task on the caller's `TaskTracker`:
//! an optional step that bounds its own time (a WebSocket upgrade), the handshake under the
//! handshake cap and timeout (TLS with SPIFFE verification is supplied by the identity
//! crate; plaintext listeners have none), then either the caller's serving of the
//! connection ([`Bounded::serve`]) or, for tonic's `serve_with_incoming`, the HTTP/2 client
//! preface within its timeout ([`Bounded::incoming`]). Nothing here knows about TLS
//! identities: the handshake hands over whatever it made of the connection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::OwnedSemaphorePermit;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::caps::{Admission, ClientSlot};
use crate::gate::{Accept, Admitted, Gate, HandshakeSlot, IncomingOptions};
use crate::h2::{H2Connection, read_h2_preface};
use crate::text;

/// Why a connection was dropped by its preparation or its handshake.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Refused {
    /// The reason counted through [`IncomingOptions::on_refused`] (a metric label value).
    pub reason: &'static str,
    /// What went wrong, for the log line.
    pub message: String,
}

impl Refused {
    /// A refusal for `reason`, told as `message`.
    pub fn new(reason: &'static str, message: impl Into<String>) -> Refused {
        Refused {
            reason,
            message: message.into(),
        }
    }
}

/// The handshake of each accepted connection, under the listener's handshake cap and
/// [`IncomingOptions::handshake_timeout`]: TLS (with the peer's verification), or none.
pub trait Handshake<IO>: Send + Sync + 'static {
    /// What the handshake makes of the connection.
    type Output: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// What log lines call it ("TLS handshake").
    const NAME: &'static str;
    /// Whether a connection waits in the kernel's backlog for a handshake slot before it is
    /// accepted (costly handshakes: a reconnect storm does not take the CPU) rather than
    /// being closed at once when no slot is free.
    const QUEUE: bool = true;
    /// Whether the wait for the HTTP/2 client preface holds the handshake slot too (a
    /// listener without a handshake: the preface is what it waits for).
    const PREFACE_IS_HANDSHAKE: bool = false;

    /// The handshake on `io` from `remote` (`None`: a Unix socket's client). Failures are
    /// logged here, with what only the handshake knows, and counted by the caller.
    fn handshake(
        &self,
        io: IO,
        remote: Option<SocketAddr>,
    ) -> impl Future<Output = Result<Self::Output, Refused>> + Send;
}

/// No handshake (plaintext listeners): the connection as accepted. Connections finding no
/// handshake slot are closed at once, and the slot is held until the HTTP/2 client preface
/// has come.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHandshake;

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Handshake<IO> for NoHandshake {
    type Output = IO;
    const NAME: &'static str = "HTTP/2 preface";
    const QUEUE: bool = false;
    const PREFACE_IS_HANDSHAKE: bool = true;

    fn handshake(
        &self,
        io: IO,
        _remote: Option<SocketAddr>,
    ) -> impl Future<Output = Result<IO, Refused>> + Send {
        std::future::ready(Ok(io))
    }
}

/// A step before the handshake that does nothing.
pub type NoPrepare<IO> = fn(IO, Option<SocketAddr>) -> std::future::Ready<Result<IO, Refused>>;

fn no_prepare<IO>(io: IO, _remote: Option<SocketAddr>) -> std::future::Ready<Result<IO, Refused>> {
    std::future::ready(Ok(io))
}

/// A connection past its handshake, with its place under the connection caps (held until
/// it is dropped).
pub struct Accepted<IO> {
    /// What the handshake made of the connection.
    pub io: IO,
    /// The client's address (`None`: a Unix socket's client).
    pub remote: Option<SocketAddr>,
    /// The connection's place under the listener's connection caps.
    pub admission: Admission,
    /// The handshake slot, still held while the preface is awaited
    /// ([`Handshake::PREFACE_IS_HANDSHAKE`]).
    held: Option<(OwnedSemaphorePermit, Option<ClientSlot>)>,
}

/// A listening socket with its caps, its preparation step and its handshake: served with
/// [`Bounded::serve`] (each connection handed to a function) or [`Bounded::incoming`] (a
/// stream for tonic's `serve_with_incoming`).
pub struct Bounded<L, P, H> {
    listener: L,
    gate: Arc<Gate>,
    prepare: Arc<P>,
    handshake: Arc<H>,
}

impl<L, H> Bounded<L, NoPrepare<L::Io>, H>
where
    L: Accept,
    H: Handshake<L::Io>,
{
    /// `listener` under the caps of `opts`, each connection through `handshake`; `name`
    /// names the listener in log lines.
    pub fn new(listener: L, opts: &IncomingOptions, name: &str, handshake: H) -> Self {
        Bounded::with_prepare(listener, opts, name, no_prepare::<L::Io>, handshake)
    }
}

impl<L, P, PF, C, H> Bounded<L, P, H>
where
    L: Accept,
    P: Fn(L::Io, Option<SocketAddr>) -> PF + Send + Sync + 'static,
    PF: Future<Output = Result<C, Refused>> + Send + 'static,
    C: Send + 'static,
    H: Handshake<C>,
{
    /// [`Bounded::new`] with a step between the accept and the handshake (`prepare`: e.g. a
    /// WebSocket upgrade the TLS then runs inside). The handshake slot (and the client
    /// address's share of them) is held from the accept through `prepare` and the
    /// handshake; the connection's place under the connection caps for its whole life.
    /// `prepare` must bound its own time and log its own refusals' details.
    pub fn with_prepare(
        listener: L,
        opts: &IncomingOptions,
        name: &str,
        prepare: P,
        handshake: H,
    ) -> Self {
        Bounded {
            listener,
            gate: Arc::new(Gate::new(opts, name, H::QUEUE)),
            prepare: Arc::new(prepare),
            handshake: Arc::new(handshake),
        }
    }

    /// Accepts until `shutdown` on `tasks`, handing each connection past its handshake to
    /// `serve` (in the connection's own task on `tasks`). A connection still in its
    /// handshake at `shutdown` is dropped; `serve` sees `shutdown` itself.
    pub fn serve<F, Fut>(self, tasks: &TaskTracker, shutdown: CancellationToken, serve: F)
    where
        F: Fn(Accepted<H::Output>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let until = shutdown.clone().cancelled_owned();
        self.run(tasks, until, shutdown, serve);
    }

    /// The connections whose client sent the HTTP/2 client preface within
    /// [`IncomingOptions::preface_timeout`] after the handshake, for
    /// `Server::serve_with_incoming`: accepted on `tasks` until `shutdown` or until the
    /// stream is dropped. Connections without a preface are counted (`NoPreface`) and
    /// logged without a storm.
    pub fn incoming(
        self,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> impl Stream<Item = io::Result<H2Connection<H::Output>>> + Send + 'static {
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        let gate = self.gate.clone();
        let until = {
            let (tx, shutdown) = (tx.clone(), shutdown.clone());
            async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = tx.closed() => {}
                }
            }
        };
        let stop = shutdown.clone();
        self.run(tasks, until, shutdown, move |accepted| {
            let (tx, gate, stop) = (tx.clone(), gate.clone(), stop.clone());
            async move {
                let hand_over = async {
                    if let Some(stream) = prefaced(&gate, accepted).await {
                        let _ = tx.send(Ok(stream)).await;
                    }
                };
                tokio::select! {
                    _ = stop.cancelled() => {}
                    _ = hand_over => {}
                }
            }
        });
        ReceiverStream::new(rx)
    }

    /// The accept loop on `tasks` until `until`; each admitted connection's preparation
    /// and handshake in its own task (dropped at `shutdown`), then `serve`.
    fn run<F, Fut>(
        self,
        tasks: &TaskTracker,
        until: impl Future<Output = ()> + Send + 'static,
        shutdown: CancellationToken,
        serve: F,
    ) where
        F: Fn(Accepted<H::Output>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let Bounded {
            listener,
            gate,
            prepare,
            handshake,
        } = self;
        let serve = Arc::new(serve);
        let conns = tasks.clone();
        tasks.spawn(async move {
            tokio::pin!(until);
            while let Some((io, remote, admitted)) = gate.next(&listener, until.as_mut()).await {
                let (gate, prepare, handshake) = (gate.clone(), prepare.clone(), handshake.clone());
                let (serve, shutdown) = (serve.clone(), shutdown.clone());
                conns.spawn(async move {
                    let Admitted {
                        connection,
                        handshake: slot,
                    } = admitted;
                    let slot = match slot {
                        Some(slot) => slot,
                        None => {
                            let waited = tokio::select! {
                                _ = shutdown.cancelled() => return,
                                slot = gate.handshake_slot(remote) => slot,
                            };
                            match waited {
                                Ok(slot) => slot,
                                Err("Busy") => return L::turn_away(io),
                                Err(_) => return, // over a cap: closed as the caps are
                            }
                        }
                    };
                    let steps =
                        handshaken(&gate, &*prepare, &*handshake, io, remote, connection, slot);
                    let accepted = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        accepted = steps => accepted,
                    };
                    if let Some(accepted) = accepted {
                        serve(accepted).await;
                    }
                });
            }
        });
    }
}

/// One connection's preparation, then its handshake within the handshake timeout; `None`
/// (counted, and a timeout logged) when either fails.
async fn handshaken<IO, P, PF, C, H>(
    gate: &Gate,
    prepare: &P,
    handshake: &H,
    io: IO,
    remote: Option<SocketAddr>,
    connection: Admission,
    slot: HandshakeSlot,
) -> Option<Accepted<H::Output>>
where
    P: Fn(IO, Option<SocketAddr>) -> PF,
    PF: Future<Output = Result<C, Refused>>,
    H: Handshake<C>,
{
    let io = match prepare(io, remote).await {
        Ok(io) => io,
        Err(e) => {
            tracing::warn!(remote = %or_dash(remote), error = %e, "connection refused before its {}", H::NAME);
            gate.refused(e.reason);
            return None;
        }
    };
    let timeout = gate.handshake_timeout;
    let output = match tokio::time::timeout(timeout, handshake.handshake(io, remote)).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => {
            gate.refused(e.reason);
            return None;
        }
        Err(_) => {
            tracing::warn!(remote = %or_dash(remote), "{} timed out after {}", H::NAME, text::duration(timeout));
            gate.refused("HandshakeTimeout");
            return None;
        }
    };
    // The slot is for the handshake only, not for waiting on the client (unless the
    // preface is all this listener waits for).
    let held = H::PREFACE_IS_HANDSHAKE.then_some(slot);
    Some(Accepted {
        io: output,
        remote,
        admission: connection,
        held,
    })
}

/// The connection once its HTTP/2 client preface has come within the preface timeout;
/// `None` (counted, and logged without a storm) otherwise.
async fn prefaced<IO: AsyncRead + Unpin>(
    gate: &Gate,
    mut accepted: Accepted<IO>,
) -> Option<H2Connection<IO>> {
    let timeout = gate.preface_timeout;
    let read = tokio::time::timeout(timeout, read_h2_preface(&mut accepted.io)).await;
    drop(accepted.held.take());
    let error = match read {
        Ok(Ok(())) => {
            return Some(H2Connection::new(
                accepted.io,
                accepted.admission,
                accepted.remote,
                gate.h2,
                gate.hook(),
            ));
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!(
            "no HTTP/2 client preface within {}",
            text::duration(timeout)
        ),
    };
    gate.refused("NoPreface");
    let remote = accepted.remote;
    tracing::debug!(remote = %or_dash(remote), %error, "connection closed before its first request");
    let secs = usize::try_from(timeout.as_secs()).unwrap_or(usize::MAX);
    gate.log.refused(remote, "NoPreface", secs);
    None
}

/// An address, or `-` for none.
fn or_dash(remote: Option<SocketAddr>) -> String {
    remote.map_or_else(|| "-".to_owned(), |r| r.to_string())
}

/// The connections of a plaintext HTTP/2 listener (TCP or a Unix socket) for
/// `Server::serve_with_incoming`, accepted on `tasks` until `shutdown` under the caps of
/// `opts`: at most `max_connections` open (`max_connections_per_client` from one
/// address), at most `max_handshakes` waiting for their HTTP/2 client preface
/// (`max_handshakes_per_client` from one address, more closed at once), and each closed
/// unless its preface arrives within `preface_timeout`. Refusals are counted through
/// `opts.on_refused` (`TooManyConnections`, `TooManyFromClient`, `NoPreface`, `NotReady`)
/// and logged (rate-limited) under `name`.
pub fn plain_incoming<L: Accept>(
    listener: L,
    opts: &IncomingOptions,
    name: &str,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> impl Stream<Item = io::Result<H2Connection<L::Io>>> + Send + 'static {
    Bounded::new(listener, opts, name, NoHandshake).incoming(tasks, shutdown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{ReadyHook, RefusedHook};
    use crate::h2::H2_PREFACE;
    use futures::StreamExt as _;
    use std::sync::Mutex;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

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
            handshake_timeout: Duration::from_secs(10),
            preface_timeout: Duration::from_secs(1),
            on_refused: Some(RefusedHook(Arc::new(move |r| seen.lock().unwrap().push(r)))),
            ready: None,
            h2: crate::h2::H2Policy::default(),
            max_handshake_wait: None,
        };
        let mut incoming = Box::pin(plain_incoming(
            listener,
            &opts,
            "test",
            &TaskTracker::new(),
            CancellationToken::new(),
        ));
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
        let mut incoming = Box::pin(plain_incoming(
            listener,
            &opts,
            "test",
            &TaskTracker::new(),
            CancellationToken::new(),
        ));
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

    /// A handshake that answers by the first byte the client sends: `s` stalls, `f` fails,
    /// anything else passes.
    struct ByFirstByte;

    impl Handshake<TcpStream> for ByFirstByte {
        type Output = TcpStream;
        const NAME: &'static str = "test handshake";
        const QUEUE: bool = false;

        async fn handshake(
            &self,
            mut io: TcpStream,
            _remote: Option<SocketAddr>,
        ) -> Result<TcpStream, Refused> {
            let mut first = [0u8; 1];
            let _ = io.read_exact(&mut first).await;
            match first[0] {
                b's' => std::future::pending().await,
                b'f' => Err(Refused::new("HandshakeFailed", "told to fail")),
                _ => Ok(io),
            }
        }
    }

    /// [`ByFirstByte`] with queued handshakes (as TLS has).
    struct QueuedByFirstByte;

    impl Handshake<TcpStream> for QueuedByFirstByte {
        type Output = TcpStream;
        const NAME: &'static str = "queued test handshake";

        async fn handshake(
            &self,
            io: TcpStream,
            remote: Option<SocketAddr>,
        ) -> Result<TcpStream, Refused> {
            ByFirstByte.handshake(io, remote).await
        }
    }

    #[tokio::test]
    async fn a_connection_waiting_too_long_for_a_handshake_slot_is_reset_as_busy() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reasons: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let seen = reasons.clone();
        let opts = IncomingOptions {
            max_handshakes: 1,
            handshake_timeout: Duration::from_millis(1500),
            max_handshake_wait: Some(Duration::from_millis(200)),
            on_refused: Some(RefusedHook(Arc::new(move |r| seen.lock().unwrap().push(r)))),
            ..IncomingOptions::default()
        };
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        Bounded::new(listener, &opts, "test", QueuedByFirstByte).serve(
            &tasks,
            stop.clone(),
            move |a| {
                let tx = tx.clone();
                async move {
                    let _ = tx.send(a);
                }
            },
        );
        // A stalled handshake holds the only slot.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled.write_all(b"s").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        // The next one is accepted at once (not left in the backlog), waits its 200 ms and
        // is reset: the client reads a reset, long before the stalled handshake's timeout.
        let started = std::time::Instant::now();
        let mut turned = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(1), turned.read(&mut buf)).await;
        let err = read
            .expect("reset within the wait")
            .expect_err("a reset, not data or EOF");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(150), "{waited:?}");
        assert!(waited < Duration::from_millis(1000), "{waited:?}");
        assert_eq!(reasons.lock().unwrap().clone(), vec!["Busy"]);
        // Once the stalled handshake times out its slot is free: a good client is served.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(b"g").await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(2), served.recv()).await;
        assert!(
            matches!(accepted, Ok(Some(_))),
            "served once a slot was free"
        );
        assert_eq!(
            reasons.lock().unwrap().clone(),
            vec!["Busy", "HandshakeTimeout"]
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn a_connection_refused_before_its_handshake_is_reset() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let opts = IncomingOptions {
            ready: Some(ReadyHook(Arc::new(|| false))),
            ..IncomingOptions::default()
        };
        let taken = Arc::new(AtomicBool::new(false));
        let flag = taken.clone();
        Bounded::new(listener, &opts, "test", QueuedByFirstByte).serve(
            &TaskTracker::new(),
            CancellationToken::new(),
            move |_| {
                flag.store(true, Ordering::SeqCst);
                async {}
            },
        );
        // Not ready: the client is told with a reset (what the agent takes as "turned away,
        // dial again soon"), not with an end of stream mid-handshake.
        let mut early = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(2), early.read(&mut buf)).await;
        let err = read.expect("closed at once").expect_err("a reset");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        assert!(!taken.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn served_connections_pass_their_handshake_in_time_and_hold_their_place() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let reasons: Arc<Mutex<Vec<&'static str>>> = Arc::default();
        let seen = reasons.clone();
        let opts = IncomingOptions {
            max_connections: 1,
            max_connections_per_client: 1,
            handshake_timeout: Duration::from_millis(300),
            on_refused: Some(RefusedHook(Arc::new(move |r| seen.lock().unwrap().push(r)))),
            ..IncomingOptions::default()
        };
        let (tasks, stop) = (TaskTracker::new(), CancellationToken::new());
        let (tx, mut served) = tokio::sync::mpsc::unbounded_channel();
        Bounded::new(listener, &opts, "test", ByFirstByte).serve(&tasks, stop.clone(), move |a| {
            let tx = tx.clone();
            async move {
                let _ = tx.send(a);
            }
        });
        let closed = |mut s: TcpStream| async move {
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
            assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
            // The place is given back as the connection's task ends.
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        // A stalled handshake is dropped after the handshake timeout, a failed one at once.
        let mut stalled = TcpStream::connect(addr).await.unwrap();
        stalled.write_all(b"s").await.unwrap();
        closed(stalled).await;
        let mut failed = TcpStream::connect(addr).await.unwrap();
        failed.write_all(b"f").await.unwrap();
        closed(failed).await;
        // A good one is served, and holds the only place until it is dropped.
        let mut good = TcpStream::connect(addr).await.unwrap();
        good.write_all(b"g").await.unwrap();
        let accepted = served.recv().await.unwrap();
        assert_eq!(accepted.remote.map(|r| r.ip()), Some(addr.ip()));
        closed(TcpStream::connect(addr).await.unwrap()).await;
        drop(accepted);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut again = TcpStream::connect(addr).await.unwrap();
        again.write_all(b"g").await.unwrap();
        assert!(served.recv().await.is_some(), "the place was given back");
        assert_eq!(
            reasons.lock().unwrap().clone(),
            vec!["HandshakeTimeout", "HandshakeFailed", "TooManyFromClient"]
        );
        // At shutdown the accept loop ends: the tracker drains.
        stop.cancel();
        tasks.close();
        tokio::time::timeout(Duration::from_secs(2), tasks.wait())
            .await
            .expect("the accept loop stops at shutdown");
    }
}
