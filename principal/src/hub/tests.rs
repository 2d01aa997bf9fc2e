//! The hub's Applications path against the in-memory backend: no API server, the same
//! writes, watch cache and `Change`s the principal gets from Kubernetes.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::resync::{Checksums, SourceUids};
use argocd_agent_domain::{
    AgentIdentity, AgentMode, ClientIdentity, Event, EventType, Namespace, Payload, ResourceKind,
    ResourceRef, RuleSet,
};
use argocd_agent_identity::SpiffeId;
use argocd_agent_kubernetes::memory::MemoryStore;
use argocd_agent_kubernetes::object::{spec_checksum, status_checksum};
use argocd_agent_kubernetes::{Kind, ObjectStore, Scope};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{Applied, Hub, HubParts, HubShared, run_hub_watch};
use crate::config_objects::ConfigObjects;
use crate::inbound::{Decision, Placement, decide};
use crate::metrics::Metrics;
use crate::sessions::{AgentState, Sessions};

/// A hub over in-memory Applications (and empty configuration objects), its watch of the
/// Applications routed to the agents' workers as `wiring` does.
struct TestHub {
    hub: Arc<Hub>,
    apps: MemoryStore,
    namespaces: MemoryStore,
    projects: MemoryStore,
    shutdown: CancellationToken,
}

impl Drop for TestHub {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

fn view(kind: Kind) -> Arc<dyn argocd_agent_kubernetes::ObjectView> {
    Arc::new(MemoryStore::new(kind).watch(Scope::namespace("argocd")).0)
}

fn test_hub() -> TestHub {
    test_hub_with(false)
}

/// [`test_hub`], creating agents' hub namespaces when `create_namespace`.
fn test_hub_with(create_namespace: bool) -> TestHub {
    let apps = MemoryStore::new(Kind::Application);
    let namespaces = MemoryStore::new(Kind::Namespace);
    let projects = MemoryStore::new(Kind::AppProject);
    let (project_cache, project_changes) = projects.watch(Scope::namespace("argocd"));
    let (cache, changes) = apps.watch(Scope::all());
    let shutdown = CancellationToken::new();
    let hub = Arc::new(Hub::new(HubParts {
        shared: HubShared {
            source: "principal".into(),
            namespaces: Arc::new(namespaces.clone()),
            metrics: Metrics::new(),
            sessions: Arc::new(Sessions::new(Default::default(), Default::default())),
            create_namespace,
            namespace_cache: None,
            namespace_labels: Default::default(),
            by_destination: false,
            bounds: Default::default(),
            tasks: TaskTracker::new(),
            shutdown: shutdown.clone(),
        },
        apps: Arc::new(apps.clone()),
        cache: Arc::new(cache),
        config: ConfigObjects::new(
            Namespace::new("argocd").unwrap(),
            true,
            Arc::new(project_cache),
            view(Kind::Secret),
            view(Kind::ConfigMap),
            Arc::new(projects.clone()),
        ),
        tenants: Default::default(),
    }));
    tokio::spawn(run_hub_watch(
        hub.clone(),
        ResourceKind::Application,
        changes,
        shutdown.clone(),
    ));
    tokio::spawn(run_hub_watch(
        hub.clone(),
        ResourceKind::AppProject,
        project_changes,
        shutdown.clone(),
    ));
    TestHub {
        hub,
        apps,
        namespaces,
        projects,
        shutdown,
    }
}

/// Agent `name`, owning hub namespace `argocd-<name>`, in `mode`.
fn identity(name: &str, mode: &str) -> AgentIdentity {
    RuleSet::from_flags(&[format!(
        "template:spiffe://{{trust_domain}}/sa/{{sa}}=>{{sa}},namespace=argocd-{{sa}},mode={mode}"
    )])
    .unwrap()
    .map_client(&ClientIdentity::Spiffe(
        SpiffeId::parse(&format!("spiffe://example.org/sa/{name}")).unwrap(),
    ))
    .unwrap()
}

impl TestHub {
    /// Agent `name` connected in `mode`, its worker running.
    fn connect(&self, name: &str, mode: AgentMode) -> Arc<AgentState> {
        let mode_flag = match mode {
            AgentMode::Managed => "managed",
            AgentMode::Autonomous => "autonomous",
        };
        let state = self
            .hub
            .attach(identity(name, mode_flag), mode, 1, CancellationToken::new());
        // As after a connect-time round with nothing to put right.
        state.release_changes(1);
        state
    }
}

fn app(ns: &str, name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }))
    .unwrap()
}

fn app_ref(ns: &str, name: &str) -> ResourceRef {
    ResourceRef::new(ResourceKind::Application, Namespace::new(ns).unwrap(), name)
}

