//! Heap bytes one agent Lease costs in a Lease watch cache (a principal with `--ha` keeps
//! one per agent), counted by a counting allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use argocd_agent_kubernetes::{Feed, Kind};
use kube::api::DynamicObject;
use serde_json::json;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Agent `i`'s Lease as the API server sends it, `managedFields` included.
fn agent_lease(i: usize) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": format!("argocd-agent-session-agent-{i:05}"),
            "namespace": "argocd",
            "uid": "5f0c8e8e-2a4b-4a59-9f43-2d7c8f1b0a11",
            "resourceVersion": format!("{}", 1000 + i),
            "creationTimestamp": "2026-11-28T10:00:00Z",
            "labels": {
                "argocd-agent.argoproj-labs.io/lease": "agent",
                "argocd-agent.argoproj-labs.io/agent-name": format!("agent-{i:05}")
            },
            "annotations": {
                "argocd-agent.argoproj-labs.io/hub-namespace": format!("agent-{i:05}")
            },
            "managedFields": [{
                "manager": "argocd-agent", "operation": "Update", "apiVersion": "coordination.k8s.io/v1",
                "time": "2026-11-28T10:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:argocd-agent.argoproj-labs.io/lease": {}}},
                             "f:spec": {"f:holderIdentity": {}, "f:renewTime": {}}}
            }]
        },
        "spec": {
            "holderIdentity": "principal-0_9f8e7d6c",
            "acquireTime": "2026-11-28T10:00:00.123456Z",
            "renewTime": "2026-11-28T10:05:00.654321Z",
            "leaseDurationSeconds": 900,
            "leaseTransitions": 0
        }
    }))
    .unwrap()
}

#[test]
fn an_agent_lease_in_the_cache_costs_few_heap_bytes() {
    const N: usize = 2_000;
    let feed = Feed::new(Kind::Lease);
    let before = LIVE.load(Ordering::Relaxed);
    for i in 0..N {
        // Decoded as a watch would, handed in, the change dropped: what stays is the cache's.
        drop(feed.applied(agent_lease(i)));
    }
    let after = LIVE.load(Ordering::Relaxed);
    let per_lease = (after - before) as f64 / N as f64;
    println!("heap bytes per cached agent Lease: {per_lease:.0}");
    assert!(per_lease < 1_000.0, "{per_lease:.0} bytes per cached Lease");
}
