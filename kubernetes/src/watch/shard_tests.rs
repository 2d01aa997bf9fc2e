//! Compact slots and held namespaces ([`Cache::shard`], [`Cache::hold`]).

use std::sync::Arc;

use kube::api::DynamicObject;
use serde_json::json;

use super::{Change, Feed};
use crate::Kind;

fn app(namespace: &str, name: &str, version: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "resourceVersion": version,
            "labels": {"team": "a"},
            "managedFields": [{"manager": "kubectl", "operation": "Apply"}]
        },
        "spec": {"project": "default", "source": {"repoURL": "https://example.com/r.git",
            "path": "apps", "targetRevision": "HEAD"},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "x"}},
        "status": {"sync": {"status": "Synced"}}
    }))
    .unwrap()
}

/// A sharded Application feed with `a/one`, `a/two` and `b/one`.
fn sharded() -> Feed {
    let feed = Feed::new(Kind::Application);
    feed.cache().shard();
    for (ns, name) in [("a", "one"), ("a", "two"), ("b", "one")] {
        assert!(feed.applied(app(ns, name, "1")).is_some());
    }
    feed.synced();
    feed
}

fn without_managed_fields(mut obj: DynamicObject) -> DynamicObject {
    obj.metadata.managed_fields = None;
    obj
}

#[test]
fn compact_objects_read_back_equal() {
    let feed = sharded();
    let cache = feed.cache();
    assert_eq!(cache.forms(), (0, 3));
    let got = cache.get(Some("a"), "one").unwrap();
    assert_eq!(*got, without_managed_fields(app("a", "one", "1")));
    let listed: Vec<DynamicObject> = cache.list().iter().map(|o| (**o).clone()).collect();
    let want: Vec<DynamicObject> = [("a", "one"), ("a", "two"), ("b", "one")]
        .iter()
        .map(|(ns, n)| without_managed_fields(app(ns, n, "1")))
        .collect();
    assert_eq!(listed, want);
    assert_eq!(cache.list_namespace("a").len(), 2);
    assert_eq!(*cache.list_namespace("b")[0], want[2]);
}

#[test]
fn the_same_version_of_a_compact_object_is_no_change() {
    let feed = sharded();
    assert!(feed.applied(app("a", "one", "1")).is_none());
    assert!(matches!(
        feed.applied(app("a", "one", "2")),
        Some(Change::Applied(_))
    ));
    assert_eq!(
        feed.cache()
            .get(Some("a"), "one")
            .unwrap()
            .metadata
            .resource_version
            .as_deref(),
        Some("2")
    );
    assert_eq!(feed.cache().forms(), (0, 3));
}

#[test]
fn a_held_namespace_is_decoded_and_its_memos_work() {
    let feed = sharded();
    let cache = feed.cache();
    cache.hold("a");
    assert_eq!(cache.forms(), (2, 1));
    let first = cache.get(Some("a"), "one").unwrap();
    let again = cache.get(Some("a"), "one").unwrap();
    assert!(Arc::ptr_eq(&first, &again), "the held object is shared");
    let sum = cache.spec_checksum(&first);
    assert_eq!(sum, crate::object::spec_checksum(&first));
    // The memo is the entry's: the managed JSON is written once and shared.
    let one = cache.managed_json(&first);
    let two = cache.managed_json(&again);
    assert_eq!(one.to_json().as_ptr(), two.to_json().as_ptr());
    // A new version of a held namespace's object is kept decoded: the change's object is
    // the cached one.
    let Some(Change::Applied(changed)) = feed.applied(app("a", "two", "2")) else {
        panic!("a new version is a change");
    };
    assert!(Arc::ptr_eq(&changed, &cache.get(Some("a"), "two").unwrap()));
    // Another namespace's is not.
    let Some(Change::Applied(other)) = feed.applied(app("b", "one", "2")) else {
        panic!("a new version is a change");
    };
    assert!(!Arc::ptr_eq(&other, &cache.get(Some("b"), "one").unwrap()));
    assert_eq!(cache.forms(), (2, 1));
}