/// The next event queued for the agent, if one comes within a moment.
async fn next_event(state: &AgentState) -> Option<Event> {
    tokio::time::timeout(Duration::from_millis(200), state.queue.next())
        .await
        .ok()
}

/// Every event queued for the agent now (each object's first), by type and object name.
async fn queued(state: &AgentState) -> Vec<(EventType, String)> {
    let mut out = Vec::new();
    while let Ok(e) = tokio::time::timeout(Duration::from_millis(50), state.queue.next()).await {
        out.push((e.ty, e.resource.map(|r| r.name).unwrap_or_default()));
    }
    out.sort_by(|a, b| a.1.cmp(&b.1));
    out
}

#[tokio::test]
async fn a_hub_change_goes_to_the_agent_owning_its_namespace_only() {
    let t = test_hub();
    let edge1 = t.connect("edge-1", AgentMode::Managed);
    let edge2 = t.connect("edge-2", AgentMode::Managed);
    t.apps
        .create(&app(
            "argocd-edge-1",
            "guestbook",
            json!({"project": "default"}),
        ))
        .await
        .unwrap();

    let sent = next_event(&edge1).await.expect("a spec-update for edge-1");
    assert_eq!(sent.ty, EventType::SpecUpdate);
    assert_eq!(sent.resource, Some(app_ref("argocd-edge-1", "guestbook")));
    assert!(
        next_event(&edge2).await.is_none(),
        "edge-2 owns another namespace"
    );

    // Acknowledged, then deleted on the hub: the owner is told to delete its copy.
    assert!(edge1.queue.ack(&sent.id).is_some());
    t.apps
        .delete(Some("argocd-edge-1"), "guestbook")
        .await
        .unwrap();
    let deleted = next_event(&edge1).await.expect("a delete for edge-1");
    assert_eq!(deleted.ty, EventType::Delete);
    assert!(next_event(&edge2).await.is_none());
}

#[tokio::test]
async fn a_hub_change_before_the_connect_round_is_not_sent_twice() {
    let t = test_hub();
    let ns = "argocd-edge-1";
    // Registered, its connect-time round not run yet: a hub change comes in meanwhile.
    let state = t.hub.attach(
        identity("edge-1", "managed"),
        AgentMode::Managed,
        7,
        CancellationToken::new(),
    );
    t.apps
        .create(&app(ns, "guestbook", json!({"project": "default"})))
        .await
        .unwrap();
    // The change waits for the round: nothing is queued by the worker meanwhile.
    assert!(next_event(&state).await.is_none(), "held until the round");
    // The round (the agent holds nothing) queues the Application once; then the change
    // that waited finds it queued already and adds nothing.
    let empty = Checksums::default();
    t.hub
        .apps
        .resync_managed(&state, &empty, &SourceUids::default(), &empty);
    state.release_changes(7);
    let mut events = Vec::new();
    while let Some(e) = next_event(&state).await {
        assert!(state.queue.ack(&e.id).is_some());
        events.push((e.ty, e.resource.map(|r| r.name).unwrap_or_default()));
    }
    assert_eq!(
        events,
        [(EventType::SpecUpdate, "guestbook".to_string())],
        "one delivery, not one from the round and one from the change"
    );
    // Later changes flow as before.
    t.apps
        .create(&app(ns, "second", json!({"project": "default"})))
        .await
        .unwrap();
    let next = next_event(&state).await.expect("a change after the round");
    assert_eq!(next.resource, Some(app_ref(ns, "second")));
}

#[tokio::test]
async fn an_acknowledged_delete_lets_the_hub_deletion_finish() {
    let t = test_hub();
    let edge1 = t.connect("edge-1", AgentMode::Managed);
    let mut held = app("argocd-edge-1", "guestbook", json!({"project": "default"}));
    held.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    t.apps.create(&held).await.unwrap();
    let sent = next_event(&edge1).await.expect("a spec-update");
    edge1.queue.ack(&sent.id).unwrap();

    // Deleted on the hub: finalizers hold it until the spoke has deleted its copy.
    t.apps
        .delete(Some("argocd-edge-1"), "guestbook")
        .await
        .unwrap();
    let delete = next_event(&edge1).await.expect("a delete");
    assert_eq!(delete.ty, EventType::Delete);
    assert!(t.apps.object(Some("argocd-edge-1"), "guestbook").is_some());
    let (key, delivered) = edge1.queue.ack(&delete.id).unwrap();
    t.hub.apps.on_ack(&edge1, key, &delivered).await;
    assert!(
        t.apps.object(Some("argocd-edge-1"), "guestbook").is_none(),
        "the spoke's acknowledgement removed the finalizers"
    );
}

