//! Exact requests this crate sends, checked against a `tower_test` mock API server (the
//! way kube-rs tests its own client).

use std::collections::BTreeMap;
use std::time::Duration;

use argocd_agent_kubernetes::{
    Change, DeleteOutcome, Error, Kind, MAX_UPDATE_ATTEMPTS, Mutation, Namespaces, Resources,
    Scope, UpdateOutcome, object, watch,
};
use futures::StreamExt;
use http::{Request, Response};
use kube::api::DynamicObject;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// One request as the mock server saw it.
#[derive(Debug)]
struct Seen {
    method: String,
    path: String,
    query: BTreeMap<String, String>,
    content_type: Option<String>,
    body: Value,
}

/// A scripted answer: HTTP status and body (a JSON value, or raw lines for watches).
enum Reply {
    Json(u16, Value),
    Lines(Vec<Value>),
}

/// Starts a mock API server answering `script` in order; requests past the script are
/// received but never answered (as a watch that stays open). Returns the client and the
/// requests seen.
fn mock(script: Vec<Reply>) -> (kube::Client, mpsc::UnboundedReceiver<Seen>) {
    let (svc, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut script = script.into_iter();
        let mut parked = Vec::new();
        while let Some((req, send)) = handle.next_request().await {
            let (parts, body) = req.into_parts();
            let bytes = body.collect_bytes().await.unwrap_or_default();
            let query = parts
                .uri
                .query()
                .map(|q| {
                    url::form_urlencoded::parse(q.as_bytes())
                        .into_owned()
                        .collect()
                })
                .unwrap_or_default();
            let _ = tx.send(Seen {
                method: parts.method.to_string(),
                path: parts.uri.path().to_string(),
                query,
                content_type: parts
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
                body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
            });
            let (status, payload) = match script.next() {
                Some(Reply::Json(status, v)) => (status, v.to_string().into_bytes()),
                Some(Reply::Lines(lines)) => {
                    let mut out = Vec::new();
                    for l in lines {
                        out.extend_from_slice(l.to_string().as_bytes());
                        out.push(b'\n');
                    }
                    (200, out)
                }
                None => {
                    parked.push(send);
                    continue;
                }
            };
            let resp = Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(Body::from(payload));
            match resp {
                Ok(resp) => send.send_response(resp),
                Err(e) => panic!("mock response: {e}"),
            }
        }
    });
    (kube::Client::new(svc, "default"), rx)
}

async fn next_seen(rx: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Some(s)) => s,
        other => panic!("expected another request, got {other:?}"),
    }
}

fn app(ns: &str, name: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "uid": format!("uid-{name}")},
        "spec": {"project": "default", "source": {"repoURL": "https://git.example/repo", "path": name}}
    })
}

fn app_list(rv: &str, items: Vec<Value>) -> Value {
    json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationList",
           "metadata": {"resourceVersion": rv}, "items": items})
}

fn status(code: u16, reason: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code,
           "reason": reason, "message": format!("{reason} from mock")})
}

fn rv(obj: &DynamicObject) -> &str {
    obj.metadata.resource_version.as_deref().unwrap_or_default()
}

fn describe(c: &Change) -> String {
    match c {
        Change::Applied(o) => format!("applied {}@{}", object::object_key(o), rv(o)),
        Change::Deleted(o) => format!("deleted {}", object::object_key(o)),
        Change::Synced => "synced".to_string(),
    }
}

async fn take_changes(
    changes: &mut (impl futures::Stream<Item = Change> + Unpin),
    n: usize,
) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(60), changes.next()).await {
            Ok(Some(c)) => out.push(describe(&c)),
            other => panic!(
                "expected change {} of {n}, got {other:?}; so far {out:?}",
                out.len() + 1
            ),
        }
    }
    out
}

