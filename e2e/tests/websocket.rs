//! `--enable-websocket` through a real HTTP/1.1-only reverse proxy: nginx (its own config,
//! no `http2` on its listener, `proxy_http_version 1.1` with the Upgrade headers) in front
//! of the principal. The agent's SVID mutual TLS runs inside the WebSocket, so nginx only
//! forwards an upgrade and then opaque bytes: the principal still reads the caller from the
//! TLS peer certificate.
//!
//! Shown: a managed agent syncs Applications both ways through nginx while a plain HTTP/2
//! agent uses the same principal port; plain gRPC cannot cross this nginx at all; the
//! stream outlives nginx's idle timeout (pings); after nginx is killed and started again the
//! agent reconnects and converges. Refused: an SVID from another CA (at the handshake
//! inside the WebSocket), an SVID that maps to no agent (by the ID in its certificate), an
//! upgrade without the subprotocol (HTTP 400), an oversized WebSocket frame (connection
//! closed, the principal serves on).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_identity::transport::ChannelOptions;
use argocd_agent_identity::websocket::{self, WsOptions};
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_proto::eventstream::AgentMode;
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_testkit::harness::*;
use argocd_agent_testkit::workload_api::DevCa;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(30);

/// nginx's idle timeouts towards both sides: shorter than the quiet spell the test waits
/// through, so only traffic on the stream (pings, heartbeats) keeps it up.
const PROXY_IDLE: &str = "8s";

fn nginx_binary() -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file());
    found.expect("nginx is not installed (.ci/run installs nginx-light)")
}

/// An unprivileged nginx in the foreground with its own config: an HTTP/1.1-only listener
/// on `port` proxying WebSocket upgrades to `upstream`.
fn nginx(dir: &Path, port: u16, upstream: SocketAddr) -> Result<Proc, HarnessError> {
    let root = dir.join("nginx");
    for sub in ["body", "proxy", "fastcgi", "uwsgi", "scgi"] {
        std::fs::create_dir_all(root.join(sub))?;
    }
    let r = root.display();
    let conf = format!(
        r#"daemon off;
master_process off;
pid {r}/nginx.pid;
error_log {r}/error.log info;
events {{ worker_connections 64; }}
http {{
    access_log {r}/access.log;
    client_body_temp_path {r}/body;
    proxy_temp_path {r}/proxy;
    fastcgi_temp_path {r}/fastcgi;
    uwsgi_temp_path {r}/uwsgi;
    scgi_temp_path {r}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://{upstream};
            proxy_http_version 1.1;
            proxy_set_header Upgrade $http_upgrade;
            proxy_set_header Connection "upgrade";
            proxy_read_timeout {PROXY_IDLE};
            proxy_send_timeout {PROXY_IDLE};
        }}
    }}
}}
"#
    );
    let path = root.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let args = vec![
        "-p".into(),
        format!("{r}/"),
        "-e".into(),
        format!("{r}/error.log"),
        "-c".into(),
        path.display().to_string(),
    ];
    let mut p = Proc::new("nginx", nginx_binary(), args, root.join("stdout.log"));
    p.start()?;
    Ok(p)
}

fn access_log(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("nginx/access.log")).unwrap_or_default()
}

/// A channel to the principal through `addr` over a WebSocket, with `source`'s SVID.
async fn dial_ws(
    source: &SvidSource,
    addr: SocketAddr,
) -> Result<tonic::transport::Channel, HarnessError> {
    let tls = argocd_agent_identity::tls::client_config(
        source,
        PeerPolicy::Exact(SpiffeId::parse(PRINCIPAL_ID)?),
    )?;
    Ok(websocket::connect(
        &addr.to_string(),
        tls,
        "127.0.0.1",
        ChannelOptions::default(),
        WsOptions::default(),
    )
    .await?)
}

