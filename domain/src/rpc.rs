//! Requests to the peer that expect answers outside the per-resource queue (the Redis
//! proxy's reads and subscriptions, the resource proxy's requests, logs and exec), and the
//! principal's [`AgentLink`] that sends them on one agent's session: answers are correlated by the
//! request's event id, bounded in number, time-limited, and fail at once when the session
//! ends.
//!
//! One [`Pending`] belongs to one session. Dropping the session's `Pending` (or calling
//! [`Pending::close`]) ends every waiting request with [`RpcError::Disconnected`], so a
//! caller never waits for an answer that can no longer come.

use argocd_agent_identity::text;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::Event;
use crate::sync::lock;

/// Why a request got no answer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum RpcError {
    /// The session already has its limit of requests waiting; this one was not sent.
    #[error("too many requests in flight to the peer (limit {limit})")]
    TooMany {
        /// Requests that may wait at once.
        limit: usize,
    },
    /// No answer came within this time.
    #[error("the peer did not answer within {q0}", q0 = text::duration(*.0))]
    Timeout(Duration),
    /// The session ended (or was closed) before an answer came.
    #[error("the peer disconnected before answering")]
    Disconnected,
}

/// One waiting request: where its answers go, and whether it is a stream (many answers).
struct Waiter<T> {
    tx: mpsc::Sender<T>,
    stream: bool,
}

/// Requests waiting for answers of type `T`, by request id; `None` once closed.
type Waiting<T> = Option<HashMap<String, Waiter<T>>>;

/// Requests waiting for answers of type `T`, by request id.
pub struct Pending<T> {
    waiting: Mutex<Waiting<T>>,
    limit: usize,
}

/// What happened to an answer handed to [`Pending::deliver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Handed to the waiting request.
    Delivered,
    /// No request with that id is waiting (answered already, timed out, or never sent):
    /// the answer is dropped.
    Unknown,
    /// The waiting stream is full; this answer is dropped.
    Full,
}

impl<T> Pending<T> {
    /// At most `limit` requests wait at once.
    pub fn new(limit: usize) -> Arc<Pending<T>> {
        Arc::new(Pending {
            waiting: Mutex::new(Some(HashMap::new())),
            limit,
        })
    }

    /// Registers request `id`; its answer arrives on the ticket. `stream`: `Some(buffer)`
    /// for a request with many answers (up to `buffer` unread), `None` for one answer.
    /// Dropping the ticket forgets the request.
    pub fn register(
        self: &Arc<Self>,
        id: &str,
        stream: Option<usize>,
    ) -> Result<Ticket<T>, RpcError> {
        let mut guard = lock(&self.waiting);
        let Some(waiting) = guard.as_mut() else {
            return Err(RpcError::Disconnected);
        };
        if waiting.len() >= self.limit {
            return Err(RpcError::TooMany { limit: self.limit });
        }
        let (tx, rx) = mpsc::channel(stream.unwrap_or(1).max(1));
        waiting.insert(
            id.to_owned(),
            Waiter {
                tx,
                stream: stream.is_some(),
            },
        );
        Ok(Ticket {
            id: id.to_owned(),
            pending: self.clone(),
            rx,
        })
    }

    /// Hands an answer to request `id`. A single-answer request is finished by it; a stream
    /// only when `last`.
    pub fn deliver(&self, id: &str, answer: T, last: bool) -> Delivery {
        let mut guard = lock(&self.waiting);
        let Some(waiting) = guard.as_mut() else {
            return Delivery::Unknown;
        };
        let Some(Waiter { tx, stream }) = waiting.get(id) else {
            return Delivery::Unknown;
        };
        let last = last || !stream;
        let result = match tx.try_send(answer) {
            Ok(()) => Delivery::Delivered,
            Err(mpsc::error::TrySendError::Full(_)) => Delivery::Full,
            Err(mpsc::error::TrySendError::Closed(_)) => Delivery::Unknown,
        };
        if last || result == Delivery::Unknown {
            waiting.remove(id);
        }
        result
    }

    /// Whether request `id` is waiting.
    pub fn contains(&self, id: &str) -> bool {
        lock(&self.waiting)
            .as_ref()
            .is_some_and(|w| w.contains_key(id))
    }

