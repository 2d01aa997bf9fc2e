//! One agent session: the handshake (hello / welcome), the resync, then inbound events
//! decided ([`crate::inbound::decide`]) and applied in order, and outbound events drained
//! from the agent's queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use argocd_agent_domain::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use argocd_agent_domain::{AgentIdentity, AgentMode, Event, EventType, Payload, ResourceKind};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::{self as pb, Hello, Welcome};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;
use tracing::Instrument;

use argocd_agent_identity::text;

use crate::error::chain;
use crate::hooks::{SessionGate, SessionObserver, SessionPass};
use crate::hub::{Applied, Hub};
use crate::inbound::{Decision, OwnerRecord, Placement, control_decision, decide};
use crate::refusals::{HELLO_TIMEOUT, NOT_READING, TOO_LARGE, UNDECODABLE};
use crate::rounds::Round;
use crate::sessions::{AgentState, SessionInfo};

mod outbound;
mod silence;

pub use outbound::OutboundStream;
use outbound::{OUTBOUND_BUFFER, Outbound, SendFailure, finish};
use silence::Silence;

static SESSION_IDS: AtomicU64 = AtomicU64::new(1);

/// How long an agent may take to send its hello, by default (`--hello-timeout`).
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(15);

/// Capabilities this principal offers.
pub const CAPABILITIES: &[&str] = &[
    "resync.v1",
    argocd_agent_domain::resync::PERIODIC_CAPABILITY,
    "operations.v1",
    argocd_agent_redis::CAPABILITY,
    argocd_agent_domain::proxy::CAPABILITY,
];

/// Longest event id echoed back in a `Malformed` refusal.
const MAX_ECHOED_ID: usize = 256;

/// Where a session runs: the hub, the task tracker it is drained with, and its limits.
#[derive(Clone)]
pub struct SessionContext {
    /// The hub the sessions read and write through.
    pub hub: Arc<Hub>,
    /// Where sessions' tasks run (drained on shutdown).
    pub tasks: TaskTracker,
    /// Ends every session (the agent is told the principal is shutting down).
    pub shutdown: CancellationToken,
    /// A session whose agent sends nothing, or accepts no outbound event, for this long is
    /// closed.
    pub idle_timeout: Duration,
    /// How long an agent may take to send its hello.
    pub hello_timeout: Duration,
    /// The shortest interval between an agent's resync rounds (`--resync-min-interval`);
    /// periodic requests within it are refused. Zero: no minimum.
    pub resync_min_interval: Duration,
    /// Requests (Redis proxy) waiting for one agent's answers at once.
    pub max_requests_in_flight: usize,
    /// Admits sessions (replicas: the agent Leases that make one session per agent across
    /// replicas).
    pub gate: Option<Arc<dyn SessionGate>>,
    /// Told when sessions start and end (agents' cluster info, cluster secrets).
    pub observers: Vec<Arc<dyn SessionObserver>>,
}

/// Starts a session for an authenticated identity; `peer` holds what the connection tells
/// about it (address, certificate expiry). Returns the outbound stream.
pub fn start(
    ctx: &SessionContext,
    identity: AgentIdentity,
    peer: SessionInfo,
    mut inbound: impl Stream<Item = Result<CloudEvent, Status>> + Send + Unpin + 'static,
    slot: crate::tenant_limits::AgentSlot,
) -> OutboundStream {
    let (tx, rx) = mpsc::channel(OUTBOUND_BUFFER);
    let tx = Outbound {
        tx,
        send_timeout: ctx.idle_timeout,
    };
    let span = tracing::info_span!("session", agent = %identity.agent, client = %identity.client, rule = %identity.rule);
    let ctx = ctx.clone();
    ctx.tasks.clone().spawn(
        async move {
            // The session watches for shutdown itself: between events, so the event being
            // applied when SIGTERM arrives is finished and answered first.
            // By reference or boxed: moved into `run`, each would be held twice.
            let result = run(&ctx, &identity, Box::new(peer), &mut inbound, &tx).await;
            // The tenant's slot is given back once the session has ended.
            drop(slot);
            finish(&tx, result).await;
        }
        .instrument(span),
    );
    OutboundStream(rx)
}

fn mode_from_wire(m: i32) -> Option<AgentMode> {
    match pb::AgentMode::try_from(m).ok()? {
        pb::AgentMode::Managed => Some(AgentMode::Managed),
        pb::AgentMode::Autonomous => Some(AgentMode::Autonomous),
        pb::AgentMode::Unspecified => None,
    }
}

