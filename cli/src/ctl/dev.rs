//! `argocd-agentctl dev` (being written).

/// Subcommands of `argocd-agentctl dev`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {}
}
