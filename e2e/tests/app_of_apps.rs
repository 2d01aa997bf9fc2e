//! App-of-apps on a managed spoke, end to end with the real binaries and the Argo CD
//! stand-in on the spoke playing the parent's sync (children created, updated, pruned):
//! the children appear on the hub, read-only, in the agent's namespace, with their status;
//! hub edits and deletions of them are reverted; a child pruned on the spoke, or left
//! without its parent, goes from the hub; another agent can neither write into that
//! namespace nor take a hub-authored Application's name for a child.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Namespace, Payload, ResourceKind, ResourceRef};
use argocd_agent_testkit::app_of_apps::REPO_CONFIGMAP;
use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
const AGENT_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";
const PARENT: &str = "argocd-agent.argoproj-labs.io/parent-application";

/// A child Application manifest as it would sit in the parent's repository.
fn child_manifest(name: &str, revision: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "labels": {"tier": "child"}},
        "spec": {
            "project": "default",
            "source": {"repoURL": "https://github.com/argoproj/argocd-example-apps",
                       "path": "guestbook", "targetRevision": revision},
            "destination": {"server": "https://kubernetes.default.svc", "namespace": name}
        }
    })
}

/// Writes the repository stand-in's `apps` path on the spoke.
async fn set_repo(topo: &Topology, children: &[Value]) -> Result<(), HarnessError> {
    let api = configmaps(&topo.managed_spoke, SPOKE_NS)?;
    let cm = object(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": REPO_CONFIGMAP, "namespace": SPOKE_NS},
        "data": {"apps": serde_json::to_string(children)?}
    }));
    match api.get_opt(REPO_CONFIGMAP).await? {
        None => {
            api.create(&PostParams::default(), &cm).await?;
        }
        Some(_) => {
            merge_patch(&api, REPO_CONFIGMAP, json!({"data": cm.data["data"]})).await?;
        }
    }
    Ok(())
}

fn hub_child(topo: &Topology, name: &str) -> Option<Value> {
    stored_app(&topo.hub, MANAGED, name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_app_of_apps_children_reach_the_hub_read_only() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = scenario(&topo).await;
    topo.finish(r).await;
}

async fn scenario(topo: &Topology) -> Result<(), HarnessError> {
    let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
    let _controller = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
        spoke.clone(),
        Duration::from_millis(300),
    )));
    set_repo(
        topo,
        &[
            child_manifest("child-a", "HEAD"),
            child_manifest("child-b", "HEAD"),
        ],
    )
    .await?;
    // The parent, authored on the hub: its source renders the children into `argocd`.
    let hub = apps(&topo.hub, MANAGED)?;
    let mut parent = serde_json::to_value(sample_app("parent", MANAGED, "apps"))?;
    parent["spec"]["destination"]["namespace"] = json!(SPOKE_NS);
    hub.create(&PostParams::default(), &object(parent)).await?;

    // The children reach the hub: labelled with the agent, naming their parent, with the
    // status the spoke's Argo CD gives them.
    for name in ["child-a", "child-b"] {
        eventually(&format!("{name} on the hub with its status"), T, || async {
            let c = hub_child(topo, name)?;
            (c["metadata"]["labels"][AGENT_LABEL] == MANAGED
                && c["metadata"]["annotations"][PARENT] == "parent"
                && c["metadata"]["labels"]["tier"] == "child"
                && c["status"]["sync"]["status"] == "Synced")
                .then_some(())
        })
        .await?;
    }
    // The parent's own status lists them (it is a managed copy; status flows as ever).
    eventually("the parent's resources on the hub", T, || async {
        let p = stored_app(&topo.hub, MANAGED, "parent")?;
        (p["status"]["resources"].as_array()?.len() == 2).then_some(())
    })
    .await?;

    // Read-only on the hub: an edit is reverted, a deletion undone.
    merge_patch(
        &hub,
        "child-a",
        json!({"spec": {"source": {"targetRevision": "hacked"}}}),
    )
    .await?;
    eventually("hub edit of a child reverted", T, || async {
        (hub_child(topo, "child-a")?["spec"]["source"]["targetRevision"] == "HEAD").then_some(())
    })
    .await?;
    let uid = hub_child(topo, "child-a").ok_or("child-a missing")?["metadata"]["uid"].clone();
    hub.delete("child-a", &DeleteParams::default()).await?;
    eventually("hub deletion of a child undone", T, || async {
        let c = hub_child(topo, "child-a")?;
        (c["metadata"]["uid"] != uid && c["metadata"]["annotations"][PARENT] == "parent")
            .then_some(())
    })
    .await?;
    // The spoke's child was never touched by that.
    let spoke_child =
        stored_app(&topo.managed_spoke, SPOKE_NS, "child-a").ok_or("spoke child-a")?;
    assert_eq!(spoke_child["spec"]["source"]["targetRevision"], "HEAD");

    // The repository changes: child-a moves to v2, child-b is pruned on the spoke; the
    // hub follows.
    set_repo(topo, &[child_manifest("child-a", "v2")]).await?;
    eventually("child-a updated on the hub", T, || async {
        (hub_child(topo, "child-a")?["spec"]["source"]["targetRevision"] == "v2").then_some(())
    })
    .await?;
    eventually("pruned child-b gone from the hub", T, || async {
        hub_child(topo, "child-b").is_none().then_some(())
    })
    .await?;

    cross_agent_attempts(topo).await?;

    // The parent deleted on the hub (no cascade: its children stay on the spoke, no longer
    // anyone's children): their hub copies go.
    hub.delete("parent", &DeleteParams::default()).await?;
    eventually("orphaned child gone from the hub", T, || async {
        (hub_child(topo, "child-a").is_none() && stored_app(&topo.hub, MANAGED, "parent").is_none())
            .then_some(())
    })
    .await?;
    assert!(
        stored_app(&topo.managed_spoke, SPOKE_NS, "child-a").is_some(),
        "the spoke keeps its own Application"
    );
    Ok(())
}

