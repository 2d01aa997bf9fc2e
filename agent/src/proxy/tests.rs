//! Resource requests against a `tower_test` mock API server: what the agent sends to its
//! cluster and what it answers.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_proto::eventstream::ResourceRequest;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

/// One request as the mock server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    uri: String,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

type Routes = HashMap<(String, String), (u16, &'static str, Vec<u8>)>;

/// A mock API server answering by `(method, path?query)`; unknown routes get a 404
/// Status. Returns the proxy and the requests seen.
fn mock(
    routes: Vec<(&str, &str, u16, Value)>,
    config: ProxyConfig,
) -> (SpokeProxy, Arc<Mutex<Vec<Seen>>>) {
    let mut table: Routes = HashMap::new();
    for (m, uri, status, body) in routes {
        table.insert(
            (m.to_string(), uri.to_string()),
            (status, "application/json", body.to_string().into_bytes()),
        );
    }
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|c| c.to_bytes().to_vec())
                .unwrap_or_default();
            let uri = parts
                .uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default();
            // The tracking settings' read is the proxy's own, not part of a request.
            if uri != ARGOCD_CM {
                log.lock().unwrap().push(Seen {
                    method: parts.method.to_string(),
                    uri: uri.clone(),
                    headers: parts.headers.clone(),
                    body,
                });
            }
            let (status, ct, body) = table
                .get(&(parts.method.to_string(), uri))
                .cloned()
                .unwrap_or((
                    404,
                    "application/json",
                    rules::status_body(404, "NotFound", "not found"),
                ));
            let resp = Response::builder()
                .status(status)
                .header(http::header::CONTENT_TYPE, ct)
                .body(Body::from(body))
                .unwrap();
            send.send_response(resp);
        }
    });
    let client = kube::Client::new(svc, "default");
    (SpokeProxy::new(client, config, Metrics::new()), seen)
}

fn apps() -> Apps {
    Apps::new([("argocd", "guestbook")])
}

fn managed_meta(name: &str) -> Value {
    json!({"name": name, "namespace": "ns", "labels": {"app.kubernetes.io/instance": "guestbook"}})
}

fn req(method: &str, path: &str, query: &str, accept: &str, body: Value) -> ResourceRequest {
    ResourceRequest {
        method: method.into(),
        path: path.into(),
        query: query.into(),
        content_type: if body.is_null() {
            String::new()
        } else {
            "application/json".into()
        },
        accept: accept.into(),
        body: if body.is_null() {
            Vec::new()
        } else {
            body.to_string().into_bytes()
        },
    }
}

fn body(r: &argocd_agent_proto::eventstream::ResourceResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap()
}

fn count(p: &SpokeProxy, verb: &str, outcome: &str) -> u64 {
    p.metrics
        .resource_proxy_responses
        .get_or_create(&crate::metrics::ProxyLabels {
            verb: verb.into(),
            outcome: outcome.into(),
        })
        .get()
}

const DEPLOY: &str = "/apis/apps/v1/namespaces/ns/deployments/web";
/// The spoke Argo CD's settings (404 unless a test routes it).
const ARGOCD_CM: &str = "/api/v1/namespaces/argocd/configmaps/argocd-cm";

#[tokio::test]
async fn the_spokes_argocd_cm_decides_how_objects_are_tracked() {
    let annotated = json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "ns",
        "annotations": {"argocd.argoproj.io/tracking-id": "guestbook:apps/Deployment:ns/web"}}});
    let labelled = json!({"kind": "Deployment", "metadata": managed_meta("web")});
    let cm = |method: &str| {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "argocd-cm", "namespace": "argocd"},
            "data": {"application.resourceTrackingMethod": method}})
    };
    let get = req("GET", DEPLOY, "", "application/json", Value::Null);
    for (method, object, want) in [
        ("annotation", &annotated, 200),
        ("annotation", &labelled, 403),
        ("label", &labelled, 200),
        ("label", &annotated, 403),
    ] {
        let (p, _) = mock(
            vec![
                ("GET", ARGOCD_CM, 200, cm(method)),
                ("GET", DEPLOY, 200, object.clone()),
            ],
            ProxyConfig::default(),
        );
        let r = p.handle_resource(&apps(), &get).await;
        assert_eq!(r.status, want, "{method}: {object}");
    }
    // Without argocd-cm, either marks an object (the Argo CD version decides its default).
    for object in [&annotated, &labelled] {
        let (p, _) = mock(
            vec![("GET", DEPLOY, 200, object.clone())],
            ProxyConfig::default(),
        );
        assert_eq!(p.handle_resource(&apps(), &get).await.status, 200);
    }
}