#[tokio::test]
async fn an_agents_hub_namespace_is_created_once_and_labelled_with_it() {
    let t = test_hub_with(true);
    let ns = Namespace::new("argocd-edge-1").unwrap();
    let agent = argocd_agent_domain::AgentName::new("edge-1").unwrap();
    t.hub.ensure_namespace(&ns, &agent).await;
    let created = t.namespaces.object(None, "argocd-edge-1").expect("created");
    let labels = created.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get(argocd_agent_kubernetes::AGENT_NAME_LABEL)
            .map(String::as_str),
        Some("edge-1")
    );
    let writes = t.namespaces.revision();
    t.hub.ensure_namespace(&ns, &agent).await;
    assert_eq!(
        t.namespaces.revision(),
        writes,
        "an existing namespace is kept"
    );
}

#[tokio::test]
async fn the_connect_resync_sends_what_differs_and_deletes_what_the_hub_lacks() {
    let t = test_hub();
    let ns = "argocd-edge-1";
    let same = t
        .apps
        .create(&app(ns, "same", json!({"project": "default"})))
        .await
        .unwrap();
    t.apps
        .replace_status(Some(ns), "same", json!({"health": {"status": "Healthy"}}))
        .await
        .unwrap();
    t.apps
        .create(&app(ns, "changed", json!({"project": "default", "rev": 2})))
        .await
        .unwrap();
    let mut held = app(ns, "leaving", json!({"project": "default"}));
    held.metadata.finalizers = Some(vec!["resources-finalizer.argocd.argoproj.io".into()]);
    t.apps.create(&held).await.unwrap();
    t.apps.delete(Some(ns), "leaving").await.unwrap();
    // The connect-time round runs before the agent's worker takes any change.
    let state = t
        .hub
        .shared
        .sessions
        .attach(
            identity("edge-1", "managed"),
            AgentMode::Managed,
            1,
            CancellationToken::new(),
        )
        .0;

    let agent: Checksums = [
        ("same".to_string(), spec_checksum(&same)),
        ("changed".to_string(), "an older spec".to_string()),
        (
            "gone".to_string(),
            "deleted on the hub while apart".to_string(),
        ),
    ]
    .into();
    let statuses: Checksums = [("same".to_string(), status_checksum(&same))].into();
    let requests = t
        .hub
        .apps
        .resync_managed(&state, &agent, &SourceUids::default(), &statuses);

    assert_eq!(
        queued(&state).await,
        [
            (EventType::SpecUpdate, "changed".to_string()),
            (EventType::Delete, "gone".to_string()),
            (EventType::Delete, "leaving".to_string()),
        ]
    );
    // The status the agent last sent (none, for `same`) is not the hub's: asked for again.
    let asked: Vec<_> = requests
        .iter()
        .map(|e| (e.ty, e.resource.clone()))
        .collect();
    assert_eq!(
        asked,
        [(EventType::RequestUpdate, Some(app_ref(ns, "same")))]
    );
}

fn status_update(ns: &str, name: &str, status: Value) -> Event {
    Event::resource(
        "spoke",
        EventType::StatusUpdate,
        app_ref(ns, name),
        Payload::Object(Arc::new(
            json!({"metadata": {"name": name}, "status": status}),
        )),
    )
}

/// What the hub decides on `event` from `state`'s agent, as the session asks it.
fn decision(t: &TestHub, state: &AgentState, event: &Event) -> Decision {
    let resource = event.resource.as_ref().unwrap();
    let owner = t.hub.owner_record(&state.name, resource);
    decide(
        &state.identity(),
        state.mode(),
        event,
        &owner,
        &Placement::Namespace,
    )
}

#[tokio::test]
async fn a_status_write_lands_in_the_agents_own_namespace_and_nowhere_else() {
    let t = test_hub();
    let edge1 = t.connect("edge-1", AgentMode::Managed);
    let spec = json!({"project": "default"});
    t.apps
        .create(&app("argocd-edge-1", "mine", spec.clone()))
        .await
        .unwrap();
    t.apps
        .create(&app("argocd-edge-2", "theirs", spec.clone()))
        .await
        .unwrap();
    let mut labelled = app("argocd-edge-1", "edge-9s", spec.clone());
    labelled.metadata.labels = Some(
        [(
            argocd_agent_kubernetes::AGENT_NAME_LABEL.to_string(),
            "edge-9".to_string(),
        )]
        .into(),
    );
    t.apps.create(&labelled).await.unwrap();
    let healthy = json!({"health": {"status": "Healthy"}});

    // Another agent's namespace: refused before anything is written.
    let other_ns = status_update("argocd-edge-2", "theirs", healthy.clone());
    let Decision::Refuse(refusal) = decision(&t, &edge1, &other_ns) else {
        panic!("a status write into another agent's namespace must be refused");
    };
    assert_eq!(refusal.reason, "Forbidden");
    // In its own namespace, an object another agent wrote: refused too.
    let other_owner = status_update("argocd-edge-1", "edge-9s", healthy.clone());
    assert!(matches!(
        decision(&t, &edge1, &other_owner),
        Decision::Refuse(_)
    ));
    for (ns, name) in [("argocd-edge-2", "theirs"), ("argocd-edge-1", "edge-9s")] {
        let obj = t.apps.object(Some(ns), name).unwrap();
        assert!(obj.data.get("status").is_none(), "{ns}/{name} untouched");
    }

    // Its own Application: admitted, applied through /status, the spec left alone.
    let own = status_update("argocd-edge-1", "mine", healthy.clone());
    let Decision::Apply(command) = decision(&t, &edge1, &own) else {
        panic!("a status write of the agent's own Application is applied");
    };
    t.hub.admit(&edge1, &own, &command).unwrap();
    assert_eq!(t.hub.apply(&edge1, command).await.unwrap(), Applied::Ack);
    let written = t.apps.object(Some("argocd-edge-1"), "mine").unwrap();
    assert_eq!(written.data["status"], healthy);
    assert_eq!(written.data["spec"], spec);
    assert_eq!(
        written.metadata.generation,
        Some(1),
        "status is no spec change"
    );
}

