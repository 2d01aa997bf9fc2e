//! What an accept loop admits connections with: the caps of [`IncomingOptions`] (handshakes
//! in progress and connections, each in total and per client address) and the server's
//! readiness, for the listening sockets of [`Accept`] (TCP and Unix).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::caps::{Admission, Caps, ClientLimit, ClientSlot};
use crate::refusal::RefusalLog;
use crate::text;

/// How long a connection's handshake (TLS, by default) may take before it is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take, after its handshake, to send the HTTP/2 client preface.
/// Authorization runs at the first RPC, so without this limit any client could hold a
/// connection open forever without ever speaking HTTP/2.
pub const PREFACE_TIMEOUT: Duration = Duration::from_secs(10);

/// Default cap on handshakes in progress at once: a reconnect storm of thousands of agents
/// queues at the accept loop instead of starving established sessions of CPU.
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

/// Reasons [`IncomingOptions::on_refused`] is called with by the accept loop itself: the
/// handshake took longer than [`IncomingOptions::handshake_timeout`] or failed
/// (`HandshakeTimeout`, `HandshakeFailed`; a handshake may give reasons of its own), no
/// HTTP/2 client preface came in time (`NoPreface`), a cap was full (`TooManyConnections`,
/// `TooManyFromClient`: [`IncomingOptions::max_connections`],
/// [`IncomingOptions::max_handshakes_per_client`],
/// [`IncomingOptions::max_connections_per_client`]), or the server was not ready
/// ([`IncomingOptions::ready`]) and the connection was closed before its handshake
/// (`NotReady`), or it waited longer than [`IncomingOptions::max_handshake_wait`] for a
/// handshake slot and was turned away before its handshake (`Busy`).
pub const REFUSED_REASONS: [&str; 7] = [
    "HandshakeTimeout",
    "HandshakeFailed",
    "NoPreface",
    "TooManyConnections",
    "TooManyFromClient",
    "NotReady",
    "Busy",
];

/// Limits of a bounded accept loop ([`crate::Bounded`]).
#[derive(Clone, Debug)]
pub struct IncomingOptions {
    /// Handshakes in progress at once (at least 1).
    pub max_handshakes: usize,
    /// Of `max_handshakes`, how many one client address may hold; more from it are closed
    /// at once.
    pub max_handshakes_per_client: usize,
    /// Connections open at once, from the accept to their end; more are closed at once.
    pub max_connections: usize,
    /// Of `max_connections`, how many one client address may hold.
    pub max_connections_per_client: usize,
    /// How long a connection's handshake may take.
    pub handshake_timeout: Duration,
    /// How long a client may take after its handshake to send the HTTP/2 client preface
    /// (the gRPC streams only).
    pub preface_timeout: Duration,
    /// Told the reason of each connection dropped before it could carry a request (for a
    /// metric): one of [`REFUSED_REASONS`], or a reason of the handshake's own.
    /// Also told, with `TooManyPings` or `IdleTimeout`, of each connection closed under
    /// [`IncomingOptions::h2`].
    pub on_refused: Option<RefusedHook>,
    /// What each gRPC connection is held to past its preface: the client's PING interval
    /// and the idle timeout ([`crate::h2`]). Off by default.
    pub h2: crate::h2::H2Policy,
    /// Asked at each accepted connection whether the server is ready for new clients; while
    /// it says no, connections are closed as soon as they are accepted, before any
    /// handshake (reason `NotReady`, logged at most once a second with a count).
    /// Connections already accepted are not touched. `None`: always ready.
    pub ready: Option<ReadyHook>,
    /// Queued handshakes only (TLS): `None`, a connection waits for a handshake slot in
    /// the kernel's backlog for as long as its client waits. `Some(wait)`: connections
    /// are accepted as they come and wait for a slot at most `wait`; one that finds none
    /// in time is reset before its handshake (reason `Busy`), which costs an accept, so
    /// that its client dials again at once and, behind a Service with several replicas,
    /// lands where there is room instead of queueing behind the busiest one.
    pub max_handshake_wait: Option<Duration>,
}

impl Default for IncomingOptions {
    fn default() -> Self {
        Self {
            max_handshakes: DEFAULT_MAX_CONCURRENT_HANDSHAKES,
            max_handshakes_per_client: DEFAULT_MAX_HANDSHAKES_PER_CLIENT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            handshake_timeout: HANDSHAKE_TIMEOUT,
            preface_timeout: PREFACE_TIMEOUT,
            on_refused: None,
            h2: crate::h2::H2Policy::default(),
            ready: None,
            max_handshake_wait: None,
        }
    }
}

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

