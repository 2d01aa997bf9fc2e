//! The Kubernetes backend's watch against the Kubernetes API test server: objects are
//! created, updated, labelled ignore-sync and deleted, the watch is dropped and the
//! history compacted (forcing 410 Gone and a re-list), and the cache and the stream of
//! changes must still match the server exactly, without missed or duplicated events.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use argocd_agent_kube_test_server::KubeTestServer;
use argocd_agent_kubernetes::{
    Cache, Change, ClientOptions, IGNORE_SYNC_LABEL, Kind, Mutation, Resources, Scope, client,
    object::object_key, watch,
};
use futures::{Stream, StreamExt};
use kube::api::DynamicObject;
use serde_json::{Value, json};

const NS: &str = "argocd";

/// Every change seen, as (event, key, resourceVersion).
#[derive(Default)]
struct Log {
    events: Vec<(String, String, String)>,
}

impl Log {
    fn record(&mut self, change: &Change) {
        match change {
            Change::Applied(o) => self.events.push(("applied".into(), object_key(o), rv(o))),
            Change::Deleted(o) => self.events.push(("deleted".into(), object_key(o), rv(o))),
            Change::Synced => self
                .events
                .push(("synced".into(), String::new(), String::new())),
        }
    }
}

fn rv(obj: &DynamicObject) -> String {
    obj.metadata.resource_version.clone().unwrap_or_default()
}

fn app(name: &str, path: &str) -> DynamicObject {
    let v = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"project": "default", "source": {"repoURL": "https://git.example/apps", "path": path},
                 "destination": {"server": "https://kubernetes.default.svc", "namespace": "default"}}
    });
    match serde_json::from_value(v) {
        Ok(o) => o,
        Err(e) => panic!("test application does not parse: {e}"),
    }
}

