//! Revocation by identity, with the real principal and agents: a write to the hub's
//! `argocd-agent-blocklist` ConfigMap closes the denied agent's session (the time from the
//! write to the close is measured and printed), its reconnects are refused, the decision
//! survives a principal restart, `argocd-agentctl blocklist` edits the list, and upstream's
//! certificate fingerprints work too.

use std::time::{Duration, SystemTime};

use argocd_agent_testkit::harness::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

const T: Duration = Duration::from_secs(30);

fn logged(topo: &Topology, what: &str, since: SystemTime) -> Option<SystemTime> {
    logged_at(&topo.principal.log(), what, since)
}

async fn agentctl(topo: &Topology, args: &[&str]) -> String {
    let out = tokio::process::Command::new(binary("argocd-agentctl").unwrap())
        .arg("blocklist")
        .args(args)
        .arg("--kubeconfig")
        .arg(topo.dir.join("hub.kubeconfig"))
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "agentctl blocklist {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_blocklisted_identity_is_cut_off_within_a_second_and_stays_out() {
    let mut topo = Topology::start(TopologyOptions::default()).await.unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    topo.wait_connected(AUTONOMOUS, T).await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(kube_client(&topo.hub).unwrap(), HUB_ARGOCD_NS);

    // 1. The ConfigMap is written: the managed agent's session is closed.
    let written = SystemTime::now();
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("argocd-agent-blocklist".into()),
            ..Default::default()
        },
        data: Some([("ids".to_string(), format!("{}\n", agent_id(MANAGED)))].into()),
        ..Default::default()
    };
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let closed = eventually("the blocked session is closed", T, || async {
        logged(&topo, "session closed: identity blocked", written)
    })
    .await
    .unwrap();
    let took = closed.duration_since(written).unwrap_or_default();
    println!(
        "revocation: ConfigMap write to session closed in {} ms",
        took.as_millis()
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");

    // 2. Its reconnects are refused; the autonomous agent is untouched.
    eventually("the blocked agent's reconnect is refused", T, || async {
        logged(&topo, "stream refused: identity blocked", written)
    })
    .await
    .unwrap();
    topo.wait_connected(AUTONOMOUS, T).await.unwrap();

    // 3. The decision survives a principal restart.
    topo.principal.stop().await;
    let restarted = SystemTime::now();
    topo.principal.start().unwrap();
    topo.wait_connected(AUTONOMOUS, T).await.unwrap();
    eventually("refused again after the restart", T, || async {
        logged(&topo, "stream refused: identity blocked", restarted)
    })
    .await
    .unwrap();

    // 4. agentctl lists and removes it; the agent is back.
    let listed = agentctl(&topo, &["list"]).await;
    assert!(listed.contains(&agent_id(MANAGED)), "{listed}");
    let before = topo.connect_count(MANAGED);
    agentctl(&topo, &["remove", "--id", &agent_id(MANAGED)]).await;
    eventually("the agent reconnects once allowed", T, || async {
        (topo.connect_count(MANAGED) > before).then_some(())
    })
    .await
    .unwrap();

    // 5. Upstream-style: the autonomous agent's certificate fingerprint.
    let source = topo.svid_source("autonomous.sock").await.unwrap();
    let state = source.current().expect("a ready source");
    let fingerprint = argocd_agent_principal::blocklist::fingerprint(state.svid.leaf().as_ref());
    let since = SystemTime::now();
    agentctl(&topo, &["add", "--fingerprint", &fingerprint]).await;
    eventually("the fingerprint's session is closed", T, || async {
        logged(&topo, "session closed: identity blocked", since)
    })
    .await
    .unwrap();
    topo.stop().await;
}