/// Another agent (the second identity, in managed mode) tries to write a child into the
/// first agent's namespace, to delete its child, and to take the name of a hub-authored
/// Application in its own namespace: all refused, nothing changed.
async fn cross_agent_attempts(topo: &Topology) -> Result<(), HarnessError> {
    let own = apps(&topo.hub, AUTONOMOUS)?;
    create_namespace(&topo.hub, AUTONOMOUS).await.ok();
    own.create(
        &PostParams::default(),
        &sample_app("hub-made", AUTONOMOUS, "guestbook"),
    )
    .await?;
    let before = stored_app(&topo.hub, AUTONOMOUS, "hub-made").ok_or("hub-made missing")?;
    let victim_before = hub_child(topo, "child-a").ok_or("child-a missing")?;

    let source = topo.svid_source("autonomous.sock").await?;
    let ((tx, mut inbound), _welcome) = open_agent_stream(
        &source,
        topo.principal_addr,
        argocd_agent_proto::eventstream::AgentMode::Managed,
    )
    .await?;
    let child_event = |ty: EventType, ns: &str, name: &str| -> Result<Event, HarnessError> {
        let mut obj = child_manifest(name, "evil");
        obj["metadata"]["namespace"] = json!(ns);
        obj["metadata"]["annotations"] = json!({PARENT: "parent"});
        Ok(Event::resource(
            "test-client",
            ty,
            ResourceRef::new(ResourceKind::Application, Namespace::new(ns)?, name),
            Payload::Object(Arc::new(obj)),
        ))
    };
    let attempts = [
        (
            child_event(EventType::SpecUpdate, MANAGED, "child-a")?,
            "namespace",
        ),
        (
            child_event(EventType::Delete, MANAGED, "child-a")?,
            "namespace",
        ),
        (
            child_event(EventType::Create, MANAGED, "planted")?,
            "namespace",
        ),
        (
            child_event(EventType::SpecUpdate, AUTONOMOUS, "hub-made")?,
            "created on the hub",
        ),
        (
            child_event(EventType::Delete, AUTONOMOUS, "hub-made")?,
            "created on the hub",
        ),
    ];
    for (event, why) in &attempts {
        tx.send(event.to_cloud_event()).await?;
        let reply = answer_to(&mut inbound, &event.id).await?;
        match &reply.payload {
            Payload::Error(d) if d.reason == "Forbidden" && d.message.contains(why) => {}
            other => {
                return Err(format!(
                    "{} {:?}: expected Forbidden ({why}), got {other:?}",
                    event.ty, event.resource
                )
                .into());
            }
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = stored_app(&topo.hub, AUTONOMOUS, "hub-made").ok_or("hub-made deleted")?;
    assert_eq!(
        before["metadata"]["resourceVersion"],
        after["metadata"]["resourceVersion"]
    );
    // The first agent's child is still its own (its status may have moved meanwhile).
    let victim_after = hub_child(topo, "child-a").ok_or("child-a deleted")?;
    assert_eq!(
        victim_before["metadata"]["uid"],
        victim_after["metadata"]["uid"]
    );
    assert_eq!(victim_after["spec"]["source"]["targetRevision"], "v2");
    assert_eq!(victim_after["metadata"]["labels"][AGENT_LABEL], MANAGED);
    assert!(stored_app(&topo.hub, MANAGED, "planted").is_none());
    // The refusals are logged with the agent and the reason.
    assert!(
        topo.principal
            .log()
            .lines()
            .any(|l| l.contains("event refused") && l.contains("hub-made")),
        "refusal logged"
    );
    // The stand-in session ends; the test's own topology is unaffected.
    drop(tx);
    own.delete("hub-made", &DeleteParams::default()).await?;
    Ok(())
}

/// Children that went while the agent was away go from the hub at its next connect; those
/// still there keep their hub copy (no delete-and-recreate churn at a reconnect).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_gone_while_the_agent_was_away_leave_the_hub_at_reconnect() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        let controller = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
            spoke.clone(),
            Duration::from_millis(300),
        )));
        set_repo(
            &topo,
            &[
                child_manifest("keep", "HEAD"),
                child_manifest("drop", "HEAD"),
            ],
        )
        .await?;
        let mut parent = serde_json::to_value(sample_app("parent", MANAGED, "apps"))?;
        parent["spec"]["destination"]["namespace"] = json!(SPOKE_NS);
        apps(&topo.hub, MANAGED)?
            .create(&PostParams::default(), &object(parent))
            .await?;
        for name in ["keep", "drop"] {
            eventually(&format!("{name} on the hub"), T, || async {
                hub_child(&topo, name).map(|_| ())
            })
            .await?;
        }
        let keep_uid = hub_child(&topo, "keep").ok_or("keep")?["metadata"]["uid"].clone();
        topo.managed.as_mut().ok_or("no agent")?.stop().await;
        // While the agent is down the parent prunes `drop` on the spoke.
        set_repo(&topo, &[child_manifest("keep", "HEAD")]).await?;
        eventually("drop pruned on the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "drop")
                .is_none()
                .then_some(())
        })
        .await?;
        drop(controller);
        assert!(
            hub_child(&topo, "drop").is_some(),
            "nobody told the hub yet"
        );
        topo.managed.as_mut().ok_or("no agent")?.start()?;
        eventually("drop gone from the hub after the reconnect", T, || async {
            hub_child(&topo, "drop").is_none().then_some(())
        })
        .await?;
        let keep = hub_child(&topo, "keep").ok_or("keep gone from the hub")?;
        assert_eq!(keep["metadata"]["uid"], keep_uid, "kept, not recreated");
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// `--ignore-unmanaged-apps` (upstream's flag): the children stay on the spoke only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_unmanaged_apps_keeps_children_local() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        per_agent_args: vec![(MANAGED, vec!["--ignore-unmanaged-apps".into()])],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        let _controller = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
            spoke.clone(),
            Duration::from_millis(300),
        )));
        set_repo(&topo, &[child_manifest("local-child", "HEAD")]).await?;
        let mut parent = serde_json::to_value(sample_app("parent", MANAGED, "apps"))?;
        parent["spec"]["destination"]["namespace"] = json!(SPOKE_NS);
        apps(&topo.hub, MANAGED)?
            .create(&PostParams::default(), &object(parent))
            .await?;
        eventually("the child created on the spoke, Synced", T, || async {
            let c = stored_app(&topo.managed_spoke, SPOKE_NS, "local-child")?;
            (c["status"]["sync"]["status"] == "Synced").then_some(())
        })
        .await?;
        eventually(
            "the parent's status on the hub lists the child",
            T,
            || async {
                let p = stored_app(&topo.hub, MANAGED, "parent")?;
                (p["status"]["resources"].as_array()?.len() == 1).then_some(())
            },
        )
        .await?;
        assert!(
            hub_child(&topo, "local-child").is_none(),
            "the child stayed on the spoke"
        );
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
