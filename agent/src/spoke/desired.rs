//! Managed: what the principal wants of each local copy, by key: the last object it sent
//! (what local edits and deletions are reverted to), and the hub's refresh request written
//! on a copy until the spoke's Argo CD carries it out (then the principal is told, see
//! `REFRESHED_ANNOTATION`). The two are one type: a carried-out refresh request leaves
//! both at once (the request, and its annotation on what is reverted to). Written by
//! `events.rs` (the principal's writes and deletes), `resync.rs` (a refresh carried out)
//! and the seeding after a restart (`mod.rs`); a leaf, behind its own lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_kubernetes::object::REFRESH_ANNOTATION;
use serde_json::Value;

use crate::managed::{lock, restore};

#[derive(Default)]
struct Wanted {
    /// The last object the principal sent, by key.
    objects: HashMap<String, Arc<Value>>,
    /// The refresh request written on a copy, by key, until carried out.
    refreshes: HashMap<String, String>,
}

/// What the principal wants of the managed copies.
#[derive(Default)]
pub(super) struct Desired(Mutex<Wanted>);

impl Desired {
    /// The object the principal last sent for `key`.
    pub(super) fn get(&self, key: &str) -> Option<Arc<Value>> {
        lock(&self.0).objects.get(key).cloned()
    }

    /// Whether the principal sent an object for `key`.
    pub(super) fn contains(&self, key: &str) -> bool {
        lock(&self.0).objects.contains_key(key)
    }

    /// Records `obj` as what `key` is reverted to from now on (before its write); returns
    /// what it replaces, for [`Desired::restore`].
    pub(super) fn record(&self, key: String, obj: Arc<Value>) -> Option<Arc<Value>> {
        lock(&self.0).objects.insert(key, obj)
    }

    /// Puts back what [`Desired::record`] replaced (its write failed).
    pub(super) fn restore(&self, key: String, previous: Option<Arc<Value>>) {
        restore(&mut lock(&self.0).objects, key, previous);
    }

    /// Forgets `key` (the principal deleted it): it is reverted no more.
    pub(super) fn forget(&self, key: &str) {
        lock(&self.0).objects.remove(key);
    }

    /// After a restart: the local copies are what the principal wants until it says
    /// otherwise; keys already known keep their object.
    pub(super) fn seed<T>(
        &self,
        local: impl IntoIterator<Item = (String, T)>,
        f: impl Fn(&T) -> Arc<Value>,
    ) {
        let mut w = lock(&self.0);
        for (key, obj) in local {
            w.objects.entry(key).or_insert_with(|| f(&obj));
        }
    }

    /// The hub's refresh request `value` was written on copy `key`.
    pub(super) fn note_refresh_applied(&self, key: String, value: String) {
        lock(&self.0).refreshes.insert(key, value);
    }

    /// The refresh request on copy `key` was carried out: returns its value, once, and
    /// removes it from what `key` is reverted to.
    pub(super) fn refresh_done(&self, key: &str) -> Option<String> {
        let mut w = lock(&self.0);
        let value = w.refreshes.remove(key)?;
        if let Some(d) = w.objects.get_mut(key)
            && let Some(a) = Arc::make_mut(d)
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
        {
            a.remove(REFRESH_ANNOTATION);
        }
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_failed_write_restores_what_was_reverted_to() {
        let d = Desired::default();
        let one = Arc::new(json!({"v": 1}));
        assert!(d.record("a".into(), one.clone()).is_none());
        let previous = d.record("a".into(), Arc::new(json!({"v": 2})));
        d.restore("a".into(), previous);
        assert_eq!(d.get("a"), Some(one));
        let previous = d.record("b".into(), Arc::new(json!({})));
        d.restore("b".into(), previous);
        assert!(!d.contains("b"));
        d.forget("a");
        assert!(d.get("a").is_none());
    }

    #[test]
    fn seeding_keeps_what_the_principal_sent() {
        let d = Desired::default();
        d.record("a".into(), Arc::new(json!({"v": 1})));
        d.seed([("a".to_owned(), 2), ("b".to_owned(), 3)], |v| {
            Arc::new(json!({"v": v}))
        });
        assert_eq!(d.get("a"), Some(Arc::new(json!({"v": 1}))));
        assert_eq!(d.get("b"), Some(Arc::new(json!({"v": 3}))));
    }

    #[test]
    fn a_carried_out_refresh_is_told_once_and_leaves_what_is_reverted_to() {
        let d = Desired::default();
        let obj = json!({"metadata": {"annotations": {REFRESH_ANNOTATION: "hard", "x": "y"}}});
        d.record("a".into(), Arc::new(obj));
        assert!(d.refresh_done("a").is_none());
        d.note_refresh_applied("a".into(), "hard".into());
        assert_eq!(d.refresh_done("a").as_deref(), Some("hard"));
        assert!(d.refresh_done("a").is_none());
        assert_eq!(
            d.get("a").unwrap()["metadata"]["annotations"],
            json!({"x": "y"})
        );
    }
}