/// The server's view: key -> resourceVersion of every synced (not ignore-sync) application.
fn server_state(server: &KubeTestServer) -> BTreeMap<String, String> {
    server
        .list_objects("argoproj.io", "v1alpha1", "applications", Some(NS))
        .into_iter()
        .filter(|o| {
            o.pointer(&format!(
                "/metadata/labels/{}",
                IGNORE_SYNC_LABEL.replace('/', "~1")
            ))
            .is_none()
        })
        .map(|o| {
            let s = |p: &str| {
                o.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            (
                format!("{}/{}", s("/metadata/namespace"), s("/metadata/name")),
                s("/metadata/resourceVersion"),
            )
        })
        .collect()
}

fn cache_state(cache: &Cache) -> BTreeMap<String, String> {
    cache
        .list()
        .iter()
        .map(|o| (object_key(o), rv(o)))
        .collect()
}

/// Polls the change stream until the cache equals the server's state (or 8 s pass).
async fn settle(
    changes: &mut (impl Stream<Item = Change> + Unpin),
    cache: &Cache,
    server: &KubeTestServer,
    log: &mut Log,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(8);
    loop {
        if cache.is_synced() && cache_state(cache) == server_state(server) {
            // Drain whatever is already queued, then stop.
            while let Ok(Some(c)) =
                tokio::time::timeout(Duration::from_millis(200), changes.next()).await
            {
                log.record(&c);
            }
            if cache_state(cache) == server_state(server) {
                return;
            }
        }
        match tokio::time::timeout_at(deadline, changes.next()).await {
            Ok(Some(c)) => log.record(&c),
            Ok(None) => panic!("change stream ended"),
            Err(_) => panic!(
                "cache never matched the server\ncache:  {:?}\nserver: {:?}\nevents: {:?}",
                cache_state(cache),
                server_state(server),
                log.events
            ),
        }
    }
}

/// For each object the last event agrees with the final state, and no
/// (object, resourceVersion) was announced as applied twice.
fn check_log(log: &Log, server: &KubeTestServer) {
    let mut applied: HashMap<(String, String), usize> = HashMap::new();
    let mut last: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (ev, key, rv) in &log.events {
        if ev == "synced" {
            continue;
        }
        if ev == "applied" {
            *applied.entry((key.clone(), rv.clone())).or_default() += 1;
        }
        last.insert(key.clone(), (ev.clone(), rv.clone()));
    }
    for ((key, rv), n) in &applied {
        assert_eq!(
            *n, 1,
            "{key}@{rv} applied {n} times; events: {:?}",
            log.events
        );
    }
    let state = server_state(server);
    for (key, (ev, rv)) in &last {
        match state.get(key) {
            Some(server_rv) => {
                assert_eq!(
                    (ev.as_str(), rv),
                    ("applied", server_rv),
                    "{key}: last event {ev}@{rv}"
                )
            }
            None => assert_eq!(
                ev, "deleted",
                "{key} is gone but its last event is {ev}@{rv}"
            ),
        }
    }
    for key in state.keys() {
        assert!(
            last.contains_key(key),
            "{key} exists on the server but was never announced"
        );
    }
}

#[tokio::test]
async fn watch_cache_matches_server_through_drops_and_410_without_missed_or_duplicate_events() {
    let server = match KubeTestServer::start().await {
        Ok(s) => s,
        Err(e) => panic!("kube test server: {e}"),
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let kubeconfig = dir.path().join("kubeconfig");
    if let Err(e) = server.write_kubeconfig(&kubeconfig, "hub") {
        panic!("write kubeconfig: {e}");
    }
    let opts = ClientOptions {
        kubeconfig: Some(kubeconfig),
        context: Some("hub".into()),
        ..Default::default()
    };
    let kube = match client(&opts).await {
        Ok(c) => c,
        Err(e) => panic!("client: {e}"),
    };
    let apps = Resources::new(kube.clone(), Kind::Application);
    assert_eq!(
        apps.ensure_namespace(NS, BTreeMap::new()).await.ok(),
        Some(true)
    );
    for name in ["a", "b", "c"] {
        if let Err(e) = apps.create(&app(name, name)).await {
            panic!("create {name}: {e}");
        }
    }
    let mut ignored = app("ignored", "x");
    ignored.metadata.labels = Some(BTreeMap::from([(
        IGNORE_SYNC_LABEL.to_string(),
        "true".to_string(),
    )]));
    assert!(apps.create(&ignored).await.is_ok());

    let (cache, changes) = watch(kube, Kind::Application, Scope::namespace(NS));
    let mut changes = Box::pin(changes);
    let mut log = Log::default();
    settle(&mut changes, &cache, &server, &mut log).await;
    assert!(log.events.iter().any(|e| e.0 == "synced"));
    assert!(
        cache.get(Some(NS), "ignored").is_none(),
        "ignore-sync objects are never cached"
    );

    // Live changes while watching.
    let set_path = |path: &'static str| {
        move |o: &mut DynamicObject| {
            o.data["spec"]["source"]["path"] = json!(path);
            Mutation::Changed
        }
    };
    assert!(
        apps.update_with(Some(NS), "a", set_path("a2"))
            .await
            .is_ok()
    );
    assert!(apps.create(&app("d", "d")).await.is_ok());
    assert!(apps.delete(Some(NS), "c").await.is_ok());
    let label = json!({"metadata": {"labels": {IGNORE_SYNC_LABEL: "yes"}}});
    assert!(apps.patch_merge(Some(NS), "b", &label).await.is_ok());
    settle(&mut changes, &cache, &server, &mut log).await;
    assert!(
        cache.get(Some(NS), "b").is_none(),
        "gaining ignore-sync looks like a deletion"
    );

    // Dropped watch: changes made while the stream is not polled arrive on re-watch.
    server.drop_watches();
    assert!(
        apps.update_with(Some(NS), "d", set_path("d2"))
            .await
            .is_ok()
    );
    assert!(apps.create(&app("e", "e")).await.is_ok());
    settle(&mut changes, &cache, &server, &mut log).await;

    // Dropped watch plus compacted history: the re-watch gets 410 and the watcher re-lists;
    // only the differences may come out.
    server.drop_watches();
    assert!(
        apps.update_with(Some(NS), "a", set_path("a3"))
            .await
            .is_ok()
    );
    assert!(apps.delete(Some(NS), "d").await.is_ok());
    assert!(apps.create(&app("f", "f")).await.is_ok());
    let unlabel = json!({"metadata": {"labels": {IGNORE_SYNC_LABEL: null}}});
    assert!(apps.patch_merge(Some(NS), "b", &unlabel).await.is_ok());
    server.compact_history();
    let synced_before = log.events.iter().filter(|e| e.0 == "synced").count();
    settle(&mut changes, &cache, &server, &mut log).await;
    let synced_after = log.events.iter().filter(|e| e.0 == "synced").count();
    assert!(
        synced_after > synced_before,
        "410 must lead to a re-list; events: {:?}",
        log.events
    );

    assert_eq!(
        cache_state(&cache).keys().cloned().collect::<Vec<_>>(),
        ["argocd/a", "argocd/b", "argocd/e", "argocd/f"]
    );
    check_log(&log, &server);
    server.shutdown().await;
}

async fn started() -> (KubeTestServer, kube::Client, tempfile::TempDir) {
    let server = match KubeTestServer::start().await {
        Ok(s) => s,
        Err(e) => panic!("kube test server: {e}"),
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("tempdir: {e}"),
    };
    let kubeconfig = dir.path().join("kubeconfig");
    if let Err(e) = server.write_kubeconfig(&kubeconfig, "hub") {
        panic!("write kubeconfig: {e}");
    }
    let opts = ClientOptions {
        kubeconfig: Some(kubeconfig),
        ..Default::default()
    };
    match client(&opts).await {
        Ok(c) => (server, c, dir),
        Err(e) => panic!("client: {e}"),
    }
}

#[tokio::test]
async fn concurrent_update_with_loses_no_update_thanks_to_conflict_retries() {
    let (server, kube, _dir) = started().await;
    let apps = Resources::new(kube, Kind::Application);
    assert_eq!(
        apps.ensure_namespace(NS, BTreeMap::new()).await.ok(),
        Some(true)
    );
    assert!(apps.create(&app("counter", "p")).await.is_ok());
    // Four writers read the same version, so all but one conflict and must re-read.
    let writers = (0..4).map(|_| {
        let apps = apps.clone();
        async move {
            apps.update_with(Some(NS), "counter", |o| {
                let n = o.data["spec"]["count"].as_u64().unwrap_or(0);
                o.data["spec"]["count"] = json!(n + 1);
                Mutation::Changed
            })
            .await
        }
    });
    for result in futures::future::join_all(writers).await {
        assert!(result.is_ok(), "{result:?}");
    }
    let stored = server.list_objects("argoproj.io", "v1alpha1", "applications", Some(NS));
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["spec"]["count"], 4, "every increment survives");
    server.shutdown().await;
}

