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