#[tokio::test(start_paused = true)]
async fn watch_lists_then_watches_and_relists_after_410_emitting_only_differences() {
    let ignored = {
        let mut v = app("argocd", "ignored", "12");
        v["metadata"]["labels"] = json!({"argocd-agent.argoproj-labs.io/ignore-sync": "true"});
        v
    };
    let b_ignored = {
        let mut v = app("argocd", "b", "13");
        v["metadata"]["labels"] = json!({"argocd-agent.argoproj-labs.io/ignore-sync": ""});
        v
    };
    let (client, mut seen) = mock(vec![
        // 1. initial list
        Reply::Json(
            200,
            app_list(
                "10",
                vec![
                    app("argocd", "a", "5"),
                    app("argocd", "b", "6"),
                    app("argocd", "c", "7"),
                ],
            ),
        ),
        // 2. watch from 10: a changes, an ignored object appears, b gains the ignore
        //    label, a bookmark, then the server says the version expired.
        Reply::Lines(vec![
            json!({"type": "MODIFIED", "object": app("argocd", "a", "11")}),
            json!({"type": "ADDED", "object": ignored}),
            json!({"type": "MODIFIED", "object": b_ignored}),
            json!({"type": "MODIFIED", "object": app("argocd", "a", "11")}),
            json!({"type": "BOOKMARK", "object": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"resourceVersion": "14"}}}),
            json!({"type": "ERROR", "object": status(410, "Expired")}),
        ]),
        // 3. re-list: a unchanged, c deleted meanwhile, d created meanwhile.
        Reply::Json(
            200,
            app_list(
                "20",
                vec![app("argocd", "a", "11"), app("argocd", "d", "18")],
            ),
        ),
    ]);
    let (cache, changes) = watch(
        client,
        Kind::Application,
        Scope::namespace("argocd").with_label_selector("team=x"),
    );
    let mut changes = Box::pin(changes);
    assert!(!cache.is_synced());

    let got = take_changes(&mut changes, 4).await;
    assert_eq!(
        got,
        [
            "applied argocd/a@5",
            "applied argocd/b@6",
            "applied argocd/c@7",
            "synced"
        ]
    );
    assert!(cache.is_synced());

    let list = next_seen(&mut seen).await;
    assert_eq!(list.method, "GET");
    assert_eq!(
        list.path,
        "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications"
    );
    assert_eq!(
        list.query.get("labelSelector").map(String::as_str),
        Some("team=x,!argocd-agent.argoproj-labs.io/ignore-sync")
    );
    assert_eq!(list.query.get("watch"), None);

    // The duplicate MODIFIED of a@11 yields nothing; b gaining the label is a delete;
    // the re-list yields c deleted and d applied, not a again.
    let got = take_changes(&mut changes, 5).await;
    assert_eq!(
        got,
        [
            "applied argocd/a@11",
            "deleted argocd/b",
            "deleted argocd/c",
            "applied argocd/d@18",
            "synced"
        ]
    );

    let w = next_seen(&mut seen).await;
    assert_eq!(
        w.path,
        "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications"
    );
    assert_eq!(w.query.get("watch").map(String::as_str), Some("true"));
    assert_eq!(
        w.query.get("resourceVersion").map(String::as_str),
        Some("10")
    );
    assert_eq!(
        w.query.get("allowWatchBookmarks").map(String::as_str),
        Some("true")
    );
    assert_eq!(
        w.query.get("labelSelector").map(String::as_str),
        Some("team=x,!argocd-agent.argoproj-labs.io/ignore-sync")
    );
    let relist = next_seen(&mut seen).await;
    assert_eq!(
        relist.query.get("watch"),
        None,
        "after 410 the watcher lists again"
    );
    assert_eq!(
        relist.query.get("resourceVersion"),
        None,
        "re-list reads the latest state"
    );
    // Drive the stream a little so the watcher opens its next watch (no change is due).
    let idle = tokio::time::timeout(Duration::from_secs(1), changes.next()).await;
    assert!(idle.is_err(), "no further change expected, got {idle:?}");
    let rewatch = next_seen(&mut seen).await;
    assert_eq!(
        rewatch.query.get("resourceVersion").map(String::as_str),
        Some("20")
    );

    let keys: Vec<String> = cache
        .list()
        .iter()
        .map(|o| format!("{}@{}", object::object_key(o), rv(o)))
        .collect();
    assert_eq!(keys, ["argocd/a@11", "argocd/d@18"]);
    assert!(cache.get(Some("argocd"), "b").is_none());
    assert_eq!(cache.list_namespace("argocd").len(), 2);
}

#[tokio::test(start_paused = true)]
async fn watch_resumes_dropped_watch_from_last_bookmark_without_relisting() {
    let (client, mut seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![app("argocd", "a", "5")])),
        Reply::Lines(vec![
            json!({"type": "BOOKMARK", "object": {"apiVersion": "argoproj.io/v1alpha1", "kind": "Application", "metadata": {"resourceVersion": "15"}}}),
        ]),
        // Connection ends; the watcher resumes from the bookmark.
        Reply::Lines(vec![
            json!({"type": "DELETED", "object": app("argocd", "a", "16")}),
        ]),
    ]);
    let (cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let mut changes = Box::pin(changes);
    let got = take_changes(&mut changes, 3).await;
    assert_eq!(got, ["applied argocd/a@5", "synced", "deleted argocd/a"]);
    let _list = next_seen(&mut seen).await;
    let first = next_seen(&mut seen).await;
    assert_eq!(
        first.query.get("resourceVersion").map(String::as_str),
        Some("10")
    );
    let second = next_seen(&mut seen).await;
    assert_eq!(second.query.get("watch").map(String::as_str), Some("true"));
    assert_eq!(
        second.query.get("resourceVersion").map(String::as_str),
        Some("15")
    );
    assert!(cache.is_empty());
}

#[tokio::test(start_paused = true)]
async fn watch_restarts_with_list_when_watch_start_is_refused_with_410() {
    let (client, mut seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![app("argocd", "a", "5")])),
        Reply::Json(410, status(410, "Expired")),
        Reply::Json(200, app_list("30", vec![app("argocd", "a", "25")])),
    ]);
    let (_cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let mut changes = Box::pin(changes);
    let got = take_changes(&mut changes, 4).await;
    assert_eq!(
        got,
        [
            "applied argocd/a@5",
            "synced",
            "applied argocd/a@25",
            "synced"
        ]
    );
    let _ = next_seen(&mut seen).await;
    let _ = next_seen(&mut seen).await;
    let relist = next_seen(&mut seen).await;
    assert_eq!(relist.query.get("watch"), None);
}

