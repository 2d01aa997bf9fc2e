//! One agent session: the handshake (hello / welcome), the resync, then inbound events
//! processed in order and outbound events drained from the agent's queue.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use argocd_agent_identity::authz::{self, Action, ObjectRef};
use argocd_agent_identity::mapping::AgentIdentity;
use argocd_agent_identity::names::AgentMode;
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::eventstream::{self as pb, Welcome};
use argocd_agent_sync::event::{PROTOCOL_MIN, PROTOCOL_VERSION};
use argocd_agent_sync::{Event, EventType, Payload};
use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use tracing::Instrument;

use crate::hub::{AGENT_NAME_LABEL, AgentState, Hub, lock};
use crate::metrics::EventLabels;

static SESSION_IDS: AtomicU64 = AtomicU64::new(1);

/// How long an agent may take to send its hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(15);

/// Capabilities this principal offers.
pub const CAPABILITIES: &[&str] = &["resync.v1", "operations.v1"];

/// Starts a session for an authenticated identity. Returns the outbound stream.
pub fn start(
    hub: Arc<Hub>,
    identity: AgentIdentity,
    inbound: impl Stream<Item = Result<CloudEvent, Status>> + Send + Unpin + 'static,
    idle_timeout: Duration,
) -> mpsc::Receiver<Result<CloudEvent, Status>> {
    let (tx, rx) = mpsc::channel(64);
    let span =
        tracing::info_span!("session", agent = %identity.agent, spiffe_id = %identity.spiffe_id);
    tokio::spawn(
        async move {
            if let Err(status) = run(hub, identity, inbound, tx.clone(), idle_timeout).await {
                tracing::warn!(code = ?status.code(), message = status.message(), "session ended with error");
                let _ = tx.send(Err(status)).await;
            }
        }
        .instrument(span),
    );
    rx
}

fn mode_from_wire(m: i32) -> Option<AgentMode> {
    match pb::AgentMode::try_from(m).ok()? {
        pb::AgentMode::Managed => Some(AgentMode::Managed),
        pb::AgentMode::Autonomous => Some(AgentMode::Autonomous),
        pb::AgentMode::Unspecified => None,
    }
}

