//! One client connection's commands: authentication, routing each command to the hub
//! Redis, an agent or another replica, and local subscriptions.

use argocd_agent_identity::text;
use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use argocd_agent_proto::eventstream::RedisCommand;
use argocd_agent_redis::resp::Frame;
use argocd_agent_redis::resp::{self, PubSub};
use argocd_agent_redis::{AppKey, FrameReader, Protocol, RespError};
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::loops::*;
use super::reply::{Out, Reply, lock};
use super::state::*;

impl Conn {
    /// Whether the connection is authenticated now, once the hub Redis has answered every
    /// AUTH sent so far (commands after an AUTH wait for its answer, as Redis runs them in
    /// order). Frees its unauthenticated place when it is.
    pub(super) async fn authenticated(&mut self) -> Result<bool, ReadStop> {
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
    pub(super) fn admit(&mut self) -> Result<(), &'static str> {
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
    pub(super) async fn next_frame<R: AsyncRead + Unpin>(
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
    pub(super) async fn noauth(&self, what: &str) {
        self.proxy.metrics.redis_proxy("agent", "unauthenticated");
        tracing::warn!(
            command = what,
            "Redis proxy: an agent's key asked for before AUTH, refused"
        );
        self.ready(Out::Reply(Reply::Error(NOAUTH.into()))).await;
    }

    /// Reads the client's commands until it leaves.
    pub(super) async fn serve<R: AsyncRead + Unpin>(
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
    pub(super) async fn prepare_read<R: AsyncRead + Unpin>(
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
    pub(super) async fn read_stopped(&self, stop: ReadStop, authed: bool) -> Result<(), RespError> {
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
    pub(super) async fn dispatch(
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
            b"CLIENT" if authed && super::replica::is_forward_marker(args) => {
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
    pub(super) async fn hello(&mut self, raw: &Bytes, args: &[Bytes]) -> Result<(), RespError> {
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
    pub(super) async fn ready(&self, out: Out) {
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(out);
        let _ = self.slots.send(rx).await;
    }

    /// Passes a command to the hub Redis unchanged; its reply fills the next slot.
    pub(super) async fn forward(&mut self, raw: &Bytes, kind: SlotKind) -> Result<(), RespError> {
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
    pub(super) async fn local_get(&self, key: AppKey) {
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

    pub(super) async fn subscribe(&mut self, channels: &[Bytes]) -> Result<(), RespError> {
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
    pub(super) async fn start_subscription(
        &mut self,
        channel: Bytes,
        key: &AppKey,
    ) -> Result<(), Reply> {
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
    pub(super) async fn start_replica_subscription(
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

    pub(super) async fn unsubscribe(
        &mut self,
        raw: &Bytes,
        channels: &[Bytes],
    ) -> Result<(), RespError> {
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