#[tokio::test(start_paused = true)]
async fn watch_of_namespace_set_runs_one_watch_per_namespace_and_syncs_after_all() {
    let (client, mut seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![])),
        Reply::Json(200, app_list("11", vec![])),
    ]);
    let scope = Scope {
        namespaces: Namespaces::Set(vec!["b".into(), "a".into(), "b".into()]),
        label_selector: None,
    };
    let (cache, changes) = watch(client, Kind::Application, scope);
    let mut changes = Box::pin(changes);
    let got = take_changes(&mut changes, 1).await;
    assert_eq!(got, ["synced"]);
    assert!(cache.is_synced());
    let mut paths = vec![
        next_seen(&mut seen).await.path,
        next_seen(&mut seen).await.path,
    ];
    paths.sort();
    assert_eq!(
        paths,
        [
            "/apis/argoproj.io/v1alpha1/namespaces/a/applications",
            "/apis/argoproj.io/v1alpha1/namespaces/b/applications"
        ]
    );
}

#[tokio::test]
async fn update_with_sends_resource_version_and_retries_after_conflict() {
    let (client, mut seen) = mock(vec![
        Reply::Json(200, app("argocd", "a", "5")),
        Reply::Json(409, status(409, "Conflict")),
        Reply::Json(200, app("argocd", "a", "6")),
        Reply::Json(200, app("argocd", "a", "7")),
    ]);
    let res = Resources::new(client, Kind::Application);
    let mut calls = 0;
    let out = res
        .update_with(Some("argocd"), "a", |o| {
            calls += 1;
            o.data["spec"]["project"] = json!("prod");
            Mutation::Changed
        })
        .await;
    assert!(
        matches!(&out, Ok(UpdateOutcome::Updated(o)) if rv(o) == "7"),
        "{out:?}"
    );
    assert_eq!(calls, 2, "mutation runs again on the re-read object");
    let get = next_seen(&mut seen).await;
    assert_eq!(
        (get.method.as_str(), get.path.as_str()),
        (
            "GET",
            "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/a"
        )
    );
    let put = next_seen(&mut seen).await;
    assert_eq!(put.method, "PUT");
    assert_eq!(
        put.path,
        "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/a"
    );
    assert_eq!(put.body["metadata"]["resourceVersion"], "5");
    assert_eq!(put.body["spec"]["project"], "prod");
    let _reget = next_seen(&mut seen).await;
    let put2 = next_seen(&mut seen).await;
    assert_eq!(put2.body["metadata"]["resourceVersion"], "6");
}

#[tokio::test]
async fn update_with_gives_up_after_bounded_conflicts() {
    let mut script = Vec::new();
    for _ in 0..MAX_UPDATE_ATTEMPTS {
        script.push(Reply::Json(200, app("argocd", "a", "5")));
        script.push(Reply::Json(409, status(409, "Conflict")));
    }
    let (client, mut seen) = mock(script);
    let res = Resources::new(client, Kind::Application);
    let out = res
        .update_with(Some("argocd"), "a", |_| Mutation::Changed)
        .await;
    match out {
        Err(e @ Error::ConflictRetriesExhausted { attempts, .. }) => {
            assert_eq!(attempts, MAX_UPDATE_ATTEMPTS);
            assert!(e.is_conflict());
            assert!(e.to_string().contains("Application \"argocd/a\""), "{e}");
        }
        other => panic!("expected exhausted retries, got {other:?}"),
    }
    let mut puts = 0;
    while let Ok(s) = seen.try_recv() {
        puts += usize::from(s.method == "PUT");
    }
    assert_eq!(puts, MAX_UPDATE_ATTEMPTS as usize);
}

#[tokio::test]
async fn update_with_unchanged_or_abort_writes_nothing() {
    let (client, mut seen) = mock(vec![
        Reply::Json(200, app("argocd", "a", "5")),
        Reply::Json(200, app("argocd", "a", "5")),
    ]);
    let res = Resources::new(client, Kind::Application);
    let out = res
        .update_with(Some("argocd"), "a", |_| Mutation::Unchanged)
        .await;
    assert!(matches!(out, Ok(UpdateOutcome::Unchanged(_))));
    let out = res
        .update_with(Some("argocd"), "a", |_| Mutation::Abort)
        .await;
    assert!(matches!(out, Ok(UpdateOutcome::Aborted(_))));
    assert_eq!(next_seen(&mut seen).await.method, "GET");
    assert_eq!(next_seen(&mut seen).await.method, "GET");
    assert!(seen.try_recv().is_err());
}

