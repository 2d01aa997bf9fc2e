//! Mutual TLS between a tonic server and client using SVIDs from the development Workload API.

mod support;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use argocd_agent_identity::tls::{PeerPolicy, TlsError};
use argocd_agent_identity::{SvidSource, SvidState, TrustBundles};
use argocd_agent_testkit::workload_api::DevCa;
use support::*;

/// A fixed source presenting `svid` and trusting `bundles`.
fn fixed(
    svid: &argocd_agent_testkit::workload_api::IssuedSvid,
    bundles: TrustBundles,
) -> SvidSource {
    SvidSource::fixed(SvidState {
        svid: Arc::new(svid.to_x509_svid().expect("usable SVID")),
        bundles: Arc::new(bundles),
    })
}

/// The principal's and an agent's sources, both issued by one CA, and a bound listener.
async fn principal_agent_and_listener() -> (
    SvidSource,
    SvidSource,
    tokio::net::TcpListener,
    std::net::SocketAddr,
) {
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let issue = |who: &str| ca.issue_x509(&id(who), Duration::from_secs(3600)).unwrap();
    let principal = fixed(&issue(PRINCIPAL), bundles_of(&[&ca]));
    let agent = fixed(&issue(AGENT), bundles_of(&[&ca]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    (principal, agent, listener, addr)
}

fn bundles_of(cas: &[&DevCa]) -> TrustBundles {
    let mut b = TrustBundles::new();
    for ca in cas {
        b.insert(ca.trust_domain().clone(), vec![ca.certificate().clone()])
            .expect("bundle");
    }
    b
}

#[tokio::test]
async fn mutual_tls_with_workload_api_svids_identifies_both_sides() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let agent = source(dir.path(), "agent").await;
    assert_eq!(
        principal.current().unwrap().svid.spiffe_id().as_str(),
        PRINCIPAL
    );

    let server = serve(&principal, PeerPolicy::Any).await;
    let answer = try_version(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL)))
        .await
        .expect("mutual TLS succeeds");
    assert_eq!(answer.version, AGENT, "server sees the agent's SPIFFE ID");
    let seen = server.seen();
    assert_eq!(seen.len(), 1);
    let (serial, _) = leaf_facts(agent.current().unwrap().svid.leaf().as_ref());
    assert_eq!(
        seen[0].serial, serial,
        "server saw the agent's current certificate"
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn client_from_untrusted_trust_domain_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let server = serve(&principal, PeerPolicy::Any).await;

    // The client trusts the principal, but its own SVID comes from a trust domain the
    // principal holds no bundle for.
    let other = DevCa::ephemeral(td("other.org")).unwrap();
    let svid = other
        .issue_x509(&id("spiffe://other.org/agent"), Duration::from_secs(600))
        .unwrap();
    let client = fixed(&svid, bundles_of(&[dev.ca()]));
    let result = try_version(server.addr, &client, PeerPolicy::Exact(id(PRINCIPAL))).await;
    assert!(result.is_err(), "foreign client accepted: {result:?}");
    assert!(server.seen().is_empty());

    // Same ID string, but signed by a CA that merely claims to be example.org.
    let rogue = DevCa::ephemeral(td("example.org")).unwrap();
    let svid = rogue
        .issue_x509(&id(AGENT), Duration::from_secs(600))
        .unwrap();
    let client = fixed(&svid, bundles_of(&[dev.ca()]));
    let result = try_version(server.addr, &client, PeerPolicy::Exact(id(PRINCIPAL))).await;
    assert!(
        result.is_err(),
        "client from a rogue CA accepted: {result:?}"
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn federated_client_verifies_against_its_own_trust_domain_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_builder(dir.path())
        .federate_with(td("partner.org"))
        .serve()
        .await
        .unwrap();
    let principal = source(dir.path(), "principal").await;
    assert!(
        principal
            .current()
            .unwrap()
            .bundles
            .get(&td("partner.org"))
            .is_some(),
        "federated bundle is part of the source state"
    );
    let partner_ca = dev.federated_ca(&td("partner.org")).unwrap().clone();
    let svid = partner_ca
        .issue_x509(&id("spiffe://partner.org/agent"), Duration::from_secs(600))
        .unwrap();
    let client = fixed(&svid, bundles_of(&[dev.ca()]));

    let open = serve(&principal, PeerPolicy::Any).await;
    let answer = try_version(open.addr, &client, PeerPolicy::Exact(id(PRINCIPAL)))
        .await
        .expect("federated client accepted");
    assert_eq!(answer.version, "spiffe://partner.org/agent");

    let own_only = serve(
        &principal,
        PeerPolicy::TrustDomains(vec![td("example.org")]),
    )
    .await;
    let result = try_version(own_only.addr, &client, PeerPolicy::Exact(id(PRINCIPAL))).await;
    assert!(
        result.is_err(),
        "policy must refuse the federated trust domain"
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn expired_client_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let server = serve(&principal, PeerPolicy::Any).await;

    let now = SystemTime::now();
    let expired = dev
        .ca()
        .issue_x509_valid(
            &id(AGENT),
            now - Duration::from_secs(7200),
            now - Duration::from_secs(3600),
        )
        .unwrap();
    let client = fixed(&expired, bundles_of(&[dev.ca()]));
    let result = try_version(server.addr, &client, PeerPolicy::Exact(id(PRINCIPAL))).await;
    assert!(result.is_err(), "expired client accepted: {result:?}");
    assert!(server.seen().is_empty());
    dev.shutdown().await;
}

#[tokio::test]
async fn server_with_valid_svid_but_wrong_id_is_not_accepted_as_principal() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let agent = source(dir.path(), "agent").await;
    // A workload of the same trust domain with a valid SVID pretends to be the principal.
    let impostor = dev
        .ca()
        .issue_x509(
            &id("spiffe://example.org/ns/evil/sa/fake"),
            Duration::from_secs(600),
        )
        .unwrap();
    let impostor_source = fixed(&impostor, bundles_of(&[dev.ca()]));
    let server = serve(&impostor_source, PeerPolicy::Any).await;

    let result = try_version(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL))).await;
    assert!(
        result.is_err(),
        "impostor accepted as principal: {result:?}"
    );
    assert!(server.seen().is_empty(), "no RPC reached the impostor");

    // The refusal names both IDs.
    let err = PeerPolicy::Exact(id(PRINCIPAL))
        .check(&id("spiffe://example.org/ns/evil/sa/fake"))
        .unwrap_err();
    assert!(matches!(err, TlsError::NotAllowed { .. }));
    assert_eq!(
        err.to_string(),
        format!("spiffe://example.org/ns/evil/sa/fake is not the pinned principal {PRINCIPAL}")
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn server_policy_one_of_refuses_other_clients_of_the_trust_domain() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let agent = source(dir.path(), "agent").await;
    let server = serve(
        &principal,
        PeerPolicy::OneOf(vec![id("spiffe://example.org/ns/argocd/sa/someone-else")]),
    )
    .await;
    let result = try_version(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL))).await;
    assert!(
        result.is_err(),
        "client outside the policy accepted: {result:?}"
    );
    dev.shutdown().await;
}