#[tokio::test]
async fn a_managed_object_is_served() {
    let (p, seen) = mock(
        vec![(
            "GET",
            DEPLOY,
            200,
            json!({"kind": "Deployment", "metadata": managed_meta("web")}),
        )],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(
            &apps(),
            &req("GET", DEPLOY, "", "application/json", Value::Null),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(body(&r)["kind"], "Deployment");
    assert_eq!(count(&p, "get", "allowed"), 1);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    // Only Accept is forwarded (no impersonation, no authorization).
    assert_eq!(seen[0].headers.get("accept").unwrap(), "application/json");
    assert!(seen[0].headers.get("impersonate-user").is_none());
    assert!(seen[0].headers.get("authorization").is_none());
}

#[tokio::test]
async fn an_unmanaged_object_is_refused_and_a_missing_one_stays_404() {
    let (p, _) = mock(
        vec![(
            "GET",
            DEPLOY,
            200,
            json!({"kind": "Deployment", "metadata": {"name": "web", "namespace": "ns"}}),
        )],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(&apps(), &req("GET", DEPLOY, "", "", Value::Null))
        .await;
    assert_eq!(r.status, 403);
    let b = body(&r);
    assert_eq!(b["kind"], "Status");
    assert_eq!(b["reason"], "Forbidden");
    assert_eq!(b["code"], 403);
    assert_eq!(count(&p, "get", "forbidden"), 1);
    let r = p
        .handle_resource(
            &apps(),
            &req(
                "GET",
                "/apis/apps/v1/namespaces/ns/deployments/gone",
                "",
                "",
                Value::Null,
            ),
        )
        .await;
    assert_eq!(r.status, 404);
}

#[tokio::test]
async fn a_table_get_is_checked_first_then_performed() {
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let (p, seen) = mock(
        vec![(
            "GET",
            DEPLOY,
            200,
            json!({"kind": "Deployment", "metadata": managed_meta("web")}),
        )],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(&apps(), &req("GET", DEPLOY, "", table, Value::Null))
        .await;
    assert_eq!(r.status, 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].headers.get("accept").unwrap(), "application/json");
    assert_eq!(seen[1].headers.get("accept").unwrap(), table);
}

#[tokio::test]
async fn lists_and_tables_are_filtered() {
    let list = json!({"kind": "PodList", "apiVersion": "v1",
    "metadata": {"resourceVersion": "42", "continue": "next"},
    "items": [
        {"metadata": managed_meta("a")},
        {"metadata": {"name": "b", "namespace": "ns"}},
        {"metadata": {"name": "c", "namespace": "ns",
            "annotations": {"argocd.argoproj.io/tracking-id": "guestbook:/Pod:ns/c"}}},
    ]});
    let table = json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1",
    "metadata": {"resourceVersion": "42"},
    "columnDefinitions": [{"name": "Name"}],
    "rows": [
        {"cells": ["a"], "object": {"metadata": managed_meta("a")}},
        {"cells": ["b"], "object": {"metadata": {"name": "b"}}},
        {"cells": ["x"]},
    ]});
    let (p, seen) = mock(
        vec![
            ("GET", "/api/v1/namespaces/ns/pods?limit=3", 200, list),
            ("GET", "/api/v1/namespaces/ns/configmaps", 200, table),
        ],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(
            &apps(),
            &req(
                "GET",
                "/api/v1/namespaces/ns/pods",
                "limit=3",
                "application/vnd.kubernetes.protobuf,application/json",
                Value::Null,
            ),
        )
        .await;
    assert_eq!(r.status, 200);
    let b = body(&r);
    let names: Vec<&str> = b["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "c"]);
    assert_eq!(b["metadata"]["continue"], "next");
    assert_eq!(b["metadata"]["resourceVersion"], "42");
    // The list was asked for as JSON only, so it can be filtered.
    assert_eq!(
        seen.lock().unwrap()[0].headers.get("accept").unwrap(),
        "application/json"
    );

    let r = p
        .handle_resource(
            &apps(),
            &req(
                "GET",
                "/api/v1/namespaces/ns/configmaps",
                "",
                "application/json;as=Table;v=v1;g=meta.k8s.io",
                Value::Null,
            ),
        )
        .await;
    let b = body(&r);
    assert_eq!(b["rows"].as_array().unwrap().len(), 1);
    assert_eq!(b["rows"][0]["cells"][0], "a");
    assert_eq!(b["columnDefinitions"][0]["name"], "Name");
    assert_eq!(count(&p, "list", "allowed"), 2);
}

#[tokio::test]
async fn a_patch_of_an_unmanaged_object_is_refused_before_it_is_sent() {
    let (p, seen) = mock(
        vec![
            (
                "GET",
                DEPLOY,
                200,
                json!({"kind": "Deployment", "metadata": {"name": "web"}}),
            ),
            ("PATCH", DEPLOY, 200, json!({"kind": "Deployment"})),
        ],
        ProxyConfig::default(),
    );
    // A patch that would mark the object as the Application's is judged by the object as
    // it is, not as the patch would make it.
    for body in [
        json!({"spec": {"replicas": 0}}),
        json!({"metadata": {"labels": {"app.kubernetes.io/instance": "guestbook"},
            "annotations": {"argocd.argoproj.io/tracking-id": "guestbook:apps/Deployment:ns/web"}}}),
    ] {
        let mut patch = req("PATCH", DEPLOY, "", "", body);
        patch.content_type = "application/merge-patch+json".into();
        let r = p.handle_resource(&deploying_apps(), &patch).await;
        assert_eq!(r.status, 403);
    }
    assert!(seen.lock().unwrap().iter().all(|s| s.method == "GET"));
    assert_eq!(count(&p, "patch", "forbidden"), 2);
}

#[tokio::test]
async fn a_patch_of_a_managed_object_is_performed_with_its_content_type() {
    let (p, seen) = mock(
        vec![
            (
                "GET",
                DEPLOY,
                200,
                json!({"kind": "Deployment", "metadata": managed_meta("web")}),
            ),
            ("PATCH", DEPLOY, 200, json!({"kind": "Deployment"})),
        ],
        ProxyConfig::default(),
    );
    let mut patch = req(
        "PATCH",
        DEPLOY,
        "",
        "application/json",
        json!({"spec": {"replicas": 0}}),
    );
    patch.content_type = "application/merge-patch+json".into();
    let r = p.handle_resource(&apps(), &patch).await;
    assert_eq!(r.status, 200);
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen[1].method, "PATCH");
    assert_eq!(
        seen[1].headers.get("content-type").unwrap(),
        "application/merge-patch+json"
    );
}

const POD: &str = "/api/v1/namespaces/ns/pods/web-0";

/// A managed pod `web-0` at resourceVersion 7 that any PATCH of answers 200.
fn pod_mock(config: ProxyConfig) -> (SpokeProxy, Arc<Mutex<Vec<Seen>>>) {
    let mut meta = managed_meta("web-0");
    meta["resourceVersion"] = json!("7");
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"automountServiceAccountToken": false,
            "containers": [{"name": "web", "image": "nginx", "securityContext": {"runAsUser": 1000}}]}});
    mock(
        vec![("GET", POD, 200, pod.clone()), ("PATCH", POD, 200, pod)],
        config,
    )
}