#[tokio::test]
async fn replace_status_is_one_json_patch_of_the_status_subresource() {
    let mut written = app("argocd", "a", "6");
    written["status"] = json!({"sync": {"status": "Synced"}});
    let (client, mut seen) = mock(vec![Reply::Json(200, written)]);
    let res = Resources::new(client, Kind::Application);
    let out = res
        .replace_status(Some("argocd"), "a", json!({"sync": {"status": "Synced"}}))
        .await;
    assert!(matches!(&out, Ok(o) if rv(o) == "6"), "{out:?}");
    let patch = next_seen(&mut seen).await;
    assert_eq!(patch.method, "PATCH");
    assert_eq!(
        patch.path,
        "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications/a/status"
    );
    assert_eq!(
        patch.content_type.as_deref(),
        Some("application/json-patch+json")
    );
    // "add" replaces the whole status: keys the new status lacks are gone.
    assert_eq!(
        patch.body,
        json!([{"op": "add", "path": "/status", "value": {"sync": {"status": "Synced"}}}])
    );
    assert!(seen.try_recv().is_err(), "one request, no read");
}

#[tokio::test]
async fn patch_merge_sends_merge_patch_content_type() {
    let (client, mut seen) = mock(vec![Reply::Json(200, app("argocd", "a", "6"))]);
    let res = Resources::new(client, Kind::Application);
    let patch = json!({"metadata": {"labels": {"x": "y"}}});
    let out = res.patch_merge(Some("argocd"), "a", &patch).await;
    assert!(out.is_ok(), "{out:?}");
    let req = next_seen(&mut seen).await;
    assert_eq!(req.method, "PATCH");
    assert_eq!(
        req.content_type.as_deref(),
        Some("application/merge-patch+json")
    );
    assert_eq!(req.body, patch);
}

#[tokio::test]
async fn delete_of_object_with_finalizers_is_pending() {
    let mut held = app("argocd", "a", "7");
    held["metadata"]["finalizers"] = json!(["resources-finalizer.argocd.argoproj.io"]);
    held["metadata"]["deletionTimestamp"] = json!("2024-01-01T00:00:00Z");
    let gone = json!({"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 200});
    let (client, mut seen) = mock(vec![
        Reply::Json(200, held),
        Reply::Json(200, gone),
        Reply::Json(404, status(404, "NotFound")),
        Reply::Json(200, app("argocd", "a", "8")),
    ]);
    let res = Resources::new(client, Kind::Application);
    assert_eq!(
        res.delete(Some("argocd"), "a").await.ok(),
        Some(DeleteOutcome::Pending)
    );
    assert_eq!(
        res.delete(Some("argocd"), "a").await.ok(),
        Some(DeleteOutcome::Deleted)
    );
    assert_eq!(
        res.delete(Some("argocd"), "a").await.ok(),
        Some(DeleteOutcome::NotFound)
    );
    assert_eq!(next_seen(&mut seen).await.method, "DELETE");
    assert!(
        res.remove_finalizers(Some("argocd"), "a")
            .await
            .unwrap_or(false)
    );
    let _ = next_seen(&mut seen).await;
    let _ = next_seen(&mut seen).await;
    let patch = next_seen(&mut seen).await;
    assert_eq!(patch.method, "PATCH");
    assert_eq!(patch.body, json!({"metadata": {"finalizers": null}}));
}

#[tokio::test]
async fn status_error_bodies_map_to_variants() {
    let (client, _seen) = mock(vec![
        Reply::Json(409, status(409, "AlreadyExists")),
        Reply::Json(422, status(422, "Invalid")),
        Reply::Json(403, status(403, "Forbidden")),
        Reply::Json(404, status(404, "NotFound")),
        Reply::Json(404, status(404, "NotFound")),
    ]);
    let res = Resources::new(client, Kind::Application);
    let obj: DynamicObject = match serde_json::from_value(app("argocd", "a", "3")) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    let err = res.create(&obj).await;
    assert!(matches!(&err, Err(e) if e.is_already_exists()), "{err:?}");
    let err = res.create(&obj).await;
    assert!(matches!(&err, Err(Error::Invalid { .. })), "{err:?}");
    let err = res.get(Some("argocd"), "a").await;
    assert!(
        matches!(&err, Err(Error::Api { code: 403, reason, .. }) if reason == "Forbidden"),
        "{err:?}"
    );
    assert!(matches!(res.get(Some("argocd"), "a").await, Ok(None)));
    let err = res
        .update_with(Some("argocd"), "a", |_| Mutation::Changed)
        .await;
    assert!(matches!(&err, Err(e) if e.is_not_found()), "{err:?}");
    let err = res.get(None, "a").await;
    assert!(matches!(err, Err(Error::InvalidRequest { .. })));
}

#[tokio::test]
async fn create_drops_resource_version_and_sets_type() {
    let (client, mut seen) = mock(vec![Reply::Json(201, app("argocd", "a", "1"))]);
    let res = Resources::new(client, Kind::Application);
    let mut v = app("argocd", "a", "99");
    v.as_object_mut().map(|m| m.remove("apiVersion"));
    let obj: DynamicObject = match serde_json::from_value(v) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    };
    assert!(res.create(&obj).await.is_ok());
    let post = next_seen(&mut seen).await;
    assert_eq!(post.method, "POST");
    assert_eq!(
        post.path,
        "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications"
    );
    assert_eq!(post.body["metadata"].get("resourceVersion"), None);
    assert_eq!(post.body["apiVersion"], "argoproj.io/v1alpha1");
}

#[tokio::test]
async fn ensure_namespace_creates_missing_namespace_with_labels() {
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "agent-a", "resourceVersion": "1"}});
    let (client, mut seen) = mock(vec![
        Reply::Json(404, status(404, "NotFound")),
        Reply::Json(201, ns.clone()),
        Reply::Json(200, ns),
    ]);
    let res = Resources::new(client, Kind::Application);
    let labels = BTreeMap::from([(
        "argocd-agent.argoproj-labs.io/agent".to_string(),
        "agent-a".to_string(),
    )]);
    assert_eq!(
        res.ensure_namespace("agent-a", labels.clone()).await.ok(),
        Some(true)
    );
    assert_eq!(
        res.ensure_namespace("agent-a", labels).await.ok(),
        Some(false)
    );
    let get = next_seen(&mut seen).await;
    assert_eq!(get.path, "/api/v1/namespaces/agent-a");
    let post = next_seen(&mut seen).await;
    assert_eq!(
        (post.method.as_str(), post.path.as_str()),
        ("POST", "/api/v1/namespaces")
    );
    assert_eq!(
        post.body["metadata"]["labels"]["argocd-agent.argoproj-labs.io/agent"],
        "agent-a"
    );
}

