//! Header (mesh) identity end to end, with a real Envoy in front of the principal:
//! Envoy verifies the agents' SVIDs and forwards the verified identity in
//! `x-forwarded-client-cert` to the principal's plaintext loopback listener
//! (`--auth header:envoy`). Also checks what must be refused: client-written identity
//! headers, header auth on a reachable address, and identity headers on the mTLS listener.
//!
//! Needs Envoy (`ENVOY_BIN`, the project's `.venv`, or `PATH`); without it the tests fail
//! with a message saying how to install it.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_identity::SpiffeId;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::{PeerPolicy, client_config};
use argocd_agent_identity::transport::{ChannelOptions, connect};
use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_proto::eventstream::{AgentMode, Hello};
use argocd_agent_testkit::envoy::*;
use argocd_agent_testkit::harness::*;
use futures::StreamExt;
use kube::api::PostParams;
use serde_json::json;
use tonic::transport::Channel;

const T: Duration = Duration::from_secs(20);
const XFCC: &str = "x-forwarded-client-cert";
const AGENT_A: &str = "agent-a";
const AGENT_B: &str = "agent-b";

/// Runs `body` against a started mesh topology and always stops the processes; on failure
/// the panic message carries the processes' logs.
async fn with_mesh<F>(opts: MeshOptions, body: F)
where
    F: AsyncFnOnce(&mut MeshTopology) -> Result<(), HarnessError>,
{
    let mut topo = MeshTopology::start(opts).await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(40), body(&mut topo)).await;
    let logs = topo.logs();
    topo.stop().await;
    match r {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("{e}\n{logs}"),
        Err(_) => panic!("test body timed out after 40 s\n{logs}"),
    }
}

/// An mTLS channel presenting the SVID served on `endpoint`, pinning the principal's ID.
async fn mtls_channel(
    endpoint: String,
    addr: SocketAddr,
) -> Result<(Channel, SvidSource), HarnessError> {
    let source = SvidSource::workload_api(Some(endpoint)).await?;
    source.wait_ready(Duration::from_secs(10)).await?;
    let tls = client_config(&source, PeerPolicy::Exact(SpiffeId::parse(PRINCIPAL_ID)?))?;
    let channel = connect(
        &addr.to_string(),
        tls,
        &addr.ip().to_string(),
        ChannelOptions::default(),
    )
    .await?;
    Ok((channel, source))
}

/// A plaintext HTTP/2 channel (what a mesh proxy uses towards the principal).
async fn plain_channel(addr: SocketAddr) -> Result<Channel, HarnessError> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await?,
    )
}

