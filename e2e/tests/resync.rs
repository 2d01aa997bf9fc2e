//! Resync after either side was away: nothing is lost, deletions are not resurrected.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
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

/// A status written on the spoke while its agent is down (killed, as a crash) reaches the
/// hub after the restart, in both modes, though no spec changed. Regression (found by the
/// chaos run, release build): an autonomous agent's hello carried spec checksums only, so
/// the principal found every spec in sync and asked for nothing; the restarted agent's
/// startup changes came before its welcome, when it had no hub namespace to publish them
/// under; and after the welcome it republished only objects whose spec differed from its
/// hello. The hub kept the older status for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_written_while_the_agent_was_down_reaches_the_hub() {
    let mut topo = Topology::start(TopologyOptions::default()).await.unwrap();
    let r = async {
        let hub_managed = apps(&topo.hub, MANAGED)?;
        let managed_spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        let autonomous_spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        hub_managed
            .create(
                &PostParams::default(),
                &sample_app("m", MANAGED, "guestbook"),
            )
            .await?;
        autonomous_spoke
            .create(
                &PostParams::default(),
                &sample_app("a", SPOKE_NS, "guestbook"),
            )
            .await?;
        eventually("managed copy on the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "m")
        })
        .await?;
        let sides = [
            (MANAGED, &managed_spoke, "m"),
            (AUTONOMOUS, &autonomous_spoke, "a"),
        ];
        for (agent, spoke, name) in sides {
            set_status(
                spoke,
                name,
                json!({"sync": {"status": "Synced", "revision": "before"}}),
            )
            .await?;
            eventually(&format!("{agent}: first status on the hub"), T, || async {
                (sync_revision(stored_app(&topo.hub, agent, name)).as_deref() == Some("before"))
                    .then_some(())
            })
            .await?;
        }

        let before = (topo.connect_count(MANAGED), topo.connect_count(AUTONOMOUS));
        topo.managed
            .as_mut()
            .ok_or("no managed agent")?
            .kill()
            .await;
        topo.autonomous
            .as_mut()
            .ok_or("no autonomous agent")?
            .kill()
            .await;
        for (_, spoke, name) in sides {
            set_status(
                spoke,
                name,
                json!({"sync": {"status": "Synced", "revision": "while-down"}}),
            )
            .await?;
        }
        topo.managed.as_mut().ok_or("no managed agent")?.start()?;
        topo.autonomous
            .as_mut()
            .ok_or("no autonomous agent")?
            .start()?;
        eventually("both agents reconnected", T, || async {
            (topo.connect_count(MANAGED) > before.0 && topo.connect_count(AUTONOMOUS) > before.1)
                .then_some(())
        })
        .await?;
        for (agent, _, name) in sides {
            eventually(
                &format!("{agent}: status written while down on the hub"),
                T,
                || async {
                    (sync_revision(stored_app(&topo.hub, agent, name)).as_deref()
                        == Some("while-down"))
                    .then_some(())
                },
            )
            .await?;
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// A status update the hub's API server fails to write (500) is written once it answers
/// again, in both modes, without a reconnect. Regression: the principal answered every
/// failed write `ApplyFailed`, which the agent takes as final, so the status was dropped
/// until the next reconnect (or for good, when it was the last one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_the_hub_failed_to_write_is_written_when_it_recovers() {
    let topo = Topology::start(TopologyOptions::default()).await.unwrap();
    let r = async {
        let hub_managed = apps(&topo.hub, MANAGED)?;
        let managed_spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        let autonomous_spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        hub_managed
            .create(
                &PostParams::default(),
                &sample_app("m", MANAGED, "guestbook"),
            )
            .await?;
        autonomous_spoke
            .create(
                &PostParams::default(),
                &sample_app("a", SPOKE_NS, "guestbook"),
            )
            .await?;
        eventually("managed copy on the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "m")
        })
        .await?;
        eventually("autonomous copy on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "a")
        })
        .await?;
        let failed_writes = || {
            topo.principal
                .log()
                .matches("could not apply event")
                .count()
        };
        for (agent, spoke, name) in [
            (MANAGED, &managed_spoke, "m"),
            (AUTONOMOUS, &autonomous_spoke, "a"),
        ] {
            // The hub's next request fails; it must be this status write (another request
            // of the principal's may take the fault first: then try again).
            let mut hit = false;
            for attempt in 0..5 {
                let revision = format!("{agent}-{attempt}");
                let failed = failed_writes();
                topo.hub.fail_next(1, 500);
                set_status(
                    spoke,
                    name,
                    json!({"sync": {"status": "Synced", "revision": revision}}),
                )
                .await?;
                eventually(
                    &format!("{agent}: status {revision} on the hub"),
                    T,
                    || async {
                        (sync_revision(stored_app(&topo.hub, agent, name)).as_deref()
                            == Some(revision.as_str()))
                        .then_some(())
                    },
                )
                .await?;
                if failed_writes() > failed {
                    hit = true;
                    break;
                }
            }
            if !hit {
                return Err(format!("{agent}: the injected 500 never met a status write").into());
            }
        }
        topo.hub.fail_next(0, 500);
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
