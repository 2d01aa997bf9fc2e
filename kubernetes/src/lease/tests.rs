use kube::api::DynamicObject;
use serde_json::json;

use super::CompactLease;

/// An agent Lease as the API server sends it (a principal's, after a renewal).
fn agent_lease() -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": "argocd-agent-session-agent-00042",
            "namespace": "argocd",
            "uid": "5f0c8e8e-2a4b-4a59-9f43-2d7c8f1b0a11",
            "resourceVersion": "1234567",
            "creationTimestamp": "2026-11-28T10:00:00Z",
            "labels": {
                "argocd-agent.argoproj-labs.io/lease": "agent",
                "argocd-agent.argoproj-labs.io/agent-name": "agent-00042",
                "shard": "a"
            },
            "annotations": {
                "argocd-agent.argoproj-labs.io/hub-namespace": "agent-00042",
                "argocd-agent.argoproj-labs.io/takeover-requested-by": "principal-1_0a1b2c3d"
            }
        },
        "spec": {
            "holderIdentity": "principal-0_9f8e7d6c",
            "acquireTime": "2026-11-28T10:00:00.123456Z",
            "renewTime": "2026-11-28T10:05:00.654321Z",
            "leaseDurationSeconds": 900,
            "leaseTransitions": 3
        }
    })
}