fn patch_req(content_type: &str, body: Value) -> ResourceRequest {
    let mut r = req("PATCH", POD, "", "application/json", body);
    r.content_type = content_type.into();
    r
}

fn patches_sent(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<Value> {
    let seen = seen.lock().unwrap();
    let sent = seen.iter().filter(|s| s.method == "PATCH");
    sent.map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect()
}

/// A strategic merge patch is merged into the container by name, as the API server
/// merges it: the privileged result is refused, by check and field, and never sent.
#[tokio::test]
async fn a_patch_is_judged_by_the_object_it_would_make() {
    let (p, seen) = pod_mock(ProxyConfig::default());
    let smp = "application/strategic-merge-patch+json";
    let cases = [
        (
            json!({"spec": {"containers": [{"name": "web", "securityContext": {"privileged": true}}]}}),
            "pod security \"baseline\": spec.containers[0].securityContext.privileged is true (check privileged)",
        ),
        (
            json!({"spec": {"hostNetwork": true, "hostPID": true}}),
            "spec.hostNetwork is true (check hostNamespaces)",
        ),
        (
            json!({"spec": {"volumes": [{"name": "x", "secret": {"secretName": "loot"}}]}}),
            "would ask for secret loot that it does not have now",
        ),
        (
            json!({"metadata": {"labels": {"app.kubernetes.io/instance": null}}}),
            "which tracks the object for Argo CD",
        ),
        (
            json!({"spec": {"$unknownDirective": 1}}),
            "is not evaluated by the agent",
        ),
    ];
    for (body, why) in cases {
        let r = p
            .handle_resource(&apps(), &patch_req(smp, body.clone()))
            .await;
        assert_eq!(r.status, 403, "{body}");
        assert!(
            body_message(&r).contains(why),
            "{body}: {}",
            body_message(&r)
        );
    }
    let json_patch = json!([{"op": "replace", "path": "/spec/containers/0/securityContext/runAsUser", "value": 0}]);
    let r = p
        .handle_resource(
            &apps(),
            &patch_req("application/json-patch+json", json_patch),
        )
        .await;
    assert!(
        body_message(&r).contains("runAsUser 0 (root)"),
        "{}",
        body_message(&r)
    );
    let apply = patch_req("application/apply-patch+yaml", json!({"spec": {}}));
    assert_eq!(p.handle_resource(&apps(), &apply).await.status, 403);
    assert!(patches_sent(&seen).is_empty());
    assert_eq!(count(&p, "patch", "forbidden"), 7);
}

/// An allowed patch is sent as the client sent it, made conditional on the version the
/// agent judged; a patch naming another version is a conflict.
#[tokio::test]
async fn an_allowed_patch_is_pinned_to_the_version_judged() {
    let (p, seen) = pod_mock(ProxyConfig::default());
    let merge = patch_req(
        "application/merge-patch+json",
        json!({"metadata": {"labels": {"tier": "front"}}}),
    );
    assert_eq!(p.handle_resource(&apps(), &merge).await.status, 200);
    let json_patch = patch_req(
        "application/json-patch+json",
        json!([{"op": "add", "path": "/metadata/labels/tier", "value": "front"}]),
    );
    assert_eq!(p.handle_resource(&apps(), &json_patch).await.status, 200);
    assert_eq!(
        patches_sent(&seen),
        [
            json!({"metadata": {"labels": {"tier": "front"}, "resourceVersion": "7"}}),
            json!([{"op": "test", "path": "/metadata/resourceVersion", "value": "7"},
                {"op": "add", "path": "/metadata/labels/tier", "value": "front"}]),
        ]
    );
    let stale = patch_req(
        "application/merge-patch+json",
        json!({"metadata": {"resourceVersion": "3", "labels": {"tier": "x"}}}),
    );
    let r = p.handle_resource(&apps(), &stale).await;
    assert_eq!(r.status, 409);
    assert_eq!(patches_sent(&seen).len(), 2);
}

/// At `privileged` the Pod Security checks are off; the owner comparison stays.
#[tokio::test]
async fn the_privileged_level_turns_pod_security_off() {
    let config = ProxyConfig {
        pod_security: pss::Level::Privileged,
        ..ProxyConfig::default()
    };
    let (p, seen) = pod_mock(config);
    let smp = "application/strategic-merge-patch+json";
    let unconfined = json!({"metadata": {"annotations": {
        "container.apparmor.security.beta.kubernetes.io/web": "unconfined"}}});
    let ok = p
        .handle_resource(&apps(), &patch_req(smp, unconfined))
        .await;
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
    let host = json!({"spec": {"hostPID": true}});
    let r = p.handle_resource(&apps(), &patch_req(smp, host)).await;
    assert!(body_message(&r).contains("hostPID that it does not have now"));
    assert_eq!(patches_sent(&seen).len(), 1);
}

const APPS_V1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"apps/v1","resources":[
 {"name":"deployments","singularName":"deployment","namespaced":true,"kind":"Deployment","verbs":["get","list"]},
 {"name":"replicasets","singularName":"replicaset","namespaced":true,"kind":"ReplicaSet","verbs":["get","list"]}]}"#;