/// Opens an event stream with a managed-mode hello and the given extra headers; returns
/// the agent name the principal's welcome says this stream was mapped to, or the refusal.
async fn open_session(
    channel: Channel,
    headers: &[(&'static str, String)],
) -> Result<Result<String, tonic::Status>, HarnessError> {
    let hello = Event::new(
        "e2e-test-client",
        EventType::Hello,
        Payload::Hello(Hello {
            mode: AgentMode::Managed as i32,
            version: "e2e".into(),
            protocol_version: 1,
            ..Default::default()
        }),
    );
    // Keep the outbound side open after the hello: a closed request stream ends the session.
    let outbound =
        futures::stream::iter(vec![hello.to_cloud_event()]).chain(futures::stream::pending());
    let mut request = tonic::Request::new(outbound);
    for (name, value) in headers {
        request.metadata_mut().insert(*name, value.parse()?);
    }
    let mut client = EventStreamClient::new(channel);
    let attempt = async {
        let mut inbound = client.subscribe(request).await?.into_inner();
        let first = inbound
            .message()
            .await?
            .ok_or_else(|| tonic::Status::unknown("stream closed before welcome"))?;
        Ok::<_, tonic::Status>(first)
    };
    let first = match tokio::time::timeout(Duration::from_secs(10), attempt).await {
        Err(_) => return Err("no answer to the hello within 10 s".into()),
        Ok(Err(status)) => return Ok(Err(status)),
        Ok(Ok(first)) => first,
    };
    let event = Event::from_cloud_event(first)?;
    match event.payload {
        Payload::Welcome(w) => Ok(Ok(w.agent_name)),
        other => Err(format!("expected a welcome, got {:?}: {other:?}", event.ty).into()),
    }
}

fn xfcc_element(uri: &str) -> String {
    format!("By={PRINCIPAL_ID};URI={uri}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_through_envoy_syncs_both_ways() {
    let opts = MeshOptions {
        agents: vec![MANAGED, AUTONOMOUS],
        ..Default::default()
    };
    with_mesh(opts, async |topo| {
        // Managed: hub create reaches the spoke, spoke status reaches the hub.
        let hub = apps(&topo.hub, MANAGED)?;
        let spoke = apps(&topo.managed_spoke, SPOKE_NS)?;
        hub.create(
            &PostParams::default(),
            &sample_app("guestbook", MANAGED, "guestbook"),
        )
        .await?;
        eventually(
            "hub create reaches the managed spoke through Envoy",
            T,
            || async { stored_app(&topo.managed_spoke, SPOKE_NS, "guestbook") },
        )
        .await?;
        set_status(
            &spoke,
            "guestbook",
            json!({"sync": {"status": "Synced"}, "health": {"status": "Healthy"}}),
        )
        .await?;
        eventually(
            "managed spoke status reaches the hub through Envoy",
            T,
            || async {
                stored_app(&topo.hub, MANAGED, "guestbook")
                    .filter(|a| a["status"]["health"]["status"] == "Healthy")
            },
        )
        .await?;

        // Autonomous: spoke create reaches the agent's hub namespace.
        apps(&topo.autonomous_spoke, SPOKE_NS)?
            .create(
                &PostParams::default(),
                &sample_app("edge-app", SPOKE_NS, "helm-guestbook"),
            )
            .await?;
        eventually(
            "autonomous spoke create reaches the hub through Envoy",
            T,
            || async { stored_app(&topo.hub, AUTONOMOUS, "edge-app") },
        )
        .await?;
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_xfcc_from_client_is_replaced_by_envoy() {
    let opts = MeshOptions {
        clients: vec![AGENT_A, AGENT_B],
        ..Default::default()
    };
    with_mesh(opts, async |topo| {
        let (channel, _source) = mtls_channel(topo.endpoint_of(AGENT_A), topo.envoy_addr).await?;
        // Agent A claims to be B in its own header; Envoy must drop it and write what it
        // verified (A's certificate).
        let forged = vec![(XFCC, xfcc_element(&agent_id(AGENT_B)))];
        let mapped = open_session(channel, &forged)
            .await?
            .map_err(|s| format!("session through Envoy refused: {s:?}"))?;
        if mapped != AGENT_A {
            return Err(format!(
                "the forged header won: session mapped to {mapped:?}, not {AGENT_A:?}"
            )
            .into());
        }
        topo.wait_connected(AGENT_A, 1, T).await?;
        let log = topo.principal.log();
        if connected_count(&log, AGENT_B) != 0 {
            return Err("the principal logged a session for the forged identity agent-b".into());
        }
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_chain_uses_nearest_element() {
    let opts = MeshOptions {
        clients: vec![AGENT_A, AGENT_B],
        ..Default::default()
    };
    with_mesh(opts, async |topo| {
        // This direct loopback connection plays the nearest proxy: its element (A) is the
        // last one; the first (B) was written further away and proves nothing.
        let chain = format!(
            "{},{}",
            xfcc_element(&agent_id(AGENT_B)),
            xfcc_element(&agent_id(AGENT_A))
        );
        let channel = plain_channel(topo.principal_addr).await?;
        let mapped = open_session(channel, &[(XFCC, chain)])
            .await?
            .map_err(|s| format!("two-element XFCC refused: {s:?}"))?;
        if mapped != AGENT_A {
            return Err(format!(
                "session mapped to {mapped:?}, not the nearest element's {AGENT_A:?}"
            )
            .into());
        }
        Ok(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_restart_mid_stream_agent_reconnects_and_resyncs() {
    let opts = MeshOptions {
        agents: vec![MANAGED],
        ..Default::default()
    };
    with_mesh(opts, async |topo| {
        let hub = apps(&topo.hub, MANAGED)?;
        hub.create(
            &PostParams::default(),
            &sample_app("before", MANAGED, "guestbook"),
        )
        .await?;
        eventually("first app reaches the spoke", T, || async {
            stored_app(&topo.managed_spoke, SPOKE_NS, "before")
        })
        .await?;
        let sessions = topo.connect_count(MANAGED);

        topo.envoy.kill().await;
        hub.create(
            &PostParams::default(),
            &sample_app("during", MANAGED, "guestbook"),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        if stored_app(&topo.managed_spoke, SPOKE_NS, "during").is_some() {
            return Err(
                "the app reached the spoke while Envoy was down: the test proves nothing".into(),
            );
        }
        topo.envoy.start()?;
        wait_listening(topo.envoy_addr, Duration::from_secs(10)).await?;
        topo.wait_connected(MANAGED, sessions + 1, T).await?;
        eventually(
            "change made while Envoy was down reaches the spoke",
            T,
            || async { stored_app(&topo.managed_spoke, SPOKE_NS, "during") },
        )
        .await?;
        Ok(())
    })
    .await;
}

/// A hub API server and its kubeconfig, for a principal started by hand.
async fn hub_only() -> Result<(KubeTestServer, tempfile::TempDir), HarnessError> {
    let dir = tempfile::Builder::new()
        .prefix("argocd-agent-e2e-guard")
        .tempdir()?;
    let hub = KubeTestServer::start_on("127.0.0.1:0".parse()?, ServerOptions::default()).await?;
    hub.write_kubeconfig(&dir.path().join("hub.kubeconfig"), "hub")?;
    create_namespace(&hub, AGENT_A).await?;
    Ok((hub, dir))
}

/// The machine's first non-loopback IPv4 address (`hostname -I`), if any.
fn non_loopback_ipv4() -> Option<IpAddr> {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|s| s.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv4() && !ip.is_loopback() && !ip.is_unspecified())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_auth_refused_on_non_loopback_listener() {
    let (_hub, dir) = hub_only().await.unwrap();
    let kubeconfig = dir.path().join("hub.kubeconfig");
    let bin = binary("argocd-agent").unwrap();

    // 1. Without the override the principal refuses to start.
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.args(header_principal_args(
        &kubeconfig,
        "0.0.0.0:0".parse().unwrap(),
    ))
    .kill_on_drop(true)
    .stdin(std::process::Stdio::null());
    let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
        .await
        .expect("principal with header auth on 0.0.0.0 kept running: the guard did not stop it")
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !out.status.success(),
        "principal exited successfully:\n{text}"
    );
    assert!(
        text.contains("not a loopback address")
            && text.contains("--insecure-header-auth-any-address"),
        "the error does not name the guard and its override:\n{text}"
    );

    // 2. With the override and a trusted proxy list, a peer that is not that proxy is refused.
    let Some(ip) = non_loopback_ipv4() else {
        println!("note: no non-loopback IPv4 address on this machine; untrusted-peer half skipped");
        return;
    };
    let port = std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let listen = SocketAddr::new(ip, port);
    let mut args = header_principal_args(&kubeconfig, listen);
    args.extend([
        "--insecure-header-auth-any-address".to_string(),
        "--header-auth-trusted-proxy".to_string(),
        "10.255.255.1".to_string(),
    ]);
    let mut principal = Proc::new("principal", bin, args, dir.path().join("principal.log"));
    principal.start().unwrap();
    let r: Result<(), HarnessError> = async {
        wait_listening(listen, T).await?;
        let channel = plain_channel(listen).await?;
        let forged = vec![(XFCC, xfcc_element(&agent_id(AGENT_A)))];
        match open_session(channel, &forged).await? {
            Ok(agent) => Err(format!("an untrusted peer got a session as {agent:?}").into()),
            Err(s)
                if s.code() == tonic::Code::PermissionDenied
                    && s.message()
                        .contains("neither loopback nor a configured trusted proxy") =>
            {
                Ok(())
            }
            Err(s) => Err(format!("refused, but not by the trusted-proxy guard: {s:?}").into()),
        }
    }
    .await;
    let log = principal.log();
    principal.stop().await;
    if let Err(e) = r {
        panic!("{e}\n--- principal ---\n{}", tail(&log, 40));
    }
    assert!(
        log.contains("non-loopback"),
        "the override was not logged loudly at start:\n{}",
        tail(&log, 40)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_header_on_mtls_listener_is_rejected() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> =
        async {
            let endpoint = topo.spiffe.endpoint(&topo.dir.join("managed.sock"));
            let (channel, _source) = mtls_channel(endpoint, topo.principal_addr).await?;
            for header in [XFCC, "l5d-client-id"] {
                // Even a header naming the caller's own, verified identity is refused.
                let value = if header == XFCC {
                    xfcc_element(&agent_id(MANAGED))
                } else {
                    format!("{MANAGED}.agents.serviceaccount.identity.linkerd.cluster.local")
                };
                match open_session(channel.clone(), &[(header, value)]).await? {
                    Err(s) if s.code() == tonic::Code::PermissionDenied => {}
                    other => return Err(format!(
                        "{header} on the mTLS listener: expected PermissionDenied, got {other:?}"
                    )
                    .into()),
                }
            }
            // The same client without the header is accepted: the refusal was about the header.
            match open_session(channel, &[]).await? {
                Ok(agent) if agent == MANAGED => Ok(()),
                other => Err(format!(
                    "plain SVID session: expected welcome as {MANAGED}, got {other:?}"
                )
                .into()),
            }
        }
        .await;
    topo.finish(r).await;
}
