//! The Redis proxy in front of argocd-server.
//!
//! argocd-server reads each Application's resource tree and managed resources from Redis,
//! but with agents the application controller that writes them runs on the spoke. The proxy
//! speaks RESP2 and RESP3 to argocd-server: `GET` and `SUBSCRIBE` of an Application's cache
//! keys (`app|managed-resources|<ns>_<name>...`, `app|resources-tree|<ns>_<name>...`) go to
//! the agent that owns `<ns>/<name>` over its stream; every other command goes to the hub
//! Redis byte for byte (HELLO, AUTH, CLIENT, PING, pipelines, pushes).
//!
//! Per connection, replies leave in the order the commands came: each command gets a slot
//! in an ordered queue that either the hub Redis's next reply or the agent's answer fills.
//! Out-of-band frames (RESP3 pushes, pub/sub messages) are written as they come.
//!
//! With several replicas, a key whose agent is served by another replica is asked there
//! (see [`replica`]).

mod replica;
mod reply;

pub use replica::{FORWARDED_NAME, default_replica_address, pinned_replica_tls};

use argocd_agent_identity::text;
use argocd_agent_identity::text::quoted;
use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argocd_agent_domain::rpc::Ticket;
use argocd_agent_domain::{AgentName, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef};
use argocd_agent_identity::listener::{Admission, Caps, RefusalLog};
use argocd_agent_proto::eventstream::{RedisCommand, RedisRequest, redis_response};
use argocd_agent_redis::resp::Frame;
use argocd_agent_redis::resp::{self, PubSub};
use argocd_agent_redis::{AppKey, FrameReader, Protocol, RedisEndpoint, RespError};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::apps::AppOwners;
use crate::ha::Leases;
use crate::metrics::Metrics;
use argocd_agent_domain::rpc::AgentLink;
use replica::{PeerRoute, Peers};
use reply::{Out, Reply, lock};

/// Requests waiting for one agent's answers at once, by default.
pub const DEFAULT_AGENT_IN_FLIGHT: usize = 256;
/// Pushes buffered per subscription before newer ones are dropped (Argo CD's messages only
/// say "changed", so a dropped one changes nothing while another is queued).
const SUBSCRIPTION_BUFFER: usize = 16;
/// Out-of-band frames buffered per client connection.
const OOB_BUFFER: usize = 256;
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client of a password-protected hub Redis has to authenticate.
const AUTH_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame from a client that has not authenticated (Redis itself reads at most 10
/// arguments of 16 KiB from an unauthenticated client: `processMultibulkBuffer` in
/// redis/src/networking.c).
const UNAUTHENTICATED_FRAME_LIMIT: usize = 64 * 1024;
/// How long the rest of a command may take once its first byte has arrived.
const FRAME_TIMEOUT: Duration = Duration::from_secs(30);
/// The reply of a Redis server to a command before AUTH when it wants a password.
const NOAUTH: &str = "NOAUTH Authentication required.";

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
struct ReplicaTarget {
    agent: String,
    replica: String,
    addr: String,
}

struct Proxy {
    /// Which agent serves each Application key.
    owners: Arc<AppOwners>,
    metrics: Metrics,
    /// CloudEvents `source` of our requests.
    source: String,
    config: RedisProxyConfig,
    tasks: TaskTracker,
    /// Places of authenticated connections.
    connections: Caps,
    /// Refused connections' log lines, at most one every few seconds.
    refusals: RefusalLog,
    /// With `--ha`: the other replicas' proxies.
    peers: Option<Peers>,
}

/// Starts the proxy; returns the bound address. With `leases` (`--ha`), the proxy's
/// replica address is published on the replica Lease and keys of agents served by other
/// replicas are asked there.
pub async fn serve(
    config: RedisProxyConfig,
    owners: Arc<AppOwners>,
    metrics: Metrics,
    source: String,
    leases: Option<Arc<Leases>>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(config.listen).await?;
    let addr = listener.local_addr()?;
    let peers = leases.map(|leases| replica_peers(&config, leases, addr));
    let proxy = Arc::new(Proxy {
        owners,
        metrics,
        source,
        connections: Caps::new(config.max_connections, config.max_connections_per_client),
        refusals: RefusalLog::new(format!("Redis proxy {addr}")),
        config,
        tasks: tasks.clone(),
        peers,
    });
    let unauthenticated = Caps::new(
        proxy.config.max_unauthenticated,
        proxy.config.max_unauthenticated_per_client,
    );
    tracing::info!(%addr, upstream = %proxy.config.upstream.addr, tls = proxy.config.tls.is_some(),
        "Redis proxy listening");
    let tasks2 = tasks.clone();
    tasks.spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                _ = shutdown.cancelled() => return,
                r = listener.accept() => match r {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!(error = %e, "Redis proxy accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
            };
            // Every connection starts unauthenticated, in a pool of its own.
            let place = match unauthenticated.admit(Some(peer.ip())) {
                Ok(place) => place,
                Err(reason) => {
                    proxy.metrics.listener_closed("redis-proxy", reason);
                    proxy
                        .refusals
                        .refused(Some(peer), reason, unauthenticated.max_total());
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let proxy = proxy.clone();
            let shutdown = shutdown.clone();
            let span = tracing::debug_span!("redis-proxy", %peer);
            tasks2.spawn(
                proxy
                    .accepted(stream, (place, peer.ip()), shutdown)
                    .instrument(span),
            );
        }
    });
    Ok(addr)
}

/// With `--ha`: publishes this proxy's replica address on the replica Lease, and reaches
/// the other replicas' proxies.
fn replica_peers(config: &RedisProxyConfig, leases: Arc<Leases>, addr: SocketAddr) -> Peers {
    let published = config.replica_address.clone().unwrap_or_else(|| {
        let pod_ip = std::env::var("POD_IP").ok();
        default_replica_address(pod_ip.as_deref(), addr)
    });
    tracing::info!(address = %published, "Redis proxy: replica address for the other replicas");
    leases.set_redis_proxy_address(&published);
    Peers::new(
        leases,
        config.replica_tls.clone(),
        (
            config.upstream.username.clone(),
            config.upstream.password.clone(),
        ),
        config.max_value_size,
        config.request_timeout,
    )
}

impl Proxy {
    /// One accepted client: the TLS handshake when configured (bounded in time), then the
    /// connection.
    async fn accepted(
        self: Arc<Self>,
        stream: TcpStream,
        pending: Unauthenticated,
        shutdown: CancellationToken,
    ) {
        match self.config.tls.clone() {
            None => self.connection(stream, pending, shutdown).await,
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(s)) => self.connection(s, pending, shutdown).await,
                    Ok(Err(e)) => {
                        self.metrics
                            .listener_closed("redis-proxy", "HandshakeFailed");
                        tracing::warn!(error = %e, "Redis proxy TLS handshake failed")
                    }
                    Err(_) => {
                        self.metrics
                            .listener_closed("redis-proxy", "HandshakeTimeout");
                        tracing::warn!("Redis proxy TLS handshake timed out")
                    }
                }
            }
        }
    }
}

