//! What the spoke knows of its session with the principal: the hub namespace the welcome
//! assigned, what the hello said (kept until its welcome), and where answers that come
//! later than their event go. Written by the handshake (`resync.rs`: the hello and the
//! welcome) and the connection (`Spoke::set_late_replies`); a leaf, behind its own lock.

use std::sync::Mutex;

use argocd_agent_domain::resync::Checksums;
use argocd_agent_domain::{Event, Namespace};
use argocd_agent_proto::eventstream::ResourceChecksum;
use tokio::sync::mpsc::Sender;

use crate::managed::lock;

/// What a hello reported, kept until its welcome.
pub(super) struct HelloState {
    /// Applications: spec checksums.
    pub(super) apps: Checksums,
    /// Autonomous Applications: status checksums (empty in managed mode).
    pub(super) statuses: Checksums,
    /// Configuration objects.
    pub(super) config: Vec<ResourceChecksum>,
}

#[derive(Default)]
struct Session {
    hub_namespace: Option<Namespace>,
    hello: Option<HelloState>,
    late_replies: Option<Sender<Event>>,
}

/// The session-scoped state of the spoke.
#[derive(Default)]
pub(super) struct SessionState(Mutex<Session>);

/// Why an event could not be sent beside the queue.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum NotSent {
    /// No session (between sessions).
    NoSession,
    /// The session's channel is full or closed.
    Full,
}

impl SessionState {
    /// The hub namespace the principal assigned (after the first welcome).
    pub(super) fn hub_namespace(&self) -> Option<Namespace> {
        lock(&self.0).hub_namespace.clone()
    }

    /// Remembers what the hello said, until its welcome.
    pub(super) fn said_hello(&self, said: HelloState) {
        lock(&self.0).hello = Some(said);
    }

    /// A welcome arrived: its hub namespace is the one from now on; returns what the hello
    /// said (taken once).
    pub(super) fn welcomed(&self, hub_namespace: Namespace) -> Option<HelloState> {
        let mut s = lock(&self.0);
        s.hub_namespace = Some(hub_namespace);
        s.hello.take()
    }

    /// Installs (or, with `None`, removes) the current session's channel for answers that
    /// come later than their event.
    pub(super) fn set_late_replies(&self, tx: Option<Sender<Event>>) {
        lock(&self.0).late_replies = tx;
    }

    /// Sends `event` on the current session's late-answer channel, without waiting.
    pub(super) fn send_late(&self, event: Event) -> Result<(), NotSent> {
        let s = lock(&self.0);
        let tx = s.late_replies.as_ref().ok_or(NotSent::NoSession)?;
        tx.try_send(event).map_err(|_| NotSent::Full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{EventType, Payload};

    fn hello() -> HelloState {
        HelloState {
            apps: Checksums::new(),
            statuses: Checksums::new(),
            config: Vec::new(),
        }
    }

    #[test]
    fn the_hello_is_taken_once_by_its_welcome_which_sets_the_hub_namespace() {
        let s = SessionState::default();
        assert!(s.hub_namespace().is_none());
        s.said_hello(hello());
        let ns = Namespace::new("agent-a").unwrap();
        assert!(s.welcomed(ns.clone()).is_some());
        assert_eq!(s.hub_namespace(), Some(ns.clone()));
        assert!(s.welcomed(ns).is_none());
    }

    #[test]
    fn late_answers_go_to_the_current_session_only() {
        let s = SessionState::default();
        let event = || Event::new("agent", EventType::Processed, Payload::None);
        assert_eq!(s.send_late(event()), Err(NotSent::NoSession));
        let (tx, mut rx) = tokio::sync::mpsc::channel(1);
        s.set_late_replies(Some(tx));
        assert_eq!(s.send_late(event()), Ok(()));
        assert_eq!(s.send_late(event()), Err(NotSent::Full));
        assert!(rx.try_recv().is_ok());
        s.set_late_replies(None);
        assert_eq!(s.send_late(event()), Err(NotSent::NoSession));
    }
}