/// Checks a hello against what this principal speaks and what the identity may do; returns
/// the agent's mode.
fn check_hello(hello: &Hello, identity: &AgentIdentity) -> Result<AgentMode, Status> {
    if hello.protocol_version < PROTOCOL_MIN || hello.protocol_version > PROTOCOL_VERSION {
        return Err(Status::failed_precondition(format!(
            "agent speaks protocol {}, this principal accepts {PROTOCOL_MIN}..={PROTOCOL_VERSION} (agent version {}, principal version {})",
            hello.protocol_version,
            text::quoted(&hello.version),
            env!("CARGO_PKG_VERSION")
        )));
    }
    let mode = mode_from_wire(hello.mode)
        .ok_or_else(|| Status::invalid_argument("hello does not state a valid agent mode"))?;
    identity
        .check_mode(mode)
        .map_err(|denied| Status::permission_denied(denied.to_string()))?;
    Ok(mode)
}

/// Waits for the agent's first event, which must be a valid hello.
async fn receive_hello(
    hub: &Hub,
    identity: &AgentIdentity,
    timeout: Duration,
    inbound: &mut (impl Stream<Item = Result<CloudEvent, Status>> + Unpin),
) -> Result<(Hello, AgentMode), Status> {
    let first = tokio::time::timeout(timeout, inbound.next())
        .await
        .map_err(|_| {
            hub.shared.metrics.refused(&identity.agent, HELLO_TIMEOUT);
            Status::deadline_exceeded(format!(
                "no hello received within {timeout}",
                timeout = text::duration(timeout)
            ))
        })?
        .ok_or_else(|| Status::cancelled("stream closed before hello"))?
        .map_err(|s| stream_error(hub, &identity.agent, s))?;
    let event = Event::from_cloud_event(first).map_err(|e| {
        hub.shared.metrics.refused(&identity.agent, "Malformed");
        Status::invalid_argument(format!("invalid hello: {e}"))
    })?;
    let Payload::Hello(hello) = event.payload else {
        return Err(Status::failed_precondition(
            "the first event must be a hello",
        ));
    };
    let mode = check_hello(&hello, identity).inspect_err(|status| {
        if status.code() == tonic::Code::PermissionDenied {
            hub.shared.metrics.auth_failed("ModeNotAllowed");
            tracing::warn!(reason = %text::quoted(status.message()), "agent mode refused");
        }
    })?;
    Ok((hello, mode))
}

fn welcome(
    hub: &Hub,
    identity: &AgentIdentity,
    hello: &Hello,
    resync_min_interval: Duration,
) -> Event {
    Event::new(
        &hub.shared.source,
        EventType::Welcome,
        Payload::Welcome(Welcome {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            agent_name: identity.agent.to_string(),
            namespace: identity.namespace.to_string(),
            capabilities: hello
                .capabilities
                .iter()
                .filter(|c| CAPABILITIES.contains(&c.as_str()))
                .cloned()
                .collect(),
            max_in_flight: u32::try_from(hub.shared.sessions.queue_limits.max_in_flight)
                .unwrap_or(u32::MAX),
            resync_min_interval_ms: u64::try_from(resync_min_interval.as_millis())
                .unwrap_or(u64::MAX),
        }),
    )
}