#[tokio::test]
async fn an_autonomous_agents_project_lands_on_the_hub_under_its_name_and_goes_with_it() {
    let t = test_hub();
    let edge1 = t.connect("edge-1", AgentMode::Autonomous);
    let project = ResourceRef::new(
        ResourceKind::AppProject,
        Namespace::new("argocd-edge-1").unwrap(),
        "default",
    );
    let upsert = crate::inbound::Command::Upsert {
        resource: project.clone(),
        object: Arc::new(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "default", "namespace": "argocd"},
            "spec": {"sourceRepos": ["*"]},
        })),
    };
    assert_eq!(t.hub.apply(&edge1, upsert).await.unwrap(), Applied::Ack);
    let copy = t
        .projects
        .object(Some("argocd"), "edge-1-default")
        .expect("the hub copy, named for the agent");
    assert_eq!(copy.data["spec"]["sourceRepos"], json!(["*"]));
    let labels = copy.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels
            .get(argocd_agent_kubernetes::AGENT_NAME_LABEL)
            .map(String::as_str),
        Some("edge-1")
    );

    // A hub edit of the copy is reverted to what the agent sent, by the agent's worker.
    let mut edited = t.projects.object(Some("argocd"), "edge-1-default").unwrap();
    let sent = edited.data["spec"].clone();
    edited.data["spec"] = json!({"sourceRepos": ["https://example.com/*"]});
    t.projects.replace(&edited).await.unwrap();
    let reverted = async {
        loop {
            let spec = t
                .projects
                .object(Some("argocd"), "edge-1-default")
                .unwrap()
                .data["spec"]
                .clone();
            if spec == sent {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), reverted)
        .await
        .expect("the hub edit reverted");

    let delete = crate::inbound::Command::Delete { resource: project };
    assert_eq!(t.hub.apply(&edge1, delete).await.unwrap(), Applied::Ack);
    assert!(
        t.projects
            .object(Some("argocd"), "edge-1-default")
            .is_none()
    );
}

#[tokio::test]
async fn a_replica_keeps_its_served_agents_applications_decoded_and_the_others_compact() {
    let t = test_hub();
    let cache = t.hub.apps.cache.clone();
    cache.shard();
    for ns in ["argocd-edge-1", "argocd-edge-2"] {
        for name in ["a", "b"] {
            t.apps
                .create(&app(ns, name, json!({"project": "default"})))
                .await
                .unwrap();
        }
    }
    while cache.len() < 4 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(cache.forms(), (0, 4), "nobody is served: all compact");

    let hold = t.hub.hold_shard(&Namespace::new("argocd-edge-1").unwrap());
    assert_eq!(
        cache.forms(),
        (2, 2),
        "the served agent's namespace is decoded"
    );
    let first = cache.get(Some("argocd-edge-1"), "a").unwrap();
    assert!(Arc::ptr_eq(
        &first,
        &cache.get(Some("argocd-edge-1"), "a").unwrap()
    ));

    // An agent whose namespace is compact still gets its Applications on resync.
    let state = t
        .hub
        .shared
        .sessions
        .attach(
            identity("edge-2", "managed"),
            AgentMode::Managed,
            1,
            CancellationToken::new(),
        )
        .0;
    let none = Checksums::default();
    t.hub
        .apps
        .resync_managed(&state, &none, &SourceUids::default(), &none);
    assert_eq!(
        queued(&state).await,
        [
            (EventType::SpecUpdate, "a".to_string()),
            (EventType::SpecUpdate, "b".to_string()),
        ]
    );

    drop(hold);
    assert_eq!(cache.forms(), (0, 4), "the session ended: compact again");
}
