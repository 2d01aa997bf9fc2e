//! Every listener bounded per client, against the real principal: one client address (a
//! loopback address of its own: on Linux the whole 127/8 answers) opens silent
//! connections up to and beyond its share, while a legitimate client from 127.0.0.1 is
//! still served.
//!
//! - resource proxy: the 33rd silent connection from one address is closed at once (32
//!   TLS handshakes per address), a GET from another is answered; request bodies are held
//!   under one budget (429 with a Status when it is full, room again once they close);
//! - agent listener over mTLS: the same handshake share; an agent from another address
//!   dials and calls at once;
//! - agent listener in plaintext (JWT-SVID): connections without an HTTP/2 preface are
//!   closed after 10 s, those over the address's share at once;
//! - admin API: 16 connections per address and 64 in all;
//! - metrics: 8 connections per address, 64 in all, and `/healthz` still answered on a
//!   connection reserved for the probes while `/metrics` is full;
//! - Redis proxy: 16 unauthenticated connections per address, 256 in all: eight addresses
//!   of idle clients leave argocd-server room to log in.

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

/// A TCP connection to `127.0.0.1:port` from `ip` (a loopback address).
async fn connect_from(ip: &str, port: u16) -> TcpStream {
    let s = TcpSocket::new_v4().unwrap();
    s.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    s.connect(format!("127.0.0.1:{port}").parse().unwrap())
        .await
        .unwrap()
}

/// `n` silent connections from `ip`.
async fn crowd(ip: &str, port: u16, n: usize) -> Vec<TcpStream> {
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        all.push(connect_from(ip, port).await);
    }
    all
}

/// Whether the server closed `s` within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline.into(), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// How many of `conns` the server closed within `within` (all watched at once).
async fn count_closed(conns: &mut [TcpStream], within: Duration) -> usize {
    let watches = conns.iter_mut().map(|c| closed_within(c, within));
    futures::future::join_all(watches)
        .await
        .into_iter()
        .filter(|c| *c)
        .count()
}

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

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn tls(connector: &tokio_rustls::TlsConnector, port: u16) -> Tls {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

/// Sends `head` (and reads the answer until the server closes): status code and text.
async fn exchange<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    s: &mut S,
    head: &[u8],
) -> (u16, String) {
    s.write_all(head).await.unwrap();
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

/// A plain HTTP/1.1 GET of `path` on `127.0.0.1:port`.
async fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let head = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    exchange(&mut s, head.as_bytes()).await
}