#[tokio::test]
async fn status_goes_through_subresource_and_finalizers_hold_deletion() {
    let (server, kube, _dir) = started().await;
    let apps = Resources::new(kube, Kind::Application);
    assert_eq!(
        apps.ensure_namespace(NS, BTreeMap::new()).await.ok(),
        Some(true)
    );
    let mut held = app("held", "p");
    held.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    assert!(apps.create(&held).await.is_ok());

    let status = json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}});
    let written = apps.replace_status(Some(NS), "held", status.clone()).await;
    assert!(
        matches!(&written, Ok(o) if o.data["status"] == status),
        "{written:?}"
    );
    // A status in a main-resource update is ignored by the server: only /status writes it.
    let out = apps
        .update_with(Some(NS), "held", |o| {
            o.data["status"] = json!({"sync": {"status": "OutOfSync"}});
            o.data["spec"]["project"] = json!("other");
            Mutation::Changed
        })
        .await;
    assert!(out.is_ok(), "{out:?}");
    let stored = apps.get(Some(NS), "held").await.ok().flatten();
    assert!(
        matches!(&stored, Some(o) if o.data["status"] == status && o.data["spec"]["project"] == "other")
    );

    use argocd_agent_kubernetes::{DeleteOutcome, object::is_being_deleted};
    assert_eq!(
        apps.delete(Some(NS), "held").await.ok(),
        Some(DeleteOutcome::Pending)
    );
    let pending = apps.get(Some(NS), "held").await.ok().flatten();
    assert!(
        matches!(&pending, Some(o) if is_being_deleted(o)),
        "being deleted, not gone"
    );
    assert_eq!(
        apps.remove_finalizers(Some(NS), "held").await.ok(),
        Some(true)
    );
    assert!(matches!(apps.get(Some(NS), "held").await, Ok(None)));
    assert_eq!(
        apps.delete(Some(NS), "held").await.ok(),
        Some(DeleteOutcome::NotFound)
    );
    assert_eq!(
        apps.remove_finalizers(Some(NS), "held").await.ok(),
        Some(false)
    );
    server.shutdown().await;
}