/// An unauthenticated connection's place in its pool, and its client's address.
type Unauthenticated = (Admission, std::net::IpAddr);

/// What the next reply of the hub Redis answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotKind {
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

struct UpstreamSlot {
    kind: SlotKind,
    tx: oneshot::Sender<Out>,
}

/// Whether a connection is authenticated, after how many answers to commands that change it
/// (AUTH, HELLO with AUTH, RESET).
#[derive(Debug, Clone, Copy, Default)]
struct AuthState {
    answered: u64,
    ok: bool,
}

/// State shared by one connection's tasks.
struct Shared {
    protocol: Mutex<Protocol>,
    upstream: Mutex<VecDeque<UpstreamSlot>>,
    auth: tokio::sync::watch::Sender<AuthState>,
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
    fn protocol(&self) -> Protocol {
        *lock(&self.protocol)
    }

    /// The hub Redis answered a command that changes authentication: `authenticated` is
    /// the state after it (a failed AUTH leaves the state as it was, as in Redis).
    fn auth_answered(&self, authenticated: Option<bool>) {
        self.auth.send_modify(|s| {
            s.answered += 1;
            if let Some(ok) = authenticated {
                s.ok = ok;
            }
        });
    }
}

/// One local subscription of a client connection.
struct Subscription {
    stop: CancellationToken,
}

/// The client-facing side of one connection.
struct Conn {
    proxy: Arc<Proxy>,
    shared: Arc<Shared>,
    slots: mpsc::Sender<oneshot::Receiver<Out>>,
    oob: mpsc::Sender<Bytes>,
    upstream: WriteHalf<Box<dyn argocd_agent_redis::client::Io>>,
    /// The hub Redis leg is in pub/sub mode (a subscribe was forwarded).
    upstream_pubsub: bool,
    subscriptions: HashMap<Bytes, Subscription>,
    /// Ends the connection (an agent subscription lost its session).
    closed: CancellationToken,
    /// The connection comes from another replica: keys are answered here, never forwarded.
    forwarded: bool,
    /// The hub Redis wants a password: nothing of an agent is served before AUTH.
    auth_required: bool,
    /// Commands sent that change authentication (their answers are in `shared.auth`).
    auth_sent: u64,
    /// Until the connection authenticates: its place among unauthenticated connections,
    /// and when it must have authenticated.
    pending: Option<Unauthenticated>,
    auth_deadline: Instant,
    /// The client's address (its share of the authenticated connections).
    peer_ip: std::net::IpAddr,
    /// Its place among authenticated connections.
    admitted: Option<Admission>,
}

/// The hub Redis leg of a client connection: its frame reader, its write half, and whether
/// it wants a password.
type Upstream = (
    FrameReader<ReadHalf<Box<dyn argocd_agent_redis::client::Io>>>,
    WriteHalf<Box<dyn argocd_agent_redis::client::Io>>,
    bool,
);