async fn run(
    ctx: &SessionContext,
    identity: &AgentIdentity,
    peer: Box<SessionInfo>,
    inbound: &mut (impl Stream<Item = Result<CloudEvent, Status>> + Send + Unpin + 'static),
    tx: &Outbound,
) -> Result<(), Status> {
    let hub = &ctx.hub;
    // 1. Hello.
    let (hello, mode) = tokio::select! {
        r = Box::pin(receive_hello(hub, identity, ctx.hello_timeout, inbound)) => r?,
        _ = ctx.shutdown.cancelled() => return Err(shutting_down()),
    };

    // 2. With replicas, the agent's Lease (handed over by its holder); register, welcome.
    let session_id = SESSION_IDS.fetch_add(1, Ordering::Relaxed);
    let pass = match &ctx.gate {
        Some(gate) => Some(
            gate.enter(&identity.agent, &identity.namespace, session_id)
                .await?,
        ),
        None => None,
    };
    let (state, token, guard) = Box::pin(register(
        ctx, identity, mode, session_id, &hello, *peer, pass,
    ))
    .await;
    let result = async {
        // Before the welcome, from which the agent times its periodic requests.
        crate::rounds::record_connect(&state, std::time::Instant::now());
        let mut direct_rx = welcome_agent(ctx, &state, identity, &hello, session_id, tx).await?;
        let view = hello.state.as_ref(); // 3. Resync, 4. exchange events.
        let resynced = resync(ctx, &state, &token, mode, view, Round::Connect, tx).await;
        state.release_changes(session_id); // changes that came meanwhile, against the round
        if !resynced? {
            return Ok(());
        }
        let exchange = Exchange {
            ctx,
            state: &state,
            identity,
            mode,
            token: &token,
            tx,
        };
        exchange.run(inbound, &mut direct_rx).await
    }
    .await;
    // Detached first, then the Lease released (or handed over), waited for, and only then
    // is the agent told, so that wherever it reconnects finds its Lease free. Except while
    // the principal shuts down: this replica clears its replica Lease, so the others take
    // its agents' Leases over at once, and its agents are told before the release (which
    // is then not written: `ha::Leases::write_release`). Otherwise each would wait for its
    // own release, and a replica's releases go at its Lease budget (thousands of sessions:
    // seconds, during a rolling update).
    if ctx.shutdown.is_cancelled() {
        let pass = guard.detach();
        finish(tx, result).await;
        if let Some(pass) = pass {
            pass.release().await;
        }
        return Ok(());
    }
    guard.end().await;
    result
}

/// Registers the session (the agent's state, the token that closes it) and records it:
/// session info, hub namespace, metrics; then tells the observers.
async fn register(
    ctx: &SessionContext,
    identity: &AgentIdentity,
    mode: AgentMode,
    session_id: u64,
    hello: &Hello,
    peer: SessionInfo,
    pass: Option<Box<dyn SessionPass>>,
) -> (Arc<AgentState>, CancellationToken, SessionGuard) {
    let hub = &ctx.hub;
    let token = CancellationToken::new();
    let state = hub.attach(identity.clone(), mode, session_id, token.clone());
    if let Some(gate) = &ctx.gate
        && gate.must_yield(&identity.agent, session_id)
    {
        // Asked for between taking the Lease and registering: this session yields.
        hub.shared.sessions.close_session(
            &identity.agent,
            Some("the agent opened a session on another principal replica".into()),
        );
    }
    tracing::info!(%mode, agent_version = %text::quoted(&hello.version), "agent connected");
    state.touch();
    state.set_session_info(
        session_id,
        SessionInfo {
            connected_since: Some(std::time::SystemTime::now()),
            agent_version: hello.version.clone(),
            ..peer
        },
    );
    Box::pin(hub.ensure_namespace(&identity.namespace, &identity.agent)).await;
    let metrics = &hub.shared.metrics;
    metrics.connected_agents.inc();
    metrics.set_tenant(identity.agent.as_str(), identity.tenant.as_ref());
    metrics.connected(identity.agent.as_str());
    let guard = SessionGuard {
        hub: hub.clone(),
        state: state.clone(),
        session_id,
        observers: ctx.observers.clone(),
        tasks: ctx.tasks.clone(),
        pass,
        _shard: hub.hold_shard(&identity.namespace),
    };
    for observer in &ctx.observers {
        observer.clone().connected(&identity.agent, &ctx.tasks);
    }
    (state, token, guard)
}

/// Sends the welcome and installs the session's request link; returns the link's
/// outbound channel.
async fn welcome_agent(
    ctx: &SessionContext,
    state: &AgentState,
    identity: &AgentIdentity,
    hello: &Hello,
    session_id: u64,
    tx: &Outbound,
) -> Result<mpsc::Receiver<Box<Event>>, Status> {
    let hub = &ctx.hub;
    let welcome = welcome(hub, identity, hello, ctx.resync_min_interval);
    let (direct_tx, direct_rx) = mpsc::channel(OUTBOUND_BUFFER);
    if let Payload::Welcome(w) = &welcome.payload {
        state.set_link(Arc::new(argocd_agent_domain::rpc::AgentLink::new(
            session_id,
            direct_tx,
            ctx.max_requests_in_flight,
            w.capabilities.clone(),
        )));
    }
    send(tx, hub, state, welcome).await?;
    Ok(direct_rx)
}

/// Resync. It can be long (an autonomous agent's hub deletes): it stops as soon as
/// the session is replaced or revoked, or the agent goes away, so an abandoned session
/// never goes on writing to the hub. `Ok(false)`: the agent went away.
async fn resync(
    ctx: &SessionContext,
    state: &AgentState,
    token: &CancellationToken,
    mode: AgentMode,
    view: Option<&pb::ResyncState>,
    round: crate::rounds::Round,
    tx: &Outbound,
) -> Result<bool, Status> {
    let hub = &ctx.hub;
    let resync_started = std::time::Instant::now();
    // Boxed, as every long sub-future of a session: the session task is as large as its
    // largest state, and an idle session only waits in the loop below.
    let resync = Box::pin(async {
        for e in crate::rounds::run(hub, state, mode, view, round).await {
            send(tx, hub, state, e).await?;
        }
        Ok::<(), Status>(())
    });
    tokio::select! {
        r = resync => r?,
        _ = token.cancelled() => {
            return Err(closed_by_principal(state, " during resync"));
        }
        _ = ctx.shutdown.cancelled() => return Err(shutting_down()),
        _ = tx.tx.closed() => {
            tracing::info!("the agent went away during resync: resync abandoned");
            return Ok(false);
        }
    }
    hub.shared
        .metrics
        .resync_duration
        .get_or_create(&crate::metrics::ModeLabels {
            mode: mode.as_str().into(),
        })
        .observe(resync_started.elapsed().as_secs_f64());
    Ok(true)
}

/// A periodic resync request (capability `resync.periodic.v1`): a round against what the
/// agent holds now, unless its last round is less than `--resync-min-interval` ago; then
/// it is refused (`ResyncTooSoon`: counted, logged, answered with an error naming the
/// minimum) and the session goes on.
async fn requested_resync(exchange: &Exchange<'_>, event: Event) -> Result<bool, Status> {
    let Exchange {
        ctx,
        state,
        mode,
        token,
        tx,
        ..
    } = *exchange;
    let hub = &ctx.hub;
    let min = ctx.resync_min_interval;
    if let Err(wait) = crate::rounds::admit_request(state, min, std::time::Instant::now()) {
        hub.shared
            .metrics
            .refused(&state.name, crate::rounds::RESYNC_TOO_SOON);
        tracing::warn!(min_interval = %text::duration(min), "periodic resync requested too soon: refused");
        let message = format!(
            "resync refused: this principal takes one resync round per agent every {} (--resync-min-interval); the next in {}",
            text::duration(min),
            text::duration(Duration::from_secs(wait.as_secs().max(1)))
        );
        let reply = event.error_reply(&hub.shared.source, crate::rounds::RESYNC_TOO_SOON, message);
        send(tx, hub, state, reply).await?;
        return Ok(true);
    }
    let argocd_agent_domain::Payload::Resync(view) = &event.payload else {
        return Ok(true);
    };
    tracing::info!("periodic resync requested by the agent");
    let done = resync(ctx, state, token, mode, Some(view), Round::Requested, tx).await?;
    if done {
        send(tx, hub, state, event.ack(&hub.shared.source)).await?;
    }
    Ok(done)
}

/// A registered, resynced session exchanging events with its agent.
struct Exchange<'a> {
    ctx: &'a SessionContext,
    state: &'a AgentState,
    identity: &'a AgentIdentity,
    mode: AgentMode,
    token: &'a CancellationToken,
    tx: &'a Outbound,
}