#[tokio::test]
async fn owners_are_followed_to_a_managed_deployment() {
    let pod = json!({"kind": "Pod", "metadata": {"name": "web-1-x", "namespace": "ns",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "rs-uid", "controller": true}]}});
    let stray = json!({"kind": "Pod", "metadata": {"name": "stray", "namespace": "ns",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other", "uid": "o-uid", "controller": true}]}});
    let rs = json!({"kind": "ReplicaSet", "metadata": {"name": "web-1", "namespace": "ns", "uid": "rs-uid",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "d-uid", "controller": true}]}});
    let other = json!({"kind": "ReplicaSet", "metadata": {"name": "other", "namespace": "ns", "uid": "o-uid"}});
    let mut deploy_meta = managed_meta("web");
    deploy_meta["uid"] = json!("d-uid");
    let deploy = json!({"kind": "Deployment", "metadata": deploy_meta});
    let (p, seen) = mock(
        vec![
            (
                "GET",
                "/apis/apps/v1",
                200,
                serde_json::from_str(APPS_V1).unwrap(),
            ),
            ("GET", "/api/v1/namespaces/ns/pods/web-1-x", 200, pod),
            ("GET", "/api/v1/namespaces/ns/pods/stray", 200, stray),
            (
                "GET",
                "/apis/apps/v1/namespaces/ns/replicasets/web-1",
                200,
                rs,
            ),
            (
                "GET",
                "/apis/apps/v1/namespaces/ns/replicasets/other",
                200,
                other,
            ),
            ("GET", DEPLOY, 200, deploy),
        ],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(
            &apps(),
            &req(
                "GET",
                "/api/v1/namespaces/ns/pods/web-1-x",
                "",
                "",
                Value::Null,
            ),
        )
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let r = p
        .handle_resource(
            &apps(),
            &req(
                "GET",
                "/api/v1/namespaces/ns/pods/stray",
                "",
                "",
                Value::Null,
            ),
        )
        .await;
    assert_eq!(r.status, 403);
    // Discovery of apps/v1 is asked once and remembered.
    let discovery = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s.uri == "/apis/apps/v1")
        .count();
    assert_eq!(discovery, 1);
}

