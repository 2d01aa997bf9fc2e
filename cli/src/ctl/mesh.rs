//! `argocd-agentctl mesh` (being written).

/// Subcommands of `argocd-agentctl mesh`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {}
}
