//! `argocd-agentctl identity` (being written).

/// Subcommands of `argocd-agentctl identity`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {}
}