/// Why reading a client's next command stopped.
enum ReadStop {
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

/// Whether the hub Redis wants a password from a new connection: its answer to `PING`
/// (`-NOAUTH ...` when it does; any other error counts as yes too).
async fn probe_auth<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    timeout: Duration,
) -> Result<bool, String> {
    let ask = async {
        writer.write_all(&resp::command(&[b"PING"])).await?;
        writer.flush().await?;
        reader
            .next(Protocol::Resp2)
            .await?
            .ok_or_else(|| RespError::Io(std::io::ErrorKind::UnexpectedEof.into()))
    };
    match tokio::time::timeout(timeout, ask).await {
        Ok(Ok(frame)) => Ok(frame.is_error()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer to PING".into()),
    }
}

impl Proxy {
    async fn connection<C: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self: Arc<Self>,
        client: C,
        pending: Unauthenticated,
        shutdown: CancellationToken,
    ) {
        let peer_ip = pending.1;
        let auth_deadline = Instant::now() + AUTH_TIMEOUT;
        let (client_r, client_w) = tokio::io::split(client);
        let (upstream_reader, upstream_w, probed_required) = match self.connect_upstream().await {
            Ok(u) => u,
            Err(e) => return self.upstream_unreachable(client_w, e).await,
        };
        // A password configured for the principal means one is required, whatever the
        // probe said.
        let auth_required = probed_required || self.config.upstream.password.is_some();
        let shared = Arc::new(Shared::default());
        let (slots_tx, slots_rx) = mpsc::channel(self.config.max_in_flight_per_connection.max(1));
        let (oob_tx, oob_rx) = mpsc::channel(OOB_BUFFER);
        let closed = shutdown.child_token();
        let writer = self
            .tasks
            .spawn(write_client(client_w, slots_rx, oob_rx, shared.clone()));
        let mut upstream_task = self.tasks.spawn(read_upstream(
            upstream_reader,
            shared.clone(),
            oob_tx.clone(),
        ));
        let mut conn = Conn {
            proxy: self.clone(),
            shared,
            slots: slots_tx,
            oob: oob_tx,
            upstream: upstream_w,
            upstream_pubsub: false,
            subscriptions: HashMap::new(),
            closed: closed.clone(),
            forwarded: false,
            auth_required,
            auth_sent: 0,
            pending: Some(pending),
            auth_deadline,
            peer_ip,
            admitted: None,
        };
        // Commands are flat arrays of strings: nothing nests (as a Redis server reads them).
        let reader = FrameReader::new(client_r, UNAUTHENTICATED_FRAME_LIMIT).with_max_depth(1);
        tokio::select! {
            r = conn.serve(reader) => {
                if let Err(e) = r {
                    tracing::debug!(error = %e, "Redis proxy connection ended");
                }
            }
            _ = &mut upstream_task => tracing::debug!("hub Redis closed the connection"),
            _ = closed.cancelled() => {}
        }
        self.close_connection(conn, writer, upstream_task).await;
    }

    /// Dials the hub Redis for a new client connection and probes whether it wants a
    /// password: its frame reader, its write half, and that answer.
    async fn connect_upstream(&self) -> std::io::Result<Upstream> {
        let u = self.config.upstream.connect_io().await?;
        let (upstream_r, mut upstream_w) = tokio::io::split(u);
        let mut reader = FrameReader::new(upstream_r, self.config.max_value_size);
        probe_auth(&mut reader, &mut upstream_w, self.config.request_timeout)
            .await
            .map(|required| (reader, upstream_w, required))
            .map_err(std::io::Error::other)
    }

    /// Tells a new client that the hub Redis cannot be reached, and closes its connection.
    async fn upstream_unreachable<W: AsyncWrite + Unpin>(
        &self,
        mut client_w: W,
        e: std::io::Error,
    ) {
        tracing::warn!(upstream = %self.config.upstream.addr, error = %e, "Redis proxy: hub Redis unreachable");
        self.metrics.redis_proxy("hub", "error");
        let msg = format!(
            "ERR hub Redis {} unreachable: {e}",
            self.config.upstream.addr
        );
        let _ = client_w.write_all(&resp::error(&msg)).await;
        let _ = client_w.shutdown().await;
    }

    /// Ends a connection: stops its subscriptions, lets the replies already owed leave
    /// (within the request timeout), then closes both legs.
    async fn close_connection(
        &self,
        mut conn: Conn,
        writer: JoinHandle<std::io::Result<()>>,
        upstream_task: JoinHandle<Result<(), RespError>>,
    ) {
        for (_, s) in conn.subscriptions.drain() {
            s.stop.cancel();
        }
        drop(conn);
        let writer_abort = writer.abort_handle();
        if tokio::time::timeout(self.config.request_timeout, writer)
            .await
            .is_err()
        {
            writer_abort.abort();
        }
        upstream_task.abort();
    }

    /// The owner of an Application key's Application, with the decision about it.
    fn route(&self, key: &AppKey) -> (Decision, Option<Arc<AgentLink>>, String) {
        let owner = self.owners.app_owner(&key.namespace, &key.name);
        let link = owner.as_ref().and_then(|o| o.link());
        let capable = link
            .as_ref()
            .is_some_and(|l| l.has(argocd_agent_redis::CAPABILITY));
        let decision = decide(owner.is_some(), link.is_some(), capable);
        let name = owner.map(|o| o.name.to_string()).unwrap_or_default();
        (decision, link, name)
    }

    fn request_event(&self, key: &AppKey, command: RedisCommand, subscription: &str) -> Event {
        Event::resource(
            &self.source,
            EventType::RedisRequest,
            ResourceRef::new(
                ResourceKind::Application,
                key.namespace.clone(),
                key.name.clone(),
            ),
            Payload::RedisRequest(RedisRequest {
                command: command as i32,
                key_kind: key.kind.as_str().into(),
                key_suffix: key.suffix.clone(),
                subscription_id: subscription.into(),
            }),
        )
    }

    /// Sends a request to the key's owner: the link and the ticket of its answers, or the
    /// reply that ends the command here.
    async fn ask(
        &self,
        key: &AppKey,
        command: RedisCommand,
        stream: Option<usize>,
    ) -> Result<(Arc<AgentLink>, Ticket<Event>, Event), Reply> {
        let (decision, link, agent) = self.route(key);
        let refused = |msg: String| {
            self.metrics.redis_proxy("agent", "refused");
            tracing::debug!(%key, %agent, reason = %msg, "Redis proxy refused a key");
            Reply::Error(msg)
        };
        let link = match (decision, link) {
            (Decision::Nil, _) => {
                self.metrics.redis_proxy("agent", "nil");
                return Err(Reply::Nil);
            }
            (Decision::Offline, _) | (_, None) => {
                let Reply::Error(msg) = Self::offline(&agent, key) else {
                    unreachable!("offline is an error")
                };
                return Err(refused(msg));
            }
            (Decision::Unsupported, _) => {
                return Err(refused(format!(
                    "ERR agent {agent} does not serve Redis requests (no {} capability)",
                    argocd_agent_redis::CAPABILITY,
                    agent = quoted(&agent)
                )));
            }
            (Decision::Forward, Some(link)) => link,
        };
        // Upstream's count of commands sent to agents, and of those that failed.
        let verb = match command {
            RedisCommand::Subscribe => "subscribe",
            _ => "get",
        };
        self.metrics.redis_proxy_agent(&agent, verb, false);
        let failed = || self.metrics.redis_proxy_agent(&agent, verb, true);
        let event = self.request_event(key, command, "");
        let mut ticket = link.request(event.clone(), stream).await.map_err(|e| {
            failed();
            refused(format!("ERR agent {agent}: {e}", agent = quoted(&agent)))
        })?;
        match ticket.answer(self.config.request_timeout).await {
            Ok(answer) => {
                if matches!(self.reply_of(key, &answer), Reply::Error(_)) {
                    failed();
                }
                Ok((link, ticket, answer))
            }
            Err(e) => {
                failed();
                self.metrics.redis_proxy("agent", "error");
                tracing::warn!(%key, %agent, error = %e, "Redis request to agent failed");
                Err(Reply::Error(format!(
                    "ERR agent {agent}: {e}",
                    agent = quoted(&agent)
                )))
            }
        }
    }

    /// The reply for a key whose owner is not connected.
    fn offline(agent: &str, key: &AppKey) -> Reply {
        Reply::Error(format!(
            "ERR agent {agent} owning application {}/{} is not connected",
            key.namespace,
            key.name,
            agent = quoted(&agent)
        ))
    }

    /// When the key's agent is not connected here but another live replica serves it: where
    /// to ask, or the reply when that replica published no address.
    ///
    /// The agent is the Application's owner when this replica knows it (it served the agent
    /// once); otherwise the agent whose Lease names this hub namespace, else (no Lease yet)
    /// the agent named like the hub namespace. Either way the replica asked decides ownership itself from its own
    /// sessions (a wrong guess gets nil or "not connected" there, never another agent's
    /// value).
    fn replica_for(&self, key: &AppKey, forwarded: bool) -> Option<Result<ReplicaTarget, Reply>> {
        let peers = self.peers.as_ref()?;
        if forwarded {
            return None;
        }
        let agent = match self.owners.app_owner(&key.namespace, &key.name) {
            Some(owner) if owner.link().is_some() => return None,
            Some(owner) => owner.name.clone(),
            None => {
                if !self.owners.exists(&key.namespace, &key.name) {
                    return None;
                }
                match peers.leases.agent_for_namespace(key.namespace.as_str()) {
                    Some(agent) => agent,
                    None => AgentName::new(key.namespace.as_str()).ok()?,
                }
            }
        };
        match peers.route(&agent, forwarded) {
            PeerRoute::Local => None,
            PeerRoute::Replica { replica, addr } => Some(Ok(ReplicaTarget {
                agent: agent.to_string(),
                replica,
                addr,
            })),
            PeerRoute::NoAddress { replica } => {
                self.metrics.redis_proxy("replica", "error");
                tracing::warn!(%key, %agent, %replica,
                    "Redis proxy: the replica serving the agent published no Redis proxy address");
                Some(Err(Self::offline(agent.as_str(), key)))
            }
        }
    }

    /// The reply when another replica could not be asked.
    fn unreachable(&self, key: &AppKey, target: &ReplicaTarget, error: &str) -> Reply {
        self.metrics.redis_proxy("replica", "error");
        tracing::warn!(%key, agent = %target.agent, replica = %target.replica, addr = %target.addr,
            %error, "Redis proxy: could not forward to the replica serving the agent");
        Self::offline(&target.agent, key)
    }

    /// `GET` of an Application key.
    async fn get(&self, key: &AppKey, forwarded: bool) -> Reply {
        match self.replica_for(key, forwarded) {
            None => {}
            Some(Err(reply)) => return reply,
            Some(Ok(target)) => {
                let peers = self.peers.as_ref().expect("replica_for needs peers");
                let replica = &target.replica;
                return match peers.get(&target.addr, &key.to_string()).await {
                    Ok(reply) => {
                        self.metrics.redis_proxy("replica", "forwarded");
                        tracing::debug!(%key, %replica, "Redis GET answered by another replica");
                        reply
                    }
                    Err(e) => self.unreachable(key, &target, &e),
                };
            }
        }
        let answer = match self.ask(key, RedisCommand::Get, None).await {
            Ok((_, _, answer)) => answer,
            Err(reply) => return reply,
        };
        let reply = self.reply_of(key, &answer);
        let result = match &reply {
            Reply::Error(_) => "error",
            Reply::Nil => "nil",
            Reply::Value(_) => "forwarded",
        };
        self.metrics.redis_proxy("agent", result);
        reply
    }

    fn reply_of(&self, key: &AppKey, answer: &Event) -> Reply {
        let Payload::RedisResponse(r) = &answer.payload else {
            return Reply::Error("ERR agent sent an invalid answer".into());
        };
        match &r.result {
            Some(redis_response::Result::Value(v)) if v.len() > self.config.max_value_size => {
                tracing::warn!(%key, size = v.len(), limit = self.config.max_value_size, "value from agent over the size limit");
                Reply::Error(format!(
                    "ERR value of {key} is larger than the proxy's limit of {} bytes",
                    self.config.max_value_size
                ))
            }
            Some(redis_response::Result::Value(v)) => Reply::Value(Bytes::copy_from_slice(v)),
            Some(redis_response::Result::Error(e)) => Reply::Error(format!("ERR agent: {e}")),
            Some(redis_response::Result::Nil(_)) | None => Reply::Nil,
        }
    }
}

