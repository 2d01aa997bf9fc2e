//! Requests to one connected agent that expect an answer (the Redis proxy now, the resource
//! proxy later). They go out beside the per-resource queue, not through it: an answer is not
//! a resource state, is never coalesced or resent, and is useless once its session is gone.
//! Answers are matched by request id within the session; when the session ends every
//! waiting request fails at once.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::Event;
use argocd_agent_domain::rpc::{Pending, RpcError, Ticket};
use tokio::sync::mpsc;

/// How long queueing a request for the session's writer may take before it counts as a
/// stalled session.
const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// The request side of one agent session.
pub struct AgentLink {
    /// The session the link belongs to: a link of an ended session is never used again.
    pub session_id: u64,
    /// Boxed: a channel allocates its first block of slots up front (see session.rs).
    outbound: mpsc::Sender<Box<Event>>,
    pending: Arc<Pending<Event>>,
    capabilities: Vec<String>,
}

impl AgentLink {
    /// A link for session `session_id` whose requests the session sends from `outbound`;
    /// at most `in_flight` requests wait at once.
    pub fn new(
        session_id: u64,
        outbound: mpsc::Sender<Box<Event>>,
        in_flight: usize,
        capabilities: Vec<String>,
    ) -> AgentLink {
        AgentLink {
            session_id,
            outbound,
            pending: Pending::new(in_flight),
            capabilities,
        }
    }

    /// Whether the agent agreed to `capability` in the handshake.
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.iter().any(|c| c == capability)
    }

    /// Sends `event` and returns the ticket its answers arrive on (`stream`: a request with
    /// many answers, buffering that many).
    pub async fn request(
        &self,
        event: Event,
        stream: Option<usize>,
    ) -> Result<Ticket<Event>, RpcError> {
        let ticket = self.pending.register(&event.id, stream)?;
        match tokio::time::timeout(ENQUEUE_TIMEOUT, self.outbound.send(Box::new(event))).await {
            Ok(Ok(())) => Ok(ticket),
            Ok(Err(_)) => Err(RpcError::Disconnected),
            Err(_) => Err(RpcError::Timeout(ENQUEUE_TIMEOUT)),
        }
    }

    /// Sends `event` expecting no answer; dropped when the session is gone or stalled.
    pub fn notify(&self, event: Event) {
        let _ = self.outbound.try_send(Box::new(event));
    }

    /// Hands an answer from the agent to the request it names; answers naming no waiting
    /// request of this session are dropped (returns false).
    pub fn answer(&self, event: Event, last: bool) -> bool {
        let Some(id) = event.ack_id.clone() else {
            return false;
        };
        self.pending.deliver(&id, event, last) != argocd_agent_domain::rpc::Delivery::Unknown
    }

    /// Fails every waiting request (the session ended).
    pub fn close(&self) {
        self.pending.close();
    }
}
