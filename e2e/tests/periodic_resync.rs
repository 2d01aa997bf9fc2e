//! Periodic resync (upstream PR #1037): an agent with `--resync-interval` asks the principal
//! for a resync round while connected, so a change lost on the way is put right without a
//! reconnect; the principal's `--resync-min-interval` bounds how often, told to agents in
//! the welcome and enforced on every request.

use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::AgentMode;
use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::json;

const T: Duration = Duration::from_secs(30);

/// Makes the hub refuse, for good, the next status of `name` written on `spoke`: its API
/// server answers 422 to the principal's write, so the principal answers `ApplyFailed`, a
/// final answer the agent does not resend. Returns the lost revision, checked absent from
/// the hub. The fault may meet another request of the principal's first: then again.
async fn lose_a_status(
    topo: &Topology,
    agent: &str,
    spoke: &kube::Api<kube::api::DynamicObject>,
    name: &str,
) -> Result<String, HarnessError> {
    let refused_writes = || {
        topo.principal
            .log()
            .lines()
            .filter(|l| l.contains("could not apply event") && !l.contains("for now"))
            .count()
    };
    for attempt in 0..5 {
        let revision = format!("{agent}-r{attempt}");
        let before = refused_writes();
        topo.hub.fail_next(1, 422);
        set_status(
            spoke,
            name,
            json!({"sync": {"status": "Synced", "revision": revision}}),
        )
        .await?;
        let refused = eventually(
            &format!("status {revision} written or refused"),
            T,
            || async {
                if refused_writes() > before {
                    Some(true)
                } else {
                    (sync_revision(stored_app(&topo.hub, agent, name)).as_deref()
                        == Some(revision.as_str()))
                    .then_some(false)
                }
            },
        )
        .await?;
        topo.hub.fail_next(0, 422);
        if refused {
            if sync_revision(stored_app(&topo.hub, agent, name)).as_deref()
                == Some(revision.as_str())
            {
                return Err("the refused status reached the hub at once: nothing was lost".into());
            }
            return Ok(revision);
        }
    }
    Err(format!("{agent}: the injected 422 never met a status write").into())
}