impl Exchange<'_> {
    /// Exchanges events until the session is closed, the agent goes away or is silent for
    /// the idle timeout, or the principal shuts down.
    async fn run(
        &self,
        inbound: &mut (impl Stream<Item = Result<CloudEvent, Status>> + Unpin),
        direct_rx: &mut mpsc::Receiver<Box<Event>>,
    ) -> Result<(), Status> {
        let Exchange {
            ctx,
            state,
            identity,
            token,
            tx,
            ..
        } = *self;
        let hub = &ctx.hub;
        let mut last_seen = tokio::time::Instant::now();
        let mut silence = Silence::new(ctx.idle_timeout);
        loop {
            tokio::select! {
                _ = token.cancelled() => {
                    return Err(closed_by_principal(state, ""));
                }
                // Checked between events only: an inbound event is applied and answered before
                // the session ends (graceful shutdown drains what is in progress).
                _ = ctx.shutdown.cancelled() => {
                    tracing::info!("principal shutting down: session closed after the last event was answered");
                    return Err(shutting_down());
                }
                _ = tx.tx.closed() => return Ok(()),
                event = state.queue.next() => send(tx, hub, state, event).await?,
                Some(event) = direct_rx.recv() => send(tx, hub, state, *event).await?,
                msg = inbound.next() => {
                    let Some(msg) = msg else { return Ok(()) };
                    last_seen = tokio::time::Instant::now();
                    state.touch();
                    let msg = msg.map_err(|s| stream_error(hub, &identity.agent, s))?;
                    Box::pin(handle_inbound(self, msg)).await?;
                }
                () = silence.since(last_seen) => {
                    return Err(Status::deadline_exceeded("agent silent for too long"));
                }
            }
        }
    }
}

/// The status sessions end with when the principal stops (the agent reconnects, to another
/// replica or to this one restarted).
fn shutting_down() -> Status {
    Status::unavailable("principal shutting down")
}

