//! Labels and annotations of Applications with Argo CD's semantics, end to end with the real
//! binaries and the Argo CD stand-in on the spokes (which carries out refresh requests as
//! Argo CD's application controller does: reconcile, then remove the annotation).
//!
//! Managed: label and annotation changes on the hub reach the spoke; a refresh requested on
//! the hub goes down, the spoke's Argo CD carries it out and removes it, and the hub copy
//! loses it too; then nothing moves any more. Autonomous: a refresh requested on the hub
//! copy reaches the spoke the same way; the hub's notifications controller (stand-in)
//! notifies once for a sync and its state survives changes from the spoke, so it never
//! notifies twice.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);
const REFRESH: &str = "argocd.argoproj.io/refresh";
const NOTIFIED: &str = "notified.notifications.argoproj.io";

fn annotation<'a>(app: &'a Value, key: &str) -> Option<&'a str> {
    app["metadata"]["annotations"][key].as_str()
}

fn version(app: Option<Value>) -> String {
    app.and_then(|a| a["metadata"]["resourceVersion"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Both copies keep their resourceVersion for a few seconds: nothing loops.
async fn settled(
    topo: &Topology,
    spoke: &argocd_agent_kube_test_server::KubeTestServer,
    hub_ns: &str,
    name: &str,
) -> Result<(), HarnessError> {
    // Let the stand-in's last writes and their reports land first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = (
        version(stored_app(&topo.hub, hub_ns, name)),
        version(stored_app(spoke, SPOKE_NS, name)),
    );
    tokio::time::sleep(Duration::from_secs(4)).await;
    let after = (
        version(stored_app(&topo.hub, hub_ns, name)),
        version(stored_app(spoke, SPOKE_NS, name)),
    );
    if before != after {
        return Err(format!(
            "still changing (hub, spoke) resourceVersions {before:?} -> {after:?}"
        )
        .into());
    }
    Ok(())
}

async fn with_topology(agent: &'static str) {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![agent]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = if agent == MANAGED {
        managed(&topo).await
    } else {
        autonomous(&topo).await
    };
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_labels_annotations_and_refresh_reach_the_spoke_and_refresh_ends_on_the_hub() {
    with_topology(MANAGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_refresh_reaches_the_spoke_and_the_hubs_notification_state_survives() {
    with_topology(AUTONOMOUS).await;
}

async fn managed(topo: &Topology) -> Result<(), HarnessError> {
    topo.wait_connected(MANAGED, T).await?;
    let name = "guestbook";
    let hub = apps(&topo.hub, MANAGED)?;
    let spoke = &topo.managed_spoke;
    hub.create(
        &PostParams::default(),
        &sample_app(name, MANAGED, "guestbook"),
    )
    .await?;
    eventually("hub create reaches the spoke", T, || async {
        stored_app(spoke, SPOKE_NS, name)
    })
    .await?;
    let _sim = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
        apps(spoke, SPOKE_NS)?,
        Duration::from_millis(500),
    )));
    eventually("spoke status reaches the hub", T, || async {
        stored_app(&topo.hub, MANAGED, name)
            .filter(|a| a["status"]["health"]["status"] == "Healthy")
    })
    .await?;

    // A label and an annotation changed on the hub (a notification subscription, say)
    // reach the spoke, without a spec change.
    let sub = "notifications.argoproj.io/subscribe.on-sync-succeeded.slack";
    merge_patch(
        &hub,
        name,
        json!({"metadata": {"labels": {"team": "a"}, "annotations": {sub: "ops"}}}),
    )
    .await?;
    eventually("hub label and annotation reach the spoke", T, || async {
        stored_app(spoke, SPOKE_NS, name)
            .filter(|a| a["metadata"]["labels"]["team"] == "a" && annotation(a, sub) == Some("ops"))
    })
    .await?;

    // Refresh on the hub: down to the spoke, carried out there (reconciledAt moves, the
    // annotation goes), then gone from the hub copy too.
    let reconciled = stored_app(spoke, SPOKE_NS, name).map(|a| a["status"]["reconciledAt"].clone());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    merge_patch(
        &hub,
        name,
        json!({"metadata": {"annotations": {REFRESH: "hard"}}}),
    )
    .await?;
    eventually(
        "the spoke's Argo CD carries out the hub's refresh",
        T,
        || async {
            stored_app(spoke, SPOKE_NS, name).filter(|a| {
                annotation(a, REFRESH).is_none()
                    && Some(a["status"]["reconciledAt"].clone()) != reconciled
            })
        },
    )
    .await?;
    eventually("the refresh request ends on the hub", T, || async {
        stored_app(&topo.hub, MANAGED, name).filter(|a| annotation(a, REFRESH).is_none())
    })
    .await?;
    let spoke_app = stored_app(spoke, SPOKE_NS, name).ok_or("spoke copy gone")?;
    assert_eq!(annotation(&spoke_app, sub), Some("ops"), "{spoke_app}");
    settled(topo, spoke, MANAGED, name).await?;
    let hub_app = stored_app(&topo.hub, MANAGED, name).ok_or("hub copy gone")?;
    assert_eq!(annotation(&hub_app, REFRESH), None, "{hub_app}");
    Ok(())
}

async fn autonomous(topo: &Topology) -> Result<(), HarnessError> {
    topo.wait_connected(AUTONOMOUS, T).await?;
    let name = "guestbook";
    let spoke = &topo.autonomous_spoke;
    let local = apps(spoke, SPOKE_NS)?;
    let hub = apps(&topo.hub, AUTONOMOUS)?;
    local
        .create(
            &PostParams::default(),
            &sample_app(name, SPOKE_NS, "guestbook"),
        )
        .await?;
    let _sim = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
        apps(spoke, SPOKE_NS)?,
        Duration::from_millis(500),
    )));
    eventually(
        "the spoke's application and status reach the hub",
        T,
        || async {
            stored_app(&topo.hub, AUTONOMOUS, name)
                .filter(|a| a["status"]["health"]["status"] == "Healthy")
        },
    )
    .await?;

    // Refresh on the hub copy reaches the spoke, whose Argo CD carries it out; the hub
    // copy follows the spoke and ends without it.
    let reconciled = stored_app(spoke, SPOKE_NS, name).map(|a| a["status"]["reconciledAt"].clone());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    merge_patch(
        &hub,
        name,
        json!({"metadata": {"annotations": {REFRESH: "normal"}}}),
    )
    .await?;
    eventually(
        "the hub copy's refresh is carried out on the spoke",
        T,
        || async {
            stored_app(spoke, SPOKE_NS, name).filter(|a| {
                annotation(a, REFRESH).is_none()
                    && Some(a["status"]["reconciledAt"].clone()) != reconciled
            })
        },
    )
    .await?;
    eventually(
        "the hub copy ends without the refresh request",
        T,
        || async {
            stored_app(&topo.hub, AUTONOMOUS, name).filter(|a| annotation(a, REFRESH).is_none())
        },
    )
    .await?;

    // The hub's notifications controller (the stand-in) notifies once for a sync issued on
    // the hub copy and records that in its state annotation; the state survives later
    // changes from the spoke, so nothing is sent twice (upstream argocd-agent issue #1058).
    let sent = argocd_agent_testkit::fake_notifications::Sent::default();
    let _notifications = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_notifications::run(
        apps(&topo.hub, AUTONOMOUS)?,
        Duration::from_millis(300),
        sent.clone(),
    )));
    merge_patch(
        &hub,
        name,
        json!({"metadata": {"annotations": {
            "notifications.argoproj.io/subscribe.on-sync-succeeded.slack": "ops"}},
            "operation": {"initiatedBy": {"username": "admin"}, "sync": {}}}),
    )
    .await?;
    let copy = eventually(
        "the sync ran on the spoke and the hub's controller notified",
        T,
        || async {
            stored_app(&topo.hub, AUTONOMOUS, name).filter(|a| annotation(a, NOTIFIED).is_some())
        },
    )
    .await?;
    let state = annotation(&copy, NOTIFIED).ok_or("no state")?.to_owned();
    merge_patch(
        &local,
        name,
        json!({"spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await?;
    let copy = eventually("the spoke's spec change reaches the hub", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, name)
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v2")
    })
    .await?;
    assert_eq!(annotation(&copy, NOTIFIED), Some(state.as_str()), "{copy}");
    settled(topo, spoke, AUTONOMOUS, name).await?;
    let copy = stored_app(&topo.hub, AUTONOMOUS, name).ok_or("hub copy gone")?;
    assert_eq!(annotation(&copy, NOTIFIED), Some(state.as_str()), "{copy}");
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "one sync, one notification: {sent:?}");
    assert_eq!(annotation(&copy, REFRESH), None, "{copy}");
    Ok(())
}