async fn run(
    hub: Arc<Hub>,
    identity: AgentIdentity,
    mut inbound: impl Stream<Item = Result<CloudEvent, Status>> + Send + Unpin + 'static,
    tx: mpsc::Sender<Result<CloudEvent, Status>>,
    idle_timeout: Duration,
) -> Result<(), Status> {
    let agent = identity.agent.as_str().to_owned();
    // 1. Hello.
    let first = tokio::time::timeout(HELLO_TIMEOUT, inbound.next())
        .await
        .map_err(|_| Status::deadline_exceeded("no hello received"))?
        .ok_or_else(|| Status::cancelled("stream closed before hello"))??;
    let hello_event = Event::from_cloud_event(first).map_err(|e| {
        hub.metrics.refused(&agent, "Malformed");
        Status::invalid_argument(format!("invalid hello: {e}"))
    })?;
    let Payload::Hello(hello) = &hello_event.payload else {
        return Err(Status::failed_precondition(
            "the first event must be a hello",
        ));
    };
    if hello.protocol_version < PROTOCOL_MIN || hello.protocol_version > PROTOCOL_VERSION {
        return Err(Status::failed_precondition(format!(
            "agent speaks protocol {}, this principal accepts {PROTOCOL_MIN}..={PROTOCOL_VERSION} (agent version {}, principal version {})",
            hello.protocol_version,
            hello.version,
            env!("CARGO_PKG_VERSION")
        )));
    }
    let mode = mode_from_wire(hello.mode)
        .ok_or_else(|| Status::invalid_argument("hello does not state a valid agent mode"))?;
    if let Err(denied) = identity.check_mode(mode) {
        hub.metrics.auth_failed("ModeNotAllowed");
        tracing::warn!(agent = %agent, %mode, reason = %denied, "agent mode refused");
        return Err(Status::permission_denied(denied.to_string()));
    }
    let state_in = hello.state.clone().unwrap_or_default();
    let agent_checksums = argocd_agent_sync::resync::from_state("Application", &state_in);
    tracing::info!(%mode, agent_version = %hello.version, "agent connected");

    // 2. Register (replacing any previous session) and welcome.
    let session_id = SESSION_IDS.fetch_add(1, Ordering::Relaxed);
    let token = CancellationToken::new();
    let state = hub.attach(identity.clone(), mode, session_id, token.clone());
    let ns = state.namespace();
    hub.ensure_namespace(&ns, &agent).await;
    hub.metrics.connected_agents.inc();
    let _guard = SessionGuard {
        hub: hub.clone(),
        state: state.clone(),
        session_id,
    };

    let welcome = Event::new(
        &hub.source,
        EventType::Welcome,
        Payload::Welcome(Welcome {
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            agent_name: agent.clone(),
            namespace: ns.clone(),
            capabilities: hello
                .capabilities
                .iter()
                .filter(|c| CAPABILITIES.contains(&c.as_str()))
                .cloned()
                .collect(),
            max_in_flight: hub.queue_limits.max_in_flight as u32,
        }),
    );
    send(&tx, &hub, &agent, welcome).await?;

    // 3. Resync.
    hub.cache.wait_synced().await;
    state.queue.requeue_in_flight();
    match mode {
        AgentMode::Managed => hub.resync_managed(&state, &agent_checksums),
        AgentMode::Autonomous => {
            for e in hub.resync_autonomous(&state, &agent_checksums).await {
                send(&tx, &hub, &agent, e).await?;
            }
        }
    }

    // 4. Exchange events.
    let mut last_seen = tokio::time::Instant::now();
    let mut idle_check = tokio::time::interval(idle_timeout / 3);
    loop {
        tokio::select! {
            _ = token.cancelled() => {
                return Err(Status::aborted("session closed by the principal (replaced by a newer session, or identity revoked)"));
            }
            _ = tx.closed() => return Ok(()),
            event = state.queue.next() => {
                send(&tx, &hub, &agent, event).await?;
            }
            msg = inbound.next() => {
                let Some(msg) = msg else { return Ok(()) };
                let ce = msg?;
                last_seen = tokio::time::Instant::now();
                handle_inbound(&hub, &state, &identity, mode, ce, &tx).await?;
            }
            _ = idle_check.tick() => {
                if last_seen.elapsed() > idle_timeout {
                    return Err(Status::deadline_exceeded("agent silent for too long"));
                }
            }
        }
    }
}

struct SessionGuard {
    hub: Arc<Hub>,
    state: Arc<AgentState>,
    session_id: u64,
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        self.hub.detach(&self.state, self.session_id);
        self.hub.metrics.connected_agents.dec();
        tracing::info!("agent disconnected");
    }
}

async fn send(
    tx: &mpsc::Sender<Result<CloudEvent, Status>>,
    hub: &Hub,
    agent: &str,
    event: Event,
) -> Result<(), Status> {
    hub.metrics
        .events_sent
        .get_or_create(&EventLabels {
            agent: agent.into(),
            r#type: event.ty.verb().into(),
        })
        .inc();
    tx.send(Ok(event.to_cloud_event()))
        .await
        .map_err(|_| Status::cancelled("agent stream closed"))
}

fn action_of(ty: EventType) -> Option<Action> {
    Some(match ty {
        EventType::Create => Action::Create,
        EventType::SpecUpdate => Action::UpdateSpec,
        EventType::StatusUpdate => Action::UpdateStatus,
        EventType::Delete => Action::Delete,
        EventType::SetOperation => Action::SetOperation,
        EventType::TerminateOperation => Action::TerminateOperation,
        EventType::RequestUpdate => Action::Read,
        _ => return None,
    })
}

