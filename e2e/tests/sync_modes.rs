//! Managed and autonomous mode, end to end with the real binaries, as one table: each mode
//! names its source of truth and its read-only mirror, and the same scenario runs on both.
//! Managed: the hub is the source; autonomous: the spoke is.

use std::time::Duration;

use argocd_agent_kube_test_server::KubeTestServer;
use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);

/// One cluster's copy of the agent's Applications.
struct Side<'a> {
    what: &'static str,
    server: &'a KubeTestServer,
    ns: &'static str,
}

impl Side<'_> {
    fn stored(&self, name: &str) -> Option<Value> {
        stored_app(self.server, self.ns, name)
    }
}

/// Which side a mode writes and which side follows.
struct Case<'a> {
    agent: &'static str,
    source: Side<'a>,
    mirror: Side<'a>,
    hub: Side<'a>,
    spoke: Side<'a>,
}

fn case<'a>(topo: &'a Topology, agent: &'static str) -> Case<'a> {
    let (spoke_server, hub_is_source) = if agent == MANAGED {
        (&topo.managed_spoke, true)
    } else {
        (&topo.autonomous_spoke, false)
    };
    let hub = || Side {
        what: "hub",
        server: &topo.hub,
        ns: agent,
    };
    let spoke = || Side {
        what: "spoke",
        server: spoke_server,
        ns: SPOKE_NS,
    };
    let (source, mirror) = if hub_is_source {
        (hub(), spoke())
    } else {
        (spoke(), hub())
    };
    Case {
        agent,
        source,
        mirror,
        hub: hub(),
        spoke: spoke(),
    }
}

async fn with_topology(agent: &'static str) {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![agent]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = scenario(&case(&topo, agent)).await;
    let logs = topo.logs();
    topo.stop().await;
    if let Err(e) = r {
        panic!("{agent}: {e}\n{logs}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_create_edit_delete_status_drift_and_operation() {
    with_topology(MANAGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_create_edit_delete_status_drift_and_operation() {
    with_topology(AUTONOMOUS).await;
}

fn revision(app: &Value) -> &str {
    app["spec"]["source"]["targetRevision"]
        .as_str()
        .unwrap_or_default()
}

async fn scenario(c: &Case<'_>) -> Result<(), HarnessError> {
    let source = apps(c.source.server, c.source.ns)?;
    let mirror = apps(c.mirror.server, c.mirror.ns)?;
    let spoke = apps(c.spoke.server, c.spoke.ns)?;
    let hub = apps(c.hub.server, c.hub.ns)?;
    let name = "guestbook";
    let (from, to) = (c.source.what, c.mirror.what);

    // A create on the source side reaches the mirror. An autonomous spoke's finalizer
    // names a controller of the spoke: the hub copy does not get it.
    let mut app = sample_app(name, c.source.ns, "guestbook");
    let autonomous = c.agent != MANAGED;
    if autonomous {
        app.metadata.finalizers = Some(vec!["e2e.example.com/spoke-only".into()]);
    }
    source.create(&PostParams::default(), &app).await?;
    let copy = eventually(&format!("{from} create reaches the {to}"), T, || async {
        c.mirror.stored(name)
    })
    .await?;
    if autonomous {
        assert_eq!(
            copy["metadata"]["finalizers"],
            Value::Null,
            "the spoke's finalizer was copied to the hub: {copy}"
        );
        merge_patch(&source, name, json!({"metadata": {"finalizers": null}})).await?;
    }

    // An edit on the source side reaches the mirror.
    merge_patch(
        &source,
        name,
        json!({"spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await?;
    eventually(&format!("{from} edit reaches the {to}"), T, || async {
        c.mirror.stored(name).filter(|a| revision(a) == "v2")
    })
    .await?;

    // Status is the spoke's (its Argo CD writes it) in both modes, and reaches the hub.
    set_status(
        &spoke,
        name,
        json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}),
    )
    .await?;
    eventually("spoke status reaches the hub", T, || async {
        c.hub
            .stored(name)
            .filter(|a| a["status"]["health"]["status"] == "Healthy")
    })
    .await?;

    // An edit on the mirror is reverted to the source's spec.
    merge_patch(
        &mirror,
        name,
        json!({"spec": {"source": {"targetRevision": "drift"}}}),
    )
    .await?;
    eventually(&format!("{to} edit reverted"), T, || async {
        c.mirror.stored(name).filter(|a| revision(a) == "v2")
    })
    .await?;

    // A delete on the mirror is reverted: the application comes back as a new object.
    let uid_before = c
        .mirror
        .stored(name)
        .and_then(|a| a["metadata"]["uid"].as_str().map(str::to_owned))
        .ok_or("mirror copy has no uid")?;
    mirror.delete(name, &DeleteParams::default()).await?;
    eventually(&format!("{to} delete reverted"), T, || async {
        c.mirror.stored(name).filter(|a| {
            revision(a) == "v2" && a["metadata"]["uid"].as_str() != Some(uid_before.as_str())
        })
    })
    .await?;

    // A sync operation requested on the hub (as `argocd app sync` does, by setting
    // `.operation`) reaches the spoke in both modes.
    let op =
        json!({"sync": {"revision": "v2", "prune": true}, "initiatedBy": {"username": "admin"}});
    merge_patch(&hub, name, json!({"operation": op})).await?;
    eventually("sync operation reaches the spoke", T, || async {
        c.spoke
            .stored(name)
            .filter(|a| a["operation"]["sync"]["revision"] == "v2")
    })
    .await?;

    // A delete on the source side reaches the mirror.
    source.delete(name, &DeleteParams::default()).await?;
    eventually(
        &format!("{from} delete reaches the {to} ({})", c.agent),
        T,
        || async { c.mirror.stored(name).is_none().then_some(()) },
    )
    .await?;
    Ok(())
}
