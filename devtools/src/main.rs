//! `argocd-agent-dev`: developer tooling that runs the shipped binaries locally: the whole
//! topology as a live demo, the development Workload API and Kubernetes API test servers, the
//! load generator and the chaos run. Operator commands are `argocd-agentctl`'s.
#![forbid(unsafe_code)]

mod bench;
mod chaos;
mod demo;
mod dev;
mod spiffe;

use clap::{Parser, Subcommand};

/// Error type for command handlers: every failure is printed as one clear line.
type CmdResult = argocd_agent_cli::CmdResult;

#[derive(Debug, Parser)]
#[command(
    name = "argocd-agent-dev",
    version = argocd_agent_cli::version::text(),
    about = "Developer tooling for argocd-agent: demo, test servers, load and chaos"
)]
struct Cli {
    /// Log level filter (overridden by RUST_LOG).
    #[arg(
        long,
        global = true,
        default_value = "info",
        env = "ARGOCD_AGENT_DEV_LOG_LEVEL"
    )]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the whole topology locally (dev Workload API, hub + 2 spokes, principal, agents).
    Demo(demo::DemoArgs),
    /// Development SPIFFE Workload API server.
    #[command(subcommand)]
    Spiffe(spiffe::Command),
    /// Development helpers (Kubernetes API test server).
    #[command(subcommand)]
    Dev(dev::Command),
    /// Load generator: a real principal and N simulated agents (docs/benchmarks.md).
    Bench(bench::BenchArgs),
    /// Chaos run: seeded operations under seeded faults, then every object checked
    /// (docs/reliability.md).
    Chaos(chaos::ChaosArgs),
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    argocd_agent_cli::logging::init(&cli.log_level, false);
    let result = match cli.command {
        Command::Demo(a) => demo::run(a).await,
        Command::Spiffe(c) => spiffe::run(c).await,
        Command::Dev(c) => dev::run(c).await,
        Command::Bench(a) => bench::run(a).await,
        Command::Chaos(a) => chaos::run(a).await,
    };
    if let Err(e) = result {
        eprintln!("error: {}", argocd_agent_domain::error_chain(&*e));
        std::process::exit(1);
    }
}