/// A status the hub refused for good is on the hub a few seconds later, on the same
/// session, in both modes: the agent's next periodic round reports the checksum of its
/// status (autonomous: the copy's; managed: the one it last sent), the principal finds its
/// copy stale and asks for it again. The managed agent asks every 500 ms, below the
/// principal's 2 s minimum: it stretches its interval to the minimum (told in the
/// welcome) and is never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_the_hub_refused_is_put_right_by_the_next_periodic_round() {
    let topo = Topology::start(TopologyOptions {
        principal_args: vec!["--resync-min-interval".into(), "2s".into()],
        per_agent_args: vec![
            (AUTONOMOUS, vec!["--resync-interval".into(), "3s".into()]),
            (MANAGED, vec!["--resync-interval".into(), "500ms".into()]),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let autonomous_spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        let managed_spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        autonomous_spoke
            .create(
                &PostParams::default(),
                &sample_app("lost", SPOKE_NS, "guestbook"),
            )
            .await?;
        apps(&topo.hub, MANAGED)?
            .create(
                &PostParams::default(),
                &sample_app("lost", MANAGED, "guestbook"),
            )
            .await?;
        eventually("the autonomous copy on the hub", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "lost")
        })
        .await?;
        eventually("the managed copy on the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "lost")
        })
        .await?;
        let connects = (topo.connect_count(AUTONOMOUS), topo.connect_count(MANAGED));

        for (agent, spoke) in [(AUTONOMOUS, &autonomous_spoke), (MANAGED, &managed_spoke)] {
            let revision = lose_a_status(&topo, agent, spoke, "lost").await?;
            eventually(
                &format!("{agent}: status {revision} on the hub after a periodic round"),
                T,
                || async {
                    (sync_revision(stored_app(&topo.hub, agent, "lost")).as_deref()
                        == Some(revision.as_str()))
                    .then_some(())
                },
            )
            .await?;
            let log = topo.principal.log();
            if !log
                .lines()
                .any(|l| l.contains(agent) && l.contains("periodic resync requested"))
            {
                return Err(format!("the principal never logged a periodic round of {agent}").into());
            }
        }
        if (topo.connect_count(AUTONOMOUS), topo.connect_count(MANAGED)) != connects {
            return Err("an agent reconnected: the status came with the hello's resync".into());
        }

        // The managed agent asks at the principal's minimum, never below it.
        let managed = topo.managed.as_ref().ok_or("no managed agent")?;
        let log = managed.log();
        if !(log.contains("asking at its minimum") && log.contains("every=2s")) {
            return Err(format!("the managed agent did not stretch its interval:\n{log}").into());
        }
        let port = topo.metrics_ports["principal"];
        let too_soon = metric_sum(
            port,
            "argocd_principal_events_refused_total{agent=\"agent-managed\",reason=\"ResyncTooSoon\",tenant=\"\"}",
        )
        .await;
        if too_soon > 0.0 {
            return Err(format!("the managed agent was refused {too_soon} rounds").into());
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// A client that asks more often than `--resync-min-interval` allows (an agent of another
/// make, or a hostile one) is refused: the welcome names the minimum, the request within it
/// gets `ResyncTooSoon` naming the flag, it is counted and logged, and the session goes on
/// (a ping still gets its pong). Without the capability's minimum nothing would stop a
/// connected agent from making the principal walk its namespace in a loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_asked_for_within_the_minimum_is_refused_and_the_session_goes_on() {
    let topo = Topology::start(TopologyOptions {
        principal_args: vec!["--resync-min-interval".into(), "1h".into()],
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        topo.wait_connected(MANAGED, T).await?;
        let source = topo.svid_source("autonomous.sock").await?;
        let ((tx, mut inbound), welcome) =
            open_agent_stream(&source, topo.principal_addr, AgentMode::Autonomous).await?;
        let Payload::Welcome(w) = welcome.payload else {
            return Err("no welcome".into());
        };
        if w.resync_min_interval_ms != 3_600_000 {
            return Err(format!("welcome names {} ms, not 1h", w.resync_min_interval_ms).into());
        }
        let ask = Event::new(
            "test-client",
            EventType::Resync,
            Payload::Resync(Default::default()),
        );
        let ask_id = ask.id.clone();
        tx.send(ask.to_cloud_event()).await?;
        let refusal = next_of(&mut inbound, EventType::Error).await?;
        let Payload::Error(detail) = &refusal.payload else {
            return Err("error without detail".into());
        };
        if detail.reason != "ResyncTooSoon"
            || !detail.message.contains("--resync-min-interval")
            || !detail.message.contains("1h")
            || refusal.ack_id.as_deref() != Some(ask_id.as_str())
        {
            return Err(format!("unexpected refusal: {detail:?} ack {:?}", refusal.ack_id).into());
        }
        let port = topo.metrics_ports["principal"];
        eventually("the refusal counted", T, || async {
            (metric_sum(
                port,
                "argocd_principal_events_refused_total{agent=\"agent-autonomous\",reason=\"ResyncTooSoon\",tenant=\"\"}",
            )
            .await
                >= 1.0)
                .then_some(())
        })
        .await?;
        if !topo
            .principal
            .log()
            .contains("periodic resync requested too soon: refused")
        {
            return Err("the refusal was not logged".into());
        }
        tx.send(Event::new("test-client", EventType::Ping, Payload::None).to_cloud_event())
            .await?;
        next_of(&mut inbound, EventType::Pong).await?;
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// The next event of type `ty` on a raw agent stream (others skipped).
async fn next_of(
    inbound: &mut tonic::Streaming<argocd_agent_proto::cloudevents::CloudEvent>,
    ty: EventType,
) -> Result<Event, HarnessError> {
    tokio::time::timeout(T, async {
        loop {
            let ce = inbound.message().await?.ok_or("stream closed")?;
            let event = Event::from_cloud_event(ce)?;
            if event.ty == ty {
                return Ok::<_, HarnessError>(event);
            }
        }
    })
    .await?
}