fn object(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

#[test]
fn a_real_lease_round_trips_exactly() {
    let obj = object(agent_lease());
    let lease = CompactLease::exact(&obj).expect("an agent Lease fits the typed fields");
    assert_eq!(lease.to_object(), obj);
    // The JSON written back is the JSON received.
    assert_eq!(
        serde_json::to_value(lease.to_object()).unwrap(),
        agent_lease()
    );
}

#[test]
fn the_fields_the_principal_reads() {
    let lease = CompactLease::exact(&object(agent_lease())).unwrap();
    assert_eq!(lease.name(), Some("argocd-agent-session-agent-00042"));
    assert_eq!(lease.namespace(), Some("argocd"));
    assert_eq!(lease.resource_version(), Some("1234567"));
    assert_eq!(
        lease.label("argocd-agent.argoproj-labs.io/lease"),
        Some("agent")
    );
    assert_eq!(
        lease.label("argocd-agent.argoproj-labs.io/agent-name"),
        Some("agent-00042")
    );
    assert_eq!(lease.label("shard"), Some("a"));
    assert_eq!(lease.label("absent"), None);
    assert_eq!(
        lease.annotation("argocd-agent.argoproj-labs.io/hub-namespace"),
        Some("agent-00042")
    );
    assert_eq!(
        lease.annotation("argocd-agent.argoproj-labs.io/takeover-requested-by"),
        Some("principal-1_0a1b2c3d")
    );
    assert_eq!(lease.holder_identity(), Some("principal-0_9f8e7d6c"));
    assert_eq!(
        lease.renew_time(),
        Some("2026-11-28T10:05:00.654321Z".parse().unwrap())
    );
    assert_eq!(
        lease.acquire_time(),
        Some("2026-11-28T10:00:00.123456Z".parse().unwrap())
    );
    assert_eq!(lease.duration_seconds(), Some(900));
    assert_eq!(lease.transitions(), Some(3));
}

#[test]
fn the_resource_version_survives_the_rebuild_for_a_write() {
    let obj = object(agent_lease());
    let rebuilt = CompactLease::exact(&obj).unwrap().to_object();
    assert_eq!(
        rebuilt.metadata.resource_version.as_deref(),
        Some("1234567")
    );
    assert_eq!(rebuilt.metadata.uid, obj.metadata.uid);
}

#[test]
fn unset_and_empty_fields_stay_as_they_were() {
    // A released Lease: no holder, no annotations, an empty label map.
    let mut v = agent_lease();
    v["spec"] = json!({"leaseDurationSeconds": 10});
    v["metadata"].as_object_mut().unwrap().remove("annotations");
    v["metadata"]["labels"] = json!({});
    let obj = object(v);
    let lease = CompactLease::exact(&obj).unwrap();
    assert_eq!(lease.holder_identity(), None);
    assert_eq!(lease.to_object(), obj);
    // An empty holder is kept as written, and so is an empty spec.
    let mut v = agent_lease();
    v["spec"] = json!({"holderIdentity": ""});
    let obj = object(v);
    assert_eq!(CompactLease::exact(&obj).unwrap().to_object(), obj);
    let mut v = agent_lease();
    v["spec"] = json!({});
    let obj = object(v);
    assert_eq!(CompactLease::exact(&obj).unwrap().to_object(), obj);
    // No spec at all, no apiVersion and kind.
    let mut v = agent_lease();
    let map = v.as_object_mut().unwrap();
    map.remove("spec");
    map.remove("apiVersion");
    map.remove("kind");
    let obj = object(v);
    let lease = CompactLease::exact(&obj).unwrap();
    assert_eq!(lease.to_object(), obj);
    assert_eq!(lease.holder_identity(), None);
}

#[test]
fn what_the_typed_fields_cannot_hold_is_not_compacted() {
    let cases = [
        ("/metadata/finalizers", json!(["x"])),
        ("/metadata/generation", json!(2)),
        (
            "/metadata/ownerReferences",
            json!([{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]),
        ),
        ("/spec/preferredHolder", json!("principal-2_00000000")),
        ("/spec/strategy", json!("OldestEmulationVersion")),
        ("/spec/somethingNew", json!(true)),
        ("/status", json!({"x": 1})),
        // A time the typed field would write differently.
        ("/spec/renewTime", json!("2026-11-28T10:05:00.6543Z")),
        ("/spec/leaseDurationSeconds", json!("ten")),
    ];
    for (pointer, value) in cases {
        let mut v = agent_lease();
        let (parent, field) = pointer.rsplit_once('/').unwrap();
        let target = if parent.is_empty() {
            &mut v
        } else {
            v.pointer_mut(parent).unwrap()
        };
        target.as_object_mut().unwrap().insert(field.into(), value);
        let Ok(obj) = serde_json::from_value::<DynamicObject>(v) else {
            continue;
        };
        assert_eq!(CompactLease::exact(&obj), None, "{pointer}");
    }
    // Another kind.
    let mut v = agent_lease();
    v["kind"] = json!("ConfigMap");
    v["apiVersion"] = json!("v1");
    assert_eq!(CompactLease::exact(&object(v)), None);
}

#[test]
fn a_malformed_spec_reads_as_unset() {
    let mut v = agent_lease();
    v["spec"]["leaseTransitions"] = json!("many");
    let lease = CompactLease::read(&object(v));
    assert_eq!(lease.holder_identity(), None);
    assert_eq!(lease.transitions(), None);
    assert_eq!(lease.resource_version(), Some("1234567"));
}

#[test]
fn a_lease_cache_keeps_leases_compact_and_gives_back_the_same_objects() {
    use crate::{Change, Feed, Kind};
    let feed = Feed::new(Kind::Lease);
    let cache = feed.cache();
    let obj = object(agent_lease());
    let Some(Change::Applied(applied)) = feed.applied(obj.clone()) else {
        panic!("a new Lease is applied");
    };
    assert_eq!(*applied, obj);
    assert!(
        feed.applied(obj.clone()).is_none(),
        "the same resourceVersion again is not news"
    );
    let name = "argocd-agent-session-agent-00042";
    assert_eq!(*cache.get(Some("argocd"), name).unwrap(), obj);
    assert_eq!(cache.list_namespace("argocd").len(), 1);
    let lease = cache.lease(Some("argocd"), name).unwrap();
    assert_eq!(lease.holder_identity(), Some("principal-0_9f8e7d6c"));
    assert_eq!(cache.leases("argocd").len(), 1);
    assert!(cache.leases("other").is_empty());
    // A newer version replaces it; a Lease the typed fields cannot hold is kept whole.
    let mut v = agent_lease();
    v["metadata"]["resourceVersion"] = json!("1234568");
    v["metadata"]["finalizers"] = json!(["example.com/keep"]);
    let newer = object(v);
    assert!(feed.applied(newer.clone()).is_some());
    assert_eq!(*cache.get(Some("argocd"), name).unwrap(), newer);
    assert_eq!(
        cache
            .lease(Some("argocd"), name)
            .unwrap()
            .resource_version(),
        Some("1234568")
    );
    assert!(matches!(feed.deleted(newer), Some(Change::Deleted(_))));
    assert!(cache.is_empty());
}
