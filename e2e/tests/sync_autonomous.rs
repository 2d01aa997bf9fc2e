//! Autonomous mode, end to end with the real binaries: the spoke is the source of truth.

use std::time::Duration;

use argocd_agent_e2e::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_create_edit_delete_hub_revert_and_sync_operation() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
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
    let hub = apps(&topo.hub, AUTONOMOUS)?;
    let spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;

    // Create on the spoke reaches the hub namespace of the agent.
    spoke
        .create(
            &PostParams::default(),
            &sample_app("edge-app", SPOKE_NS, "helm-guestbook"),
        )
        .await?;
    eventually("spoke create reaches the hub", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, "edge-app")
    })
    .await?;

    // Edit on the spoke reaches the hub.
    merge_patch(
        &spoke,
        "edge-app",
        json!({"spec": {"source": {"targetRevision": "v3"}}}),
    )
    .await?;
    eventually("spoke edit reaches the hub", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, "edge-app")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v3")
    })
    .await?;

    // Spoke status reaches the hub.
    set_status(
        &spoke,
        "edge-app",
        json!({"sync": {"status": "OutOfSync"}, "health": {"status": "Progressing"}}),
    )
    .await?;
    eventually("spoke status reaches the hub", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, "edge-app")
            .filter(|a| a["status"]["health"]["status"] == "Progressing")
    })
    .await?;

    // A hub edit of an autonomous app is reverted.
    merge_patch(
        &hub,
        "edge-app",
        json!({"spec": {"source": {"targetRevision": "edited-on-hub"}}}),
    )
    .await?;
    eventually("hub edit reverted", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, "edge-app")
            .filter(|a| a["spec"]["source"]["targetRevision"] == "v3")
    })
    .await?;

    // A sync operation requested on the hub reaches the spoke (as `argocd app sync` does, by
    // setting `.operation`).
    let op =
        json!({"sync": {"revision": "v3", "prune": true}, "initiatedBy": {"username": "admin"}});
    merge_patch(&hub, "edge-app", json!({"operation": op})).await?;
    eventually("sync operation reaches the spoke", T, || async {
        stored_app(&topo.autonomous_spoke, SPOKE_NS, "edge-app")
            .filter(|a| a["operation"]["sync"]["revision"] == "v3")
    })
    .await?;

    // Delete on the spoke reaches the hub.
    spoke.delete("edge-app", &DeleteParams::default()).await?;
    eventually("spoke delete reaches the hub", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, "edge-app")
            .is_none()
            .then_some(())
    })
    .await?;
    Ok(())
}