#[tokio::test]
async fn stalled_and_garbage_handshakes_do_not_block_or_stop_the_server() {
    use tokio::io::AsyncWriteExt as _;
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let agent = source(dir.path(), "agent").await;
    let server = serve(&principal, PeerPolicy::Any).await;

    // A client that connects and never speaks, and one that sends garbage.
    let _stalled = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    let mut garbage = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();

    let answer = tokio::time::timeout(
        Duration::from_secs(3),
        try_version(server.addr, &agent, PeerPolicy::Exact(id(PRINCIPAL))),
    )
    .await
    .expect("not blocked by the stalled handshake")
    .expect("server still serving");
    assert_eq!(answer.version, AGENT);
    dev.shutdown().await;
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let principal = source(dir.path(), "principal").await;
    let server = serve(&principal, PeerPolicy::Any).await;

    // A client that accepts any server (so only the server can refuse) and presents no
    // certificate.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AcceptAnyServer(provider)))
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let result = async {
        let channel = argocd_agent_identity::transport::connect(
            &server.addr.to_string(),
            Arc::new(config),
            "localhost",
            Default::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
        version(channel).await.map_err(|e| e.to_string())
    }
    .await;
    assert!(result.is_err(), "anonymous client accepted: {result:?}");
    assert!(server.seen().is_empty());
    dev.shutdown().await;
}

/// Test-only verifier that accepts every server certificate.
#[derive(Debug)]
struct AcceptAnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AcceptAnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[tokio::test]
async fn client_that_never_speaks_http2_is_closed_after_the_preface_timeout() {
    use argocd_agent_identity::tls::{client_config, server_config};
    use argocd_agent_identity::transport::tls_incoming_with_options;
    use argocd_agent_listener::IncomingOptions;
    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (principal, agent, listener, addr) = principal_agent_and_listener().await;
    let mut incoming = Box::pin(tls_incoming_with_options(
        listener,
        server_config(&principal, PeerPolicy::Any).unwrap(),
        IncomingOptions {
            preface_timeout: Duration::from_millis(300),
            ..IncomingOptions::default()
        },
        &tokio_util::task::TaskTracker::new(),
        tokio_util::sync::CancellationToken::new(),
    ));
    let connector = tokio_rustls::TlsConnector::from(
        client_config(&agent, PeerPolicy::Exact(id(PRINCIPAL))).unwrap(),
    );
    let dial = || async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.expect("TLS handshake")
    };
    let mut buf = [0u8; 16];

    // A valid SVID that completes the handshake and then says nothing is closed.
    let mut silent = dial().await;
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf))
        .await
        .expect("server closes a silent connection within the preface timeout");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

    // So is one that speaks something other than HTTP/2.
    let mut http1 = dial().await;
    http1.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(5), http1.read(&mut buf))
        .await
        .expect("server closes a non-HTTP/2 connection");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    assert!(
        tokio::time::timeout(Duration::from_millis(100), incoming.next())
            .await
            .is_err(),
        "neither connection reaches the server"
    );

    // The preface is replayed to the server, and the verified peer is still attached.
    let mut good = dial().await;
    good.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    good.flush().await.unwrap();
    let mut stream = tokio::time::timeout(Duration::from_secs(5), incoming.next())
        .await
        .expect("preface accepted")
        .expect("stream open")
        .expect("connection");
    assert_eq!(Some(stream.get_ref().peer().id.as_str()), Some(AGENT));
    // The handshake's round trip is measured, for the agent's send queue.
    let handshake = stream
        .get_ref()
        .peer()
        .handshake
        .expect("handshake measured");
    assert!(handshake > Duration::ZERO && handshake < Duration::from_secs(5));
    let mut replayed = [0u8; 24];
    stream.read_exact(&mut replayed).await.unwrap();
    assert_eq!(&replayed, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
}

