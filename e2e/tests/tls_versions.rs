//! TLS versions on every TLS listener of the real principal, probed with rustls clients
//! restricted to TLS 1.2: the gRPC listener (agents, SVID mutual TLS), the resource proxy
//! (HTTPS) and the Redis proxy (with its TLS on).
//!
//! - by default every listener speaks TLS 1.3 only: a TLS 1.2 client is refused in the
//!   handshake (`protocol_version` alert), and the agent (TLS 1.3 by default) connects;
//! - with `--tls-min-version tls1.2` each listener completes a TLS 1.2 handshake (the gRPC
//!   one verifying the client's SVID), and an agent told to speak only TLS 1.2
//!   (`--tls-min-version tls1.2 --tls-max-version tls1.2`) connects.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use argocd_agent_identity::source::SvidSource;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::tls::{PeerPolicy, TlsProfile, client_config_with};
use argocd_agent_testkit::envoy::free_loopback_port;
use argocd_agent_testkit::harness::*;
use rustls::ProtocolVersion;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;

const T: Duration = Duration::from_secs(30);

/// A rustls client profile that speaks TLS 1.2 only.
fn tls12_only() -> TlsProfile {
    TlsProfile::from_settings(Some("tls1.2"), Some("tls1.2"), &[]).expect("a TLS 1.2 profile")
}

/// The principal's three TLS listeners.
struct Listeners {
    grpc: SocketAddr,
    resource_proxy: SocketAddr,
    redis_proxy: SocketAddr,
}

/// A CA-less self-signed certificate for the Redis proxy, as PEM files in `dir`.
fn redis_proxy_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let paths = (dir.join("redis-proxy.pem"), dir.join("redis-proxy.key"));
    std::fs::write(&paths.0, c.cert.pem()).unwrap();
    std::fs::write(&paths.1, c.signing_key.serialize_pem()).unwrap();
    paths
}

