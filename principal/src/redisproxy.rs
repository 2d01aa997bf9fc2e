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

mod conn;
mod loops;
mod replica;
mod reply;
mod state;

pub use replica::{FORWARDED_NAME, PinnedTlsError, default_replica_address, pinned_replica_tls};

use argocd_agent_identity::text::quoted;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_domain::rpc::Ticket;
use argocd_agent_domain::{AgentName, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef};
use argocd_agent_listener::{
    Bounded, Caps, Handshake, IncomingOptions, RefusalLog, Refused, RefusedHook,
};
use argocd_agent_proto::eventstream::{RedisCommand, RedisRequest, redis_response};
use argocd_agent_redis::resp;
use argocd_agent_redis::{AppKey, FrameReader, Protocol, RespError};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::apps::AppOwners;
use crate::ha::Leases;
use crate::metrics::Metrics;
use argocd_agent_domain::rpc::AgentLink;
use loops::*;
use replica::{PeerRoute, Peers};
use reply::Reply;
use state::*;
pub use state::{DEFAULT_AGENT_IN_FLIGHT, Decision, RedisProxyConfig, decide};

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
    let proxy = Arc::new(RedisProxy {
        owners,
        metrics,
        source,
        connections: Caps::new(config.max_connections, config.max_connections_per_client),
        refusals: RefusalLog::new(format!("Redis proxy {addr}")),
        config,
        tasks: tasks.clone(),
        peers,
    });
    tracing::info!(%addr, upstream = %proxy.config.upstream.addr, tls = proxy.config.tls.is_some(),
        "Redis proxy listening");
    let opts = client_limits(&proxy);
    let handshake = ClientTls(
        proxy
            .config
            .tls
            .clone()
            .map(tokio_rustls::TlsAcceptor::from),
    );
    let name = format!("Redis proxy {addr}");
    let stop = shutdown.clone();
    Bounded::new(listener, &opts, &name, handshake).serve(tasks, shutdown, move |client| {
        let (proxy, shutdown) = (proxy.clone(), stop.clone());
        let peer = client
            .remote
            .unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        let span = tracing::debug_span!("redis-proxy", %peer);
        proxy
            .connection(client.io, (client.admission, peer.ip()), shutdown)
            .instrument(span)
    });
    Ok(addr)
}

/// The caps every client connection is accepted under: the pool of unauthenticated
/// connections (`max_unauthenticated`, `max_unauthenticated_per_client`), which TLS
/// handshakes are part of, and the TLS handshake timeout. The handshake caps are one above
/// the pool's, so that they never bind first: the pool refuses. Refusals and failed
/// handshakes are counted in
/// `argocd_principal_listener_connections_closed_total{listener="redis-proxy"}`.
fn client_limits(proxy: &RedisProxy) -> IncomingOptions {
    let metrics = proxy.metrics.clone();
    IncomingOptions {
        max_handshakes: proxy.config.max_unauthenticated.saturating_add(1),
        max_handshakes_per_client: proxy
            .config
            .max_unauthenticated_per_client
            .saturating_add(1),
        max_connections: proxy.config.max_unauthenticated,
        max_connections_per_client: proxy.config.max_unauthenticated_per_client,
        handshake_timeout: TLS_HANDSHAKE_TIMEOUT,
        on_refused: Some(RefusedHook(Arc::new(move |reason| {
            metrics.listener_closed("redis-proxy", reason)
        }))),
        ready: None,
        ..IncomingOptions::default()
    }
}

/// A client connection: TCP, or TLS on it when the proxy serves TLS.
type ClientIo = tokio_util::either::Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// The TLS handshake towards argocd-server, when configured (none otherwise).
struct ClientTls(Option<tokio_rustls::TlsAcceptor>);

impl Handshake<TcpStream> for ClientTls {
    type Output = ClientIo;
    const NAME: &'static str = "Redis proxy TLS handshake";
    // Connections finding the pool full are refused at once, not left in the backlog.
    const QUEUE: bool = false;

    fn handshake(
        &self,
        io: TcpStream,
        remote: Option<SocketAddr>,
    ) -> impl std::future::Future<Output = Result<ClientIo, Refused>> + Send {
        let acceptor = self.0.clone();
        async move {
            let Some(acceptor) = acceptor else {
                return Ok(ClientIo::Left(io));
            };
            acceptor.accept(io).await.map(ClientIo::Right).map_err(|e| {
                let peer = argocd_agent_identity::text::or_dash(remote);
                tracing::warn!(%peer, error = %e, "Redis proxy TLS handshake failed");
                Refused::new("HandshakeFailed", e.to_string())
            })
        }
    }
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

/// Why the hub Redis could not be asked whether it wants a password (the cause is printed in
/// the message, so it is no `#[source]`).
#[derive(Debug, thiserror::Error)]
enum ProbeError {
    /// Writing `PING` or reading its answer failed.
    #[error("{0}")]
    Resp(RespError),
    /// No answer within the request timeout.
    #[error("no answer to PING")]
    Timeout,
}

/// Whether the hub Redis wants a password from a new connection: its answer to `PING`
/// (`-NOAUTH ...` when it does; any other error counts as yes too).
async fn probe_auth<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    reader: &mut FrameReader<R>,
    writer: &mut W,
    timeout: Duration,
) -> Result<bool, ProbeError> {
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
        Ok(Err(e)) => Err(ProbeError::Resp(e)),
        Err(_) => Err(ProbeError::Timeout),
    }
}

impl RedisProxy {
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
    fn unreachable(
        &self,
        key: &AppKey,
        target: &ReplicaTarget,
        error: &replica::ReplicaError,
    ) -> Reply {
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

#[cfg(test)]
mod tests {
    use super::reply::{Out, lock};
    use super::*;
    use tokio::sync::oneshot;

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
