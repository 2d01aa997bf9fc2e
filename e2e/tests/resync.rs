//! Resync after either side was away: nothing is lost, deletions are not resurrected.

use std::time::Duration;

use argocd_agent_e2e::harness::*;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

const T: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managed_spoke_converges_after_agent_restart() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let hub = apps(&topo.hub, MANAGED)?;
        for name in ["keep-edit", "to-delete"] {
            hub.create(
                &PostParams::default(),
                &sample_app(name, MANAGED, "guestbook"),
            )
            .await?;
        }
        for name in ["keep-edit", "to-delete"] {
            eventually("initial sync", T, || async {
                stored_app(&topo.managed_spoke, SPOKE_NS, name)
            })
            .await?;
        }
        let before = topo.connect_count(MANAGED);
        topo.managed.as_mut().ok_or("no agent")?.stop().await;

        merge_patch(
            &hub,
            "keep-edit",
            json!({"spec": {"source": {"targetRevision": "while-away"}}}),
        )
        .await?;
        hub.delete("to-delete", &DeleteParams::default()).await?;
        hub.create(
            &PostParams::default(),
            &sample_app("created-while-away", MANAGED, "guestbook"),
        )
        .await?;

        topo.managed.as_mut().ok_or("no agent")?.start()?;
        eventually("agent reconnected", T, || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;
        eventually("edit made while away applied", T, || async {
            (target_revision(stored_app(&topo.managed_spoke, SPOKE_NS, "keep-edit")).as_deref()
                == Some("while-away"))
            .then_some(())
        })
        .await?;
        eventually("delete made while away applied", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "to-delete")
                .is_none()
                .then_some(())
        })
        .await?;
        eventually("create made while away applied", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "created-while-away")
        })
        .await?;
        // Not resurrected later either.
        tokio::time::sleep(Duration::from_secs(1)).await;
        if stored_app(&topo.managed_spoke, SPOKE_NS, "to-delete").is_some() {
            return Err("deleted application was resurrected".into());
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_converges_after_principal_restart() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        for name in ["keep-edit", "to-delete"] {
            spoke
                .create(
                    &PostParams::default(),
                    &sample_app(name, SPOKE_NS, "guestbook"),
                )
                .await?;
        }
        for name in ["keep-edit", "to-delete"] {
            eventually("initial sync", T, || async {
                stored_app(&topo.hub, AUTONOMOUS, name)
            })
            .await?;
        }
        topo.principal.stop().await;

        merge_patch(
            &spoke,
            "keep-edit",
            json!({"spec": {"source": {"targetRevision": "while-away"}}}),
        )
        .await?;
        spoke.delete("to-delete", &DeleteParams::default()).await?;
        spoke
            .create(
                &PostParams::default(),
                &sample_app("created-while-away", SPOKE_NS, "guestbook"),
            )
            .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;

        let before = topo.connect_count(AUTONOMOUS);
        topo.principal.start()?;
        eventually("agent reconnected", T, || async {
            (topo.connect_count(AUTONOMOUS) > before).then_some(())
        })
        .await?;
        eventually("edit made while away applied", T, || async {
            (target_revision(stored_app(&topo.hub, AUTONOMOUS, "keep-edit")).as_deref()
                == Some("while-away"))
            .then_some(())
        })
        .await?;
        eventually("delete made while away applied", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "to-delete")
                .is_none()
                .then_some(())
        })
        .await?;
        eventually("create made while away applied", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "created-while-away")
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_sides_converge_after_connection_cut_mid_stream() {
    let topo = Topology::start(TopologyOptions {
        with_proxy: true,
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let hub = apps(&topo.hub, MANAGED)?;
        let spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        hub.create(
            &PostParams::default(),
            &sample_app("m1", MANAGED, "guestbook"),
        )
        .await?;
        spoke
            .create(
                &PostParams::default(),
                &sample_app("a1", SPOKE_NS, "guestbook"),
            )
            .await?;
        eventually("m1 synced", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "m1")
        })
        .await?;
        eventually("a1 synced", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "a1")
        })
        .await?;

        let (m0, a0) = (topo.connect_count(MANAGED), topo.connect_count(AUTONOMOUS));
        let proxy = topo.proxy.as_ref().ok_or("no proxy")?;
        proxy.cut_all();
        // Changes on both sides right after the cut.
        merge_patch(
            &hub,
            "m1",
            json!({"spec": {"source": {"targetRevision": "after-cut"}}}),
        )
        .await?;
        hub.create(
            &PostParams::default(),
            &sample_app("m2", MANAGED, "guestbook"),
        )
        .await?;
        merge_patch(
            &spoke,
            "a1",
            json!({"spec": {"source": {"targetRevision": "after-cut"}}}),
        )
        .await?;
        spoke
            .create(
                &PostParams::default(),
                &sample_app("a2", SPOKE_NS, "guestbook"),
            )
            .await?;
        proxy.cut_all();

        eventually("both agents reconnected", T, || async {
            (topo.connect_count(MANAGED) > m0 && topo.connect_count(AUTONOMOUS) > a0).then_some(())
        })
        .await?;
        eventually("managed side converged", T, || async {
            (target_revision(stored_app(&topo.managed_spoke, SPOKE_NS, "m1")).as_deref()
                == Some("after-cut")
                && stored_app(&topo.managed_spoke, SPOKE_NS, "m2").is_some())
            .then_some(())
        })
        .await?;
        eventually("autonomous side converged", T, || async {
            (target_revision(stored_app(&topo.hub, AUTONOMOUS, "a1")).as_deref()
                == Some("after-cut")
                && stored_app(&topo.hub, AUTONOMOUS, "a2").is_some())
            .then_some(())
        })
        .await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
