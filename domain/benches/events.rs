//! Event encoding on the stream: an Application spec-update as both sides build and read it,
//! `Event` -> CloudEvent -> protobuf bytes and back (JSON payload included). The object is a
//! realistic Argo CD Application of just under 8 KiB of JSON, half of it `status.resources`.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::{Value, json};

use argocd_agent_domain::Namespace;
use argocd_agent_domain::{Event, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_proto::cloudevents::CloudEvent;
use argocd_agent_proto::prost::Message;

/// One entry of `status.resources`: what the application controller reports per object.
fn managed_resource(i: usize) -> Value {
    let (group, kind) = match i % 5 {
        0 => ("apps", "Deployment"),
        1 => ("", "Service"),
        2 => ("", "ConfigMap"),
        3 => ("networking.k8s.io", "Ingress"),
        _ => ("autoscaling", "HorizontalPodAutoscaler"),
    };
    let version = match group {
        "autoscaling" => "v2",
        _ => "v1",
    };
    json!({
        "group": group,
        "version": version,
        "kind": kind,
        "namespace": "guestbook-prod",
        "name": format!("guestbook-{}-{i:02}", kind.to_ascii_lowercase()),
        "status": "Synced",
        "health": { "status": "Healthy" },
    })
}

/// A synced, healthy Application with automated sync and 30 managed resources.
fn application() -> Value {
    let source = json!({
        "repoURL": "https://git.example.com/platform/guestbook-deploy.git",
        "targetRevision": "release-2.14",
        "path": "overlays/prod",
        "kustomize": {
            "namePrefix": "prod-",
            "commonLabels": { "app.kubernetes.io/part-of": "guestbook" },
            "images": ["registry.example.com/guestbook/frontend:v2.14.3"],
        },
    });
    let destination = json!({
        "server": "https://kubernetes.default.svc",
        "namespace": "guestbook-prod",
    });
    let revision = "8f0c2a1d9e7b6c5a4f3e2d1c0b9a8f7e6d5c4b3a";
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": "guestbook-prod",
            "namespace": "agent-edge-7",
            "uid": "6b1f7a0e-3c2d-4e5f-8a9b-0c1d2e3f4a5b",
            "resourceVersion": "48213377",
            "generation": 412,
            "creationTimestamp": "2026-03-14T09:21:07Z",
            "labels": {
                "app.kubernetes.io/instance": "guestbook-prod",
                "team": "storefront",
                "env": "prod",
            },
            "annotations": {
                "argocd.argoproj.io/refresh": "normal",
                "notifications.argoproj.io/subscribe.on-sync-failed.slack": "storefront-alerts",
            },
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
        },
        "spec": {
            "project": "storefront",
            "source": source,
            "destination": destination,
            "syncPolicy": {
                "automated": { "prune": true, "selfHeal": true, "allowEmpty": false },
                "syncOptions": ["CreateNamespace=true", "PrunePropagationPolicy=foreground", "ServerSideApply=true"],
                "retry": {
                    "limit": 5,
                    "backoff": { "duration": "5s", "factor": 2, "maxDuration": "3m" },
                },
            },
            "revisionHistoryLimit": 10,
        },
        "status": {
            "resources": (0..30).map(managed_resource).collect::<Vec<_>>(),
            "sync": {
                "status": "Synced",
                "comparedTo": { "source": source, "destination": destination },
                "revision": revision,
            },
            "health": { "status": "Healthy", "lastTransitionTime": "2026-11-23T12:58:40Z" },
            "history": [
                {
                    "id": 57,
                    "revision": revision,
                    "deployedAt": "2026-11-23T12:58:31Z",
                    "deployStartedAt": "2026-11-23T12:58:12Z",
                    "source": source,
                },
            ],
            "reconciledAt": "2026-11-23T13:01:44Z",
            "operationState": {
                "operation": {
                    "sync": { "revision": revision, "syncOptions": ["ServerSideApply=true"] },
                    "initiatedBy": { "automated": true },
                    "retry": { "limit": 5 },
                },
                "phase": "Succeeded",
                "message": "successfully synced (all tasks run)",
                "startedAt": "2026-11-23T12:58:12Z",
                "finishedAt": "2026-11-23T12:58:31Z",
                "syncResult": { "revision": revision, "source": source },
            },
            "sourceType": "Kustomize",
            "summary": {
                "images": [
                    "registry.example.com/guestbook/frontend:v2.14.3",
                    "registry.example.com/guestbook/redis:7.2.4",
                ],
            },
            "controllerNamespace": "argocd",
        },
    })
}

fn spec_update() -> Event {
    let resource = ResourceRef::new(
        ResourceKind::Application,
        Namespace::new("agent-edge-7").unwrap(),
        "guestbook-prod",
    );
    let mut event = Event::resource(
        "principal",
        EventType::SpecUpdate,
        resource,
        Payload::Object(Arc::new(application())),
    );
    // Events carry the trace context when tracing is on; measure the fuller envelope.
    event.traceparent = Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into());
    event
}

fn events(c: &mut Criterion) {
    let event = spec_update();
    let json_len = serde_json::to_vec(event.object().unwrap().as_ref())
        .unwrap()
        .len();
    assert!(
        (4 * 1024..=8 * 1024).contains(&json_len),
        "the Application should be 4-8 KiB of JSON, is {json_len} bytes"
    );
    let bytes = event.to_cloud_event().encode_to_vec();
    let decoded = Event::from_cloud_event(CloudEvent::decode(bytes.as_slice()).unwrap()).unwrap();
    assert_eq!(decoded.object(), event.object());

    let mut g = c.benchmark_group("events");
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("encode/application", |b| {
        b.iter(|| black_box(&event).to_cloud_event().encode_to_vec())
    });
    g.bench_function("decode/application", |b| {
        b.iter(|| {
            let ce = CloudEvent::decode(black_box(bytes.as_slice())).unwrap();
            Event::from_cloud_event(ce).unwrap()
        })
    });
    // The JSON part alone, to see how much of the above it is.
    let object = event.object().unwrap().clone();
    let json = serde_json::to_vec(object.as_ref()).unwrap();
    g.throughput(Throughput::Bytes(json.len() as u64));
    g.bench_function("encode/json_only", |b| {
        b.iter(|| serde_json::to_vec(black_box(object.as_ref())).unwrap())
    });
    g.bench_function("decode/json_only", |b| {
        b.iter(|| serde_json::from_slice::<Value>(black_box(json.as_slice())).unwrap())
    });
    g.finish();
}

criterion_group!(benches, events);
criterion_main!(benches);
