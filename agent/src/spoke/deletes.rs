//! Managed: the principal's deletes of copies that finalizers hold (the spoke's Argo CD is
//! deleting their resources), by key: acknowledged only once the copy is gone, so the hub
//! Application stays "deleting" for as long as the spoke's does. Written by `events.rs`
//! (the delete waits; the copy's deletion ends the wait); a leaf, behind its own lock.

use std::collections::HashMap;
use std::sync::Mutex;

use argocd_agent_domain::Event;

use crate::managed::lock;

/// Deletes waiting for their copy to be gone.
#[derive(Default)]
pub(super) struct Deletes(Mutex<HashMap<String, Event>>);

impl Deletes {
    /// The delete `event` of copy `key` waits for the copy to be gone (a newer delete of
    /// the same copy replaces it).
    pub(super) fn wait_for(&self, key: String, event: Event) {
        lock(&self.0).insert(key, event);
    }

    /// Copy `key` is gone: the delete that waited for it, if any (taken once).
    pub(super) fn gone(&self, key: &str) -> Option<Event> {
        lock(&self.0).remove(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{EventType, Payload};

    #[test]
    fn a_waiting_delete_is_answered_once_when_its_copy_is_gone() {
        let d = Deletes::default();
        assert!(d.gone("a").is_none());
        let first = Event::new("hub", EventType::Delete, Payload::None);
        let second = Event::new("hub", EventType::Delete, Payload::None);
        d.wait_for("a".into(), first);
        d.wait_for("a".into(), second.clone());
        assert_eq!(d.gone("a").map(|e| e.id), Some(second.id));
        assert!(d.gone("a").is_none());
    }
}