/// An error on the agent's inbound stream: a lost connection as it is; a message too large
/// (tonic: `OutOfRange`) or not decodable (tonic: `Internal`) is counted as refused and
/// ends the session with a status that says so.
fn stream_error(hub: &Hub, agent: &argocd_agent_domain::AgentName, status: Status) -> Status {
    if argocd_agent_identity::transport::is_connection_loss(&status) {
        return status;
    }
    let (reason, status) = match status.code() {
        tonic::Code::OutOfRange | tonic::Code::ResourceExhausted => (
            TOO_LARGE,
            Status::new(
                status.code(),
                format!("message refused: {}", status.message()),
            ),
        ),
        tonic::Code::Internal => (
            UNDECODABLE,
            Status::invalid_argument(format!(
                "message is not a protobuf CloudEvent: {}",
                status.message()
            )),
        ),
        _ => return status,
    };
    hub.shared.metrics.refused(agent, reason);
    tracing::warn!(reason, message = %text::quoted(status.message()), "agent stream refused");
    status
}

/// The status a session closed by the principal ends with: the reason it gave (a replica
/// handing the agent over, rebalancing), or the usual ones.
fn closed_by_principal(state: &AgentState, when: &str) -> Status {
    match state.take_close_reason() {
        Some(reason) => {
            // Only replicas give reasons, and each sends the agent elsewhere: it may come
            // back at once (see `RECONNECT_METADATA`).
            let mut status =
                Status::unavailable(format!("session closed by the principal{when}: {reason}"));
            status.metadata_mut().insert(
                argocd_agent_domain::event::RECONNECT_METADATA,
                tonic::metadata::MetadataValue::from_static("now"),
            );
            status
        }
        None => Status::aborted(format!(
            "session closed by the principal{when} (replaced by a newer session, or identity revoked)"
        )),
    }
}

struct SessionGuard {
    hub: Arc<Hub>,
    state: Arc<AgentState>,
    session_id: u64,
    observers: Vec<Arc<dyn SessionObserver>>,
    tasks: TaskTracker,
    /// Released (replicas: the Lease released or handed over) only once this session is
    /// detached: by [`SessionGuard::end`], or, should the session task fail, when the
    /// guard is dropped.
    pass: Option<Box<dyn SessionPass>>,
    _shard: crate::hub::ShardHold, // the served agent's Applications kept decoded
}

impl SessionGuard {
    /// Ends the session: detaches it, then releases its pass and waits for that.
    async fn end(self) {
        if let Some(pass) = self.detach() {
            pass.release().await;
        }
    }

    /// Detaches the session; returns its pass, still to be released.
    fn detach(mut self) -> Option<Box<dyn SessionPass>> {
        self.pass.take()
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.state.clear_link(self.session_id);
        self.hub
            .shared
            .sessions
            .detach(&self.state, self.session_id);
        // Unless a newer session of the agent took over.
        if !self.state.is_connected() {
            self.hub
                .shared
                .metrics
                .disconnected(self.state.name.as_str());
            for observer in &self.observers {
                observer.clone().disconnected(&self.state.name, &self.tasks);
            }
        }
        self.hub.shared.metrics.connected_agents.dec();
        tracing::info!("agent disconnected");
    }
}

/// Sends one event. Span `principal.send`: a child of the span the event was created (or
/// queued) in; the event then carries the send span's context to the agent.
fn send<'a>(
    tx: &'a Outbound,
    hub: &'a Hub,
    state: &'a AgentState,
    event: Event,
) -> futures::future::BoxFuture<'a, Result<(), Status>> {
    // Boxed: sent from every state of a session (see `run`).
    Box::pin(send_inner(tx, hub, state, event))
}

async fn send_inner(
    tx: &Outbound,
    hub: &Hub,
    state: &AgentState,
    mut event: Event,
) -> Result<(), Status> {
    let span = argocd_agent_domain::event_span!("principal.send", &event,
        agent = %state.name, client = %state.identity().client);
    event.stamp_trace(&span);
    hub.shared
        .metrics
        .event(true, state.name.as_str(), event.ty.verb());
    match tx.send(Ok(event.to_cloud_event())).instrument(span).await {
        Ok(()) => Ok(()),
        Err(SendFailure::Closed) => {
            // Upstream's reason for a send on a cancelled stream.
            hub.shared
                .metrics
                .send_error(state.name.as_str(), "context-canceled");
            Err(Status::cancelled("agent stream closed"))
        }
        Err(SendFailure::NotReading) => {
            hub.shared.metrics.send_error(state.name.as_str(), "other");
            hub.shared.metrics.refused(&state.name, NOT_READING);
            tracing::warn!(timeout = %text::duration(tx.send_timeout), "agent takes no events: session closed");
            Err(Status::deadline_exceeded(format!(
                "agent took no event for {}",
                text::duration(tx.send_timeout)
            )))
        }
    }
}

