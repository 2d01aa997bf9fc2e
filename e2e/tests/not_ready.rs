//! A principal that is not ready (its hub watches have not listed yet) closes new agent
//! connections before any TLS: a crowd of dialing agents cannot take the CPU it needs to
//! get ready. The refusals are counted (`NotReady`), agents back off as from any closed
//! connection, and once ready the principal takes them at once.

use std::time::{Duration, Instant};

use argocd_agent_testkit::harness::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const T: Duration = Duration::from_secs(30);

/// How long each hub API request takes while the principal starts: its watches cannot
/// list before this, so it stays not ready at least this long.
const HUB_LATENCY: Duration = Duration::from_secs(8);

const NOT_READY: &str =
    r#"argocd_principal_listener_connections_closed_total{listener="grpc",reason="NotReady"}"#;

/// The first bytes of a TLS ClientHello record: a server doing TLS would answer with a
/// ServerHello (or an alert); one that is not ready closes without a byte.
const CLIENT_HELLO_START: [u8; 9] = [0x16, 0x03, 0x01, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_principal_that_is_not_ready_closes_connections_before_tls() {
    let mut topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        let port = topo.metrics_ports["principal"];
        let addr = topo.principal_addr;
        let source = topo.svid_source("managed.sock").await?;
        // Restart the principal against a slow hub, the agent stopped meanwhile.
        topo.managed.as_mut().ok_or("no agent")?.stop().await;
        topo.principal.stop().await;
        topo.hub.set_latency(HUB_LATENCY);
        let started = Instant::now();
        topo.principal.start()?;
        wait_port(addr).await?;
        if http_status(port, "/readyz").await != Some(503) {
            return Err("the restarted principal should not be ready yet".into());
        }

        // A real agent's TLS handshake does not complete...
        if dial_principal(&source, addr).await.is_ok() {
            return Err("an mTLS channel was opened while not ready".into());
        }
        // ...and the principal says nothing at all, not even a ServerHello: it resets the
        // connection (which may reach the client before its connect returns).
        let reset = |e: &std::io::Error| e.kind() == std::io::ErrorKind::ConnectionReset;
        let mut raw = match tokio::net::TcpStream::connect(addr).await {
            Ok(raw) => Some(raw),
            Err(e) if reset(&e) => None,
            Err(e) => return Err(e.into()),
        };
        let mut buf = [0u8; 64];
        let read = async {
            let Some(raw) = raw.as_mut() else {
                return Ok(0);
            };
            let _ = raw.write_all(&CLIENT_HELLO_START).await;
            raw.read(&mut buf).await
        };
        match tokio::time::timeout(Duration::from_secs(3), read).await {
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(n)) => return Err(format!("the principal answered {n} bytes").into()),
            Err(_) => return Err("the connection was left open".into()),
        }
        let refused = metric_sum(port, NOT_READY).await;
        if refused < 2.0 {
            return Err(format!("NotReady refusals counted: {refused}").into());
        }
        // Not auth failures.
        let auth_failures = metric_sum(port, "argocd_principal_auth_failures_total").await;
        if auth_failures > 0.0 {
            return Err(format!("auth failures counted: {auth_failures}").into());
        }

        // An agent started meanwhile is refused, backs off, and connects once ready.
        let before = topo.connect_count(MANAGED);
        topo.managed.as_mut().ok_or("no agent")?.start()?;
        eventually("the agent's attempts are refused", T, || async {
            (metric_sum(port, NOT_READY).await > refused).then_some(())
        })
        .await?;
        // (The count first: a principal still not ready after it has not served the agent.)
        let sessions = topo.connect_count(MANAGED);
        if http_status(port, "/readyz").await == Some(503) && sessions != before {
            return Err("the agent got a session while the principal was not ready".into());
        }
        topo.hub.set_latency(Duration::ZERO);
        eventually("principal /readyz is 200", T, || async {
            (http_status(port, "/readyz").await == Some(200)).then_some(())
        })
        .await?;
        let ready_at = Instant::now();
        eventually(
            "the agent connects once the principal is ready",
            T,
            || async { (topo.connect_count(MANAGED) > before).then_some(()) },
        )
        .await?;
        let waited = ready_at.elapsed();
        let plog = topo.principal.log();
        if !plog.contains("connection refused before TLS: not ready yet") {
            return Err(format!("no NotReady log line\n{plog}").into());
        }
        // Logged at most once a second: far fewer lines than refusals.
        let lines = plog
            .lines()
            .filter(|l| l.contains("connection refused before TLS: not ready yet"))
            .count();
        let secs = started.elapsed().as_secs() as usize + 1;
        if lines > secs {
            return Err(format!("{lines} NotReady log lines in {secs} s").into());
        }
        // The agent only saw closed connections: no auth failure on its side.
        let agent_port = topo.metrics_ports[MANAGED];
        let agent_auth = metric_sum(agent_port, "argocd_agent_auth_failures_total").await;
        if agent_auth > 0.0 {
            return Err(format!("agent counted {agent_auth} auth failures").into());
        }
        let alog = topo.managed.as_ref().ok_or("no agent")?.log();
        if alog.contains("principal refused the stream") {
            return Err(format!("agent blamed the principal\n{alog}").into());
        }
        eprintln!(
            "not ready for {:.1}s; {} NotReady refusals; agent connected {:.1}s after ready",
            (ready_at - started).as_secs_f64(),
            metric_sum(port, NOT_READY).await,
            waited.as_secs_f64()
        );
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
