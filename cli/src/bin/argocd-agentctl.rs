//! `argocd-agentctl`: operator tooling for argocd-agent (developer tooling is `argocd-agent-dev`).

use argocd_agent_cli::ctl;
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "argocd-agentctl",
    version = argocd_agent_cli::version::text(),
    about = "Tooling for argocd-agent"
)]
struct Cli {
    /// Log level filter (overridden by RUST_LOG).
    #[arg(
        long,
        global = true,
        default_value = "info",
        env = "ARGOCD_AGENTCTL_LOG_LEVEL"
    )]
    log_level: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Agents: onboard (create, delete) and, through a running principal's admin API, list,
    /// inspect, disconnect.
    #[command(subcommand)]
    Agent(ctl::agent::Command),
    /// Revocation by identity: the hub's blocklist of SPIFFE IDs, prefixes and certificate
    /// fingerprints (add, remove, list).
    #[command(subcommand)]
    Blocklist(ctl::blocklist::Command),
    /// Principal replicas (`--ha`) and the agents each serves, from the hub's Leases.
    Replicas(ctl::replicas::ReplicasArgs),
    /// SPIFFE identities: explain mapping rules, inspect the current SVID.
    #[command(subcommand)]
    Identity(ctl::identity::Command),
    /// Service-mesh config generators (Envoy, Istio, Linkerd).
    #[command(subcommand)]
    Mesh(ctl::mesh::Command),
    /// Offline checks of a principal's or an agent's flags, environment, mapping rules and
    /// SVID files: OK / WARN / ERROR lines, non-zero exit on errors.
    #[command(subcommand)]
    Validate(ctl::validate::Command),
    /// Tenants of the hub: from a rules file (--rules) or a running principal's admin API
    /// (list, inspect: agents, quotas and their use).
    #[command(subcommand)]
    Tenant(ctl::tenant::Command),
    /// Print the version, the git commit and the protocol versions this build speaks.
    Version,
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    argocd_agent_cli::logging::init(&cli.log_level, false);
    let result = match cli.command {
        Command::Agent(c) => ctl::agent::run(c).await,
        Command::Blocklist(c) => ctl::blocklist::run(c).await,
        Command::Replicas(a) => ctl::replicas::run(a).await,
        Command::Tenant(c) => ctl::tenant::run(c).await,
        Command::Identity(c) => ctl::identity::run(c).await,
        Command::Mesh(c) => ctl::mesh::run(c).await,
        Command::Validate(c) => ctl::validate::run(c).await,
        Command::Version => {
            println!("argocd-agentctl {}", argocd_agent_cli::version::text());
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("error: {}", argocd_agent_domain::error_chain(&*e));
        std::process::exit(1);
    }
}