/// Decodes, decides and applies one inbound event, then answers it.
async fn handle_inbound(x: &Exchange<'_>, ce: CloudEvent) -> Result<(), Status> {
    let Exchange {
        ctx,
        state,
        identity,
        tx,
        ..
    } = *x;
    let hub = &ctx.hub;
    let agent = &identity.agent;
    // The refused event's id, so the agent can tell which event it was (and stop resending
    // it); an id too long to be one is not echoed.
    let id = (ce.id.len() <= MAX_ECHOED_ID).then(|| ce.id.clone());
    let event = match Event::from_cloud_event(ce) {
        Ok(e) => e,
        Err(e) => {
            hub.shared.metrics.refused(agent, "Malformed");
            tracing::warn!(error = %text::quoted(&e), "malformed event refused");
            let mut reply = Event::new(
                &hub.shared.source,
                EventType::Error,
                Payload::Error(pb::ErrorDetail {
                    reason: "Malformed".into(),
                    message: e.to_string(),
                    event_id: id.clone().unwrap_or_default(),
                }),
            );
            reply.ack_id = id.filter(|i| !i.is_empty());
            return send(tx, hub, state, reply).await;
        }
    };
    hub.shared
        .metrics
        .event(false, agent.as_str(), event.ty.verb());
    if crate::ratelimit::is_limited(event.ty) {
        if let crate::ratelimit::Verdict::Refused { log } = state.check_rate() {
            return refuse_rate_limited(hub, state, event, log, tx).await;
        }
        if let Some(tenant) = &identity.tenant
            && let (crate::ratelimit::Verdict::Refused { log }, Some(limit)) =
                hub.shared.sessions.tenancy.check_events(tenant)
        {
            let over = TenantOver { tenant, limit, log };
            return refuse_tenant_rate_limited(hub, state, over, event, tx).await;
        }
    }
    let span = argocd_agent_domain::event_span!("principal.handle_inbound", &event,
        agent = %identity.agent, client = %identity.client, rule = %identity.rule);
    handle_event(x, event).instrument(span).await
}

/// Refuses an event over the agent's rate limit before anything touches the hub: an error
/// event `TooManyRequests` naming it (the agent resends it later), the refused-events metric
/// (`RateLimited`) and, at most once a second per agent, a log line with the count.
async fn refuse_rate_limited(
    hub: &Hub,
    state: &AgentState,
    event: Event,
    log: Option<u64>,
    tx: &Outbound,
) -> Result<(), Status> {
    let limit = hub.shared.sessions.event_rate;
    hub.shared
        .metrics
        .refused(&state.name, crate::refusals::RATE_LIMITED);
    if let Some(refused) = log {
        tracing::warn!(
            refused,
            rate = limit.rate,
            burst = limit.burst,
            "agent over its event rate limit: events refused with TooManyRequests"
        );
    }
    let message = format!(
        "agent {} is over its event rate limit ({} events/s, burst {}): resend later",
        state.name, limit.rate, limit.burst
    );
    let reply = event.error_reply(
        &hub.shared.source,
        crate::ratelimit::TOO_MANY_REQUESTS,
        message,
    );
    send(tx, hub, state, reply).await
}

/// A tenant's event bucket that refused an event.
struct TenantOver<'a> {
    tenant: &'a argocd_agent_domain::TenantName,
    limit: crate::ratelimit::EventRate,
    /// Refusals since the last log line, when one is due.
    log: Option<u64>,
}

/// Refuses an event over its tenant's `eventsPerSecond` as the per-agent limit refuses:
/// `TooManyRequests` naming the tenant, `argocd_principal_events_refused_total` reason
/// `TenantRateLimited` (and the tenant's quota counter), a log line at most once a second.
async fn refuse_tenant_rate_limited(
    hub: &Hub,
    state: &AgentState,
    over: TenantOver<'_>,
    event: Event,
    tx: &Outbound,
) -> Result<(), Status> {
    let TenantOver { tenant, limit, log } = over;
    hub.shared
        .metrics
        .refused(&state.name, crate::refusals::TENANT_RATE_LIMITED);
    if let Some(refused) = log {
        tracing::warn!(
            refused,
            %tenant,
            rate = limit.rate,
            burst = limit.burst,
            "tenant over its events per second quota: events refused with TooManyRequests"
        );
    }
    let message = format!(
        "tenant {tenant} is over its event quota (quotas.eventsPerSecond {}, burst {}): resend later",
        limit.rate, limit.burst
    );
    let reply = event.error_reply(
        &hub.shared.source,
        crate::ratelimit::TOO_MANY_REQUESTS,
        message,
    );
    send(tx, hub, state, reply).await
}