/// A full upstream-shaped Application, with fields this crate does not model.
fn full_application() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {
            "name": "guestbook", "namespace": "agent-a", "uid": "8c1d", "resourceVersion": "1234",
            "generation": 7, "creationTimestamp": "2024-05-01T10:00:00Z",
            "labels": {"app.kubernetes.io/part-of": "demo"},
            "annotations": {"argocd.argoproj.io/refresh": "hard", "note": "keep me"},
            "finalizers": ["resources-finalizer.argocd.argoproj.io"],
            "managedFields": [{"manager": "argocd-server", "operation": "Update", "apiVersion": "argoproj.io/v1alpha1"}]
        },
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps", "path": "guestbook",
                       "targetRevision": "HEAD", "helm": {"valueFiles": ["values.yaml"], "parameters": [{"name": "a", "value": "1"}]}},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "guestbook"},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}, "syncOptions": ["CreateNamespace=true"],
                           "retry": {"limit": 5, "backoff": {"duration": "5s", "factor": 2, "maxDuration": "3m"}}},
            "futureField": {"x": 1}
        },
        "status": {
            "sync": {"status": "Synced", "revision": "abc123", "comparedTo": {"source": {"repoURL": "r"}}},
            "health": {"status": "Healthy", "lastTransitionTime": "2024-05-01T10:05:00Z"},
            "operationState": {"phase": "Succeeded", "message": "successfully synced", "startedAt": "2024-05-01T10:04:00Z",
                               "operation": {"sync": {"revision": "abc123"}}, "syncResult": {"resources": [{"kind": "Service", "name": "guestbook-ui"}]}},
            "resources": [{"kind": "Deployment", "name": "guestbook-ui", "status": "Synced"}],
            "reconciledAt": "2024-05-01T10:05:00Z"
        },
        "operation": {"sync": {"revision": "HEAD", "prune": true}, "initiatedBy": {"username": "admin"}, "retry": {}}
    })
}

#[tokio::test]
async fn full_application_survives_get_update_and_strip_for_transfer() {
    let original = full_application();
    let mut updated = original.clone();
    updated["metadata"]["resourceVersion"] = json!("1235");
    updated["metadata"]["labels"]["synced-by"] = json!("agent");
    let (client, mut seen) = mock(vec![
        Reply::Json(200, original.clone()),
        Reply::Json(200, original.clone()),
        Reply::Json(200, updated.clone()),
    ]);
    let res = Resources::new(client, Kind::Application);
    let got = match res.get(Some("agent-a"), "guestbook").await {
        Ok(Some(o)) => o,
        other => panic!("get: {other:?}"),
    };
    assert_eq!(
        serde_json::to_value(&got).ok(),
        Some(original.clone()),
        "get keeps every field"
    );

    let out = res
        .update_with(Some("agent-a"), "guestbook", |o| {
            o.metadata
                .labels
                .get_or_insert_default()
                .insert("synced-by".into(), "agent".into());
            Mutation::Changed
        })
        .await;
    let written = match out {
        Ok(UpdateOutcome::Updated(o)) => o,
        other => panic!("update: {other:?}"),
    };
    let _get = next_seen(&mut seen).await;
    let _get = next_seen(&mut seen).await;
    let put = next_seen(&mut seen).await;
    let mut expected_put = original.clone();
    expected_put["metadata"]["labels"]["synced-by"] = json!("agent");
    assert_eq!(
        put.body, expected_put,
        "PUT body carries every field of the object read"
    );

    let stripped =
        serde_json::to_value(object::strip_for_transfer(&written)).unwrap_or(Value::Null);
    let mut expected = updated;
    for field in [
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "managedFields",
    ] {
        expected["metadata"]
            .as_object_mut()
            .map(|m| m.remove(field));
    }
    assert_eq!(stripped, expected);
    assert_eq!(
        object::spec_checksum(&written),
        object::checksum_of(&original["spec"])
    );
}