#[tokio::test]
async fn watch_of_namespace_set_recovers_from_server_errors() {
    let (server, kube, _dir) = started().await;
    let apps = Resources::new(kube.clone(), Kind::Application);
    for ns in ["agent-a", "agent-b", "agent-c"] {
        assert_eq!(
            apps.ensure_namespace(ns, BTreeMap::new()).await.ok(),
            Some(true)
        );
        let mut a = app("guestbook", ns);
        a.metadata.namespace = Some(ns.into());
        assert!(apps.create(&a).await.is_ok());
    }
    let scope = Scope {
        namespaces: argocd_agent_kubernetes::Namespaces::Set(vec![
            "agent-a".into(),
            "agent-b".into(),
        ]),
        label_selector: None,
    };
    // The first list requests fail; the watch retries with backoff.
    server.fail_next(1, 500);
    let (cache, changes) = watch(kube, Kind::Application, scope);
    let mut changes = Box::pin(changes);
    let drive = async {
        while let Some(c) = changes.next().await {
            if matches!(c, Change::Synced) {
                return;
            }
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(8), drive)
            .await
            .is_ok(),
        "never synced"
    );
    assert!(cache.is_synced());
    let keys: Vec<String> = cache.list().iter().map(|o| object_key(o)).collect();
    assert_eq!(
        keys,
        ["agent-a/guestbook", "agent-b/guestbook"],
        "agent-c is outside the scope"
    );
    assert_eq!(cache.list_namespace("agent-b").len(), 1);
    server.shutdown().await;
}

/// An agent Lease as a principal with `--ha` writes it.
fn agent_lease(name: &str) -> DynamicObject {
    let mut obj = DynamicObject::new(name, &Kind::Lease.api_resource()).within(NS);
    obj.metadata.labels = Some(
        [
            (
                "argocd-agent.argoproj-labs.io/lease".to_string(),
                "agent".to_string(),
            ),
            (
                "argocd-agent.argoproj-labs.io/agent-name".to_string(),
                name.to_string(),
            ),
        ]
        .into(),
    );
    obj.metadata.annotations = Some(
        [(
            "argocd-agent.argoproj-labs.io/hub-namespace".to_string(),
            name.to_string(),
        )]
        .into(),
    );
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string();
    obj.data = json!({"spec": {
        "holderIdentity": "principal-0_1a2b3c4d",
        "acquireTime": now,
        "renewTime": now,
        "leaseDurationSeconds": 900,
        "leaseTransitions": 0
    }});
    obj
}

/// Leases written through the API server are kept in the watch cache in typed fields (an
/// object asked for is rebuilt: a new `Arc` each time), both as listed and as watched, and
/// the rebuilt object is the server's (resourceVersion, uid and all), which a write starts
/// from.
#[tokio::test]
async fn lease_cache_keeps_server_leases_compact_and_exact() {
    let (server, kube, _dir) = started().await;
    let leases = Resources::new(kube.clone(), Kind::Lease);
    assert_eq!(
        leases.ensure_namespace(NS, BTreeMap::new()).await.ok(),
        Some(true)
    );
    assert!(leases.create(&agent_lease("listed")).await.is_ok());
    let (cache, changes) = watch(kube, Kind::Lease, Scope::namespace(NS));
    let mut changes = Box::pin(changes);
    let pump = tokio::spawn(async move { while changes.next().await.is_some() {} });
    assert!(leases.create(&agent_lease("watched")).await.is_ok());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while cache.len() < 2 {
        assert!(tokio::time::Instant::now() < deadline, "never cached both");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for name in ["listed", "watched"] {
        let (Some(a), Some(b)) = (cache.get(Some(NS), name), cache.get(Some(NS), name)) else {
            panic!("{name} not cached");
        };
        assert!(!std::sync::Arc::ptr_eq(&a, &b), "{name} kept whole");
        let Ok(Some(mut stored)) = leases.get(Some(NS), name).await else {
            panic!("{name} not on the server");
        };
        stored.metadata.managed_fields = None;
        assert_eq!(*a, stored, "{name}");
        let lease = cache.lease(Some(NS), name);
        assert_eq!(
            lease
                .as_ref()
                .and_then(|l| l.holder_identity().map(str::to_owned)),
            Some("principal-0_1a2b3c4d".to_string())
        );
        // A renewal starts from the cached copy.
        let renewed = leases
            .update_from(Some(NS), name, Some((*a).clone()), |o| {
                o.data["spec"]["leaseTransitions"] = json!(1);
                Mutation::Changed
            })
            .await;
        assert!(
            matches!(
                renewed,
                Ok(argocd_agent_kubernetes::UpdateOutcome::Updated(_))
            ),
            "{renewed:?}"
        );
    }
    pump.abort();
    server.shutdown().await;
}
