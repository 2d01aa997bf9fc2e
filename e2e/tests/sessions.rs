//! Sessions under abuse by one legitimate identity: an autonomous agent's resync never
//! deletes hub-authored Applications in its namespace, and sessions abandoned during resync
//! (or replaced by a newer one) stop at once — the connected-agents gauge comes back to the
//! real agents, and the newest session of an identity is the live one.

use std::time::Duration;

use argocd_agent_domain::EventType;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_proto::eventstream::AgentMode;
use argocd_agent_testkit::harness::*;
use kube::api::PostParams;

const T: Duration = Duration::from_secs(30);

/// The principal's `argocd_principal_connected_agents`.
async fn connected(topo: &Topology) -> f64 {
    let text = http_get(topo.metrics_ports["principal"], "/metrics")
        .await
        .unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("argocd_principal_connected_agents "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(-1.0)
}

/// Opens a session as the autonomous agent's identity with an empty spoke, and returns once
/// the principal has welcomed it (the resync starts right after).
async fn empty_autonomous_session(source: &SvidSource, addr: std::net::SocketAddr) -> AgentStream {
    let (stream, welcome) = open_agent_stream(source, addr, AgentMode::Autonomous)
        .await
        .unwrap();
    assert_eq!(welcome.ty, EventType::Welcome);
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hub_authored_apps_survive_autonomous_resyncs_and_abandoned_sessions_end() {
    let topo = Topology::start(TopologyOptions::default()).await.unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    topo.wait_connected(AUTONOMOUS, T).await.unwrap();
    // Applications authored on the hub, in the autonomous agent's namespace.
    let hub_apps = apps(&topo.hub, AUTONOMOUS).unwrap();
    for i in 0..20 {
        hub_apps
            .create(
                &PostParams::default(),
                &sample_app(&format!("hub-made-{i}"), AUTONOMOUS, "guestbook"),
            )
            .await
            .unwrap();
    }

    // Sessions with the autonomous identity and an empty spoke, each dropped right after
    // its welcome (during its resync), then one left open.
    let source = topo.svid_source("autonomous.sock").await.unwrap();
    for _ in 0..15 {
        let session = empty_autonomous_session(&source, topo.principal_addr).await;
        drop(session);
    }
    let (_tx, mut last) = empty_autonomous_session(&source, topo.principal_addr).await;

    // Nothing the hub authored was deleted by those resyncs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for i in 0..20 {
        assert!(
            stored_app(&topo.hub, AUTONOMOUS, &format!("hub-made-{i}")).is_some(),
            "hub-made-{i} was deleted by an autonomous resync"
        );
    }
    // Every abandoned or replaced session ended: the gauge counts the managed agent and
    // the one live autonomous session.
    eventually("abandoned sessions end", T, || async {
        (connected(&topo).await == 2.0).then_some(())
    })
    .await
    .unwrap();
    // The newest session is the live one: the real agent's session (replaced) reconnects
    // and replaces ours in turn, which is closed by the principal.
    let closed = tokio::time::timeout(T, async {
        loop {
            match last.message().await {
                Ok(Some(_)) => continue,
                other => return other.map(|_| ()),
            }
        }
    })
    .await
    .expect("the replaced session is closed");
    if let Err(status) = closed {
        assert_eq!(status.code(), tonic::Code::Aborted, "{status:?}");
    }
    topo.wait_connected(AUTONOMOUS, T).await.unwrap();
    topo.stop().await;
}