/// While the server is not ready, a TLS client's connection is closed before the server
/// says anything (no ServerHello): the handshake never completes, and costs the server no
/// TLS work. Once ready, the next client is taken at once.
#[tokio::test]
async fn a_listener_that_is_not_ready_closes_connections_before_tls() {
    use argocd_agent_identity::tls::{client_config, server_config};
    use argocd_agent_identity::transport::tls_incoming_with_options;
    use argocd_agent_listener::{IncomingOptions, ReadyHook, RefusedHook};
    use futures::StreamExt as _;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let (principal, agent, listener, addr) = principal_agent_and_listener().await;
    let (ready, rx) = tokio::sync::watch::channel(false);
    let reasons: Arc<std::sync::Mutex<Vec<&'static str>>> = Arc::default();
    let seen = reasons.clone();
    let mut incoming = Box::pin(tls_incoming_with_options(
        listener,
        server_config(&principal, PeerPolicy::Any).unwrap(),
        IncomingOptions {
            on_refused: Some(RefusedHook(Arc::new(move |r| seen.lock().unwrap().push(r)))),
            ready: Some(ReadyHook::from_watch(rx)),
            ..IncomingOptions::default()
        },
        &tokio_util::task::TaskTracker::new(),
        tokio_util::sync::CancellationToken::new(),
    ));
    let connector = tokio_rustls::TlsConnector::from(
        client_config(&agent, PeerPolicy::Exact(id(PRINCIPAL))).unwrap(),
    );
    let name = || rustls_pki_types::ServerName::try_from("localhost").unwrap();

    // The real client's handshake fails...
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let handshake = tokio::time::timeout(Duration::from_secs(5), connector.connect(name(), tcp))
        .await
        .expect("closed at once, not left waiting");
    assert!(handshake.is_err(), "no handshake while not ready");
    // ...and the server wrote not one byte (a ServerHello would be the first).
    let mut raw = tokio::net::TcpStream::connect(addr).await.unwrap();
    let _ = raw
        .write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 0, 0, 1, 0])
        .await;
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut buf))
        .await
        .expect("closed at once");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");

    // Ready: the next client is served.
    ready.send_replace(true);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = connector.connect(name(), tcp).await.expect("TLS handshake");
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    tls.flush().await.unwrap();
    let stream = tokio::time::timeout(Duration::from_secs(5), incoming.next())
        .await
        .expect("taken once ready")
        .expect("stream open")
        .expect("connection");
    assert_eq!(Some(stream.get_ref().peer().id.as_str()), Some(AGENT));
    assert_eq!(*reasons.lock().unwrap(), vec!["NotReady"; 2]);
}
