//! gRPC compression between agent and principal (`--enable-compression` on either side,
//! `--compression-algorithm`), and the principal's `--keepalive-min-interval`, with the real
//! binaries. The agent dials through a TCP proxy that counts the bytes on the wire, so each
//! case shows whether what crossed was compressed: Applications with large, compressible
//! Helm values go hub → spoke, large statuses go spoke → hub.

use std::time::Duration;

use argocd_agent_testkit::harness::*;
use kube::api::PostParams;
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
/// Applications per direction.
const APPS: usize = 6;

/// About 40 KB of YAML, as compressible as real Helm values (repeated keys, varying numbers).
fn big_text(seed: &str) -> String {
    (0..1000)
        .map(|i| {
            format!(
                "{seed}-replica{i}: {{cpu: {}m, memory: 256Mi}}\n",
                100 + i % 7
            )
        })
        .collect()
}

/// How the two sides are configured, and what the wire must show.
struct Case {
    principal_args: &'static [&'static str],
    agent_args: &'static [&'static str],
    envs: &'static [(&'static str, &'static str)],
    /// `inbound>outbound` as the principal logs it; `None`: no compressed stream logged.
    principal_logs: Option<&'static str>,
    /// The encoding the agent logs for the principal's messages.
    agent_receives: &'static str,
    /// Whether hub → spoke (principal's messages) and spoke → hub must be compressed.
    down_compressed: bool,
    up_compressed: bool,
}

async fn run(case: Case) {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        with_proxy: true,
        principal_args: case.principal_args.iter().map(|s| s.to_string()).collect(),
        agent_args: case.agent_args.iter().map(|s| s.to_string()).collect(),
        envs: case
            .envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    })
    .await
    .unwrap();
    let r = scenario(&topo, &case).await;
    topo.finish(r).await;
}

/// Sends the Applications down and their statuses up; checks the logs and the bytes.
async fn scenario(topo: &Topology, case: &Case) -> Result<(), HarnessError> {
    let proxy = topo.proxy.as_ref().ok_or("no proxy")?;
    let hub_apps = apps(&topo.hub, MANAGED)?;
    let spoke_apps = apps(&topo.managed_spoke, SPOKE_NS)?;
    let names: Vec<String> = (0..APPS).map(|i| format!("big-{i}")).collect();

    let (_, down0) = proxy.bytes();
    let mut sent = 0;
    for name in &names {
        let mut app = sample_app(name, MANAGED, "guestbook");
        let values = big_text(name);
        sent += values.len();
        app.data["spec"]["source"]["helm"] = json!({ "values": values });
        hub_apps.create(&PostParams::default(), &app).await?;
    }
    for name in &names {
        let want = big_text(name);
        eventually(&format!("{name} on the spoke"), T, || {
            let got = stored_app(&topo.managed_spoke, SPOKE_NS, name).and_then(|a| {
                a["spec"]["source"]["helm"]["values"]
                    .as_str()
                    .map(str::to_owned)
            });
            let ok = got.as_deref() == Some(want.as_str());
            async move { ok.then_some(()) }
        })
        .await?;
    }
    let (up1, down1) = proxy.bytes();
    let down = down1 - down0;

    let mut reported = 0;
    for name in &names {
        let images = big_text(&format!("{name}-status"));
        reported += images.len();
        set_status(
            &spoke_apps,
            name,
            json!({"sync": {"status": "Synced"}, "summary": {"images": [images]}}),
        )
        .await?;
    }
    for name in &names {
        let want = big_text(&format!("{name}-status"));
        eventually(&format!("{name}'s status on the hub"), T, || {
            let got: Option<Value> = stored_app(&topo.hub, MANAGED, name)
                .map(|a| a["status"]["summary"]["images"][0].clone());
            let ok = got.as_ref().and_then(Value::as_str) == Some(want.as_str());
            async move { ok.then_some(()) }
        })
        .await?;
    }
    let (up2, _) = proxy.bytes();
    let up = up2 - up1;
    eprintln!(
        "hub -> spoke: {down} bytes on the wire for {sent} bytes of values; spoke -> hub: {up} bytes for {reported} bytes of status"
    );

    // Compressed, the wire carries well under a quarter of the text (it shrinks ~20x);
    // uncompressed, at least all of it (JSON, CloudEvents, TLS around it).
    let check = |what: &str, bytes: u64, text: usize, compressed: bool| {
        let text = text as u64;
        let ok = if compressed {
            bytes < text / 4
        } else {
            bytes > text
        };
        if ok {
            Ok(())
        } else {
            Err(format!(
                "{what}: {bytes} bytes on the wire for {text} bytes of text; expected {}",
                if compressed {
                    "compressed"
                } else {
                    "uncompressed"
                }
            ))
        }
    };
    check("hub -> spoke", down, sent, case.down_compressed)?;
    check("spoke -> hub", up, reported, case.up_compressed)?;

    let principal = topo.principal.log();
    let logged = principal
        .lines()
        .find(|l| l.contains("agent stream compressed") && l.contains(MANAGED));
    match (case.principal_logs, logged) {
        (None, None) => {}
        (Some(want), Some(line)) => {
            let (inbound, outbound) = want.split_once('>').ok_or("bad case")?;
            if !line.contains(&format!("inbound={inbound}"))
                || !line.contains(&format!("outbound={outbound}"))
            {
                return Err(format!("principal logged {line:?}, expected {want}").into());
            }
        }
        (want, got) => {
            return Err(format!("principal: expected {want:?}, logged {got:?}").into());
        }
    }
    let agent = topo.managed.as_ref().ok_or("no agent")?.log();
    let needle = format!("received_compressed={}", case.agent_receives);
    if !agent
        .lines()
        .any(|l| l.contains("connected to principal") && l.contains(&needle))
    {
        return Err(format!("the agent never logged {needle}").into());
    }
    Ok(())
}

