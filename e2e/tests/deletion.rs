//! Deleting Applications that carry Argo CD's finalizers, end to end with the real binaries
//! and the Argo CD stand-in on the spokes deleting as Argo CD's application controller does
//! (resources finalizer, then the post-delete hooks' finalizer).
//!
//! Managed: an Application deleted on the hub stays there, being deleted, until its spoke
//! copy (which holds the same finalizers) has been finalized by the spoke's Argo CD and is
//! gone; then the hub copy goes too. Nothing is left behind on either side, whether the
//! resources finalizer is the plain, the foreground or the background one. Autonomous: an
//! Application deleted on the spoke is finalized there, and its hub copy (which never holds
//! the spoke's finalizers) goes once it is gone.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(20);
const RESOURCES: &str = "resources-finalizer.argocd.argoproj.io";
const POST_DELETE: &str = "post-delete-finalizer.argocd.argoproj.io";

fn with_finalizers(name: &str, ns: &str, finalizers: &[&str]) -> DynamicObject {
    let mut v = serde_json::to_value(sample_app(name, ns, "guestbook")).unwrap();
    v["metadata"]["finalizers"] = json!(finalizers);
    serde_json::from_value(v).unwrap()
}

fn finalizers(app: &Value) -> Vec<String> {
    app["metadata"]["finalizers"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
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
async fn managed_hub_deletion_waits_for_the_spokes_argo_cd_to_finalize() {
    with_topology(MANAGED).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn autonomous_spoke_deletion_with_finalizers_removes_the_hub_copy_once_gone() {
    with_topology(AUTONOMOUS).await;
}

async fn managed(topo: &Topology) -> Result<(), HarnessError> {
    topo.wait_connected(MANAGED, T).await?;
    let hub = apps(&topo.hub, MANAGED)?;
    let spoke = &topo.managed_spoke;
    let cases = [
        ("plain", vec![RESOURCES, POST_DELETE]),
        (
            "foreground",
            vec!["resources-finalizer.argocd.argoproj.io/foreground"],
        ),
        (
            "background",
            vec!["resources-finalizer.argocd.argoproj.io/background"],
        ),
    ];
    for (name, f) in &cases {
        hub.create(&PostParams::default(), &with_finalizers(name, MANAGED, f))
            .await?;
    }
    for (name, f) in &cases {
        eventually("the spoke copy holds the hub's finalizers", T, || async {
            stored_app(spoke, SPOKE_NS, name).filter(|a| finalizers(a) == *f)
        })
        .await?;
    }
    // The spoke's Argo CD only now: nothing could have finalized anything before.
    let _sim = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
        apps(spoke, SPOKE_NS)?,
        Duration::from_millis(300),
    )));
    for (name, _) in &cases {
        eventually("the spoke's status reaches the hub", T, || async {
            stored_app(&topo.hub, MANAGED, name)
                .filter(|a| a["status"]["health"]["status"] == "Healthy")
        })
        .await?;
    }
    for (name, _) in &cases {
        hub.delete(name, &DeleteParams::default()).await?;
    }
    // While a spoke copy exists, its hub Application is still there (being deleted).
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let mut left = 0;
        for (name, _) in &cases {
            let on_spoke = stored_app(spoke, SPOKE_NS, name).is_some();
            let on_hub = stored_app(&topo.hub, MANAGED, name).is_some();
            if on_spoke && !on_hub {
                return Err(format!(
                    "{name}: gone from the hub while the spoke's Argo CD still finalizes it"
                )
                .into());
            }
            left += usize::from(on_spoke) + usize::from(on_hub);
        }
        if left == 0 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let state: Vec<_> = cases
                .iter()
                .map(|(n, _)| {
                    (
                        *n,
                        stored_app(spoke, SPOKE_NS, n).map(|a| finalizers(&a)),
                        stored_app(&topo.hub, MANAGED, n).map(|a| finalizers(&a)),
                    )
                })
                .collect();
            return Err(format!("deletions did not finish (name, spoke, hub): {state:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

async fn autonomous(topo: &Topology) -> Result<(), HarnessError> {
    topo.wait_connected(AUTONOMOUS, T).await?;
    let name = "guestbook";
    let spoke = &topo.autonomous_spoke;
    let local = apps(spoke, SPOKE_NS)?;
    local
        .create(
            &PostParams::default(),
            &with_finalizers(name, SPOKE_NS, &[RESOURCES, POST_DELETE]),
        )
        .await?;
    let _sim = AbortOnDrop(tokio::spawn(argocd_agent_testkit::fake_argocd::run(
        apps(spoke, SPOKE_NS)?,
        Duration::from_millis(300),
    )));
    let copy = eventually("the spoke's application reaches the hub", T, || async {
        stored_app(&topo.hub, AUTONOMOUS, name)
            .filter(|a| a["status"]["health"]["status"] == "Healthy")
    })
    .await?;
    if !finalizers(&copy).is_empty() {
        return Err(format!("the hub copy holds the spoke's finalizers: {copy}").into());
    }
    local.delete(name, &DeleteParams::default()).await?;
    // While the spoke's Argo CD still finalizes it, the hub copy stays; then both go.
    let deadline = tokio::time::Instant::now() + T;
    loop {
        let on_spoke = stored_app(spoke, SPOKE_NS, name).is_some();
        let on_hub = stored_app(&topo.hub, AUTONOMOUS, name).is_some();
        if on_spoke && !on_hub {
            return Err("the hub copy went while the spoke's Argo CD still finalized it".into());
        }
        if !on_spoke && !on_hub {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(
                format!("deletion did not finish (spoke: {on_spoke}, hub: {on_hub})").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}
