//! `argocd-agentctl demo`: the whole topology on this machine. A development Workload API
//! server, Kubernetes API test servers for the hub and two spokes, the principal, a managed
//! and an autonomous agent (real `argocd-agent` processes), sample Applications, and a live
//! table of where each Application is and what state it reports.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_e2e::harness::{self, AUTONOMOUS, MANAGED, SPOKE_NS, Topology, TopologyOptions};
use argocd_agent_kube_test_server::KubeTestServer;
use kube::api::PostParams;
use serde_json::Value;

/// Arguments of `argocd-agentctl demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Directory for kubeconfigs, sockets, the dev CA and logs.
    #[arg(long, default_value = ".demo")]
    dir: PathBuf,
    /// Stop after this many seconds (default: run until Ctrl-C).
    #[arg(long)]
    exit_after: Option<u64>,
    /// Verify that the sample Applications flow both ways, then exit (0 on success).
    #[arg(long)]
    check: bool,
}

fn row(server: &KubeTestServer, ns: &str) -> Vec<[String; 5]> {
    let mut rows: Vec<[String; 5]> = server
        .list_objects("argoproj.io", "v1alpha1", "applications", Some(ns))
        .iter()
        .map(|a| {
            let s = |p: &str| {
                a.pointer(p)
                    .and_then(Value::as_str)
                    .unwrap_or("-")
                    .to_owned()
            };
            [
                ns.to_owned(),
                s("/metadata/name"),
                s("/spec/source/targetRevision"),
                s("/status/sync/status"),
                s("/status/health/status"),
            ]
        })
        .collect();
    rows.sort();
    rows
}

fn table(topo: &Topology) -> String {
    let mut out = String::new();
    let sections: [(&str, &KubeTestServer, &str); 4] = [
        ("hub", &topo.hub, MANAGED),
        ("hub", &topo.hub, AUTONOMOUS),
        ("spoke agent-managed", &topo.managed_spoke, SPOKE_NS),
        ("spoke agent-autonomous", &topo.autonomous_spoke, SPOKE_NS),
    ];
    out.push_str(&format!(
        "{:<24} {:<18} {:<20} {:<10} {:<10} {:<10}\n",
        "CLUSTER", "NAMESPACE", "NAME", "REVISION", "SYNC", "HEALTH"
    ));
    for (cluster, server, ns) in sections {
        for [ns, name, rev, sync, health] in row(server, ns) {
            out.push_str(&format!(
                "{cluster:<24} {ns:<18} {name:<20} {rev:<10} {sync:<10} {health:<10}\n"
            ));
        }
    }
    out
}

fn kubectl() -> String {
    let venv = PathBuf::from(".venv/bin/kubectl");
    if venv.exists() {
        venv.display().to_string()
    } else {
        "kubectl".into()
    }
}

async fn check(topo: &Topology) -> Result<(), harness::HarnessError> {
    let t = Duration::from_secs(60);
    harness::eventually(
        "hub application reaches the managed spoke and reports Healthy",
        t,
        || async {
            harness::stored_app(&topo.hub, MANAGED, "guestbook")
                .filter(|a| a.pointer("/status/health/status") == Some(&Value::from("Healthy")))
                .and(harness::stored_app(
                    &topo.managed_spoke,
                    SPOKE_NS,
                    "guestbook",
                ))
        },
    )
    .await?;
    harness::eventually(
        "autonomous spoke application reaches the hub and reports Healthy",
        t,
        || async {
            harness::stored_app(&topo.hub, AUTONOMOUS, "edge-guestbook")
                .filter(|a| a.pointer("/status/health/status") == Some(&Value::from("Healthy")))
        },
    )
    .await?;
    Ok(())
}

/// Runs the demo.
pub async fn run(args: DemoArgs) -> crate::CmdResult {
    std::fs::create_dir_all(&args.dir)?;
    let dir = std::fs::canonicalize(&args.dir)?;
    eprintln!("starting the local topology in {} ...", dir.display());
    let topo = Topology::start(TopologyOptions {
        dir: Some(dir.clone()),
        ..Default::default()
    })
    .await?;

    // Simulated Argo CD controllers on the spokes (they only write status).
    let managed_sim = spawn_sim(harness::apps(&topo.managed_spoke, SPOKE_NS)?);
    let autonomous_sim = spawn_sim(harness::apps(&topo.autonomous_spoke, SPOKE_NS)?);

    // Samples: one on the hub for the managed agent, one on the autonomous spoke.
    harness::apps(&topo.hub, MANAGED)?
        .create(
            &PostParams::default(),
            &harness::sample_app("guestbook", MANAGED, "guestbook"),
        )
        .await?;
    harness::apps(&topo.autonomous_spoke, SPOKE_NS)?
        .create(
            &PostParams::default(),
            &harness::sample_app("edge-guestbook", SPOKE_NS, "helm-guestbook"),
        )
        .await?;

    if args.check {
        let r = check(&topo).await;
        println!("{}", table(&topo));
        managed_sim.abort();
        autonomous_sim.abort();
        let logs = topo.logs();
        topo.stop().await;
        return match r {
            Ok(()) => {
                println!(
                    "demo check passed: Applications flow hub -> managed spoke and autonomous spoke -> hub, status flows back"
                );
                Ok(())
            }
            Err(e) => Err(format!("demo check failed: {e}\n{logs}").into()),
        };
    }

    let k = kubectl();
    let help = format!(
        "Try (in another terminal):\n  {k} --kubeconfig {d}/hub.kubeconfig -n {MANAGED} edit application guestbook\n  {k} --kubeconfig {d}/hub.kubeconfig -n {MANAGED} apply -f my-app.yaml\n  {k} --kubeconfig {d}/managed.kubeconfig -n {SPOKE_NS} get applications -w\n  {k} --kubeconfig {d}/autonomous.kubeconfig -n {SPOKE_NS} delete application edge-guestbook\nLogs: {d}/principal.log, {d}/{MANAGED}.log, {d}/{AUTONOMOUS}.log. Ctrl-C stops everything.\n",
        d = dir.display()
    );
    let tty = std::io::stdout().is_terminal();
    let deadline = args
        .exit_after
        .map(|s| tokio::time::Instant::now() + Duration::from_secs(s));
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tick.tick() => {
                if tty {
                    print!("\x1b[2J\x1b[H");
                }
                println!("{}\n{help}", table(&topo));
                if deadline.is_some_and(|d| tokio::time::Instant::now() > d) {
                    break;
                }
            }
        }
    }
    eprintln!("stopping ...");
    managed_sim.abort();
    autonomous_sim.abort();
    topo.stop().await;
    Ok(())
}

fn spawn_sim(api: kube::Api<kube::api::DynamicObject>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Err(e) = argocd_agent_e2e::fake_argocd::run(api, Duration::from_secs(1)).await {
            tracing::warn!(error = %e, "simulated Argo CD stopped");
        }
    })
}