/// Opens an event stream through `addr` over a WebSocket and returns the principal's first
/// answer to a hello.
async fn hello_over_ws(source: &SvidSource, addr: SocketAddr) -> Result<Event, HarnessError> {
    let channel = dial_ws(source, addr).await?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let hello = Event::new(
        "test-client",
        EventType::Hello,
        Payload::Hello(argocd_agent_proto::eventstream::Hello {
            mode: AgentMode::Managed as i32,
            version: "test".into(),
            protocol_version: 1,
            ..Default::default()
        }),
    );
    tx.send(hello.to_cloud_event()).await?;
    let mut inbound = EventStreamClient::new(channel)
        .subscribe(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(T, inbound.message())
        .await??
        .ok_or("stream closed before the welcome")?;
    drop(tx);
    Ok(Event::from_cloud_event(first)?)
}

/// An SVID for `id` signed by `ca`, trusting the topology's bundle (and `ca`'s).
fn pem_source(
    tmp: &Path,
    topo: &Topology,
    ca: &DevCa,
    id: &str,
) -> Result<SvidSource, HarnessError> {
    let svid = ca.issue_x509(&SpiffeId::parse(id)?, Duration::from_secs(600))?;
    let name = id.rsplit('/').next().unwrap_or("svid");
    let (cert, key) = (
        tmp.join(format!("{name}.pem")),
        tmp.join(format!("{name}.key")),
    );
    std::fs::write(&cert, svid.chain_pem())?;
    std::fs::write(&key, svid.key_pem())?;
    let bundle = tmp.join("bundle.pem");
    std::fs::write(&bundle, topo.spiffe.ca().certificate_pem())?;
    let own = tmp.join(format!("{name}-bundle.pem"));
    std::fs::write(&own, ca.certificate_pem())?;
    Ok(SvidSource::pem_files(
        cert,
        key,
        vec![
            (Some(TrustDomain::new("example.org")?), bundle),
            (Some(ca.trust_domain().clone()), own),
        ],
        Duration::from_secs(60),
    )?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_syncs_through_an_http11_only_nginx_and_resyncs_after_it_restarts() {
    let mut topo = Topology::start(TopologyOptions {
        principal_args: vec!["--enable-websocket".into()],
        // Heartbeat events far apart: only pings cross nginx while the stream is quiet.
        per_agent_args: vec![(
            MANAGED,
            vec![
                "--enable-websocket".into(),
                "--heartbeat-interval".into(),
                "60s".into(),
            ],
        )],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = sync_through_nginx(&mut topo).await;
    topo.finish(r).await;
}

async fn sync_through_nginx(topo: &mut Topology) -> Result<(), HarnessError> {
    // Both agents came straight to the principal's one port: the managed one over a
    // WebSocket, the autonomous one over HTTP/2.
    // The principal logs the session before the agent logs its side of it: wait for it.
    let managed = topo.managed.as_ref().ok_or("no managed agent")?;
    eventually(
        "the managed agent connected over a WebSocket",
        T,
        || async {
            let log = managed.log();
            (log.contains("transport=\"websocket\"") || log.contains("transport=websocket"))
                .then_some(())
        },
    )
    .await?;
    let port = argocd_agent_testkit::envoy::free_loopback_port()?;
    let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut proxy = nginx(&topo.dir, port, topo.principal_addr)?;
    wait_port(proxy_addr).await?;

    // Plain gRPC (TLS straight on TCP) cannot cross this proxy.
    let source = topo.svid_source("managed.sock").await?;
    let plain = async {
        let channel = dial_principal(&source, proxy_addr).await?;
        argocd_agent_proto::version::version_client::VersionClient::new(channel)
            .version(argocd_agent_proto::version::VersionRequest {})
            .await?;
        Ok::<(), HarnessError>(())
    };
    if plain.await.is_ok() {
        return Err("plain gRPC crossed the HTTP/1.1 proxy".into());
    }

    // The managed agent now goes through nginx.
    let agent = topo.managed.as_mut().ok_or("no managed agent")?;
    agent.stop().await;
    agent.set_arg("--server-port", &port.to_string());
    agent.start()?;
    eventually("the agent connected through nginx", T, || async {
        (topo.connect_count(MANAGED) >= 2).then_some(())
    })
    .await?;

    let hub_apps = apps(&topo.hub, MANAGED)?;
    let spoke_apps = apps(&topo.managed_spoke, SPOKE_NS)?;
    hub_apps
        .create(
            &PostParams::default(),
            &sample_app("via-ws", MANAGED, "guestbook"),
        )
        .await?;
    eventually("via-ws on the spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "via-ws").map(|_| ())
    })
    .await?;
    set_status(
        &spoke_apps,
        "via-ws",
        json!({"sync": {"status": "Synced", "revision": "r1"}}),
    )
    .await?;
    eventually("via-ws status on the hub", T, || async {
        let app = stored_app(&topo.hub, MANAGED, "via-ws")?;
        (app["status"]["sync"]["revision"] == "r1").then_some(())
    })
    .await?;

    // Quiet for longer than nginx's idle timeouts (no heartbeat either): pings keep the
    // stream up.
    let connects = topo.connect_count(MANAGED);
    tokio::time::sleep(Duration::from_secs(20)).await;
    if topo.connect_count(MANAGED) != connects {
        return Err("the agent reconnected during a quiet spell: the proxy cut the stream".into());
    }

    // nginx dies; changes pile up on the hub; nginx comes back on the same port.
    proxy.kill().await;
    hub_apps.delete("via-ws", &DeleteParams::default()).await?;
    hub_apps
        .create(
            &PostParams::default(),
            &sample_app("while-down", MANAGED, "guestbook"),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.start()?;
    wait_port(proxy_addr).await?;
    eventually("the agent reconnected through nginx", T, || async {
        (topo.connect_count(MANAGED) > connects).then_some(())
    })
    .await?;
    eventually("the spoke converged after the restart", T, || async {
        let gone = stored_app(&topo.managed_spoke, SPOKE_NS, "via-ws").is_none();
        let there = stored_app(&topo.managed_spoke, SPOKE_NS, "while-down").is_some();
        (gone && there).then_some(())
    })
    .await?;
    // nginx logs a WebSocket when it ends: the agent stops, its upgrade shows up.
    topo.managed
        .as_mut()
        .ok_or("no managed agent")?
        .stop()
        .await;
    let logged = eventually("the upgrade in nginx's access log", T, || async {
        access_log(&topo.dir)
            .contains("\"GET / HTTP/1.1\" 101")
            .then_some(())
    })
    .await;
    proxy.stop().await;
    logged?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_through_nginx_leave_the_principal_serving() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        principal_args: vec!["--enable-websocket".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = refusals(&topo).await;
    topo.finish(r).await;
}

async fn refusals(topo: &Topology) -> Result<(), HarnessError> {
    let port = argocd_agent_testkit::envoy::free_loopback_port()?;
    let proxy_addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut proxy = nginx(&topo.dir, port, topo.principal_addr)?;
    wait_port(proxy_addr).await?;
    let tmp = tempfile::tempdir()?;
    let r = async {
        // An SVID from another CA: refused at the TLS handshake inside the WebSocket.
        let evil = DevCa::ephemeral(TrustDomain::new("evil.org")?)?;
        let impostor = pem_source(
            tmp.path(),
            topo,
            &evil,
            &agent_id(MANAGED).replace("example.org", "evil.org"),
        )?;
        impostor.wait_ready(T).await?;
        if hello_over_ws(&impostor, proxy_addr).await.is_ok() {
            return Err::<(), HarnessError>("an SVID of another CA opened a stream".into());
        }
        eventually("the foreign SVID refused at the handshake", T, || async {
            topo.principal
                .log()
                .contains("TLS handshake failed")
                .then_some(())
        })
        .await?;

        // A valid SVID that maps to no agent: refused by the ID in its certificate.
        let intruder = pem_source(
            tmp.path(),
            topo,
            topo.spiffe.ca(),
            "spiffe://example.org/ns/other/sa/intruder",
        )?;
        intruder.wait_ready(T).await?;
        match hello_over_ws(&intruder, proxy_addr).await {
            Ok(e) => return Err(format!("an unmapped SVID was answered: {e:?}").into()),
            Err(e) => {
                let s = e.to_string();
                if !s.contains("PermissionDenied") && !s.contains("permission") {
                    return Err(format!("unexpected refusal: {s}").into());
                }
            }
        }
        eventually("the unmapped ID logged", T, || async {
            topo.principal.log().contains("intruder").then_some(())
        })
        .await?;

        // An upgrade without the subprotocol: HTTP 400 through nginx.
        let status = raw_upgrade(proxy_addr, None).await?;
        if !status.starts_with("HTTP/1.1 400") {
            return Err(format!("upgrade without the subprotocol answered {status:?}").into());
        }

        // An oversized frame: the connection is closed, nothing else happens.
        oversized_frame(proxy_addr).await?;
        eventually("the oversized frame refused", T, || async {
            topo.principal
                .log()
                .contains("over the limit")
                .then_some(())
        })
        .await?;

        // The principal still serves: a mapped SVID gets its welcome through nginx.
        let source = topo.svid_source("managed.sock").await?;
        let welcome = hello_over_ws(&source, proxy_addr).await?;
        if welcome.ty != EventType::Welcome {
            return Err(format!("expected a welcome, got {welcome:?}").into());
        }
        Ok(())
    }
    .await;
    proxy.stop().await;
    r
}

/// Sends a WebSocket upgrade (offering `subprotocol`, if any) and returns the status line.
async fn raw_upgrade(addr: SocketAddr, subprotocol: Option<&str>) -> Result<String, HarnessError> {
    let (status, _) = upgrade(addr, subprotocol).await?;
    Ok(status)
}

async fn upgrade(
    addr: SocketAddr,
    subprotocol: Option<&str>,
) -> Result<(String, tokio::net::TcpStream), HarnessError> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    let offer = subprotocol
        .map(|p| format!("Sec-WebSocket-Protocol: {p}\r\n"))
        .unwrap_or_default();
    let request = format!(
        "GET / HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{offer}\r\n"
    );
    tcp.write_all(request.as_bytes()).await?;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(T, tcp.read(&mut byte)).await??;
        if n == 0 || head.len() > 16 * 1024 {
            break;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).to_string();
    Ok((text.lines().next().unwrap_or_default().to_string(), tcp))
}

/// Upgrades, then sends a binary frame announcing 1 MiB (over the principal's limit) and
/// expects the connection to end.
async fn oversized_frame(addr: SocketAddr) -> Result<(), HarnessError> {
    let (status, mut tcp) = upgrade(addr, Some(websocket::SUBPROTOCOL)).await?;
    if !status.starts_with("HTTP/1.1 101") {
        return Err(format!("upgrade answered {status:?}").into());
    }
    let len: u64 = 1 << 20;
    // FIN + binary; masked (client frames are), 64-bit length; the mask key; some payload.
    let mut frame = vec![0x82, 0x80 | 127];
    frame.extend_from_slice(&len.to_be_bytes());
    frame.extend_from_slice(&[1, 2, 3, 4]);
    frame.extend_from_slice(&[0u8; 4096]);
    tcp.write_all(&frame).await?;
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(T, tcp.read(&mut buf)).await {
            Err(_) => return Err("the connection stayed open after an oversized frame".into()),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(()),
            // A close frame may come first.
            Ok(Ok(_)) => continue,
        }
    }
}
