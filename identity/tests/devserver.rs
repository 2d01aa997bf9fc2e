//! The development Workload API server against the official `spiffe` client and raw gRPC.

mod support;

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_proto::workload::X509svidRequest;
use argocd_agent_proto::workload::spiffe_workload_api_client::SpiffeWorkloadApiClient;
use argocd_agent_testkit::workload_api::{DevCa, DevWorkloadApi, Registration, RegistrationFile};
use hyper_util::rt::TokioIo;
use support::*;
use x509_parser::extensions::{GeneralName, ParsedExtension};

/// A raw tonic client on a Unix socket (authority `localhost`, as h2 requires).
async fn raw_client(path: PathBuf) -> SpiffeWorkloadApiClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: http::Uri| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
            }
        }))
        .await
        .expect("unix connect");
    SpiffeWorkloadApiClient::new(channel)
}

#[tokio::test]
async fn spiffe_crate_client_fetches_svid_and_bundles() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_builder(dir.path())
        .federate_with(td("partner.org"))
        .serve()
        .await
        .unwrap();
    let client = spiffe::WorkloadApiClient::connect_to(endpoint(dir.path(), "agent"))
        .await
        .expect("spiffe client connects");
    let ctx = client.fetch_x509_context().await.expect("X.509 context");
    let svid = ctx.default_svid().expect("one SVID");
    assert_eq!(svid.spiffe_id().to_string(), AGENT);
    assert_eq!(svid.cert_chain().len(), 2, "leaf + CA");
    let partner = spiffe::TrustDomain::new("partner.org").unwrap();
    let own = spiffe::TrustDomain::new("example.org").unwrap();
    assert!(ctx.bundle_set().get(&own).is_some());
    assert!(ctx.bundle_set().get(&partner).is_some());

    let bundles = client.fetch_x509_bundles().await.expect("bundles");
    assert_eq!(bundles.len(), 2);
    let jwt_bundles = client.fetch_jwt_bundles().await.expect("JWT bundles");
    assert!(jwt_bundles.get(&own).is_some());

    let token = client
        .fetch_jwt_token(["spiffe://example.org/ns/argocd/sa/principal"], None)
        .await
        .expect("JWT-SVID");
    let validated = client
        .validate_jwt_token("spiffe://example.org/ns/argocd/sa/principal", &token)
        .await
        .expect("dev server validates its own token");
    assert_eq!(validated.spiffe_id().to_string(), AGENT);
    assert!(
        client
            .validate_jwt_token("spiffe://example.org/other", &token)
            .await
            .is_err(),
        "wrong audience refused by ValidateJWTSVID"
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn call_without_security_header_is_invalid_argument() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let mut client = raw_client(dir.path().join("agent.sock")).await;
    let status = client
        .fetch_x509svid(X509svidRequest {})
        .await
        .expect_err("no header must fail");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert_eq!(status.message(), "security header missing from request");

    let mut request = tonic::Request::new(X509svidRequest {});
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    let mut stream = client
        .fetch_x509svid(request)
        .await
        .expect("with header")
        .into_inner();
    let first = stream.message().await.expect("message").expect("some");
    assert_eq!(first.svids[0].spiffe_id, AGENT);
    dev.shutdown().await;
}

#[tokio::test]
async fn uid_registrations_select_identity_by_caller_uid() {
    let dir = tempfile::tempdir().unwrap();
    let my_uid = std::fs::metadata(dir.path()).unwrap().uid();
    let socket = dir.path().join("api.sock");
    let other_socket = dir.path().join("other.sock");
    let dev = DevWorkloadApi::builder(dir.path().join("ca"), td("example.org"))
        .default_socket(&socket)
        .registration(Registration {
            spiffe_id: id(AGENT),
            socket: None,
            uid: Some(my_uid),
        })
        .registration(Registration {
            spiffe_id: id("spiffe://example.org/someone-else"),
            socket: Some(other_socket.clone()),
            uid: Some(my_uid.wrapping_add(1)),
        })
        .serve()
        .await
        .unwrap();
    let client = spiffe::WorkloadApiClient::connect_to(format!("unix://{}", socket.display()))
        .await
        .unwrap();
    let svid = client.fetch_x509_svid().await.expect("uid entry matches");
    assert_eq!(svid.spiffe_id().to_string(), AGENT);

    // On the other socket our uid entry still applies (uid-only entries match every socket),
    // but the socket's own entry is for another uid and is not handed out.
    let client =
        spiffe::WorkloadApiClient::connect_to(format!("unix://{}", other_socket.display()))
            .await
            .unwrap();
    let svids = client.fetch_all_x509_svids().await.unwrap();
    let ids: Vec<String> = svids.iter().map(|s| s.spiffe_id().to_string()).collect();
    assert_eq!(ids, vec![AGENT.to_string()]);
    dev.shutdown().await;
}

