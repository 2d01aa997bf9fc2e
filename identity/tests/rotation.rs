//! SVID rotation: open streams survive, new connections present the new certificate; PEM file
//! sources pick up rewritten files and keep the last good state when new files are broken.

mod support;

use std::time::Duration;

use argocd_agent_identity::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_testkit::workload_api::DevCa;
use futures::StreamExt;
use support::*;

async fn wait_for_new_serial(source: &SvidSource, old: &str) -> String {
    let mut rx = source.subscribe();
    let state = tokio::time::timeout(
        Duration::from_secs(5),
        rx.wait_for(|s| {
            s.as_ref()
                .map(|s| leaf_facts(s.svid.leaf().as_ref()).0 != old)
                .unwrap_or(false)
        }),
    )
    .await
    .expect("rotated SVID arrives")
    .expect("source alive")
    .clone()
    .unwrap();
    leaf_facts(state.svid.leaf().as_ref()).0
}

#[tokio::test]
async fn rotation_keeps_open_stream_and_next_connection_presents_new_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let agent = source(dir.path(), "agent").await;
    let server = serve(&principal, PeerPolicy::Any).await;

    let channel = channel(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL))).await;
    let mut client = EventStreamClient::new(channel);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let mut inbound = client
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("stream opens")
        .into_inner();
    tx.send(event(1)).await.unwrap();
    let echoed = inbound.next().await.expect("echo").expect("ok");
    assert_eq!(echoed.id, "ev-1");
    let first = server.seen();
    assert_eq!(first.len(), 1);
    let old_serial = first[0].serial.clone();
    let (principal_serial, _) = leaf_facts(principal.current().unwrap().svid.leaf().as_ref());

    dev.rotate_now().expect("rotation");
    let new_serial = wait_for_new_serial(&agent, &old_serial).await;
    wait_for_new_serial(&principal, &principal_serial).await;

    // The stream opened before the rotation keeps working.
    tx.send(event(2)).await.unwrap();
    let echoed = tokio::time::timeout(Duration::from_secs(5), inbound.next())
        .await
        .expect("echo after rotation")
        .expect("stream still open")
        .expect("ok");
    assert_eq!(echoed.id, "ev-2");

    // A new connection presents the rotated certificate.
    let answer = try_version(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL)))
        .await
        .expect("new connection after rotation");
    assert_eq!(answer.version, AGENT);
    let seen = server.seen();
    let last = seen.last().unwrap();
    assert_eq!(last.serial, new_serial);
    assert_ne!(last.serial, old_serial);
    assert!(last.not_after >= first[0].not_after);
    drop(tx);
    dev.shutdown().await;
}

#[tokio::test]
async fn scheduled_rotation_streams_new_svids() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_builder(dir.path())
        .rotate_every(Some(Duration::from_millis(300)))
        .serve()
        .await
        .unwrap();
    let agent = source(dir.path(), "agent").await;
    let (serial, _) = leaf_facts(agent.current().unwrap().svid.leaf().as_ref());
    let new_serial = wait_for_new_serial(&agent, &serial).await;
    assert_ne!(serial, new_serial);
    dev.shutdown().await;
}

#[tokio::test]
async fn pem_file_source_reloads_rewritten_files_and_keeps_last_good_on_garbage() {
    let dir = tempfile::tempdir().unwrap();
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let partner = DevCa::ephemeral(td("partner.org")).unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    let bundle = dir.path().join("ca.crt");
    let partner_bundle = dir.path().join("partner.crt");
    let first = ca.issue_x509(&id(AGENT), Duration::from_secs(600)).unwrap();
    std::fs::write(&cert, first.chain_pem()).unwrap();
    std::fs::write(&key, first.key_pem()).unwrap();
    std::fs::write(&bundle, ca.certificate_pem()).unwrap();
    std::fs::write(&partner_bundle, partner.certificate_pem()).unwrap();

    let source = SvidSource::pem_files(
        cert.clone(),
        key.clone(),
        vec![
            (None, bundle.clone()),
            (Some(td("partner.org")), partner_bundle.clone()),
        ],
        Duration::from_millis(50),
    )
    .expect("valid files load");
    let state = source.current().unwrap();
    assert_eq!(state.svid.spiffe_id().as_str(), AGENT);
    assert!(state.bundles.get(&td("example.org")).is_some());
    assert!(state.bundles.get(&td("partner.org")).is_some());
    let (old_serial, _) = leaf_facts(state.svid.leaf().as_ref());

    // Broken new files: logged, last good state kept.
    std::fs::write(&cert, "not a certificate").unwrap();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let kept = source.current().unwrap();
    assert_eq!(leaf_facts(kept.svid.leaf().as_ref()).0, old_serial);

    // A proper rotation is picked up.
    let second = ca.issue_x509(&id(AGENT), Duration::from_secs(600)).unwrap();
    std::fs::write(&key, second.key_pem()).unwrap();
    std::fs::write(&cert, second.chain_pem()).unwrap();
    let new_serial = wait_for_new_serial(&source, &old_serial).await;
    assert_eq!(new_serial, leaf_facts(second.chain[0].as_ref()).0);
}

#[tokio::test]
async fn pem_file_source_refuses_key_that_does_not_match_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let a = ca.issue_x509(&id(AGENT), Duration::from_secs(600)).unwrap();
    let b = ca.issue_x509(&id(AGENT), Duration::from_secs(600)).unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, a.chain_pem()).unwrap();
    std::fs::write(&key, b.key_pem()).unwrap();
    let err = SvidSource::pem_files(cert, key, vec![], Duration::from_secs(1)).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
}