#[tokio::test]
async fn compression_on_both_sides_zstd() {
    run(Case {
        principal_args: &["--enable-compression"],
        agent_args: &["--enable-compression", "--compression-algorithm", "zstd"],
        envs: &[],
        principal_logs: Some("zstd>zstd"),
        agent_receives: "zstd",
        down_compressed: true,
        up_compressed: true,
    })
    .await;
}

/// Upstream's setup: the flag on the agent only (here through its environment variable),
/// gzip. The principal answers in the agent's encoding, as upstream's does.
#[tokio::test]
async fn compression_on_the_agent_only() {
    run(Case {
        principal_args: &[],
        agent_args: &[],
        envs: &[("ARGOCD_AGENT_ENABLE_COMPRESSION", "true")],
        principal_logs: Some("gzip>gzip"),
        agent_receives: "gzip",
        down_compressed: true,
        up_compressed: true,
    })
    .await;
}

/// The principal compresses for an agent that does not compress (it accepts both).
#[tokio::test]
async fn compression_on_the_principal_only() {
    run(Case {
        principal_args: &["--enable-compression=true"],
        agent_args: &[],
        envs: &[],
        principal_logs: Some("identity>gzip"),
        agent_receives: "gzip",
        down_compressed: true,
        up_compressed: false,
    })
    .await;
}

/// The control: by default nothing is compressed, and the checks above would fail.
#[tokio::test]
async fn no_compression_by_default() {
    run(Case {
        principal_args: &[],
        agent_args: &[],
        envs: &[],
        principal_logs: None,
        agent_receives: "identity",
        down_compressed: false,
        up_compressed: false,
    })
    .await;
}

/// `--keepalive-min-interval 3s`: the managed agent pinging every second is sent away
/// (GOAWAY `too_many_pings`) and keeps reconnecting; the autonomous agent pinging every 5 s
/// keeps its one connection. Heartbeats are slow (30 s), so only HTTP/2 PINGs flow.
#[tokio::test]
async fn pings_faster_than_the_minimum_interval_close_the_connection() {
    let mut topo = Topology::start(TopologyOptions {
        principal_args: vec!["--keepalive-min-interval".into(), "3s".into()],
        agent_args: vec!["--heartbeat-interval".into(), "30s".into()],
        ..Default::default()
    })
    .await
    .unwrap();
    let r = async {
        let managed = topo.managed.as_mut().ok_or("no managed agent")?;
        managed.stop().await;
        managed.set_arg("--keep-alive-ping-interval", "1s");
        managed.start()?;
        eventually("the pinging agent sent away three times", T, || {
            let n = topo.connect_count(MANAGED);
            let refused = topo
                .principal
                .log()
                .matches("more often than --keepalive-min-interval")
                .count();
            async move { (n >= 4 && refused >= 3).then_some(()) }
        })
        .await?;
        if topo.connect_count(AUTONOMOUS) != 1 {
            return Err(format!(
                "the agent pinging every 5 s reconnected: {} connections",
                topo.connect_count(AUTONOMOUS)
            )
            .into());
        }
        // The agent logs each loss when it notices it, which can come after the principal's
        // third refusal and its fourth accepted connection: wait for the line, not a snapshot.
        let managed = topo.managed.as_ref().ok_or("no managed agent")?;
        eventually("the agent saw three lost connections", T, || {
            let lost = managed
                .log()
                .matches("connection to the principal lost")
                .count();
            async move { (lost >= 3).then_some(()) }
        })
        .await?;
        Ok::<_, HarnessError>(())
    }
    .await;
    topo.finish(r).await;
}
