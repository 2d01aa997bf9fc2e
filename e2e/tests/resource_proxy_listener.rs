//! The resource proxy's listener attacked as an outsider and as a slow client would: the
//! real principal with `--enable-resource-proxy` and a real managed agent; raw TCP and TLS
//! clients next to kubectl (playing argocd-server).
//!
//! - connections over the per-address cap are closed at accept, and argocd-server from
//!   another address still gets in;
//! - a TLS connection that sends nothing, or headers that never finish, is closed;
//! - request bodies are read before a request takes one of its agent's slots, within the
//!   body timeout: slow POSTs with the agent's own token do not block its other requests;
//! - the `Bearer` scheme is read in any case (RFC 7235).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use argocd_agent_testkit::harness::*;
use base64::Engine;
use rustls_pki_types::pem::PemObject;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const T: Duration = Duration::from_secs(30);

/// The proxy's URL, token and CA from a kubeconfig `argocd-agentctl agent kubeconfig` wrote.
fn kubeconfig(path: &Path) -> (String, String, Vec<u8>) {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let cluster = &v["clusters"][0]["cluster"];
    let ca = base64::engine::general_purpose::STANDARD
        .decode(cluster["certificate-authority-data"].as_str().unwrap())
        .unwrap();
    (
        cluster["server"].as_str().unwrap().to_owned(),
        v["users"][0]["user"]["token"].as_str().unwrap().to_owned(),
        ca,
    )
}

fn tls_connector(ca_pem: &[u8]) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

async fn connect_from(ip: &str, port: u16) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    s.connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap()
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls(connector: &tokio_rustls::TlsConnector, tcp: TcpStream) -> Tls {
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// Reads until the server closes; how long that took (`None`: still open after `within`).
async fn closed_within<S: tokio::io::AsyncRead + Unpin>(
    s: &mut S,
    within: Duration,
) -> Option<Duration> {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + within).into(), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(started.elapsed()),
            Ok(Ok(_)) => {}
            Err(_) => return None,
        }
    }
}

/// One HTTP/1.1 request over a fresh TLS connection; the status code and body.
async fn request(connector: &tokio_rustls::TlsConnector, port: u16, head: &str) -> (u16, String) {
    let mut s = tls(
        connector,
        TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
    )
    .await;
    s.write_all(head.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    let _ = tokio::time::timeout(T, s.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (code, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_resource_proxy_listener_holds_against_idle_slow_and_crowding_clients() {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
            "--resource-proxy-max-connections-per-client".into(),
            "20".into(),
            "--resource-proxy-idle-timeout".into(),
            "2s".into(),
            "--resource-proxy-header-timeout".into(),
            "2s".into(),
            "--resource-proxy-body-timeout".into(),
            "2s".into(),
            "--resource-proxy-max-in-flight-per-agent".into(),
            "4".into(),
        ],
        ..Default::default()
    })
    .await
    .unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    eventually("the cluster secret", T, || async {
        stored_secret(&topo.hub, HUB_ARGOCD_NS, &format!("cluster-{MANAGED}"))
    })
    .await
    .unwrap();
    let kc = agent_kubeconfig(&topo.dir, MANAGED).await;
    let (url, token, ca) = kubeconfig(&kc);
    let prefix = url
        .trim_start_matches(&format!("https://127.0.0.1:{port}"))
        .to_owned();
    let connector = tls_connector(&ca);
    let version = |scheme: &str| {
        format!(
            "GET {prefix}/version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {scheme} {token}\r\nConnection: close\r\n\r\n"
        )
    };

    // 1. Bearer in any case.
    for scheme in ["Bearer", "bearer", "BEARER"] {
        let (code, text) = request(&connector, port, &version(scheme)).await;
        assert_eq!(code, 200, "{scheme}: {text}");
    }

    // 2. An idle TLS connection and one whose headers never finish are closed.
    let mut idle = tls(
        &connector,
        TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
    )
    .await;
    let took = closed_within(&mut idle, Duration::from_secs(10)).await;
    assert!(
        took.is_some_and(|t| t >= Duration::from_millis(1500)),
        "idle TLS connection: {took:?}"
    );
    let mut slow = tls(
        &connector,
        TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
    )
    .await;
    slow.write_all(format!("GET {prefix}/version HTTP/1.1\r\nHost: 127.0.0.1\r\n").as_bytes())
        .await
        .unwrap();
    let took = closed_within(&mut slow, Duration::from_secs(10)).await;
    assert!(
        took.is_some(),
        "headers that never finish keep the connection"
    );

    // 3. Connections over the per-address cap are closed at once; argocd-server (another
    // address) still gets in.
    let mut crowd = Vec::new();
    for _ in 0..20 {
        crowd.push(connect_from("127.0.0.2", port).await);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut over = connect_from("127.0.0.2", port).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(3))
            .await
            .is_some(),
        "the 21st connection from one address is refused"
    );
    let (code, _) = request(&connector, port, &version("Bearer")).await;
    assert_eq!(code, 200, "another client is not crowded out");
    drop(crowd);

    // 4. Slow bodies do not take the agent's slots (4 here): 6 POSTs that never finish
    // their body, then a GET with the same token is answered at once; the POSTs get 408.
    let mut posts = Vec::new();
    for i in 0..6 {
        let mut s = tls(
            &connector,
            TcpStream::connect(("127.0.0.1", port)).await.unwrap(),
        )
        .await;
        s.write_all(
            format!(
                "POST {prefix}/api/v1/namespaces/guestbook/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{{\"slow\":{i}"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        posts.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let (code, text) = request(&connector, port, &version("Bearer")).await;
    assert_eq!(code, 200, "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "the GET waited for the slow POSTs"
    );
    for mut s in posts {
        let mut raw = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut raw)).await;
        let text = String::from_utf8_lossy(&raw);
        assert!(text.starts_with("HTTP/1.1 408"), "a slow body: {text}");
    }

    let metrics = http_get(topo.metrics_ports["principal"], "/metrics")
        .await
        .unwrap();
    for reason in ["IdleTimeout", "TooManyFromClient"] {
        assert!(
            metrics.lines().any(|l| l
                .starts_with("argocd_principal_listener_connections_closed_total")
                && l.contains("listener=\"resource-proxy\"")
                && l.contains(&format!("reason=\"{reason}\""))),
            "no {reason} counted:\n{metrics}"
        );
    }
    topo.stop().await;
}