async fn handle_inbound(
    hub: &Hub,
    state: &AgentState,
    identity: &AgentIdentity,
    mode: AgentMode,
    ce: CloudEvent,
    tx: &mpsc::Sender<Result<CloudEvent, Status>>,
) -> Result<(), Status> {
    let agent = identity.agent.as_str();
    let event = match Event::from_cloud_event(ce) {
        Ok(e) => e,
        Err(e) => {
            hub.metrics.refused(agent, "Malformed");
            tracing::warn!(error = %e, "malformed event refused");
            let reply = Event::new(
                &hub.source,
                EventType::Error,
                Payload::Error(pb::ErrorDetail {
                    reason: "Malformed".into(),
                    message: e.to_string(),
                    event_id: String::new(),
                }),
            );
            return send(tx, hub, agent, reply).await;
        }
    };
    hub.metrics
        .events_received
        .get_or_create(&EventLabels {
            agent: agent.into(),
            r#type: event.ty.verb().into(),
        })
        .inc();
    let span = tracing::debug_span!("event", id = %event.id, r#type = %event.ty);
    let _enter = span.enter();

    match event.ty {
        EventType::Ping => {
            return send(
                tx,
                hub,
                agent,
                Event::new(&hub.source, EventType::Pong, Payload::None),
            )
            .await;
        }
        EventType::Pong => return Ok(()),
        EventType::Processed => {
            if let Some(id) = &event.ack_id
                && let Some((key, ty)) = state.queue.ack(id)
            {
                hub.on_ack(state, key, ty).await;
            }
            return Ok(());
        }
        EventType::Error => {
            if let Payload::Error(d) = &event.payload {
                tracing::warn!(reason = %d.reason, message = %d.message, event_id = %d.event_id, "agent reported an error");
            }
            return Ok(());
        }
        _ => {}
    }

    let (Some(action), Some(resource)) = (action_of(event.ty), event.resource.clone()) else {
        hub.metrics.refused(agent, "UnexpectedEvent");
        let reply = event.error_reply(
            &hub.source,
            "BadRequest",
            format!("{} events are not accepted from agents", event.ty),
        );
        return send(tx, hub, agent, reply).await;
    };
    // The owner of a hub object is recorded in its agent-name label, when present.
    let owner = hub
        .cache
        .get(Some(&resource.namespace), &resource.name)
        .and_then(|o| {
            o.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(AGENT_NAME_LABEL).cloned())
        });
    let object = ObjectRef {
        kind: resource.kind.as_str(),
        namespace: &resource.namespace,
        name: &resource.name,
        owner: owner.as_deref(),
    };
    if let Err(denied) = authz::authorize(identity, mode, action, &object) {
        hub.metrics.refused(agent, denied.reason_code());
        tracing::warn!(agent, object = %resource, reason = %denied, "event refused");
        let reply = event.error_reply(&hub.source, "Forbidden", denied.to_string());
        return send(tx, hub, agent, reply).await;
    }
    // An object payload must name the same object as the attributes.
    if let Some(obj) = event.object() {
        let name = obj.pointer("/metadata/name").and_then(|v| v.as_str());
        if name.is_some_and(|n| n != resource.name) {
            hub.metrics.refused(agent, "Invalid");
            let reply = event.error_reply(
                &hub.source,
                "Invalid",
                format!(
                    "payload names {:?}, event names {resource}",
                    name.unwrap_or_default()
                ),
            );
            return send(tx, hub, agent, reply).await;
        }
    }

    let result: Result<(), String> = match event.ty {
        EventType::StatusUpdate => {
            let status = event
                .object()
                .and_then(|o| o.get("status").cloned())
                .unwrap_or_default();
            if hub
                .cache
                .get(Some(&resource.namespace), &resource.name)
                .is_none()
            {
                Err(format!("{resource} does not exist on the hub"))
            } else {
                hub.write_status(&resource.namespace, &resource.name, status)
                    .await
            }
        }
        EventType::Create | EventType::SpecUpdate => {
            let obj = event.object().cloned().unwrap_or_default();
            // Recorded before the write, so the hub watch does not take our own write for a
            // hub edit to revert; restored if the write fails.
            let previous = lock(&state.desired).insert(resource.name.clone(), obj.clone());
            let result = hub
                .upsert_from_agent(&resource.namespace, agent, &obj)
                .await;
            if result.is_err() {
                let mut desired = lock(&state.desired);
                match previous {
                    Some(p) => desired.insert(resource.name.clone(), p),
                    None => desired.remove(&resource.name),
                };
            }
            result
        }
        EventType::Delete => {
            hub.delete_from_agent(state, &resource.name).await;
            Ok(())
        }
        EventType::RequestUpdate => {
            // A managed agent asks for one application again.
            hub.send_current(state, resource.clone());
            return Ok(());
        }
        _ => Ok(()),
    };
    match result {
        Ok(()) => send(tx, hub, agent, event.ack(&hub.source)).await,
        Err(message) => {
            tracing::warn!(object = %resource, error = %message, "could not apply event");
            let reply = event.error_reply(&hub.source, "ApplyFailed", message);
            send(tx, hub, agent, reply).await
        }
    }
}
