//! What the spoke last reported to the principal, so unchanged objects are not sent
//! again: each Application's status checksum (managed copies' statuses, by key) and each
//! autonomous Application's published object checksum (by hub name). Written by the
//! reports and their resets (`resync.rs`, also `events.rs` and `local.rs` when a copy or
//! an Application goes); a leaf, behind its own lock. Both maps are cleared together at
//! each welcome.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::managed::lock;

#[derive(Default)]
struct Sent {
    /// Last status checksum reported, by key.
    status: HashMap<String, String>,
    /// Autonomous: checksum of the last object published, by hub name.
    object: HashMap<String, String>,
}

/// What was last reported to the principal.
#[derive(Default)]
pub(super) struct SentLedger(Mutex<Sent>);

impl SentLedger {
    /// A new session: everything is reported again.
    pub(super) fn forget_all(&self) {
        let mut s = lock(&self.0);
        s.status.clear();
        s.object.clear();
    }

    /// Records status checksum `sum` of `key` as reported; returns whether it changed
    /// (whether the status is to go out).
    pub(super) fn record_status(&self, key: String, sum: String) -> bool {
        lock(&self.0).status.insert(key, sum.clone()) != Some(sum)
    }

    /// The status checksum last reported for `key`.
    pub(super) fn status(&self, key: &str) -> Option<String> {
        lock(&self.0).status.get(key).cloned()
    }

    /// Forgets the status last reported for `key`, so the next report goes out.
    pub(super) fn forget_status(&self, key: &str) {
        lock(&self.0).status.remove(key);
    }

    /// Records object checksum `sum` as published under `hub`; returns whether it changed
    /// (whether the object is to go out).
    pub(super) fn record_object(&self, hub: String, sum: String) -> bool {
        lock(&self.0).object.insert(hub, sum.clone()) != Some(sum)
    }

    /// Whether an object was published under `hub`.
    pub(super) fn has_object(&self, hub: &str) -> bool {
        lock(&self.0).object.contains_key(hub)
    }

    /// Forgets what was published under `hub`, so the next publish goes out.
    pub(super) fn forget_object(&self, hub: &str) {
        lock(&self.0).object.remove(hub);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_goes_out_once_per_checksum_until_forgotten() {
        let l = SentLedger::default();
        assert!(l.record_status("a".into(), "1".into()));
        assert!(!l.record_status("a".into(), "1".into()));
        assert_eq!(l.status("a").as_deref(), Some("1"));
        assert!(l.record_status("a".into(), "2".into()));
        l.forget_status("a");
        assert!(l.status("a").is_none());
        assert!(l.record_status("a".into(), "2".into()));
        assert!(l.record_object("h".into(), "1".into()));
        assert!(!l.record_object("h".into(), "1".into()));
        assert!(l.has_object("h"));
        l.forget_object("h");
        assert!(!l.has_object("h"));
    }

    #[test]
    fn a_new_session_forgets_statuses_and_objects_together() {
        let l = SentLedger::default();
        l.record_status("a".into(), "1".into());
        l.record_object("h".into(), "1".into());
        l.forget_all();
        assert!(l.status("a").is_none() && !l.has_object("h"));
    }
}