#[tokio::test]
async fn an_owner_with_another_uid_does_not_count() {
    let pod = json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "ns",
        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": "web", "uid": "old-uid"}]}});
    let mut deploy_meta = managed_meta("web");
    deploy_meta["uid"] = json!("new-uid");
    let (p, _) = mock(
        vec![
            (
                "GET",
                "/apis/apps/v1",
                200,
                serde_json::from_str(APPS_V1).unwrap(),
            ),
            ("GET", "/api/v1/namespaces/ns/pods/p", 200, pod),
            (
                "GET",
                DEPLOY,
                200,
                json!({"kind": "Deployment", "metadata": deploy_meta}),
            ),
        ],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(
            &apps(),
            &req("GET", "/api/v1/namespaces/ns/pods/p", "", "", Value::Null),
        )
        .await;
    assert_eq!(r.status, 403);
}

const BATCH_V1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"batch/v1","resources":[
 {"name":"cronjobs","singularName":"cronjob","namespaced":true,"kind":"CronJob","verbs":["get"]},
 {"name":"jobs","singularName":"job","namespaced":true,"kind":"Job","verbs":["get","create"]}]}"#;
const CORE_V1: &str = r#"{"kind":"APIResourceList","groupVersion":"v1","resources":[
 {"name":"namespaces","singularName":"namespace","namespaced":false,"kind":"Namespace","verbs":["create","get"]},
 {"name":"pods","singularName":"pod","namespaced":true,"kind":"Pod","verbs":["create","get"]},
 {"name":"secrets","singularName":"secret","namespaced":true,"kind":"Secret","verbs":["create","get"]},
 {"name":"configmaps","singularName":"configmap","namespaced":true,"kind":"ConfigMap","verbs":["create","get"]}]}"#;
const RBAC_V1: &str = r#"{"kind":"APIResourceList","apiVersion":"v1","groupVersion":"rbac.authorization.k8s.io/v1","resources":[
 {"name":"clusterrolebindings","singularName":"clusterrolebinding","namespaced":false,"kind":"ClusterRoleBinding","verbs":["create"]},
 {"name":"rolebindings","singularName":"rolebinding","namespaced":true,"kind":"RoleBinding","verbs":["create"]}]}"#;