/// A process's resident memory (KiB).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn resource_proxy_and_agent_listener_keep_room_for_others_and_bound_held_bodies() {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
            "--resource-proxy-max-buffered-bodies".into(),
            (8 << 20).to_string(),
            "--resource-proxy-body-wait".into(),
            "1s".into(),
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
    let (url, token, ca) = kubeconfig(&agent_kubeconfig(&topo.dir, MANAGED).await);
    let prefix = url
        .trim_start_matches(&format!("https://127.0.0.1:{port}"))
        .to_owned();
    let connector = tls_connector(&ca);
    let get = format!(
        "GET {prefix}/version HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );

    // Resource proxy: 40 silent connections from one address; the 8 over its 32 TLS
    // handshakes are closed at once, and a client from another address is served.
    let mut silent = crowd("127.0.0.2", port, 40).await;
    let closed = count_closed(&mut silent, Duration::from_secs(2)).await;
    assert_eq!(closed, 8, "connections over the address's handshake share");
    let started = Instant::now();
    let (code, text) = exchange(&mut tls(&connector, port).await, get.as_bytes()).await;
    assert_eq!(code, 200, "{text}");
    assert!(started.elapsed() < Duration::from_secs(3));

    // Agent listener (mTLS): the same share; an agent from 127.0.0.1 dials and calls.
    let grpc = topo.principal_addr.port();
    let mut silent_grpc = crowd("127.0.0.3", grpc, 40).await;
    let closed = count_closed(&mut silent_grpc, Duration::from_secs(2)).await;
    assert_eq!(
        closed, 8,
        "agent listener: over the address's handshake share"
    );
    let source = topo.svid_source("managed.sock").await.unwrap();
    let started = Instant::now();
    let channel = dial_principal(&source, topo.principal_addr).await.unwrap();
    argocd_agent_proto::version::version_client::VersionClient::new(channel)
        .version(argocd_agent_proto::version::VersionRequest {})
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    drop((silent, silent_grpc));

    // Held bodies: two POSTs declaring 4 MiB each take the 8 MiB budget; a third is
    // answered 429 with a Status, and once they close there is room again.
    let post = |len: usize| {
        format!(
            "POST {prefix}/api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        )
    };
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = tls(&connector, port).await;
        s.write_all(post(4 << 20).as_bytes()).await.unwrap();
        s.write_all(&[b' '; 1024]).await.unwrap();
        held.push(s);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut third = tls(&connector, port).await;
    let (code, text) = exchange(&mut third, post(4 << 20).as_bytes()).await;
    assert_eq!(code, 429, "{text}");
    assert!(text.contains("\"reason\":\"TooManyRequests\""), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    drop(held);

    // 30 clients each streaming most of a 4 MiB body without a declared length: the
    // principal buffers at most the 8 MiB budget of them (each takes room as its bytes
    // come), not 120 MiB.
    let pid = topo.principal.pid().unwrap();
    let before = rss_kib(pid);
    let mut streams = Vec::new();
    for _ in 0..30 {
        let mut s = tls(&connector, port).await;
        let head = post(0).replace("Content-Length: 0", "Transfer-Encoding: chunked");
        streams.push(tokio::spawn(async move {
            s.write_all(head.as_bytes()).await.ok()?;
            s.write_all(format!("{:x}\r\n", (4 << 20) - 1).as_bytes())
                .await
                .ok()?;
            s.write_all(&vec![b' '; (4 << 20) - 1]).await.ok()?;
            tokio::time::sleep(T).await;
            Some(s)
        }));
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let grown = rss_kib(pid).saturating_sub(before);
    assert!(grown < 64 * 1024, "principal RSS grew by {grown} KiB");
    for s in streams {
        s.abort();
        // Aborted and awaited: its connection is closed before the next request.
        let _ = s.await;
    }
    let body = r#"{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"bounded"}}"#;
    let request = format!("{}{body}", post(body.len()));
    // The principal releases a closed connection's buffered body once it sees the close
    // (a moment after the client's): room must come back within a few seconds.
    let mut answer = (429, String::new());
    for _ in 0..10 {
        let mut s = tls(&connector, port).await;
        answer = exchange(&mut s, request.as_bytes()).await;
        if answer.0 != 429 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, text) = answer;
    assert_ne!(code, 429, "room again after the held bodies closed: {text}");
    assert_ne!(code, 0, "{text}");
    topo.finish(Ok(())).await;
}

/// The managed agent on the plaintext listener (JWT-SVID), the principal with `args` too.
async fn jwt_topology(args: &[&str]) -> Topology {
    let mut principal_args = vec!["--auth".to_owned(), "jwt-svid".to_owned()];
    principal_args.extend(args.iter().map(|a| a.to_string()));
    Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args,
        agent_creds: Some("jwt-svid".into()),
        ..Default::default()
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_agent_listener_times_out_silent_connections_and_shares_its_prefaces() {
    let topo = jwt_topology(&["--max-handshakes-per-client", "4"]).await;
    let port = topo.principal_addr.port();
    let mut silent = crowd("127.0.0.4", port, 6).await;
    let started = Instant::now();
    // The two over the address's share of 4 are closed at once.
    assert_eq!(count_closed(&mut silent, Duration::from_secs(2)).await, 2);
    // A client from another address is served meanwhile.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", topo.principal_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    argocd_agent_proto::version::version_client::VersionClient::new(channel)
        .version(argocd_agent_proto::version::VersionRequest {})
        .await
        .unwrap();
    // The four within the share are closed when the 10 s preface timeout ends.
    assert_eq!(count_closed(&mut silent, Duration::from_secs(15)).await, 6);
    let took = started.elapsed();
    assert!(took >= Duration::from_secs(9), "closed after {took:?}");
    let metrics = topo.metrics_ports["principal"];
    let refused = metric_sum(
        metrics,
        "argocd_principal_listener_connections_closed_total",
    )
    .await;
    assert!(refused >= 2.0, "refusals counted: {refused}");
    topo.finish(Ok(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_api_is_capped_and_liveness_answers_while_metrics_is_full() {
    let admin_port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        principal_args: vec!["--admin-address".into(), format!("127.0.0.1:{admin_port}")],
        ..Default::default()
    })
    .await
    .unwrap();

    // Admin API: 16 per address; 64 in all.
    let mut first = crowd("127.0.0.5", admin_port, 17).await;
    assert!(closed_within(&mut first[16], Duration::from_secs(2)).await);
    let mut rest = Vec::new();
    for ip in ["127.0.0.6", "127.0.0.7", "127.0.0.8"] {
        rest.extend(crowd(ip, admin_port, 16).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut over = connect_from("127.0.0.9", admin_port).await;
    assert!(
        closed_within(&mut over, Duration::from_secs(2)).await,
        "the 65th admin connection is refused"
    );
    drop((first, rest));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{admin_port}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    argocd_agent_proto::admin::admin_client::AdminClient::new(channel)
        .list_agents(argocd_agent_proto::admin::ListAgentsRequest {})
        .await
        .unwrap();

    // Metrics: 8 addresses fill its 64 connections (8 each); /healthz is still answered on
    // a reserved connection, /metrics is not.
    let metrics = topo.metrics_ports["principal"];
    let mut full = Vec::new();
    for i in 10..18 {
        full.extend(crowd(&format!("127.0.0.{i}"), metrics, 8).await);
    }
    let mut ninth = connect_from("127.0.0.10", metrics).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        assert_eq!(http_get(metrics, "/healthz").await.0, 200, "liveness");
    }
    assert_eq!(http_get(metrics, "/readyz").await.0, 200, "readiness");
    assert_eq!(
        http_get(metrics, "/metrics").await.0,
        503,
        "metrics is full"
    );
    let head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    assert_eq!(exchange(&mut ninth, head).await.0, 503);
    drop(full);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(http_get(metrics, "/metrics").await.0, 200);
    topo.finish(Ok(())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_proxy_logins_get_through_eight_addresses_of_idle_unauthenticated_clients() {
    use argocd_agent_testkit::redis::{RedisServer, RespClient};
    const PASSWORD: &str = "s3cret-hub-redis";
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-listener-bounds")
        .tempdir()
        .unwrap();
    let hub_redis = RedisServer::start_with_password(dir.path(), "redis-hub", PASSWORD)
        .await
        .unwrap();
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let topo = Topology::start(TopologyOptions {
        dir: Some(dir.path().join("topology")),
        agents: Some(vec![]),
        principal_args: vec![
            "--redis-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--redis-server-address".into(),
            hub_redis.addr(),
        ],
        principal_envs: vec![("REDIS_PASSWORD".into(), PASSWORD.into())],
        ..Default::default()
    })
    .await
    .unwrap();
    // 8 addresses × 16 idle unauthenticated connections (each address's share): the 17th
    // from one of them is refused, and argocd-server still logs in (256 places in all).
    let mut idle = Vec::new();
    for i in 20..28 {
        idle.extend(crowd(&format!("127.0.0.{i}"), port, 16).await);
    }
    let mut over = connect_from("127.0.0.20", port).await;
    assert!(closed_within(&mut over, Duration::from_secs(3)).await);
    for _ in 0..5 {
        let mut client = RespClient::connect(port).await;
        let reply = client.cmd(&[b"AUTH", PASSWORD.as_bytes()]).await;
        assert!(!reply.is_error(), "login refused: {reply:?}");
        let pong = client.cmd(&[b"PING"]).await;
        assert!(!pong.is_error(), "{pong:?}");
    }
    drop(idle);
    topo.finish(Ok(())).await;
}

/// `--max-connection-idle`: a gRPC connection left without a stream gets a GOAWAY
/// (`NO_ERROR`, `max_idle`) and is closed, and counted; an agent, whose event stream stays
/// open, keeps its connection; a client whose connection was closed dials again for its
/// next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_connection_left_without_a_stream_is_closed() {
    let topo = jwt_topology(&["--max-connection-idle", "2s"]).await;
    topo.wait_connected(MANAGED, T).await.unwrap();
    let port = topo.principal_addr.port();
    // A client that speaks HTTP/2 (preface and SETTINGS) and opens no stream.
    let mut idle = connect_from("127.0.0.5", port).await;
    idle.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0")
        .await
        .unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), idle.read_to_end(&mut got)).await;
    assert!(
        read.is_ok(),
        "the idle connection was not closed within 10 s"
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(1900), "closed after {took:?}");
    // The server's SETTINGS (and its ACK), then the GOAWAY: NO_ERROR, debug data max_idle.
    let goaway = got
        .windows(8)
        .position(|w| w == b"max_idle")
        .expect("a GOAWAY with max_idle");
    assert_eq!(&got[goaway - 4..goaway], &[0, 0, 0, 0], "NO_ERROR");
    assert_eq!(got[goaway - 14], 0x7, "a GOAWAY frame");
    // A client's connection idle after a call is closed too; its next call dials again.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", topo.principal_addr))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut version = argocd_agent_proto::version::version_client::VersionClient::new(channel);
    version
        .version(argocd_agent_proto::version::VersionRequest {})
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    eventually("the call after the idle close", T, || {
        let mut version = version.clone();
        async move {
            version
                .version(argocd_agent_proto::version::VersionRequest {})
                .await
                .ok()
        }
    })
    .await
    .unwrap();
    let metrics = topo.metrics_ports["principal"];
    let closed = metric_sum(
        metrics,
        r#"argocd_principal_listener_connections_closed_total{listener="grpc",reason="IdleTimeout"}"#,
    )
    .await;
    assert!(closed >= 2.0, "idle closes counted: {closed}");
    // The agent's stream kept its connection all along: still its first session.
    assert_eq!(topo.connect_count(MANAGED), 1, "the agent reconnected");
    topo.finish(Ok(())).await;
}
