//! The spoke against the in-memory backend: a managed agent applying the principal's
//! events, no API server.

use super::*;
use argocd_agent_domain::QueueLimits;
use argocd_agent_kubernetes::memory::MemoryStore;
use argocd_agent_kubernetes::{Kind, ObjectStore, Scope};

/// A managed spoke whose Argo CD namespace is `argocd`, welcomed into hub namespace
/// `edge-1`, over in-memory Applications.
fn managed_spoke() -> (Spoke, MemoryStore) {
    let apps = MemoryStore::new(Kind::Application);
    let (cache, _changes) = apps.watch(Scope::namespace("argocd"));
    let spoke = Spoke::new(
        AgentMode::Managed,
        Namespace::new("argocd").unwrap(),
        "agent".into(),
        Arc::new(apps.clone()),
        Arc::new(cache),
        SendQueue::new(QueueLimits::default()),
        crate::config_objects::ConfigKinds::new(Vec::new()),
    );
    spoke.after_welcome(Namespace::new("edge-1").unwrap());
    (spoke, apps)
}

fn spec_update(spec: Value) -> Event {
    Event::resource(
        "principal",
        EventType::SpecUpdate,
        ResourceRef::new(
            ResourceKind::Application,
            Namespace::new("edge-1").unwrap(),
            "guestbook",
        ),
        Payload::Object(Arc::new(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "guestbook", "namespace": "edge-1", "uid": "hub-uid-1",
                         "labels": {"team": "a"}},
            "spec": spec,
        }))),
    )
}

#[tokio::test]
async fn a_managed_spec_update_writes_the_copy_and_keeps_the_spokes_status() {
    let (spoke, apps) = managed_spoke();
    let first = spec_update(json!({"project": "default", "source": {"targetRevision": "v1"}}));
    let reply = spoke.on_principal_event(&first).await.expect("an answer");
    assert_eq!(reply.ty, EventType::Processed, "{reply:?}");
    assert_eq!(reply.ack_id.as_deref(), Some(first.id.as_str()));

    let copy = apps.object(Some("argocd"), "guestbook").expect("the copy");
    assert_eq!(copy.data["spec"]["source"]["targetRevision"], "v1");
    let labels = copy.metadata.labels.clone().unwrap_or_default();
    assert!(labels.contains_key(MANAGED_LABEL), "{labels:?}");
    assert_eq!(labels.get("team").map(String::as_str), Some("a"));

    // The spoke's Argo CD reports a status; the next spec from the hub leaves it alone.
    let healthy = json!({"health": {"status": "Healthy"}});
    apps.replace_status(Some("argocd"), "guestbook", healthy.clone())
        .await
        .unwrap();
    let second = spec_update(json!({"project": "default", "source": {"targetRevision": "v2"}}));
    let reply = spoke.on_principal_event(&second).await.expect("an answer");
    assert_eq!(reply.ty, EventType::Processed, "{reply:?}");
    let copy = apps.object(Some("argocd"), "guestbook").unwrap();
    assert_eq!(copy.data["spec"]["source"]["targetRevision"], "v2");
    assert_eq!(copy.data["status"], healthy);
    assert_eq!(copy.metadata.generation, Some(2));

    // The same object again writes nothing.
    let written = apps.revision();
    let reply = spoke.on_principal_event(&second).await.expect("an answer");
    assert_eq!(reply.ty, EventType::Processed);
    assert_eq!(apps.revision(), written);
}

/// A managed spoke over in-memory Applications and AppProjects.
fn managed_spoke_with_projects() -> (Spoke, MemoryStore) {
    let apps = MemoryStore::new(Kind::Application);
    let (cache, _changes) = apps.watch(Scope::namespace("argocd"));
    let projects = MemoryStore::new(Kind::from(ResourceKind::AppProject));
    let (project_cache, _project_changes) = projects.watch(Scope::namespace("argocd"));
    let spoke = Spoke::new(
        AgentMode::Managed,
        Namespace::new("argocd").unwrap(),
        "agent".into(),
        Arc::new(apps),
        Arc::new(cache),
        SendQueue::new(QueueLimits::default()),
        crate::config_objects::ConfigKinds::new(vec![crate::config_objects::ConfigKind {
            kind: ResourceKind::AppProject,
            resources: Arc::new(projects.clone()),
            cache: Arc::new(project_cache),
        }]),
    );
    spoke.after_welcome(Namespace::new("edge-1").unwrap());
    (spoke, projects)
}

fn project_event(ty: EventType, name: &str, spec: Value) -> Event {
    Event::resource(
        "principal",
        ty,
        ResourceRef::new(
            ResourceKind::AppProject,
            Namespace::new("edge-1").unwrap(),
            name,
        ),
        Payload::Object(Arc::new(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": name, "namespace": "edge-1", "uid": "hub-uid-p"},
            "spec": spec,
        }))),
    )
}

#[tokio::test]
async fn a_managed_project_is_written_updated_and_deleted_and_a_local_one_is_left_alone() {
    let (spoke, projects) = managed_spoke_with_projects();
    let create = project_event(
        EventType::SpecUpdate,
        "team-a",
        json!({"sourceRepos": ["https://example.com/a.git"]}),
    );
    let reply = spoke.on_principal_event(&create).await.expect("an answer");
    assert_eq!(reply.ty, EventType::Processed, "{reply:?}");
    let copy = projects.object(Some("argocd"), "team-a").expect("the copy");
    assert_eq!(
        copy.data["spec"]["sourceRepos"][0],
        "https://example.com/a.git"
    );
    let labels = copy.metadata.labels.clone().unwrap_or_default();
    assert!(labels.contains_key(MANAGED_LABEL), "{labels:?}");

    let update = project_event(
        EventType::SpecUpdate,
        "team-a",
        json!({"sourceRepos": ["https://example.com/b.git"]}),
    );
    spoke.on_principal_event(&update).await.expect("an answer");
    let copy = projects.object(Some("argocd"), "team-a").unwrap();
    assert_eq!(
        copy.data["spec"]["sourceRepos"][0],
        "https://example.com/b.git"
    );

    let delete = project_event(EventType::Delete, "team-a", json!({}));
    let reply = spoke.on_principal_event(&delete).await.expect("an answer");
    assert_eq!(reply.ty, EventType::Processed, "{reply:?}");
    assert!(projects.object(Some("argocd"), "team-a").is_none());

    // A project the spoke made itself (no managed label) is not the principal's to delete.
    let local: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
        "metadata": {"name": "local", "namespace": "argocd"},
        "spec": {"sourceRepos": ["*"]},
    }))
    .unwrap();
    projects.create(&local).await.unwrap();
    let delete = project_event(EventType::Delete, "local", json!({}));
    spoke.on_principal_event(&delete).await.expect("an answer");
    assert!(
        projects.object(Some("argocd"), "local").is_some(),
        "a local project was deleted"
    );
}