const CRONJOB: &str = "/apis/batch/v1/namespaces/ns/cronjobs/nightly";
const JOBS: &str = "/apis/batch/v1/namespaces/ns/jobs";

/// Application guestbook deploying to namespace `ns`, managing a CronJob there.
fn deploying_apps() -> Apps {
    Apps::from_facts([rules::AppFacts::from_application(
        "argocd",
        "guestbook",
        &json!({"spec": {"destination": {"namespace": "ns"}},
            "status": {"resources": [{"group": "batch", "kind": "CronJob", "namespace": "ns", "name": "nightly"}]}}),
    )])
}

/// A cluster with the discovery of core, batch and RBAC, the managed CronJob `nightly`
/// (uid `cj-uid`) in `ns`, a CronJob `nightly` in `kube-system` that carries the
/// Application's label without being one of its resources (uid `cj-uid` too), and a 201
/// for every create the tests may send.
fn create_mock() -> (SpokeProxy, Arc<Mutex<Vec<Seen>>>) {
    let mut cj_meta = managed_meta("nightly");
    cj_meta["uid"] = json!("cj-uid");
    let mut system_meta = cj_meta.clone();
    system_meta["namespace"] = json!("kube-system");
    let created = json!({"kind": "Status", "code": 201});
    let mut routes = vec![
        (
            "GET",
            "/api/v1",
            200,
            serde_json::from_str(CORE_V1).unwrap(),
        ),
        (
            "GET",
            "/apis/batch/v1",
            200,
            serde_json::from_str(BATCH_V1).unwrap(),
        ),
        (
            "GET",
            "/apis/rbac.authorization.k8s.io/v1",
            200,
            serde_json::from_str(RBAC_V1).unwrap(),
        ),
        (
            "GET",
            CRONJOB,
            200,
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": cj_meta,
                "spec": {"jobTemplate": {"spec": {"template": {"spec": {
                    "containers": [{"name": "run", "image": "busybox"}]}}}}}}),
        ),
        (
            "GET",
            "/apis/batch/v1/namespaces/kube-system/cronjobs/nightly",
            200,
            json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": system_meta}),
        ),
    ];
    for path in [
        JOBS,
        "/apis/batch/v1/namespaces/ns/jobs?dryRun=All",
        "/api/v1/namespaces",
        "/api/v1/namespaces/ns/pods",
        "/api/v1/namespaces/ns/secrets",
        "/api/v1/namespaces/kube-system/secrets",
        "/api/v1/namespaces/kube-system/pods",
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings",
    ] {
        routes.push(("POST", path, 201, created.clone()));
    }
    mock(routes, ProxyConfig::default())
}

fn owned_by_cronjob(uid: &str) -> Value {
    json!([{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": uid,
        "controller": true, "blockOwnerDeletion": true}])
}

fn posts(seen: &Arc<Mutex<Vec<Seen>>>) -> Vec<String> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|s| s.method == "POST")
        .map(|s| s.uri.clone())
        .collect()
}

/// Argo CD's `create-job` action on a managed CronJob: dry run, then the create.
#[tokio::test]
async fn the_create_job_action_of_a_managed_cronjob_is_performed() {
    let (p, seen) = create_mock();
    let job = json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "nightly-manual",
        "namespace": "ns", "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
        "ownerReferences": owned_by_cronjob("cj-uid")},
        "spec": {"template": {"spec": {"containers": [{"name": "run", "image": "busybox"}]}}}});
    for query in ["dryRun=All", ""] {
        let r = p
            .handle_resource(
                &deploying_apps(),
                &req("POST", JOBS, query, "", job.clone()),
            )
            .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(
        posts(&seen),
        ["/apis/batch/v1/namespaces/ns/jobs?dryRun=All", JOBS]
    );
    assert_eq!(count(&p, "create", "allowed"), 2);
}

