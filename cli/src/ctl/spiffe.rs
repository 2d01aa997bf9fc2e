//! `argocd-agentctl spiffe` (being written).

/// Subcommands of `argocd-agentctl spiffe`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {}
}