#[tokio::test(start_paused = true)]
async fn wait_synced_returns_once_the_first_list_is_in_the_cache() {
    let (client, _seen) = mock(vec![Reply::Json(
        200,
        app_list("10", vec![app("argocd", "a", "5")]),
    )]);
    let (cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let reader = cache.clone();
    let waiter = tokio::spawn(async move {
        reader.wait_synced().await;
        reader.get(Some("argocd"), "a").map(|o| rv(&o).to_string())
    });
    let driver = tokio::spawn(changes.for_each(|_| async {}));
    let got = tokio::time::timeout(Duration::from_secs(5), waiter).await;
    assert!(matches!(&got, Ok(Ok(Some(v))) if v == "5"), "{got:?}");
    assert!(cache.is_synced());
    driver.abort();
}

#[tokio::test(start_paused = true)]
async fn delete_of_never_announced_object_yields_nothing() {
    let (client, _seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![])),
        Reply::Lines(vec![
            json!({"type": "DELETED", "object": app("argocd", "ghost", "11")}),
            json!({"type": "ADDED", "object": app("argocd", "real", "12")}),
        ]),
    ]);
    let (_cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let mut changes = Box::pin(changes);
    let got = take_changes(&mut changes, 2).await;
    assert_eq!(got, ["synced", "applied argocd/real@12"]);
}

fn dyn_obj(v: Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn upsert_known_absent_is_one_create() {
    let (client, mut seen) = mock(vec![Reply::Json(201, app("argocd", "a", "1"))]);
    let res = Resources::new(client, Kind::Application);
    let copy = dyn_obj(app("argocd", "a", ""));
    let out = res
        .upsert_copy_known(&copy, &["spec"], argocd_agent_kubernetes::Known::Absent)
        .await;
    assert_eq!(
        out.ok(),
        Some(argocd_agent_kubernetes::UpsertOutcome::Created)
    );
    assert_eq!(next_seen(&mut seen).await.method, "POST");
    assert!(seen.try_recv().is_err(), "one request");
}

#[tokio::test]
async fn upsert_known_present_and_equal_costs_no_request() {
    let (client, mut seen) = mock(vec![]);
    let res = Resources::new(client, Kind::Application);
    let cached = std::sync::Arc::new(dyn_obj(app("argocd", "a", "7")));
    let copy = dyn_obj(app("argocd", "a", ""));
    let out = res
        .upsert_copy_known(
            &copy,
            &["spec"],
            argocd_agent_kubernetes::Known::Present(cached),
        )
        .await;
    assert_eq!(
        out.ok(),
        Some(argocd_agent_kubernetes::UpsertOutcome::Unchanged)
    );
    assert!(seen.try_recv().is_err(), "no request");
}

#[tokio::test]
async fn upsert_known_present_is_one_put_from_the_cached_version_and_a_stale_one_rereads() {
    let mut changed = app("argocd", "a", "");
    changed["spec"]["source"]["path"] = json!("elsewhere");
    // Fresh cache: one PUT carrying the cached resourceVersion.
    let (client, mut seen) = mock(vec![Reply::Json(200, app("argocd", "a", "8"))]);
    let res = Resources::new(client, Kind::Application);
    let cached = std::sync::Arc::new(dyn_obj(app("argocd", "a", "7")));
    let out = res
        .upsert_copy_known(
            &dyn_obj(changed.clone()),
            &["spec"],
            argocd_agent_kubernetes::Known::Present(cached.clone()),
        )
        .await;
    assert_eq!(
        out.ok(),
        Some(argocd_agent_kubernetes::UpsertOutcome::Updated)
    );
    let put = next_seen(&mut seen).await;
    assert_eq!(put.method, "PUT");
    assert_eq!(put.body["metadata"]["resourceVersion"], "7");
    assert_eq!(put.body["spec"]["source"]["path"], "elsewhere");
    assert!(seen.try_recv().is_err(), "one request");

    // Stale cache: the PUT conflicts, the object is read, the PUT is repeated.
    let (client, mut seen) = mock(vec![
        Reply::Json(409, status(409, "Conflict")),
        Reply::Json(200, app("argocd", "a", "9")),
        Reply::Json(200, app("argocd", "a", "10")),
    ]);
    let res = Resources::new(client, Kind::Application);
    let out = res
        .upsert_copy_known(
            &dyn_obj(changed),
            &["spec"],
            argocd_agent_kubernetes::Known::Present(cached),
        )
        .await;
    assert_eq!(
        out.ok(),
        Some(argocd_agent_kubernetes::UpsertOutcome::Updated)
    );
    assert_eq!(next_seen(&mut seen).await.method, "PUT");
    assert_eq!(next_seen(&mut seen).await.method, "GET");
    let put = next_seen(&mut seen).await;
    assert_eq!(put.method, "PUT");
    assert_eq!(put.body["metadata"]["resourceVersion"], "9");
}

#[tokio::test]
async fn upsert_unknown_of_a_missing_object_reads_then_creates() {
    let (client, mut seen) = mock(vec![
        Reply::Json(404, status(404, "NotFound")),
        Reply::Json(201, app("argocd", "a", "1")),
    ]);
    let res = Resources::new(client, Kind::Application);
    let out = res
        .upsert_copy(&dyn_obj(app("argocd", "a", "")), &["spec"])
        .await;
    assert_eq!(
        out.ok(),
        Some(argocd_agent_kubernetes::UpsertOutcome::Created)
    );
    assert_eq!(next_seen(&mut seen).await.method, "GET");
    assert_eq!(next_seen(&mut seen).await.method, "POST");
}

#[tokio::test(start_paused = true)]
async fn cache_spec_checksum_is_per_version_and_equals_the_computed_one() {
    let mut changed = app("argocd", "a", "6");
    changed["spec"]["source"]["path"] = json!("elsewhere");
    let (client, _seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![app("argocd", "a", "5")])),
        Reply::Lines(vec![json!({"type": "MODIFIED", "object": changed})]),
    ]);
    let (cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let mut changes = Box::pin(changes);
    let Some(Change::Applied(v5)) = changes.next().await else {
        panic!("the listed object first")
    };
    let sum5 = cache.spec_checksum(&v5);
    assert_eq!(sum5, object::spec_checksum(&v5));
    assert_eq!(cache.spec_checksum(&v5), sum5, "asked again: the same");
    let got = take_changes(&mut changes, 2).await;
    assert_eq!(got, ["synced", "applied argocd/a@6"]);
    let v6 = cache.get(Some("argocd"), "a").unwrap();
    let sum6 = cache.spec_checksum(&v6);
    assert_eq!(sum6, object::spec_checksum(&v6));
    assert_ne!(sum6, sum5, "the new version has its own checksum");
    // An object the cache no longer holds is computed afresh, not given the memo.
    assert_eq!(cache.spec_checksum(&v5), sum5);
}