/// Decides and applies one decoded inbound event, then answers it (span
/// `principal.handle_inbound`, a child of the agent's span that sent it).
async fn handle_event(x: &Exchange<'_>, event: Event) -> Result<(), Status> {
    let Exchange {
        ctx,
        state,
        identity,
        mode,
        tx,
        ..
    } = *x;
    let hub = &ctx.hub;
    let agent = &identity.agent;
    let Some(event) = take_answer(ctx, state, agent, event) else {
        return Ok(());
    };
    if event.ty == EventType::Resync {
        // The agent gone mid-round ends the session in the exchange loop.
        return requested_resync(x, event).await.map(|_| ());
    }
    let started = std::time::Instant::now();
    // Acks and pings are decided by their type alone, with no hub cache lookup.
    let decision = control_decision(&event).unwrap_or_else(|| {
        let owner = (event.resource.as_ref()).map(|r| hub.owner_record(&identity.agent, r));
        let (owner, placement) = (
            owner.unwrap_or(OwnerRecord::Absent),
            placement_of(hub, mode, &event),
        );
        decide(identity, mode, &event, &owner, &placement)
    });
    use crate::metrics::Processing;
    let mut processing = Processing::Success;
    let reply = match decision {
        Decision::Pong => Some(Event::new(
            &hub.shared.source,
            EventType::Pong,
            Payload::None,
        )),
        Decision::Ignore => None,
        Decision::Acked(id) => {
            if let Some((key, delivered)) = state.queue.ack(&id) {
                hub.apps.on_ack(state, key, &delivered).await;
            }
            None
        }
        Decision::PeerError(d) => {
            tracing::warn!(reason = %text::quoted(&d.reason), message = %text::quoted(&d.message), event_id = %text::quoted(&d.event_id), "agent reported an error");
            None
        }
        Decision::Refuse(r) => {
            processing = Processing::NotAllowed;
            Some(refuse(hub, agent, &event, r))
        }
        Decision::Apply(command) => match hub.admit(state, &event, &command) {
            Err(r) => {
                processing = Processing::NotAllowed;
                Some(refuse(hub, agent, &event, r))
            }
            Ok(admitted) => {
                let reply = apply_reply(hub, state, agent, &event, command).await;
                if reply.as_ref().is_some_and(|e| e.ty == EventType::Error) {
                    processing = Processing::Failure;
                } else if let Some(admitted) = admitted {
                    hub.ledger.record(agent, admitted);
                }
                reply
            }
        },
    };
    if let Some(r) = &event.resource {
        let seconds = started.elapsed().as_secs_f64();
        hub.shared
            .metrics
            .processed(agent.as_str(), r.kind, processing, seconds);
    }
    match reply {
        Some(reply) => send(tx, hub, state, reply).await,
        None => Ok(()),
    }
}

/// Counts and logs a refused event; returns the error event that answers it.
fn refuse(
    hub: &Hub,
    agent: &argocd_agent_domain::AgentName,
    event: &Event,
    r: crate::inbound::Refusal,
) -> Event {
    hub.shared.metrics.refused(agent, r.metric);
    tracing::warn!(object = %text::or_dash(event.resource.as_ref()), reason = r.metric, message = %text::quoted(&r.message), "event refused");
    event.error_reply(&hub.shared.source, r.reason, r.message)
}

/// Takes the agent's answers to this session's requests (resource proxy, Redis) and its
/// cluster cache info; returns any other event.
fn take_answer(
    ctx: &SessionContext,
    state: &AgentState,
    agent: &argocd_agent_domain::AgentName,
    event: Event,
) -> Option<Event> {
    // Answers to this session's requests: matched by request id within the session only,
    // so an agent can only answer what was asked of it.
    if event.ty == EventType::ResourceResponse {
        if !state.link().is_some_and(|l| l.answer(event, true)) {
            tracing::debug!("resource proxy answer to an unknown or finished request dropped");
        }
        return None;
    }
    if matches!(event.ty, EventType::RedisResponse | EventType::RedisPush) {
        // An error ends a subscription; single answers end their request anyway.
        let last = matches!(&event.payload, Payload::RedisResponse(r)
            if matches!(r.result, Some(pb::redis_response::Result::Error(_))));
        let delivered = state.link().is_some_and(|l| l.answer(event, last));
        if !delivered {
            tracing::debug!("answer to an unknown or finished request dropped");
        }
        return None;
    }
    if event.ty == EventType::ClusterCacheInfoUpdate {
        if let Payload::ClusterCacheInfo(counts) = &event.payload {
            for observer in &ctx.observers {
                observer.clone().cache_info(agent, counts, &ctx.tasks);
            }
        }
        return None;
    }
    Some(event)
}