    /// Requests waiting now.
    pub fn len(&self) -> usize {
        lock(&self.waiting).as_ref().map_or(0, HashMap::len)
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ends every waiting request with [`RpcError::Disconnected`] and refuses new ones.
    pub fn close(&self) {
        lock(&self.waiting).take();
    }

    fn forget(&self, id: &str) {
        if let Some(w) = lock(&self.waiting).as_mut() {
            w.remove(id);
        }
    }
}

/// A registered request: its answers, until dropped.
pub struct Ticket<T> {
    id: String,
    pending: Arc<Pending<T>>,
    rx: mpsc::Receiver<T>,
}

impl<T> Ticket<T> {
    /// The request id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The next answer, waiting at most `timeout`.
    pub async fn answer(&mut self, timeout: Duration) -> Result<T, RpcError> {
        match tokio::time::timeout(timeout, self.rx.recv()).await {
            Ok(Some(a)) => Ok(a),
            Ok(None) => Err(RpcError::Disconnected),
            Err(_) => Err(RpcError::Timeout(timeout)),
        }
    }

    /// The next answer of a stream; `None` once the session ended or the stream finished.
    pub async fn next(&mut self) -> Option<T> {
        self.rx.recv().await
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        self.pending.forget(&self.id);
    }
}

/// How long queueing a request for the session's writer may take before it counts as a
/// stalled session.
const ENQUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// The request side of one agent session: requests to the agent that expect an answer (the
/// Redis proxy, the resource proxy and its logs and exec). They go out beside the
/// per-resource queue, not through it: an answer is not a resource state, is never coalesced
/// or resent, and is useless once its session is gone. When the session ends every waiting
/// request fails at once.
pub struct AgentLink {
    /// The session the link belongs to (a newer session of the agent has its own).
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
        self.pending.deliver(&id, event, last) != Delivery::Unknown
    }

    /// Fails every waiting request (the session ended).
    pub fn close(&self) {
        self.pending.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn answer_reaches_the_request_with_its_id() {
        let p = Pending::new(4);
        let mut a = p.register("a", None).unwrap();
        let mut b = p.register("b", None).unwrap();
        assert_eq!(p.deliver("b", 2, false), Delivery::Delivered);
        assert_eq!(p.deliver("a", 1, false), Delivery::Delivered);
        assert_eq!(a.answer(T).await, Ok(1));
        assert_eq!(b.answer(T).await, Ok(2));
        assert!(p.is_empty(), "unary requests are forgotten once answered");
        assert_eq!(p.deliver("a", 3, true), Delivery::Unknown);
    }

    #[tokio::test]
    async fn close_fails_waiting_requests_at_once_and_refuses_new_ones() {
        let p: Arc<Pending<u8>> = Pending::new(4);
        let mut a = p.register("a", None).unwrap();
        p.close();
        assert_eq!(a.answer(T).await, Err(RpcError::Disconnected));
        assert!(matches!(p.register("b", None), Err(RpcError::Disconnected)));
    }

    #[tokio::test]
    async fn limit_and_timeout_are_enforced_and_dropped_tickets_free_their_slot() {
        let p: Arc<Pending<u8>> = Pending::new(1);
        let mut a = p.register("a", None).unwrap();
        assert_eq!(
            p.register("b", None).err(),
            Some(RpcError::TooMany { limit: 1 })
        );
        assert!(matches!(
            a.answer(Duration::from_millis(10)).await,
            Err(RpcError::Timeout(_))
        ));
        drop(a);
        assert!(p.register("b", None).is_ok());
    }

    #[tokio::test]
    async fn stream_answers_arrive_in_order_and_overflow_is_dropped() {
        let p = Pending::new(1);
        let mut s = p.register("s", Some(2)).unwrap();
        assert_eq!(p.deliver("s", 1, false), Delivery::Delivered);
        assert_eq!(p.deliver("s", 2, false), Delivery::Delivered);
        assert_eq!(p.deliver("s", 3, false), Delivery::Full);
        assert_eq!(s.next().await, Some(1));
        assert_eq!(s.next().await, Some(2));
        assert_eq!(p.deliver("s", 4, true), Delivery::Delivered);
        assert_eq!(s.next().await, Some(4));
        assert_eq!(s.next().await, None, "the last answer ends the stream");
    }
}