#[test]
fn unhold_compacts_after_the_last_holder() {
    let feed = sharded();
    let cache = feed.cache();
    cache.hold("a");
    cache.hold("a");
    cache.unhold("a");
    assert_eq!(cache.forms(), (2, 1), "one holder is left");
    cache.unhold("a");
    assert_eq!(cache.forms(), (0, 3));
    // A surplus unhold changes nothing.
    cache.unhold("a");
    cache.hold("a");
    assert_eq!(cache.forms(), (2, 1));
    assert_eq!(
        *cache.get(Some("a"), "two").unwrap(),
        without_managed_fields(app("a", "two", "1"))
    );
}

#[test]
fn a_cache_that_does_not_shard_keeps_everything_decoded() {
    let feed = Feed::new(Kind::Application);
    feed.applied(app("a", "one", "1"));
    feed.applied(app("b", "one", "1"));
    let cache = feed.cache();
    cache.hold("a");
    cache.unhold("a");
    assert_eq!(cache.forms(), (2, 0));
    // Sharding later compacts what nobody holds.
    cache.hold("b");
    cache.shard();
    assert_eq!(cache.forms(), (1, 1));
}

#[test]
fn leases_are_never_compacted() {
    let feed = Feed::new(Kind::Lease);
    feed.cache().shard();
    assert!(!feed.cache().is_sharded());
}

/// A reconciler of one all-namespace partition over `cache`.
fn reconciler(cache: &super::Cache) -> super::Reconciler {
    super::Reconciler {
        kind: Kind::Application,
        cache: cache.clone(),
        partitions: vec![super::Partition {
            namespace: None,
            listing: None,
            synced: false,
        }],
    }
}

#[test]
fn a_list_keeps_what_nobody_holds_compact_as_each_object_is_read() {
    use kube::runtime::watcher::Event;
    let cache = Feed::new(Kind::Application).cache();
    cache.shard();
    cache.hold("b");
    let mut rec = reconciler(&cache);
    assert!(rec.handle(0, Ok(Event::Init)).is_empty());
    for (ns, name) in [("a", "one"), ("a", "two"), ("b", "one")] {
        assert!(
            rec.handle(0, Ok(Event::InitApply(app(ns, name, "1"))))
                .is_empty()
        );
    }
    // Before the list is done, the unheld namespace's objects are already JSON.
    let listing = rec.partitions[0].listing.as_ref().unwrap();
    let compact = |ns: &str, name: &str| {
        matches!(
            listing.get(&(ns.to_string(), name.to_string())),
            Some(super::Listed::Compact(_))
        )
    };
    assert!(compact("a", "one") && compact("a", "two"));
    assert!(!compact("b", "one"), "a held namespace is listed decoded");
    let pending = rec.handle(0, Ok(Event::InitDone));
    // The compact ones are decoded only as their changes are taken.
    let cached = pending
        .iter()
        .filter(|p| matches!(p, super::Pending::Cached(_)))
        .count();
    assert_eq!(cached, 2);
    let changes: Vec<Change> = pending
        .into_iter()
        .filter_map(|p| p.resolve(&cache))
        .collect();
    let applied: Vec<DynamicObject> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Applied(o) => Some((**o).clone()),
            _ => None,
        })
        .collect();
    let want: Vec<DynamicObject> = [("a", "one"), ("a", "two"), ("b", "one")]
        .iter()
        .map(|(ns, n)| without_managed_fields(app(ns, n, "1")))
        .collect();
    assert_eq!(applied, want);
    assert!(matches!(changes.last(), Some(Change::Synced)));
    assert_eq!(cache.forms(), (1, 2));
    // A re-list of the same versions is no change, compact or not.
    rec.handle(0, Ok(Event::Init));
    for (ns, name) in [("a", "one"), ("a", "two"), ("b", "one")] {
        rec.handle(0, Ok(Event::InitApply(app(ns, name, "1"))));
    }
    let again: Vec<Change> = rec
        .handle(0, Ok(Event::InitDone))
        .into_iter()
        .filter_map(|p| p.resolve(&cache))
        .collect();
    assert!(matches!(again.as_slice(), [Change::Synced]));
}
