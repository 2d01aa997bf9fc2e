//! Health endpoints of the real binaries: `/readyz` turns ready once the principal's hub
//! watch has synced and once the agent has its SVID and a synced cache; the agent's
//! `/healthz` follows its connection to the principal.

use std::time::Duration;

use argocd_agent_testkit::harness::*;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_and_healthz_answer_on_both_binaries() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let (principal, agent) = (topo.metrics_ports["principal"], topo.metrics_ports[MANAGED]);
        for (who, port) in [("principal", principal), ("agent", agent)] {
            eventually(&format!("{who} /readyz is 200"), T, || async {
                (http_status(port, "/readyz").await == Some(200)).then_some(())
            })
            .await?;
        }
        eventually("principal /healthz is 200", T, || async {
            (http_status(principal, "/healthz").await == Some(200)).then_some(())
        })
        .await?;
        eventually("connected agent /healthz is 200", T, || async {
            (http_status(agent, "/healthz").await == Some(200)).then_some(())
        })
        .await?;
        // Without the principal the agent stays ready (it keeps reconciling locally) but
        // reports itself unhealthy, as upstream does.
        topo.principal.stop().await;
        eventually("disconnected agent /healthz is 503", T, || async {
            (http_status(agent, "/healthz").await == Some(503)).then_some(())
        })
        .await?;
        if http_status(agent, "/readyz").await != Some(200) {
            return Err("agent /readyz should stay 200 while disconnected".into());
        }
        Ok::<(), HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Upstream's `--healthz-port`: `/healthz` and `/readyz` (not `/metrics`) on their own port.
/// (The reasons a not-ready answer gives are unit-tested next to each endpoint.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthz_port_serves_the_probes_only() {
    let (pp, ap) = (free_port(), free_port());
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: vec!["--healthz-port".into(), pp.to_string()],
        agent_args: vec!["--healthz-port".into(), ap.to_string()],
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        for (who, port) in [("principal", pp), ("agent", ap)] {
            eventually(&format!("{who} /readyz on the healthz port"), T, || async {
                (http_status(port, "/readyz").await == Some(200)).then_some(())
            })
            .await?;
            assert_eq!(http_status(port, "/healthz").await, Some(200), "{who}");
            assert_eq!(
                http_status(port, "/metrics").await,
                Some(404),
                "{who}: probes only"
            );
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}

/// A lost connection is logged as one, on both sides, not as a refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_connections_are_logged_as_lost() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        // The agent stops normally: the principal sees its connection go.
        let agent = topo.managed.as_mut().ok_or("no agent")?;
        agent.stop().await;
        eventually("principal logs the agent's departure", T, || async {
            topo.principal
                .log()
                .contains("agent disconnected")
                .then_some(())
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let plog = topo.principal.log();
        assert!(!plog.contains("session ended with error"), "{plog}");
        // The principal is killed: the agent says the connection was lost.
        let before = topo.connect_count(MANAGED);
        topo.managed.as_mut().ok_or("no agent")?.start()?;
        eventually("agent reconnected", T, || async {
            (topo.connect_count(MANAGED) > before).then_some(())
        })
        .await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        topo.principal.kill().await;
        let agent = topo.managed.as_ref().ok_or("no agent")?;
        eventually("agent logs a lost connection", T, || async {
            agent
                .log()
                .contains("connection to the principal lost")
                .then_some(())
        })
        .await?;
        assert!(
            !agent.log().contains("principal refused the stream"),
            "{}",
            agent.log()
        );
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