/// A status write makes a new version whose managed copy is the same: its JSON and
/// checksums are kept, the same bytes; a label change starts afresh.
#[tokio::test(start_paused = true)]
async fn a_status_write_keeps_the_managed_json_a_spec_or_label_change_does_not() {
    let mut status = app("argocd", "a", "6");
    status["status"] = json!({"health": {"status": "Healthy"}});
    let mut labelled = status.clone();
    labelled["metadata"]["resourceVersion"] = json!("7");
    labelled["metadata"]["labels"] = json!({"team": "b"});
    let (client, _seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![app("argocd", "a", "5")])),
        Reply::Lines(vec![
            json!({"type": "MODIFIED", "object": status}),
            json!({"type": "MODIFIED", "object": labelled}),
        ]),
    ]);
    let (cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let mut changes = Box::pin(changes);
    let Some(Change::Applied(v5)) = changes.next().await else {
        panic!("the listed object first")
    };
    let json5 = cache.managed_json(&v5).to_json();
    let meta5 = cache.metadata_checksum(&v5);
    let got = take_changes(&mut changes, 2).await;
    assert_eq!(got, ["synced", "applied argocd/a@6"]);
    let v6 = cache.get(Some("argocd"), "a").unwrap();
    let json6 = cache.managed_json(&v6).to_json();
    assert_eq!(
        json6.as_ptr(),
        json5.as_ptr(),
        "kept across the status write"
    );
    assert_eq!(cache.metadata_checksum(&v6), meta5);
    assert_eq!(cache.spec_checksum(&v6), object::spec_checksum(&v6));
    let got = take_changes(&mut changes, 1).await;
    assert_eq!(got, ["applied argocd/a@7"]);
    let v7 = cache.get(Some("argocd"), "a").unwrap();
    let json7 = cache.managed_json(&v7).to_json();
    assert_ne!(json7, json6);
    let mut written = Vec::new();
    object::write_stamped_without_status(&v7, &mut written);
    assert_eq!(json7, written);
    assert_eq!(cache.metadata_checksum(&v7), object::metadata_checksum(&v7));
}