impl Conn {
    /// Whether the connection is authenticated now, once the hub Redis has answered every
    /// AUTH sent so far (commands after an AUTH wait for its answer, as Redis runs them in
    /// order). Frees its unauthenticated place when it is.
    async fn authenticated(&mut self) -> Result<bool, ReadStop> {
        if !self.auth_required {
            return Ok(true);
        }
        let sent = self.auth_sent;
        // Nothing in flight (every command but one right after an AUTH): no waiting.
        let now = *self.shared.auth.borrow();
        if now.answered >= sent {
            return Ok(now.ok);
        }
        let mut rx = self.shared.auth.subscribe();
        let state = match tokio::time::timeout(
            self.proxy.config.request_timeout,
            rx.wait_for(|s| s.answered >= sent),
        )
        .await
        {
            Ok(Ok(s)) => *s,
            // The hub Redis leg is gone or silent: the connection ends.
            _ => {
                return Err(ReadStop::Error(RespError::Io(
                    std::io::ErrorKind::TimedOut.into(),
                )));
            }
        };
        Ok(state.ok)
    }

    /// Moves an authenticated connection from the unauthenticated pool to the authenticated
    /// one; the reason when that is full (or full for this client address).
    fn admit(&mut self) -> Result<(), &'static str> {
        if self.admitted.is_some() {
            return Ok(());
        }
        let place = self.proxy.connections.admit(Some(self.peer_ip))?;
        self.admitted = Some(place);
        self.pending = None;
        Ok(())
    }

    /// The client's next command: within the idle timeout (`wait`), and once it has begun,
    /// in full within [`FRAME_TIMEOUT`].
    async fn next_frame<R: AsyncRead + Unpin>(
        reader: &mut FrameReader<R>,
        wait: Option<(Duration, ReadStop)>,
    ) -> Result<Option<Frame>, ReadStop> {
        let now = Instant::now();
        let (mut deadline, mut why) = match wait {
            Some((d, why)) => (Some(now + d), why),
            None => (None, ReadStop::Idle),
        };
        let mut begun = false;
        loop {
            if let Some(f) = reader.decode(Protocol::Resp2)? {
                return Ok(Some(f));
            }
            if reader.partial() && !begun {
                begun = true;
                let frame_deadline = Instant::now() + FRAME_TIMEOUT;
                if deadline.is_none_or(|d| frame_deadline < d) {
                    deadline = Some(frame_deadline);
                    why = ReadStop::FrameTimeout;
                }
            }
            let filled = match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), reader.fill()).await {
                    Ok(r) => r?,
                    Err(_) => return Err(why),
                },
                None => reader.fill().await?,
            };
            if !filled {
                return if reader.partial() {
                    Err(RespError::Io(std::io::ErrorKind::UnexpectedEof.into()).into())
                } else {
                    Ok(None)
                };
            }
        }
    }

    /// Refuses a command for an agent's key on a connection that has not authenticated.
    async fn noauth(&self, what: &str) {
        self.proxy.metrics.redis_proxy("agent", "unauthenticated");
        tracing::warn!(
            command = what,
            "Redis proxy: an agent's key asked for before AUTH, refused"
        );
        self.ready(Out::Reply(Reply::Error(NOAUTH.into()))).await;
    }

    /// Reads the client's commands until it leaves.
    async fn serve<R: AsyncRead + Unpin>(
        &mut self,
        mut reader: FrameReader<R>,
    ) -> Result<(), RespError> {
        loop {
            let authed = match self.authenticated().await {
                Ok(a) => a,
                Err(ReadStop::Error(e)) => return Err(e),
                Err(_) => return Ok(()),
            };
            let ControlFlow::Continue(wait) = self.prepare_read(&mut reader, authed).await else {
                return Ok(());
            };
            let frame = match Self::next_frame(&mut reader, wait).await {
                Ok(Some(f)) => f,
                Ok(None) => return Ok(()),
                Err(stop) => return self.read_stopped(stop, authed).await,
            };
            let Some(args) = frame.command().filter(|a| !a.is_empty()) else {
                self.ready(Out::Reply(Reply::Error(
                    "ERR Protocol error: expected a command (an array of bulk strings)".into(),
                )))
                .await;
                continue;
            };
            self.dispatch(&frame, &args, authed).await?;
        }
    }

    /// Before reading the next command: admits an authenticated connection (`Break`: too
    /// many, refused and to be closed), sets the frame limit, and says how long the read
    /// may wait (idle timeout, or what is left of the authentication deadline).
    async fn prepare_read<R: AsyncRead + Unpin>(
        &mut self,
        reader: &mut FrameReader<R>,
        authed: bool,
    ) -> ControlFlow<(), Option<(Duration, ReadStop)>> {
        if !authed {
            reader.set_limit(UNAUTHENTICATED_FRAME_LIMIT);
            let left = self.auth_deadline.saturating_duration_since(Instant::now());
            return ControlFlow::Continue(Some((left, ReadStop::AuthTimeout)));
        }
        if let Err(reason) = self.admit() {
            self.proxy.metrics.listener_closed("redis-proxy", reason);
            let limit = self.proxy.connections.max_total();
            let peer = SocketAddr::new(self.peer_ip, 0);
            self.proxy.refusals.refused(Some(peer), reason, limit);
            self.ready(Out::Reply(Reply::Error(
                "ERR max number of clients reached".into(),
            )))
            .await;
            return ControlFlow::Break(());
        }
        reader.set_limit(self.proxy.config.max_value_size);
        let idle = self.subscriptions.is_empty() && !self.upstream_pubsub;
        ControlFlow::Continue(idle.then_some((self.proxy.config.idle_timeout, ReadStop::Idle)))
    }

    /// Ends the connection after reading stopped: counts and logs why, and answers a bad
    /// command with a protocol error.
    async fn read_stopped(&self, stop: ReadStop, authed: bool) -> Result<(), RespError> {
        match stop {
            ReadStop::Idle => {
                tracing::debug!("idle Redis proxy connection closed");
                Ok(())
            }
            ReadStop::AuthTimeout => {
                self.proxy
                    .metrics
                    .listener_closed("redis-proxy", "AuthTimeout");
                tracing::warn!(timeout = %text::duration(AUTH_TIMEOUT), "Redis proxy: client did not authenticate in time, closing");
                Ok(())
            }
            ReadStop::FrameTimeout => {
                self.proxy
                    .metrics
                    .listener_closed("redis-proxy", "FrameTimeout");
                tracing::warn!(timeout = %text::duration(FRAME_TIMEOUT), "Redis proxy: command not received in full in time, closing");
                Ok(())
            }
            ReadStop::Error(
                e @ (RespError::Malformed(_)
                | RespError::TooLarge { .. }
                | RespError::TooDeep { .. }),
            ) => {
                self.proxy
                    .metrics
                    .listener_closed("redis-proxy", "ProtocolError");
                tracing::warn!(error = %e, authenticated = authed, "Redis proxy: bad command, closing");
                self.ready(Out::Reply(Reply::Error(format!("ERR Protocol error: {e}"))))
                    .await;
                Err(e)
            }
            ReadStop::Error(e) => Err(e),
        }
    }

    /// Routes one command: an Application key's `GET` and `SUBSCRIBE` are answered through
    /// its agent, the proxy's own marker here, everything else goes to the hub Redis.
    async fn dispatch(
        &mut self,
        frame: &Frame,
        args: &[Bytes],
        authed: bool,
    ) -> Result<(), RespError> {
        let name = args[0].to_ascii_uppercase();
        match name.as_slice() {
            b"GET" if args.len() == 2 => match AppKey::parse(&args[1]) {
                Some(_) if !authed => self.noauth("GET").await,
                Some(key) => self.local_get(key).await,
                None => self.forward(&frame.raw, SlotKind::Reply).await?,
            },
            b"SUBSCRIBE"
                if args.len() > 1
                    && !authed
                    && args[1..].iter().any(|c| AppKey::parse(c).is_some()) =>
            {
                self.noauth("SUBSCRIBE").await
            }
            b"SUBSCRIBE" if args.len() > 1 => self.subscribe(&args[1..]).await?,
            b"CLIENT" if authed && replica::is_forward_marker(args) => {
                self.forwarded = true;
                self.ready(Out::Raw(Bytes::from_static(b"+OK\r\n"))).await;
            }
            // In pub/sub mode every frame of the hub Redis is out of band: the answer
            // cannot be matched, and the state stays as it was (conservative).
            b"AUTH" if !self.upstream_pubsub => {
                self.auth_sent += 1;
                self.forward(&frame.raw, SlotKind::Auth).await?
            }
            b"RESET" if !self.upstream_pubsub => {
                self.auth_sent += 1;
                self.forward(&frame.raw, SlotKind::Reset).await?
            }
            b"UNSUBSCRIBE" => self.unsubscribe(&frame.raw, &args[1..]).await?,
            b"PSUBSCRIBE" | b"SSUBSCRIBE" => self.forward(&frame.raw, SlotKind::Subscribe).await?,
            b"PUNSUBSCRIBE" | b"SUNSUBSCRIBE" => {
                self.forward(&frame.raw, SlotKind::PubSubReply).await?
            }
            b"HELLO" => self.hello(&frame.raw, args).await?,
            _ => self.forward(&frame.raw, SlotKind::Reply).await?,
        }
        Ok(())
    }

    /// `HELLO`: forwarded, its reply switching the protocol (and authentication, when it
    /// carries `AUTH`).
    async fn hello(&mut self, raw: &Bytes, args: &[Bytes]) -> Result<(), RespError> {
        let version = match args.get(1).map(|v| v.as_ref()) {
            Some(b"3") => Protocol::Resp3,
            Some(b"2") => Protocol::Resp2,
            _ => self.shared.protocol(),
        };
        let auth =
            !self.upstream_pubsub && args[1..].iter().any(|a| a.eq_ignore_ascii_case(b"AUTH"));
        if auth {
            self.auth_sent += 1;
        }
        self.forward(raw, SlotKind::Hello(version, auth)).await
    }

    /// Queues a reply that is ready now.
    async fn ready(&self, out: Out) {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(out);
        let _ = self.slots.send(rx).await;
    }

    /// Passes a command to the hub Redis unchanged; its reply fills the next slot.
    async fn forward(&mut self, raw: &Bytes, kind: SlotKind) -> Result<(), RespError> {
        self.proxy.metrics.redis_proxy("hub", "forwarded");
        if self.upstream_pubsub {
            // In pub/sub mode every frame of the hub Redis is out of band.
            self.upstream.write_all(raw).await?;
            self.upstream.flush().await?;
            return Ok(());
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.upstream).push_back(UpstreamSlot { kind, tx });
        self.upstream.write_all(raw).await?;
        self.upstream.flush().await?;
        if kind == SlotKind::Subscribe {
            self.upstream_pubsub = true;
        }
        let _ = self.slots.send(rx).await;
        Ok(())
    }

    /// `GET` of an Application key: the owner's answer fills the slot.
    async fn local_get(&self, key: AppKey) {
        let (tx, rx) = oneshot::channel();
        let proxy = self.proxy.clone();
        let forwarded = self.forwarded;
        self.proxy.tasks.spawn(
            async move {
                let _ = tx.send(Out::Reply(proxy.get(&key, forwarded).await));
            }
            .instrument(tracing::Span::current()),
        );
        let _ = self.slots.send(rx).await;
    }

    async fn subscribe(&mut self, channels: &[Bytes]) -> Result<(), RespError> {
        let (apps, others): (Vec<&Bytes>, Vec<&Bytes>) =
            channels.iter().partition(|c| AppKey::parse(c).is_some());
        if !others.is_empty() {
            let mut args: Vec<&[u8]> = vec![b"SUBSCRIBE"];
            args.extend(others.iter().map(|c| c.as_ref()));
            self.forward(&resp::command(&args), SlotKind::Subscribe)
                .await?;
        }
        for channel in apps {
            let Some(key) = AppKey::parse(channel) else {
                continue;
            };
            if !self.subscriptions.contains_key(channel) {
                match self.start_subscription(channel.clone(), &key).await {
                    Ok(()) => {}
                    Err(reply) => {
                        self.ready(Out::Reply(reply)).await;
                        continue;
                    }
                }
            }
            let count = i64::try_from(self.subscriptions.len()).unwrap_or(i64::MAX);
            self.ready(Out::PubSub("subscribe", channel.clone(), count))
                .await;
        }
        Ok(())
    }

    /// Subscribes through the key's owner and forwards its pushes as pub/sub messages.
    async fn start_subscription(&mut self, channel: Bytes, key: &AppKey) -> Result<(), Reply> {
        match self.proxy.replica_for(key, self.forwarded) {
            None => {}
            Some(Err(reply)) => return Err(reply),
            Some(Ok(target)) => {
                return self.start_replica_subscription(channel, key, &target).await;
            }
        }
        let (link, mut ticket, answer) = match self
            .proxy
            .ask(key, RedisCommand::Subscribe, Some(SUBSCRIPTION_BUFFER))
            .await
        {
            Ok(x) => x,
            // Nobody owns it: a subscription that never fires, as on a plain Redis.
            Err(Reply::Nil) => {
                self.subscriptions.insert(
                    channel,
                    Subscription {
                        stop: CancellationToken::new(),
                    },
                );
                return Ok(());
            }
            Err(reply) => return Err(reply),
        };
        if let Reply::Error(e) = self.proxy.reply_of(key, &answer) {
            self.proxy.metrics.redis_proxy("agent", "error");
            return Err(Reply::Error(e));
        }
        self.proxy.metrics.redis_proxy("agent", "forwarded");
        let stop = self.closed.child_token();
        let (oob, shared, closed) = (self.oob.clone(), self.shared.clone(), self.closed.clone());
        let unsubscribe = self
            .proxy
            .request_event(key, RedisCommand::Unsubscribe, ticket.id());
        let key_text = key.to_string();
        let stop2 = stop.clone();
        let map_key = channel.clone();
        self.proxy.tasks.spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = stop2.cancelled() => {
                            link.notify(unsubscribe);
                            return;
                        }
                        push = ticket.next() => {
                            let Some(push) = push else {
                                // The agent's session ended: close the client so it
                                // subscribes again (go-redis does) and gets a fresh answer.
                                tracing::info!(key = %key_text, "agent session ended: closing subscribed Redis client");
                                closed.cancel();
                                return;
                            };
                            let payload = match pushed_message(push, &key_text) {
                                ControlFlow::Continue(Some(payload)) => payload,
                                ControlFlow::Continue(None) => continue,
                                ControlFlow::Break(()) => {
                                    closed.cancel();
                                    return;
                                }
                            };
                            let frame = resp::pubsub(shared.protocol(), "message", &channel, PubSub::Message(payload));
                            if oob.send(frame).await.is_err() {
                                link.notify(unsubscribe);
                                return;
                            }
                        }
                    }
                }
            }
            .instrument(tracing::Span::current()),
        );
        self.subscriptions.insert(map_key, Subscription { stop });
        Ok(())
    }

    /// Subscribes through the replica serving the key's agent and relays its messages.
    async fn start_replica_subscription(
        &mut self,
        channel: Bytes,
        key: &AppKey,
        target: &ReplicaTarget,
    ) -> Result<(), Reply> {
        let peers = self.proxy.peers.as_ref().expect("replica_for needs peers");
        let replica = target.replica.clone();
        let mut conn = match peers.subscribe(&target.addr, &channel).await {
            Ok(Ok(conn)) => conn,
            Ok(Err(reply)) => {
                self.proxy.metrics.redis_proxy("replica", "forwarded");
                return Err(reply);
            }
            Err(e) => return Err(self.proxy.unreachable(key, target, &e)),
        };
        self.proxy.metrics.redis_proxy("replica", "forwarded");
        tracing::debug!(%key, %replica, "Redis SUBSCRIBE relayed from another replica");
        let stop = self.closed.child_token();
        let (oob, shared, closed) = (self.oob.clone(), self.shared.clone(), self.closed.clone());
        let key_text = key.to_string();
        let stop2 = stop.clone();
        let map_key = channel.clone();
        self.proxy.tasks.spawn(
            async move {
                loop {
                    tokio::select! {
                        // Closing the connection ends the subscription on the target.
                        _ = stop2.cancelled() => return,
                        frame = conn.next() => {
                            let frame = match frame {
                                Ok(f) => f,
                                Err(e) => {
                                    // As when an agent's session ends: the client subscribes
                                    // again and is routed afresh.
                                    tracing::info!(key = %key_text, %replica, error = %e,
                                        "replica subscription ended: closing subscribed Redis client");
                                    closed.cancel();
                                    return;
                                }
                            };
                            let Some(payload) = frame.into_message() else {
                                continue;
                            };
                            let frame = resp::pubsub(shared.protocol(), "message", &channel, PubSub::Message(payload));
                            if oob.send(frame).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
            .instrument(tracing::Span::current()),
        );
        self.subscriptions.insert(map_key, Subscription { stop });
        Ok(())
    }

    async fn unsubscribe(&mut self, raw: &Bytes, channels: &[Bytes]) -> Result<(), RespError> {
        let local: Vec<Bytes> = if channels.is_empty() {
            self.subscriptions.keys().cloned().collect()
        } else {
            channels
                .iter()
                .filter(|c| AppKey::parse(c).is_some())
                .cloned()
                .collect()
        };
        let others: Vec<&Bytes> = channels
            .iter()
            .filter(|c| AppKey::parse(c).is_none())
            .collect();
        if channels.is_empty() && (local.is_empty() || self.upstream_pubsub) {
            self.forward(raw, SlotKind::PubSubReply).await?;
        } else if !others.is_empty() {
            let mut args: Vec<&[u8]> = vec![b"UNSUBSCRIBE"];
            args.extend(others.iter().map(|c| c.as_ref()));
            self.forward(&resp::command(&args), SlotKind::PubSubReply)
                .await?;
        }
        for channel in local {
            if let Some(s) = self.subscriptions.remove(&channel) {
                s.stop.cancel();
            }
            let count = i64::try_from(self.subscriptions.len()).unwrap_or(i64::MAX);
            self.ready(Out::PubSub("unsubscribe", channel, count)).await;
        }
        Ok(())
    }
}

/// The message one push of an agent's subscription carries (`None`: not a Redis answer,
/// skipped); `Break` when the agent ended the subscription.
fn pushed_message(push: Event, key: &str) -> ControlFlow<(), Option<Bytes>> {
    let Payload::RedisResponse(r) = push.payload else {
        return ControlFlow::Continue(None);
    };
    match r.result {
        Some(redis_response::Result::Value(v)) => ControlFlow::Continue(Some(Bytes::from(v))),
        Some(redis_response::Result::Error(e)) => {
            tracing::warn!(key = %key, error = %text::quoted(&e), "agent ended a subscription");
            ControlFlow::Break(())
        }
        _ => ControlFlow::Continue(Some(Bytes::new())),
    }
}

/// Writes replies in command order, and out-of-band frames as they come.
async fn write_client<W: AsyncWrite + Unpin>(
    mut w: W,
    mut slots: mpsc::Receiver<oneshot::Receiver<Out>>,
    mut oob: mpsc::Receiver<Bytes>,
    shared: Arc<Shared>,
) -> std::io::Result<()> {
    let mut current: Option<oneshot::Receiver<Out>> = None;
    loop {
        tokio::select! {
            biased;
            Some(frame) = oob.recv() => {
                w.write_all(&frame).await?;
                w.flush().await?;
            }
            reply = async { current.as_mut().expect("guarded").await }, if current.is_some() => {
                current = None;
                if let Ok(out) = reply {
                    w.write_all(&out.encode(shared.protocol())).await?;
                    w.flush().await?;
                }
            }
            next = slots.recv(), if current.is_none() => match next {
                Some(rx) => current = Some(rx),
                None => {
                    w.shutdown().await?;
                    return Ok(());
                }
            },
        }
    }
}

/// Reads the hub Redis's frames: each fills the oldest waiting slot, except out-of-band
/// pushes and everything after the connection entered pub/sub mode.
async fn read_upstream<R: AsyncRead + Unpin>(
    mut reader: FrameReader<R>,
    shared: Arc<Shared>,
    oob: mpsc::Sender<Bytes>,
) -> Result<(), RespError> {
    let mut pubsub = false;
    loop {
        // The protocol is chosen when the bytes are there: the slot of the command they
        // answer is always queued before the command is sent.
        let head = lock(&shared.upstream).front().map(|s| s.kind);
        let protocol = match head {
            Some(SlotKind::Hello(p, _)) => p,
            _ => shared.protocol(),
        };
        let Some(frame) = reader.decode(protocol)? else {
            if !reader.fill().await? {
                return Ok(());
            }
            continue;
        };
        if pubsub {
            if oob.send(frame.raw).await.is_err() {
                return Ok(());
            }
            continue;
        }
        let slot = {
            let mut queue = lock(&shared.upstream);
            match queue.front().map(|s| s.kind) {
                Some(SlotKind::Subscribe | SlotKind::PubSubReply) => queue.pop_front(),
                _ if frame.is_push() => None,
                Some(_) => queue.pop_front(),
                None => None,
            }
        };
        match slot {
            Some(slot) => {
                let ok = !frame.is_error();
                match slot.kind {
                    SlotKind::Subscribe if ok => pubsub = true,
                    SlotKind::Hello(p, auth) => {
                        if ok {
                            *lock(&shared.protocol) = p;
                        }
                        if auth {
                            shared.auth_answered(ok.then_some(true));
                        }
                    }
                    SlotKind::Auth => shared.auth_answered(ok.then_some(true)),
                    // Back to the default user, who needs a password here.
                    SlotKind::Reset => shared.auth_answered(ok.then_some(false)),
                    _ => {}
                }
                let _ = slot.tx.send(Out::Raw(frame.raw));
            }
            None => {
                if oob.send(frame.raw).await.is_err() {
                    return Ok(());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_connected_capable_owner_is_asked() {
        assert_eq!(decide(false, false, false), Decision::Nil);
        assert_eq!(decide(false, true, true), Decision::Nil);
        assert_eq!(decide(true, false, true), Decision::Offline);
        assert_eq!(decide(true, true, false), Decision::Unsupported);
        assert_eq!(decide(true, true, true), Decision::Forward);
    }

    use tokio::io::AsyncReadExt;

    fn slot(shared: &Shared, kind: SlotKind) -> oneshot::Receiver<Out> {
        let (tx, rx) = oneshot::channel();
        lock(&shared.upstream).push_back(UpstreamSlot { kind, tx });
        rx
    }

    fn raw(out: Out) -> Bytes {
        match out {
            Out::Raw(b) => b,
            _ => panic!("not raw"),
        }
    }

    #[tokio::test]
    async fn hub_replies_fill_slots_in_order_switch_protocol_and_pushes_go_out_of_band() {
        let shared = Arc::new(Shared::default());
        let hello = slot(&shared, SlotKind::Hello(Protocol::Resp3, false));
        let get = slot(&shared, SlotKind::Reply);
        let (mut hub, upstream) = tokio::io::duplex(4096);
        let (oob_tx, mut oob) = mpsc::channel(8);
        let task = tokio::spawn(read_upstream(
            FrameReader::new(upstream, 1024),
            shared.clone(),
            oob_tx,
        ));
        // A RESP3 map (only valid once HELLO 3 is known), an invalidation push, a value.
        hub.write_all(b"%1\r\n$5\r\nproto\r\n:3\r\n>2\r\n$10\r\ninvalidate\r\n_\r\n$1\r\nx\r\n")
            .await
            .unwrap();
        assert_eq!(&raw(hello.await.unwrap())[..2], b"%1");
        assert_eq!(&raw(get.await.unwrap())[..], b"$1\r\nx\r\n");
        assert_eq!(&oob.recv().await.unwrap()[..2], b">2");
        assert_eq!(shared.protocol(), Protocol::Resp3);
        drop(hub);
        task.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn after_a_subscribe_every_hub_frame_is_out_of_band() {
        let shared = Arc::new(Shared::default());
        let sub = slot(&shared, SlotKind::Subscribe);
        let (mut hub, upstream) = tokio::io::duplex(4096);
        let (oob_tx, mut oob) = mpsc::channel(8);
        tokio::spawn(read_upstream(
            FrameReader::new(upstream, 1024),
            shared.clone(),
            oob_tx,
        ));
        hub.write_all(
            b"*3\r\n$9\r\nsubscribe\r\n$1\r\na\r\n:1\r\n*3\r\n$9\r\nsubscribe\r\n$1\r\nb\r\n:2\r\n",
        )
        .await
        .unwrap();
        assert!(raw(sub.await.unwrap()).starts_with(b"*3\r\n$9\r\nsubscribe\r\n$1\r\na"));
        assert!(oob.recv().await.unwrap().ends_with(b"b\r\n:2\r\n"));
    }

    #[tokio::test]
    async fn malformed_hub_frames_end_the_reader_with_an_error() {
        let shared = Arc::new(Shared::default());
        let _get = slot(&shared, SlotKind::Reply);
        let (mut hub, upstream) = tokio::io::duplex(4096);
        let (oob_tx, _oob) = mpsc::channel(8);
        let task = tokio::spawn(read_upstream(
            FrameReader::new(upstream, 1024),
            shared,
            oob_tx,
        ));
        hub.write_all(b"$abc\r\n").await.unwrap();
        assert!(matches!(task.await.unwrap(), Err(RespError::Malformed(_))));
    }

    #[tokio::test]
    async fn the_writer_keeps_command_order_and_encodes_local_replies_when_written() {
        let shared = Arc::new(Shared::default());
        let (slots_tx, slots_rx) = mpsc::channel(8);
        let (_oob_tx, oob_rx) = mpsc::channel(8);
        let (client, mut out) = tokio::io::duplex(4096);
        let writer = tokio::spawn(write_client(client, slots_rx, oob_rx, shared.clone()));
        let (first_tx, first) = oneshot::channel();
        let (second_tx, second) = oneshot::channel();
        slots_tx.send(first).await.unwrap();
        slots_tx.send(second).await.unwrap();
        drop(slots_tx);
        // The second (local) reply is ready first; the first (HELLO 3) switches the protocol.
        second_tx.send(Out::Reply(Reply::Nil)).unwrap();
        tokio::task::yield_now().await;
        *lock(&shared.protocol) = Protocol::Resp3;
        first_tx
            .send(Out::Raw(Bytes::from_static(b"+OK\r\n")))
            .unwrap();
        writer.await.unwrap().unwrap();
        let mut got = Vec::new();
        out.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"+OK\r\n_\r\n");
    }

    #[test]
    fn replies_are_encoded_in_the_connection_protocol() {
        assert_eq!(&Reply::Nil.encode(Protocol::Resp2)[..], b"$-1\r\n");
        assert_eq!(&Reply::Nil.encode(Protocol::Resp3)[..], b"_\r\n");
        assert_eq!(
            &Reply::Error("ERR x".into()).encode(Protocol::Resp3)[..],
            b"-ERR x\r\n"
        );
    }
}
