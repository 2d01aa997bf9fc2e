//! SIGTERM on either binary drains what is in progress: the event being applied when the
//! signal arrives is finished and acknowledged before the process exits. Each test slows
//! the API server the event is applied to, signals the process while the write waits on
//! it, and checks both that the write landed and that the other side got the
//! acknowledgement from the process that was stopping (a crash would give neither).

use std::time::{Duration, Instant};

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::json;

const T: Duration = Duration::from_secs(30);
/// How long the slowed API server holds every request.
const SLOW: Duration = Duration::from_millis(1500);

/// The value of one series (`family{labels}`) whose labels include all of `labels`.
async fn series(port: u16, family: &str, labels: &[&str]) -> f64 {
    let text = http_get(port, "/metrics").await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_the_agent_finishes_and_acknowledges_the_event_being_applied() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let hub = apps(&topo.hub, MANAGED)?;
        hub.create(
            &PostParams::default(),
            &sample_app("drain", MANAGED, "guestbook"),
        )
        .await?;
        eventually("initial sync", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "drain")
        })
        .await?;
        let port = topo.metrics_ports["principal"];
        let acks = [r#"agent="agent-managed""#, r#"type="processed""#];
        let acked_before = series(port, "argocd_principal_events_received_total", &acks).await;

        // The spoke's API answers slowly: the agent's write of this edit waits on it.
        topo.managed_spoke.set_latency(SLOW);
        merge_patch(
            &hub,
            "drain",
            json!({"spec": {"source": {"targetRevision": "during-shutdown"}}}),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let signalled = Instant::now();
        topo.managed.as_mut().ok_or("no agent")?.stop().await;
        let took = signalled.elapsed();
        topo.managed_spoke.set_latency(Duration::ZERO);
        eprintln!("agent stopped {took:?} after SIGTERM");

        // The write landed, and the principal got the acknowledgement from the stopping
        // agent (it is not restarted: nothing else could have sent it).
        let spoke = target_revision(stored_app(&topo.managed_spoke, SPOKE_NS, "drain"));
        assert_eq!(
            spoke.as_deref(),
            Some("during-shutdown"),
            "edit not applied"
        );
        eventually("the principal has the acknowledgement", T, || async {
            (series(port, "argocd_principal_events_received_total", &acks).await > acked_before)
                .then_some(())
        })
        .await?;
        assert!(
            took < Duration::from_secs(5),
            "the agent needed SIGKILL ({took:?})"
        );
        let log = std::fs::read_to_string(topo.dir.join(format!("{MANAGED}.log")))?;
        assert!(log.contains("shutting down: no new events; waiting for acknowledgements"));
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_on_the_principal_finishes_and_acknowledges_the_event_being_applied() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![AUTONOMOUS]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let spoke = apps(&topo.autonomous_spoke, SPOKE_NS)?;
        spoke
            .create(
                &PostParams::default(),
                &sample_app("drain", SPOKE_NS, "guestbook"),
            )
            .await?;
        eventually("initial sync", T, || async {
            stored_app(&topo.hub, AUTONOMOUS, "drain")
        })
        .await?;
        let port = topo.metrics_ports[AUTONOMOUS];
        let acks = [r#"type="processed""#];
        let acked_before = series(port, "argocd_agent_events_received_total", &acks).await;

        // The hub's API answers slowly: the principal's write of this edit waits on it.
        topo.hub.set_latency(SLOW);
        merge_patch(
            &spoke,
            "drain",
            json!({"spec": {"source": {"targetRevision": "during-shutdown"}}}),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let signalled = Instant::now();
        topo.principal.stop().await;
        let took = signalled.elapsed();
        topo.hub.set_latency(Duration::ZERO);
        eprintln!("principal stopped {took:?} after SIGTERM");

        let hub = target_revision(stored_app(&topo.hub, AUTONOMOUS, "drain"));
        assert_eq!(hub.as_deref(), Some("during-shutdown"), "edit not written");
        // The agent got the acknowledgement from the principal that was stopping (it is
        // not restarted).
        let acked_after = series(port, "argocd_agent_events_received_total", &acks).await;
        assert!(
            acked_after > acked_before,
            "no acknowledgement before the principal exited ({acked_before} -> {acked_after})"
        );
        assert!(
            took < Duration::from_secs(5),
            "the principal needed SIGKILL ({took:?})"
        );
        let log = std::fs::read_to_string(topo.dir.join("principal.log"))?;
        assert!(log.contains("session closed after the last event was answered"));
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