/// A managed copy's JSON is written once per cached version and shared by every event
/// that sends it (the same bytes, not a copy); metadata checksums are kept the same way.
#[tokio::test(start_paused = true)]
async fn cache_managed_json_is_written_once_per_version_and_shared() {
    let mut changed = app("argocd", "a", "6");
    changed["metadata"]["labels"] = json!({"team": "b"});
    changed["status"] = json!({"health": {"status": "Healthy"}});
    let (client, _seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![app("argocd", "a", "5")])),
        Reply::Lines(vec![json!({"type": "MODIFIED", "object": changed})]),
    ]);
    let (cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    let mut changes = Box::pin(changes);
    let Some(Change::Applied(v5)) = changes.next().await else {
        panic!("the listed object first")
    };
    let written = |obj: &DynamicObject| {
        let mut out = Vec::new();
        object::write_stamped_without_status(obj, &mut out);
        out
    };
    let (first, again) = (
        cache.managed_json(&v5).to_json(),
        cache.managed_json(&v5).to_json(),
    );
    assert_eq!(first, written(&v5));
    assert_eq!(first.as_ptr(), again.as_ptr(), "the same bytes, shared");
    assert_eq!(cache.metadata_checksum(&v5), object::metadata_checksum(&v5));
    let got = take_changes(&mut changes, 2).await;
    assert_eq!(got, ["synced", "applied argocd/a@6"]);
    let v6 = cache.get(Some("argocd"), "a").unwrap();
    let json6 = cache.managed_json(&v6).to_json();
    assert_eq!(
        json6,
        written(&v6),
        "the new version's own, without its status"
    );
    assert!(!String::from_utf8_lossy(&json6).contains("Healthy"));
    assert_ne!(
        cache.metadata_checksum(&v6),
        cache.metadata_checksum(&v5),
        "labels changed"
    );
    // An event queued for the old version keeps its bytes; the old version asked for
    // again (no longer cached) is written afresh, equal but not shared.
    let stale = cache.managed_json(&v5).to_json();
    assert_eq!(stale, first);
    assert_ne!(stale.as_ptr(), first.as_ptr());
}

/// A cache told to stub large objects keeps those it applies to as stubs, from the
/// initial list on and for watched changes, with their whole size; the list asks for
/// pages of `LIST_PAGE_SIZE`.
#[tokio::test(start_paused = true)]
async fn oversized_objects_are_cached_as_stubs_and_lists_are_paged() {
    let mut big = app("argocd", "big", "5");
    big["metadata"]["labels"] = json!({"owner": "agent"});
    big["spec"]["source"]["helm"] = json!({"values": "x".repeat(5000)});
    let mut unlabelled = app("argocd", "hub", "6");
    unlabelled["spec"]["source"]["helm"] = json!({"values": "y".repeat(5000)});
    let mut grown = app("argocd", "small", "8");
    grown["metadata"]["labels"] = json!({"owner": "agent"});
    grown["spec"]["source"]["helm"] = json!({"values": "z".repeat(5000)});
    let weight = |v: &Value| object::object_weight(&serde_json::from_value(v.clone()).unwrap());
    let (big_size, grown_size) = (weight(&big), weight(&grown));
    let mut small = app("argocd", "small", "7");
    small["metadata"]["labels"] = json!({"owner": "agent"});
    // Claims to be a stub of 1 byte: its writer's word, not the cache's.
    let mut forged = app("argocd", "forged", "9");
    forged["metadata"]["labels"] = json!({"owner": "agent"});
    forged["metadata"]["annotations"] = json!({object::OVERSIZED_ANNOTATION: "1"});
    let forged_size = weight(&forged);
    let (client, mut seen) = mock(vec![
        Reply::Json(200, app_list("10", vec![big, unlabelled, small, forged])),
        Reply::Lines(vec![json!({"type": "MODIFIED", "object": grown})]),
    ]);
    let (cache, changes) = watch(client, Kind::Application, Scope::namespace("argocd"));
    fn labelled(o: &DynamicObject) -> bool {
        o.metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key("owner"))
    }
    cache.stub_oversized(1000, labelled);
    let mut changes = Box::pin(changes);
    take_changes(&mut changes, 6).await;
    let list = next_seen(&mut seen).await;
    assert_eq!(
        list.query.get("limit").map(String::as_str),
        Some(argocd_agent_kubernetes::LIST_PAGE_SIZE.to_string().as_str())
    );
    let stub = cache.get(Some("argocd"), "big").expect("big cached");
    assert_eq!(stub.data, json!({}), "no spec or status");
    assert_eq!(object::oversized_size(&stub), Some(big_size));
    assert_eq!(cache.object_size(&stub), big_size);
    assert!(cache.is_stub(&stub));
    let forged = cache.get(Some("argocd"), "forged").expect("forged cached");
    assert!(!cache.is_stub(&forged));
    assert_eq!(cache.object_size(&forged), forged_size);
    assert!(forged_size > 1);
    assert!(matches!(
        cache.known(Some("argocd"), "big"),
        argocd_agent_kubernetes::Known::Unknown
    ));
    // Not labelled: kept whole, whatever its size.
    let hub = cache.get(Some("argocd"), "hub").expect("hub cached");
    assert!(hub.data["spec"]["source"]["helm"]["values"].is_string());
    // Grown past the bound by a watched change: a stub too.
    let grown = cache.get(Some("argocd"), "small").expect("small cached");
    assert_eq!(grown.metadata.resource_version.as_deref(), Some("8"));
    assert_eq!(object::oversized_size(&grown), Some(grown_size));
}
