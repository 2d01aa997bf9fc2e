//! The Redis proxy's state: its configuration and limits, the proxy itself, and one
//! connection's client side, shared state and reply slots.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_listener::{Admission, Caps, RefusalLog};
use argocd_agent_redis::{FrameReader, Protocol, RedisEndpoint, RespError};
use bytes::Bytes;
use tokio::io::{ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::replica::Peers;
use super::reply::{Out, lock};
use crate::apps::AppOwners;
use crate::metrics::Metrics;

/// Requests waiting for one agent's answers at once, by default.
pub const DEFAULT_AGENT_IN_FLIGHT: usize = 256;
/// Pushes buffered per subscription before newer ones are dropped (Argo CD's messages only
/// say "changed", so a dropped one changes nothing while another is queued).
pub(super) const SUBSCRIPTION_BUFFER: usize = 16;
/// Out-of-band frames buffered per client connection.
pub(super) const OOB_BUFFER: usize = 256;
pub(super) const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client of a password-protected hub Redis has to authenticate.
pub(super) const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame from a client that has not authenticated (Redis itself reads at most 10
/// arguments of 16 KiB from an unauthenticated client: `processMultibulkBuffer` in
/// redis/src/networking.c).
pub(super) const UNAUTHENTICATED_FRAME_LIMIT: usize = 64 * 1024;
/// How long the rest of a command may take once its first byte has arrived.
pub(super) const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// The reply of a Redis server to a command before AUTH when it wants a password.
pub(super) const NOAUTH: &str = "NOAUTH Authentication required.";

/// Configuration of the Redis proxy.
#[derive(Clone, Debug)]
pub struct RedisProxyConfig {
    /// Where argocd-server connects (`--redis-proxy-address`).
    pub listen: SocketAddr,
    /// The hub's Redis (`--redis-server-address`).
    pub upstream: RedisEndpoint,
    /// TLS towards argocd-server (`None`: plaintext).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Largest frame accepted from either side, and largest value an agent may return.
    pub max_value_size: usize,
    /// Commands of one client connection waiting for replies at once (pipelining beyond
    /// this waits).
    pub max_in_flight_per_connection: usize,
    /// Requests waiting for one agent's answers at once (more get an error).
    pub max_in_flight_per_agent: usize,
    /// How long an agent may take to answer.
    pub request_timeout: Duration,
    /// A client connection silent for this long is closed (not while subscribed).
    pub idle_timeout: Duration,
    /// Client connections at once (authenticated ones, or all when the hub Redis has no
    /// password).
    pub max_connections: usize,
    /// Of `max_connections`, how many one client address may hold (default 256: room for
    /// an argocd-server's connection pool, a quarter of the total).
    pub max_connections_per_client: usize,
    /// Connections at once that have not authenticated yet (a password-protected hub
    /// Redis), in all and from one client address; they never take the places of
    /// authenticated ones.
    pub max_unauthenticated: usize,
    /// Of `max_unauthenticated`, how many one client address may hold (default 16 of 256:
    /// it takes 16 addresses to fill the pool, and each place for at most 10 s).
    pub max_unauthenticated_per_client: usize,
    /// The hub Argo CD's Redis compression (for the cluster info the principal writes).
    pub compression: argocd_agent_redis::clusterinfo::Compression,
    /// Server URL of an agent's cluster in Argo CD (`{agent}` is replaced by its name).
    pub cluster_server_template: String,
    /// With `--ha`: the address (`host:port`) other replicas reach this proxy at; `None`:
    /// `$POD_IP:<port>`, else the bound address.
    pub replica_address: Option<String>,
    /// With `--ha` and TLS: how to trust the other replicas' proxies
    /// ([`pinned_replica_tls`]).
    pub replica_tls: Option<Arc<rustls::ClientConfig>>,
}

impl Default for RedisProxyConfig {
    fn default() -> Self {
        RedisProxyConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 6379)),
            upstream: RedisEndpoint {
                addr: "argocd-redis:6379".into(),
                ..Default::default()
            },
            tls: None,
            max_value_size: 64 * 1024 * 1024,
            max_in_flight_per_connection: 128,
            max_in_flight_per_agent: DEFAULT_AGENT_IN_FLIGHT,
            request_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30 * 60),
            max_connections: 1024,
            max_connections_per_client: 256,
            max_unauthenticated: 256,
            max_unauthenticated_per_client: 16,
            compression: Default::default(),
            cluster_server_template: crate::clusterinfo::DEFAULT_SERVER_TEMPLATE.into(),
            replica_address: None,
            replica_tls: None,
        }
    }
}

/// What to do with a command for an Application's key, given its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Nobody owns the Application (or it does not exist): a cache miss.
    Nil,
    /// The owner is not connected: an error at once.
    Offline,
    /// The owner did not announce the Redis capability: an error at once.
    Unsupported,
    /// Ask the owner.
    Forward,
}

/// The rule: the owner answers, if it can; nobody else ever does.
pub fn decide(owner_known: bool, connected: bool, capable: bool) -> Decision {
    match (owner_known, connected, capable) {
        (false, _, _) => Decision::Nil,
        (true, false, _) => Decision::Offline,
        (true, true, false) => Decision::Unsupported,
        (true, true, true) => Decision::Forward,
    }
}

