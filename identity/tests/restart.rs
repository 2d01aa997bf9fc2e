//! An SVID source survives a Workload API restart: it keeps serving the last SVID while the
//! server is away, reconnects with backoff, and picks up the SVID of the new server.

mod support;

use std::time::Duration;

use argocd_agent_identity::tls::PeerPolicy;
use support::*;

#[tokio::test]
async fn source_keeps_last_svid_across_workload_api_restart_and_picks_up_new_one() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let agent = source(dir.path(), "agent").await;
    let principal = source(dir.path(), "principal").await;
    let before = agent.current().unwrap();
    let (old_serial, _) = leaf_facts(before.svid.leaf().as_ref());

    dev.shutdown().await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let during = agent.current().expect("last SVID still served");
    assert_eq!(leaf_facts(during.svid.leaf().as_ref()).0, old_serial);

    // While the Workload API is down, mTLS keeps working with the last SVIDs.
    let server = serve(&principal, PeerPolicy::Any).await;
    try_version(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL)))
        .await
        .expect("mTLS with the last good SVIDs");

    // Same directory (same CA) and socket paths: the source reconnects on its own.
    let dev = dev_server(dir.path()).await;
    let mut rx = agent.subscribe();
    let after = tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|s| {
            s.as_ref()
                .map(|s| leaf_facts(s.svid.leaf().as_ref()).0 != old_serial)
                .unwrap_or(false)
        }),
    )
    .await
    .expect("new SVID after restart")
    .unwrap()
    .clone()
    .unwrap();
    assert_eq!(after.svid.spiffe_id().as_str(), AGENT);
    assert_eq!(
        after.bundles.get(&td("example.org")),
        before.bundles.get(&td("example.org")),
        "restarted server reuses its CA"
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn workload_api_source_times_out_with_clear_error_when_nothing_listens() {
    let dir = tempfile::tempdir().unwrap();
    let err = argocd_agent_identity::SvidSource::workload_api_with(
        argocd_agent_identity::source::WorkloadApiOptions {
            endpoint: Some(endpoint(dir.path(), "missing")),
            initial_timeout: Duration::from_millis(500),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("no X.509-SVID from Workload API"), "{msg}");
    assert!(msg.contains("missing.sock"), "{msg}");
}
