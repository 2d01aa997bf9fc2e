//! `argocd-agent-dev chaos`: the chaos run (`argocd_agent_load::chaos`). Real principal and
//! agent processes, a hub and one spoke per agent, a fault-injecting proxy on every agent
//! link; seeded operations and faults, then a check of every object against the model.
//! Exits non-zero when anything was lost, divergent, duplicated or resurrected. See
//! `docs/reliability.md`.

use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_load::chaos::{self, ChaosOptions};

/// Arguments of `argocd-agent-dev chaos`.
#[derive(Debug, clap::Args)]
pub struct ChaosArgs {
    /// Seed of the operations and of the fault schedule (the same seed, the same inputs).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Operations, over all agents.
    #[arg(long, default_value_t = 10_000)]
    ops: usize,
    /// Agents, one spoke each: even-numbered managed, odd-numbered autonomous (at least 3
    /// gives both modes and two of one).
    #[arg(long, default_value_t = 4)]
    agents: usize,
    /// Operations per second, over all agents.
    #[arg(long, default_value_t = 40.0)]
    rate: f64,
    /// Application names per agent.
    #[arg(long, default_value_t = 12)]
    names: usize,
    /// Mean pause between faults, milliseconds.
    #[arg(long, default_value_t = 1500)]
    fault_every_ms: u64,
    /// SVID rotation interval, seconds (0: none).
    #[arg(long, default_value_t = 3)]
    rotate_every: u64,
    /// Run the operations without faults (a baseline).
    #[arg(long)]
    no_faults: bool,
    /// Longest wait for convergence after the faults stop, seconds.
    #[arg(long, default_value_t = 120)]
    converge_timeout: u64,
    /// Keep logs and kubeconfigs here (default: a temporary directory, kept if the run fails).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Append the report as one JSON line to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Runs the chaos run and prints its report.
pub async fn run(a: ChaosArgs) -> crate::CmdResult {
    let opts = ChaosOptions {
        seed: a.seed,
        ops: a.ops,
        agents: a.agents.max(1),
        rate: a.rate.max(0.1),
        names: a.names.max(1),
        faults: !a.no_faults,
        fault_every: Duration::from_millis(a.fault_every_ms.max(10)),
        rotate_every: Duration::from_secs(a.rotate_every),
        converge_timeout: Duration::from_secs(a.converge_timeout),
        dir: a.dir,
    };
    let report = chaos::run(&opts)
        .await
        .map_err(|e| format!("chaos seed {}: {e}", a.seed))?;
    print!("{}", report.table());
    if let Some(path) = a.json {
        super::bench::append_json_line(&path, &report.json())?;
    }
    if report.passed() {
        Ok(())
    } else {
        Err(format!(
            "chaos seed {}: {} lost, {} divergent, {} duplicated, {} resurrected, {} panics{}",
            a.seed,
            report.lost,
            report.divergent,
            report.duplicated,
            report.resurrected,
            report.panics,
            if report.converged {
                ""
            } else {
                " (did not converge)"
            }
        )
        .into())
    }
}