/// Another replica serving a key's agent.
pub(super) struct ReplicaTarget {
    pub(super) agent: String,
    pub(super) replica: String,
    pub(super) addr: String,
}

pub(super) struct RedisProxy {
    /// Which agent serves each Application key.
    pub(super) owners: Arc<AppOwners>,
    pub(super) metrics: Metrics,
    /// CloudEvents `source` of our requests.
    pub(super) source: String,
    pub(super) config: RedisProxyConfig,
    pub(super) tasks: TaskTracker,
    /// Places of authenticated connections.
    pub(super) connections: Caps,
    /// Refused connections' log lines, at most one every few seconds.
    pub(super) refusals: RefusalLog,
    /// With `--ha`: the other replicas' proxies.
    pub(super) peers: Option<Peers>,
}

/// An unauthenticated connection's place in its pool, and its client's address.
pub(super) type Unauthenticated = (Admission, std::net::IpAddr);

/// What the next reply of the hub Redis answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotKind {
    Reply,
    /// `HELLO <version> [AUTH ...]`: a successful reply switches the connection's protocol
    /// (and authenticates it, with `AUTH`).
    Hello(Protocol, bool),
    /// `AUTH`: a successful reply authenticates the connection.
    Auth,
    /// `RESET`: the connection is back to the default user.
    Reset,
    /// A subscribe command: the connection enters pub/sub mode, where every frame of the
    /// hub Redis is out of band.
    Subscribe,
    /// An unsubscribe: one frame, a push in RESP3.
    PubSubReply,
}

pub(super) struct UpstreamSlot {
    pub(super) kind: SlotKind,
    pub(super) tx: oneshot::Sender<Out>,
}

/// Whether a connection is authenticated, after how many answers to commands that change it
/// (AUTH, HELLO with AUTH, RESET).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct AuthState {
    pub(super) answered: u64,
    pub(super) ok: bool,
}

/// State shared by one connection's tasks.
pub(super) struct Shared {
    pub(super) protocol: Mutex<Protocol>,
    pub(super) upstream: Mutex<VecDeque<UpstreamSlot>>,
    pub(super) auth: tokio::sync::watch::Sender<AuthState>,
}

impl Default for Shared {
    fn default() -> Self {
        Shared {
            protocol: Mutex::default(),
            upstream: Mutex::default(),
            auth: tokio::sync::watch::Sender::new(AuthState::default()),
        }
    }
}

impl Shared {
    pub(super) fn protocol(&self) -> Protocol {
        *lock(&self.protocol)
    }

    /// The hub Redis answered a command that changes authentication: `authenticated` is
    /// the state after it (a failed AUTH leaves the state as it was, as in Redis).
    pub(super) fn auth_answered(&self, authenticated: Option<bool>) {
        self.auth.send_modify(|s| {
            s.answered += 1;
            if let Some(ok) = authenticated {
                s.ok = ok;
            }
        });
    }
}

/// One local subscription of a client connection.
pub(super) struct Subscription {
    pub(super) stop: CancellationToken,
}

/// The client-facing side of one connection.
pub(super) struct Conn {
    pub(super) proxy: Arc<RedisProxy>,
    pub(super) shared: Arc<Shared>,
    pub(super) slots: mpsc::Sender<oneshot::Receiver<Out>>,
    pub(super) oob: mpsc::Sender<Bytes>,
    pub(super) upstream: WriteHalf<Box<dyn argocd_agent_redis::client::Io>>,
    /// The hub Redis leg is in pub/sub mode (a subscribe was forwarded).
    pub(super) upstream_pubsub: bool,
    pub(super) subscriptions: HashMap<Bytes, Subscription>,
    /// Ends the connection (an agent subscription lost its session).
    pub(super) closed: CancellationToken,
    /// The connection comes from another replica: keys are answered here, never forwarded.
    pub(super) forwarded: bool,
    /// The hub Redis wants a password: nothing of an agent is served before AUTH.
    pub(super) auth_required: bool,
    /// Commands sent that change authentication (their answers are in `shared.auth`).
    pub(super) auth_sent: u64,
    /// Until the connection authenticates: its place among unauthenticated connections,
    /// and when it must have authenticated.
    pub(super) pending: Option<Unauthenticated>,
    pub(super) auth_deadline: Instant,
    /// The client's address (its share of the authenticated connections).
    pub(super) peer_ip: std::net::IpAddr,
    /// Its place among authenticated connections.
    pub(super) admitted: Option<Admission>,
}

/// The hub Redis leg of a client connection: its frame reader, its write half, and whether
/// it wants a password.
pub(super) type Upstream = (
    FrameReader<ReadHalf<Box<dyn argocd_agent_redis::client::Io>>>,
    WriteHalf<Box<dyn argocd_agent_redis::client::Io>>,
    bool,
);

/// Why reading a client's next command stopped.
pub(super) enum ReadStop {
    /// The connection was idle for the idle timeout.
    Idle,
    /// It did not authenticate in time.
    AuthTimeout,
    /// A command did not arrive in full in time.
    FrameTimeout,
    Error(RespError),
}

impl From<RespError> for ReadStop {
    fn from(e: RespError) -> Self {
        ReadStop::Error(e)
    }
}
