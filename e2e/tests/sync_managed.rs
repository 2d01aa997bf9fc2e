//! Managed mode, end to end with the real binaries: the hub is the source of truth.

use std::time::Duration;

use argocd_agent_e2e::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_create_edit_delete_status_and_local_drift() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = run(&topo).await;
    let logs = topo.logs();
    topo.stop().await;
    if let Err(e) = r {
        panic!("{e}\n{logs}");
    }
}

async fn run(topo: &Topology) -> Result<(), HarnessError> {
    let hub = apps(&topo.hub, MANAGED)?;
    let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;

    // Create on the hub reaches the spoke.
    hub.create(
        &PostParams::default(),
        &sample_app("guestbook", MANAGED, "guestbook"),
    )
    .await?;
    eventually("hub create reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
    })
    .await?;

    // Edit on the hub reaches the spoke.
    merge_patch(
        &hub,
        "guestbook",
        json!({"spec": {"source": {"targetRevision": "v2"}}}),
    )
    .await?;
    eventually("hub edit reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v2")
    })
    .await?;

    // Spoke status (written by the local Argo CD) reaches the hub.
    set_status(
        &spoke,
        "guestbook",
        json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}),
    )
    .await?;
    eventually("spoke status reaches the hub", T, || async {
        stored_app(&topo.hub, MANAGED, "guestbook")
            .filter(|a| a["status"]["health"]["status"] == "Healthy")
    })
    .await?;

    // A local edit on the spoke is reverted.
    merge_patch(
        &spoke,
        "guestbook",
        json!({"spec": {"source": {"targetRevision": "hacked"}}}),
    )
    .await?;
    eventually("local edit reverted", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v2")
    })
    .await?;

    // A local delete on the spoke is reverted: the application comes back as a new object.
    let uid_before = stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
        .and_then(|a| a["metadata"]["uid"].as_str().map(str::to_owned))
        .ok_or("spoke copy has no uid")?;
    spoke.delete("guestbook", &DeleteParams::default()).await?;
    eventually("local delete reverted", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook").filter(|a| {
            a["spec"]["source"]["targetRevision"] == "v2"
                && a["metadata"]["uid"].as_str() != Some(uid_before.as_str())
        })
    })
    .await?;

    // Delete on the hub reaches the spoke.
    hub.delete("guestbook", &DeleteParams::default()).await?;
    eventually("hub delete reaches the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
            .is_none()
            .then_some(())
    })
    .await?;
    Ok(())
}
