//! Managed agents meeting local objects, with upstream's policies: `--adoption-policy`
//! (and its per-object annotation), `--source-uid-mismatch-policy` when a hub object was
//! deleted and recreated while the agent was away, and `--on-application-recreate` after a
//! local deletion was reverted.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::Value;

const T: Duration = Duration::from_secs(20);
const MANAGED_LABEL: &str = "argocd-agent.argoproj-labs.io/managed-by-principal";
const SOURCE_UID: &str = "argocd.argoproj.io/source-uid";

async fn run(agent_args: &[&str], f: impl AsyncFnOnce(&mut Topology) -> Result<(), HarnessError>) {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = f(&mut topo).await;
    topo.finish(r).await;
}

fn path(app: &Value) -> &str {
    app["spec"]["source"]["path"].as_str().unwrap_or_default()
}

fn uid(v: &Value) -> String {
    v["metadata"]["uid"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_policy_never_keeps_local_apps_unless_the_hub_copy_says_always() {
    run(&["--adoption-policy", "never"], async |topo| {
        let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        let hub = apps(&topo.hub, MANAGED)?;
        let pp = PostParams::default();
        for name in ["kept", "adopted"] {
            spoke
                .create(&pp, &sample_app(name, SPOKE_NS, "local-path"))
                .await?;
        }
        hub.create(&pp, &sample_app("kept", MANAGED, "hub-path"))
            .await?;
        let mut adopted = sample_app("adopted", MANAGED, "hub-path");
        adopted.metadata.annotations = Some(
            [(
                "argocd.argoproj.io/adoption-policy".to_owned(),
                "always".to_owned(),
            )]
            .into(),
        );
        hub.create(&pp, &adopted).await?;

        eventually("annotated app adopted", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "adopted").filter(|a| {
                path(a) == "hub-path" && a["metadata"]["labels"][MANAGED_LABEL] == "true"
            })
        })
        .await?;
        eventually("refusal reported to the principal", T, || async {
            topo.principal
                .log()
                .lines()
                .any(|l| {
                    l.contains("agent reported an error") && l.contains("adoption policy is never")
                })
                .then_some(())
        })
        .await?;
        let kept = stored_app(&topo.managed_spoke, SPOKE_NS, "kept").ok_or("local app vanished")?;
        assert_eq!(path(&kept), "local-path", "the local app is left alone");
        assert!(kept["metadata"]["labels"].get(MANAGED_LABEL).is_none());
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_app_recreated_while_the_agent_was_away_is_recreated_or_updated_on_the_spoke() {
    run(&[], async |topo| {
        let hub = apps(&topo.hub, MANAGED)?;
        let pp = PostParams::default();
        let mut upserted = sample_app("upserted", MANAGED, "guestbook");
        upserted.metadata.annotations = Some(
            [(
                "argocd.argoproj.io/source-uid-mismatch-policy".to_owned(),
                "upsert".to_owned(),
            )]
            .into(),
        );
        hub.create(&pp, &sample_app("recreated", MANAGED, "guestbook"))
            .await?;
        hub.create(&pp, &upserted).await?;
        let spoke_uid = |name: &'static str| {
            let spoke = &topo.managed_spoke;
            async move { stored_app(spoke, SPOKE_NS, name).map(|a| uid(&a)) }
        };
        let (first_recreated, first_upserted) = (
            eventually("recreated reaches the spoke", T, || spoke_uid("recreated")).await?,
            eventually("upserted reaches the spoke", T, || spoke_uid("upserted")).await?,
        );
        let copy = stored_app(&topo.managed_spoke, SPOKE_NS, "recreated").unwrap();
        let hub_uid = uid(&stored_app(&topo.hub, MANAGED, "recreated").unwrap());
        assert_eq!(
            copy["metadata"]["annotations"][SOURCE_UID],
            hub_uid.as_str()
        );

        // While the agent and the principal are down (so no queued delete survives; only
        // the source UIDs in the hello tell the copies are stale), both are deleted and
        // created again with the same spec.
        topo.managed.as_mut().ok_or("no agent")?.stop().await;
        topo.principal.stop().await;
        for name in ["recreated", "upserted"] {
            hub.delete(name, &DeleteParams::default()).await?;
        }
        hub.create(&pp, &sample_app("recreated", MANAGED, "guestbook"))
            .await?;
        hub.create(&pp, &upserted).await?;
        let new_hub_uid = uid(&stored_app(&topo.hub, MANAGED, "recreated").unwrap());
        assert_ne!(hub_uid, new_hub_uid);
        let before = topo.connect_count(MANAGED);
        topo.principal.start()?;
        topo.managed.as_mut().ok_or("no agent")?.start()?;
        eventually("agent reconnected", T, || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;

        eventually(
            "recreate policy: a new local copy from the new hub object",
            T,
            || async {
                stored_app(&topo.managed_spoke, SPOKE_NS, "recreated").filter(|a| {
                    uid(a) != first_recreated
                        && a["metadata"]["annotations"][SOURCE_UID] == new_hub_uid.as_str()
                })
            },
        )
        .await?;
        let new_upserted_hub = uid(&stored_app(&topo.hub, MANAGED, "upserted").unwrap());
        eventually(
            "upsert policy: the same local copy, now from the new hub object",
            T,
            || async {
                stored_app(&topo.managed_spoke, SPOKE_NS, "upserted").filter(|a| {
                    uid(a) == first_upserted
                        && a["metadata"]["annotations"][SOURCE_UID] == new_upserted_hub.as_str()
                })
            },
        )
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_application_recreate_resync_starts_a_sync_after_a_local_deletion() {
    run(&["--on-application-recreate", "resync"], async |topo| {
        let hub = apps(&topo.hub, MANAGED)?;
        hub.create(
            &PostParams::default(),
            &sample_app("guestbook", MANAGED, "guestbook"),
        )
        .await?;
        let first = eventually("app reaches the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook").map(|a| uid(&a))
        })
        .await?;
        apps(&topo.managed_spoke, SPOKE_NS)?
            .delete("guestbook", &DeleteParams::default())
            .await?;
        eventually("deletion reverted and a sync started", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook")
                .filter(|a| uid(a) != first && a["operation"]["sync"].is_object())
        })
        .await?;
        Ok(())
    })
    .await;
}