/// The topology (principal and the managed agent, with `agent_args`) with the resource
/// proxy and the Redis proxy (TLS) on, and `principal_tls` added to the principal's flags.
async fn start(
    principal_tls: &[&str],
    agent_args: &[&str],
) -> (Topology, Listeners, tempfile::TempDir) {
    let tmp = tempfile::Builder::new()
        .prefix("argocd-agent-tls-versions")
        .tempdir()
        .unwrap();
    let (cert, key) = redis_proxy_cert(tmp.path());
    let (rp, rd, redis) = (
        free_loopback_port().unwrap(),
        free_loopback_port().unwrap(),
        free_loopback_port().unwrap(),
    );
    let mut principal_args: Vec<String> = vec![
        "--enable-resource-proxy".into(),
        "--resource-proxy-address".into(),
        format!("127.0.0.1:{rp}"),
        "--redis-proxy-address".into(),
        format!("127.0.0.1:{rd}"),
        // Nothing listens there: the proxy's TLS handshake comes before the hub leg.
        "--redis-server-address".into(),
        format!("127.0.0.1:{redis}"),
        "--redis-proxy-tls-cert-path".into(),
        cert.display().to_string(),
        "--redis-proxy-tls-key-path".into(),
        key.display().to_string(),
    ];
    principal_args.extend(principal_tls.iter().map(|s| s.to_string()));
    let topo = Topology::start(TopologyOptions {
        dir: Some(tmp.path().join("topology")),
        agents: Some(vec![MANAGED]),
        principal_args,
        agent_args: agent_args.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    for port in [rp, rd] {
        wait_port(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
    }
    let listeners = Listeners {
        grpc: topo.principal_addr,
        resource_proxy: format!("127.0.0.1:{rp}").parse().unwrap(),
        redis_proxy: format!("127.0.0.1:{rd}").parse().unwrap(),
    };
    (topo, listeners, tmp)
}

/// A TLS handshake with `addr`; the version negotiated, or rustls' error.
async fn handshake(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<ProtocolVersion, String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("localhost").unwrap();
    let tls = tokio::time::timeout(
        T,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| format!("handshake with {addr} timed out"))?
    .map_err(
        |e| match e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
            Some(r) => format!("{r:?}"),
            None => e.to_string(),
        },
    )?;
    tls.get_ref()
        .1
        .protocol_version()
        .ok_or_else(|| "no version negotiated".into())
}

/// The gRPC listener's client: the managed agent's SVID, pinning the principal.
fn grpc_client(source: &SvidSource, profile: &TlsProfile) -> Arc<rustls::ClientConfig> {
    let pin = PeerPolicy::Exact(SpiffeId::parse(PRINCIPAL_ID).unwrap());
    client_config_with(source, pin, profile).unwrap()
}

/// A client for the proxies, which serve certificates this test does not check (the
/// version is what is probed).
fn proxy_client(profile: &TlsProfile) -> Arc<rustls::ClientConfig> {
    let provider = profile.provider();
    let config = profile
        .client_builder()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    Arc::new(config)
}

/// Every listener's answer to a client of `profile`.
async fn probe(
    topo: &Topology,
    l: &Listeners,
    profile: &TlsProfile,
) -> Vec<(&'static str, Result<ProtocolVersion, String>)> {
    let proxy = proxy_client(profile);
    // Kept until the handshake is done: its SVID is read then.
    let source = topo.svid_source("managed.sock").await.unwrap();
    vec![
        (
            "gRPC",
            handshake(l.grpc, grpc_client(&source, profile)).await,
        ),
        (
            "resource proxy",
            handshake(l.resource_proxy, proxy.clone()).await,
        ),
        ("Redis proxy", handshake(l.redis_proxy, proxy).await),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_listener_refuses_tls12_by_default() {
    let (topo, listeners, _dir) = start(&[], &[]).await;
    let r = async {
        topo.wait_connected(MANAGED, T).await?;
        for (name, answer) in probe(&topo, &listeners, &tls12_only()).await {
            let e = answer
                .err()
                .ok_or(format!("{name}: a TLS 1.2 client was served"))?;
            if !e.contains("ProtocolVersion") {
                return Err(format!("{name}: refused, but not for its version: {e}").into());
            }
        }
        for (name, answer) in probe(&topo, &listeners, &TlsProfile::default()).await {
            if answer != Ok(ProtocolVersion::TLSv1_3) {
                return Err(format!("{name}: a TLS 1.3 client got {answer:?}").into());
            }
        }
        Ok::<(), HarnessError>(())
    }
    .await;
    if let Err(e) = r {
        panic!("{e}\n{}", topo.logs());
    }
    topo.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tls_min_version_tls12_serves_tls12_clients_and_agents() {
    let only_12 = ["--tls-min-version", "tls1.2", "--tls-max-version", "tls1.2"];
    let (topo, listeners, _dir) = start(&["--tls-min-version", "tls1.2"], &only_12).await;
    let r = async {
        // The agent speaks TLS 1.2 only here: connecting proves both sides honour the flags.
        topo.wait_connected(MANAGED, T).await?;
        for (name, answer) in probe(&topo, &listeners, &tls12_only()).await {
            if answer != Ok(ProtocolVersion::TLSv1_2) {
                return Err(format!("{name}: a TLS 1.2 client got {answer:?}").into());
            }
        }
        for (name, answer) in probe(&topo, &listeners, &TlsProfile::default()).await {
            if answer != Ok(ProtocolVersion::TLSv1_3) {
                return Err(format!("{name}: a TLS 1.3 client got {answer:?}").into());
            }
        }
        Ok::<(), HarnessError>(())
    }
    .await;
    if let Err(e) = r {
        panic!("{e}\n{}", topo.logs());
    }
    topo.stop().await;
}

/// Accepts every server certificate (the handshake signatures are still checked).
#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls_pki_types::CertificateDer<'_>,
        _intermediates: &[rustls_pki_types::CertificateDer<'_>],
        _server_name: &ServerName<'_>,
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
        let algs = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls_pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        let algs = &self.0.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