/// A listening socket the accept loops take connections from: TCP (the client's address
/// known) or a Unix socket (no address: counted in the totals only).
pub trait Accept: Send + Sync + 'static {
    /// One accepted connection.
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and its client's address.
    fn accept_one(&self)
    -> impl Future<Output = io::Result<(Self::Io, Option<SocketAddr>)>> + Send;
    /// Closes a connection refused before its handshake. TCP: with a reset, so the client
    /// is told at once that it was turned away, not that a handshake broke off.
    fn turn_away(io: Self::Io) {
        drop(io);
    }
}

impl Accept for TcpListener {
    type Io = TcpStream;
    async fn accept_one(&self) -> io::Result<(TcpStream, Option<SocketAddr>)> {
        let (tcp, remote) = self.accept().await?;
        let _ = tcp.set_nodelay(true);
        Ok((tcp, Some(remote)))
    }

    fn turn_away(io: TcpStream) {
        // SO_LINGER 0: the close sends a reset and never blocks.
        let _ = io.set_zero_linger();
        drop(io);
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
pub(crate) struct Gate {
    handshakes: Arc<Semaphore>,
    handshake_clients: Arc<ClientLimit>,
    handshakes_per_client: usize,
    max_handshakes: usize,
    connections: Caps,
    pub(crate) log: RefusalLog,
    on_refused: Option<RefusedHook>,
    /// Whether new connections are taken ([`IncomingOptions::ready`]).
    ready: Option<ReadyHook>,
    /// The `NotReady` refusals' own log (once a second), apart from the caps'.
    not_ready_log: RefusalLog,
    /// The `Busy` refusals' own log (once a second).
    busy_log: RefusalLog,
    /// [`IncomingOptions::max_handshake_wait`], with `queue` only.
    handshake_wait: Option<Duration>,
    /// Wait for a handshake slot before accepting (TLS: a reconnect storm waits in the
    /// kernel's backlog instead of taking CPU); otherwise (where waiting costs nothing but
    /// a socket) a connection finding no slot is refused.
    queue: bool,
    pub(crate) handshake_timeout: Duration,
    pub(crate) preface_timeout: Duration,
    pub(crate) h2: crate::h2::H2Policy,
}

/// A connection's handshake slot, and its client address's share of them.
pub(crate) type HandshakeSlot = (OwnedSemaphorePermit, Option<ClientSlot>);

/// A connection's places: for its whole life, and for its handshake only (`None`: still
/// to be waited for, at most [`IncomingOptions::max_handshake_wait`]).
pub(crate) struct Admitted {
    pub(crate) connection: Admission,
    pub(crate) handshake: Option<HandshakeSlot>,
}

impl Gate {
    pub(crate) fn new(opts: &IncomingOptions, name: &str, queue: bool) -> Gate {
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
            busy_log: RefusalLog::every(name, NOT_READY_LOG_EVERY),
            handshake_wait: opts.max_handshake_wait.filter(|_| queue),
            queue,
            handshake_timeout: opts.handshake_timeout,
            preface_timeout: opts.preface_timeout,
            h2: opts.h2,
        }
    }

    /// The hook told of refusals and closes.
    pub(crate) fn hook(&self) -> Option<crate::h2::OnClose> {
        self.on_refused.as_ref().map(|h| h.0.clone())
    }

    /// Counts a connection dropped for `reason`.
    pub(crate) fn refused(&self, reason: &'static str) {
        if let Some(hook) = &self.on_refused {
            (hook.0)(reason);
        }
    }

    /// Whether a new connection is taken now: the server is ready (or has no say).
    pub(crate) fn accepting(&self) -> bool {
        self.ready.as_ref().is_none_or(|ready| (ready.0)())
    }

    /// Closes a connection accepted while the server is not ready: counted, and logged at
    /// most once a second with how many were closed in between.
    fn refuse_not_ready(&self, remote: Option<SocketAddr>) {
        self.refuse_before_tls(
            &self.not_ready_log,
            "NotReady",
            remote,
            "refused before TLS: not ready yet",
        );
    }

    /// Counts a connection turned away before its handshake for `reason`, and logs it
    /// through `log` (at most once a second, with how many were left out in between).
    fn refuse_before_tls(
        &self,
        log: &RefusalLog,
        reason: &'static str,
        remote: Option<SocketAddr>,
        what: &str,
    ) {
        self.refused(reason);
        if let Some(held) = log.due() {
            let peer = remote.map_or_else(|| "-".to_owned(), |p| p.to_string());
            tracing::warn!(
                listener = %log.listener(),
                %peer,
                reason,
                not_logged_since_last = held,
                "connection {what} (further such refusals logged at most every {})",
                text::duration(NOT_READY_LOG_EVERY)
            );
        }
    }

    /// The next connection with its places; connections over a cap are closed, and those
    /// accepted while the server is not ready reset (counted and logged), and the next one
    /// is taken.
    /// `None` when `closed` ends first. With [`IncomingOptions::max_handshake_wait`] the
    /// connection comes without its handshake slot: [`Gate::handshake_slot`] waits for it.
    pub(crate) async fn next<L: Accept>(
        &self,
        listener: &L,
        closed: impl Future<Output = ()>,
    ) -> Option<(L::Io, Option<SocketAddr>, Admitted)> {
        tokio::pin!(closed);
        loop {
            // Queued without a bound: wait for a handshake slot before accepting, so
            // excess connections wait in the kernel's backlog.
            let queued = if self.queue && self.handshake_wait.is_none() {
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
            // Not ready: close before any handshake, so a crowd of dialing clients cannot
            // take the CPU the server needs to get ready.
            if !self.accepting() {
                self.refuse_not_ready(remote);
                L::turn_away(io);
                continue;
            }
            let admitted = if self.handshake_wait.is_some() {
                self.admit_connection(remote).map(|connection| Admitted {
                    connection,
                    handshake: None,
                })
            } else {
                let permit = match queued {
                    Some(p) => Ok(p),
                    None => self.handshakes.clone().try_acquire_owned(),
                };
                match permit {
                    Ok(permit) => self.admit(remote, permit),
                    Err(_) => Err(("TooManyConnections", self.max_handshakes)),
                }
            };
            match admitted {
                Ok(admitted) => return Some((io, remote, admitted)),
                Err((reason, limit)) => {
                    // Closed (dropped) as it always was: a cap is no reason to redial soon.
                    self.refused(reason);
                    self.log.refused(remote, reason, limit);
                }
            }
        }
    }

    /// A handshake slot for a connection admitted without one, within
    /// [`IncomingOptions::max_handshake_wait`] (slots are handed out in arrival order);
    /// otherwise the reason it gets none, counted and logged: `Busy` when it waited too
    /// long (the caller resets it, so its client dials again soon), `TooManyFromClient`
    /// when its client address holds its share already (closed, as the caps are).
    pub(crate) async fn handshake_slot(
        &self,
        remote: Option<SocketAddr>,
    ) -> Result<HandshakeSlot, &'static str> {
        let wait = self.handshake_wait.unwrap_or(Duration::MAX);
        let Ok(Ok(permit)) =
            tokio::time::timeout(wait, self.handshakes.clone().acquire_owned()).await
        else {
            let what = format!(
                "turned away before TLS: no handshake slot within {}",
                text::duration(wait)
            );
            self.refuse_before_tls(&self.busy_log, "Busy", remote, &what);
            return Err("Busy");
        };
        match self.client_slot(remote) {
            Ok(slot) => Ok((permit, slot)),
            Err((reason, limit)) => {
                self.refused(reason);
                self.log.refused(remote, reason, limit);
                Err(reason)
            }
        }
    }

    /// The places of a connection from `remote`, or the cap it is over.
    fn admit(
        &self,
        remote: Option<SocketAddr>,
        permit: OwnedSemaphorePermit,
    ) -> Result<Admitted, (&'static str, usize)> {
        let connection = self.admit_connection(remote)?;
        let slot = self.client_slot(remote)?;
        Ok(Admitted {
            connection,
            handshake: Some((permit, slot)),
        })
    }

    /// A connection's place under the connection caps, or the cap it is over.
    fn admit_connection(
        &self,
        remote: Option<SocketAddr>,
    ) -> Result<Admission, (&'static str, usize)> {
        let ip = remote.map(|r| r.ip());
        self.connections.admit(ip).map_err(|reason| {
            let limit = if reason == "TooManyFromClient" {
                self.connections.per_client()
            } else {
                self.connections.max_total()
            };
            (reason, limit)
        })
    }

    /// The client address's share of the handshake slots, or the cap it is over.
    fn client_slot(
        &self,
        remote: Option<SocketAddr>,
    ) -> Result<Option<ClientSlot>, (&'static str, usize)> {
        match remote.map(|r| r.ip()) {
            Some(ip) => self
                .handshake_clients
                .take(ip, self.handshakes_per_client)
                .map(Some)
                .ok_or(("TooManyFromClient", self.handshakes_per_client)),
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