/// Where the hub places the Application an event names (with destination-based mapping,
/// a managed agent's Applications are those whose destination names it).
fn placement_of(hub: &Hub, mode: AgentMode, event: &Event) -> Placement {
    match &event.resource {
        Some(r)
            if hub.shared.by_destination
                && mode == AgentMode::Managed
                && r.kind == ResourceKind::Application =>
        {
            Placement::Destination(
                hub.apps
                    .cache
                    .get(Some(r.namespace.as_str()), &r.name)
                    .and_then(|o| crate::apps::destination_of(&o).map(str::to_owned)),
            )
        }
        _ => Placement::Namespace,
    }
}

/// Applies an authorized command; returns the answer to the event.
async fn apply_reply(
    hub: &Hub,
    state: &AgentState,
    agent: &argocd_agent_domain::AgentName,
    event: &Event,
    command: crate::inbound::Command,
) -> Option<Event> {
    match hub.apply(state, command).await {
        Ok(Applied::Ack) => Some(event.ack(&hub.shared.source)),
        Ok(Applied::Silent) => None,
        Ok(Applied::NotFound) => {
            // Not a failure worth a warning: an agent resending a delete after a lost
            // acknowledgement lands here.
            hub.shared.metrics.refused(agent, "NotFound");
            tracing::info!(object = %text::or_dash(event.resource.as_ref()), "delete of an object the hub does not have: answered NotFound");
            let message = match &event.resource {
                Some(r) => format!("{r} does not exist on the hub (already deleted)"),
                None => "no such object on the hub".into(),
            };
            Some(event.error_reply(&hub.shared.source, "NotFound", message))
        }
        // The hub's API server failing or overloaded: the agent resends the change
        // later (dropping it would lose a status until the next resync, or for good).
        Err(e) if e.is_transient() => {
            let message = chain(&e);
            tracing::warn!(object = %text::or_dash(event.resource.as_ref()), error = %text::quoted(&message), "could not apply event for now: the agent resends it");
            Some(event.error_reply(
                &hub.shared.source,
                argocd_agent_domain::event::REASON_UNAVAILABLE,
                message,
            ))
        }
        Err(e) => {
            let message = chain(&e);
            tracing::warn!(object = %text::or_dash(event.resource.as_ref()), error = %text::quoted(&message), "could not apply event");
            Some(event.error_reply(&hub.shared.source, "ApplyFailed", message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{ClientIdentity, RuleSet};
    use argocd_agent_identity::SpiffeId;

    fn identity(modes: &str) -> AgentIdentity {
        RuleSet::from_flags(&[format!(
            "template:spiffe://{{trust_domain}}/sa/{{sa}}=>{{sa}},mode={modes}"
        )])
        .unwrap()
        .map_client(&ClientIdentity::Spiffe(
            SpiffeId::parse("spiffe://example.org/sa/edge-1").unwrap(),
        ))
        .unwrap()
    }

    fn hello(protocol: u32, mode: pb::AgentMode) -> Hello {
        Hello {
            mode: mode as i32,
            version: "9.9.9".into(),
            protocol_version: protocol,
            capabilities: vec![],
            state: None,
        }
    }

    #[test]
    fn hello_outside_the_protocol_range_is_refused_naming_both_versions() {
        let err = check_hello(
            &hello(PROTOCOL_VERSION + 1, pb::AgentMode::Managed),
            &identity("both"),
        )
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(
            err.message().contains("agent version \"9.9.9\""),
            "{}",
            err.message()
        );
        // The agent's version string is quoted, so it cannot forge a line of the log.
        let mut forged = hello(PROTOCOL_VERSION + 1, pb::AgentMode::Managed);
        forged.version = "1\nlevel=ERROR forged".into();
        let err = check_hello(&forged, &identity("both")).unwrap_err();
        assert!(!err.message().contains('\n'), "{}", err.message());
    }

    #[test]
    fn hello_without_a_mode_is_invalid() {
        let err = check_hello(
            &hello(PROTOCOL_VERSION, pb::AgentMode::Unspecified),
            &identity("both"),
        )
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn hello_in_a_mode_the_rule_forbids_is_permission_denied() {
        let err = check_hello(
            &hello(PROTOCOL_VERSION, pb::AgentMode::Autonomous),
            &identity("managed"),
        )
        .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert_eq!(
            check_hello(
                &hello(PROTOCOL_VERSION, pb::AgentMode::Managed),
                &identity("managed")
            )
            .unwrap(),
            AgentMode::Managed
        );
    }
}