/// The attacks of the issue, each naming the managed CronJob as owner and carrying the
/// Application's label and tracking annotation: all refused, none reaches the cluster.
#[tokio::test]
async fn creates_beyond_what_an_action_makes_are_refused() {
    let (p, seen) = create_mock();
    let meta = |name: &str, ns: &str| {
        json!({"name": name, "namespace": ns, "ownerReferences": owned_by_cronjob("cj-uid"),
            "labels": {"app.kubernetes.io/instance": "guestbook"},
            "annotations": {"argocd.argoproj.io/tracking-id": format!("guestbook:/X:{ns}/{name}")}})
    };
    let privileged = |ns: &str| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta("root", ns),
            "spec": {"hostPID": true, "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
                "containers": [{"name": "sh", "image": "busybox", "securityContext": {"privileged": true}}]}})
    };
    let cases: Vec<(&str, &str, Value)> = vec![
        (
            "/api/v1/namespaces/kube-system/secrets",
            "not a destination",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("s", "kube-system")}),
        ),
        (
            "/api/v1/namespaces/ns/secrets",
            "service-account token",
            json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/service-account-token",
                "metadata": {"name": "tok", "ownerReferences": owned_by_cronjob("cj-uid"),
                    "annotations": {"kubernetes.io/service-account.name": "argocd-application-controller"}}}),
        ),
        (
            "/api/v1/namespaces/kube-system/pods",
            "not a destination",
            privileged("kube-system"),
        ),
        ("/api/v1/namespaces/ns/pods", "privileged", privileged("ns")),
        (
            "/api/v1/namespaces",
            "cluster-scoped",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": meta("evil", "")}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            "cluster-scoped",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": meta("pwn", ""),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "ns"}]}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/ns/rolebindings",
            "manages no RoleBinding",
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": meta("pwn", "ns"),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": "ns"}]}),
        ),
    ];
    for (path, why, body) in cases {
        let r = p
            .handle_resource(&deploying_apps(), &req("POST", path, "", "", body))
            .await;
        assert_eq!(
            r.status,
            403,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let message = body_message(&r);
        assert!(message.contains(why), "{path}: {message}");
    }
    assert!(posts(&seen).is_empty(), "{:?}", posts(&seen));
    assert_eq!(count(&p, "create", "forbidden"), 7);
}

fn body_message(r: &argocd_agent_proto::eventstream::ResourceResponse) -> String {
    body(r)["message"].as_str().unwrap_or_default().to_owned()
}