#[tokio::test]
async fn caller_without_registration_gets_permission_denied() {
    let dir = tempfile::tempdir().unwrap();
    let my_uid = std::fs::metadata(dir.path()).unwrap().uid();
    let socket = dir.path().join("api.sock");
    let dev = DevWorkloadApi::builder(dir.path().join("ca"), td("example.org"))
        .registration(Registration {
            spiffe_id: id(AGENT),
            socket: Some(socket.clone()),
            uid: Some(my_uid.wrapping_add(1)),
        })
        .serve()
        .await
        .unwrap();
    let mut client = raw_client(socket).await;
    let mut request = tonic::Request::new(X509svidRequest {});
    request
        .metadata_mut()
        .insert("workload.spiffe.io", "true".parse().unwrap());
    let status = client.fetch_x509svid(request).await.expect_err("no entry");
    assert_eq!(status.code(), tonic::Code::PermissionDenied);
    dev.shutdown().await;
}

#[tokio::test]
async fn dev_ca_is_created_once_and_reused_from_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = DevCa::load_or_create(dir.path(), td("example.org")).unwrap();
    let b = DevCa::load_or_create(dir.path(), td("example.org")).unwrap();
    assert_eq!(a.certificate(), b.certificate());
    assert_eq!(a.jwt_key_id(), b.jwt_key_id());
    // An SVID from the reloaded CA chains to the original certificate.
    let svid = b.issue_x509(&id(AGENT), Duration::from_secs(60)).unwrap();
    assert_eq!(&svid.chain[1], a.certificate());
    let key_mode = std::fs::metadata(dir.path().join("example.org/ca.key.pem"))
        .unwrap()
        .mode();
    assert_eq!(key_mode & 0o077, 0, "CA key is private to its owner");
}

#[tokio::test]
async fn issued_svid_leaf_follows_strict_x509_svid_rules() {
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let svid = ca.issue_x509(&id(AGENT), Duration::from_secs(60)).unwrap();
    let (_, leaf) = x509_parser::parse_x509_certificate(svid.chain[0].as_ref()).unwrap();
    let mut uris = Vec::new();
    let mut ca_flag = None;
    let mut key_usage = None;
    for ext in leaf.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::SubjectAlternativeName(san) => {
                for n in &san.general_names {
                    match n {
                        GeneralName::URI(u) => uris.push(u.to_string()),
                        other => panic!("unexpected SAN {other:?}"),
                    }
                }
            }
            ParsedExtension::BasicConstraints(bc) => ca_flag = Some(bc.ca),
            ParsedExtension::KeyUsage(ku) => key_usage = Some(*ku),
            _ => {}
        }
    }
    assert_eq!(uris, vec![AGENT.to_string()]);
    assert_eq!(ca_flag, Some(false), "basicConstraints CA:false present");
    let ku = key_usage.expect("key usage present");
    assert!(ku.digital_signature());
    assert!(!ku.key_cert_sign());
    assert!(!ku.crl_sign());
}

#[tokio::test]
async fn restart_on_same_socket_replaces_stale_socket_file() {
    let dir = tempfile::tempdir().unwrap();
    let first = dev_server(dir.path()).await;
    // Simulate a crash: the socket files stay behind.
    drop(first);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(dir.path().join("agent.sock").exists());
    let second = dev_server(dir.path()).await;
    let client = spiffe::WorkloadApiClient::connect_to(endpoint(dir.path(), "agent"))
        .await
        .unwrap();
    assert!(client.fetch_x509_svid().await.is_ok());
    second.shutdown().await;
    assert!(
        !dir.path().join("agent.sock").exists(),
        "shutdown removes sockets"
    );
}

#[test]
fn registration_file_parses_and_rejects_entries_without_selector() {
    let file = RegistrationFile::parse(
        "trustDomain: example.org\n\
         defaultSocket: /tmp/x/api.sock\n\
         federatesWith: [partner.org]\n\
         registrations:\n\
         \x20 - spiffeId: spiffe://example.org/a\n\
         \x20   socket: /tmp/x/a.sock\n\
         \x20 - spiffeId: spiffe://example.org/b\n\
         \x20   uid: 1000\n",
        "test.yaml",
    )
    .unwrap();
    assert_eq!(file.trust_domain, Some(td("example.org")));
    assert_eq!(file.federates_with, vec![td("partner.org")]);
    assert_eq!(file.registrations.len(), 2);
    assert_eq!(file.registrations[1].uid, Some(1000));

    let err = RegistrationFile::parse(
        "registrations:\n  - spiffeId: spiffe://example.org/a\n",
        "bad.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("neither socket nor uid"), "{err}");
    let err = RegistrationFile::parse(
        "registrations:\n  - spiffeId: not-a-spiffe-id\n    uid: 1\n",
        "bad.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("bad.yaml"), "{err}");
}