/// A new object's own label or tracking annotation, an owner reference without a uid, or
/// one whose uid is not the live object's: nothing is created.
#[tokio::test]
async fn a_create_is_admitted_only_by_a_live_managed_owner() {
    let (p, seen) = create_mock();
    let job = |meta: Value| json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": meta});
    for (meta, why) in [
        (
            json!({"name": "a", "labels": {"app.kubernetes.io/instance": "guestbook"},
                "annotations": {"argocd.argoproj.io/tracking-id": "guestbook:batch/Job:ns/a"}}),
            "names no owner",
        ),
        (
            json!({"name": "b", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly"}]}),
            "names no owner",
        ),
        (
            json!({"name": "c", "ownerReferences": owned_by_cronjob("old-uid")}),
            "with that uid",
        ),
        (
            json!({"name": "d", "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "gone", "uid": "x"}]}),
            "with that uid",
        ),
    ] {
        let r = p
            .handle_resource(
                &deploying_apps(),
                &req("POST", JOBS, "", "", job(meta.clone())),
            )
            .await;
        assert_eq!(r.status, 403, "{meta}");
        assert!(
            body_message(&r).contains(why),
            "{meta}: {}",
            body_message(&r)
        );
    }
    // Not JSON, or a repeated key: refused unread.
    let mut yaml = req("POST", JOBS, "", "", Value::Null);
    yaml.content_type = "application/yaml".into();
    yaml.body = b"kind: Job\n".to_vec();
    assert_eq!(
        p.handle_resource(&deploying_apps(), &yaml).await.status,
        403
    );
    let mut twice = req("POST", JOBS, "", "", Value::Null);
    twice.content_type = "application/json".into();
    twice.body =
        br#"{"kind":"Job","metadata":{"name":"x","ownerReferences":[]},"metadata":{"name":"y"}}"#
            .to_vec();
    assert_eq!(
        p.handle_resource(&deploying_apps(), &twice).await.status,
        403
    );
    // An Application known by name only (no destination): nothing is created for it.
    let good = job(json!({"name": "e", "ownerReferences": owned_by_cronjob("cj-uid")}));
    let r = p
        .handle_resource(&apps(), &req("POST", JOBS, "", "", good.clone()))
        .await;
    assert_eq!(r.status, 403);
    let r = p
        .handle_resource(&deploying_apps(), &req("POST", JOBS, "", "", good))
        .await;
    assert_eq!(r.status, 201);
    assert_eq!(posts(&seen), [JOBS]);
}

#[tokio::test]
async fn refused_shapes_never_reach_the_cluster() {
    let (p, seen) = mock(vec![], ProxyConfig::default());
    for (m, path, q) in [
        ("GET", "/api/v1/namespaces/ns/pods", "watch=true"),
        ("GET", "/api/v1/namespaces/ns/pods", "watch=f"),
        ("GET", "/api/v1/namespaces/ns/pods", "watch="),
        ("GET", "/api/v1/namespaces/ns/pods", "watch"),
        ("PUT", DEPLOY, ""),
        ("GET", "/api/v1/namespaces/ns/pods/p/log", ""),
        ("GET", "/api/v1/namespaces/ns/pods/../secrets", ""),
        ("GET", "/api/v1/namespaces/ns%2Fsecrets/pods", ""),
        ("DELETE", "/api/v1/namespaces/ns/pods", ""),
    ] {
        let r = p
            .handle_resource(&apps(), &req(m, path, q, "", Value::Null))
            .await;
        assert_eq!(r.status, 403, "{m} {path}?{q}");
        assert_eq!(body(&r)["reason"], "Forbidden");
    }
    assert!(seen.lock().unwrap().is_empty());
}

#[tokio::test]
async fn discovery_and_events_pass_through() {
    let (p, _) = mock(
        vec![
            ("GET", "/apis", 200, json!({"kind": "APIGroupList"})),
            (
                "GET",
                "/api/v1/namespaces/ns/events",
                200,
                json!({"kind": "EventList", "items": [{"metadata": {"name": "e"}}]}),
            ),
        ],
        ProxyConfig::default(),
    );
    let r = p
        .handle_resource(&apps(), &req("GET", "/apis", "", "", Value::Null))
        .await;
    assert_eq!(r.status, 200);
    let r = p
        .handle_resource(
            &apps(),
            &req("GET", "/api/v1/namespaces/ns/events", "", "", Value::Null),
        )
        .await;
    assert_eq!(body(&r)["items"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn large_responses_become_502() {
    let big: Vec<Value> = (0..200)
        .map(|i| json!({"metadata": {"name": format!("item-{i}")}}))
        .collect();
    let (p, _) = mock(
        vec![(
            "GET",
            "/apis",
            200,
            json!({"kind": "APIGroupList", "groups": big}),
        )],
        ProxyConfig {
            max_body: 1024,
            ..ProxyConfig::default()
        },
    );
    let r = p
        .handle_resource(&apps(), &req("GET", "/apis", "", "", Value::Null))
        .await;
    assert_eq!(r.status, 502);
    assert_eq!(body(&r)["message"], "response too large");
    assert_eq!(count(&p, "get", "error"), 1);
}

#[tokio::test]
async fn slow_requests_time_out_and_slots_are_limited() {
    // A server that never answers.
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        let mut parked = Vec::new();
        while let Some((_, send)) = handle.next_request().await {
            parked.push(send);
        }
    });
    let p = SpokeProxy::new(
        kube::Client::new(svc, "default"),
        ProxyConfig {
            timeout: std::time::Duration::from_millis(50),
            max_concurrent: 1,
            ..ProxyConfig::default()
        },
        Metrics::new(),
    );
    let r = p
        .handle_resource(&apps(), &req("GET", "/apis", "", "", Value::Null))
        .await;
    assert_eq!(r.status, 504);
    let slot = p.try_request_slot();
    assert!(slot.is_some());
    assert!(p.try_request_slot().is_none());
    drop(slot);
    assert!(p.try_request_slot().is_some());
}

#[test]
fn response_events_answer_the_request() {
    let e = response_event("agent", "req-1", Answer::status(403, "no").into_response());
    assert_eq!(e.ty, EventType::ResourceResponse);
    assert_eq!(e.ack_id.as_deref(), Some("req-1"));
    let Payload::ResourceResponse(r) = &e.payload else {
        panic!("not a resource response");
    };
    assert_eq!(r.status, 403);
}
