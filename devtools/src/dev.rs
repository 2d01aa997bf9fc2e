//! `argocd-agent-dev dev`: development servers for local demos and e2e runs.

use std::net::SocketAddr;
use std::path::PathBuf;

use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};

/// Subcommands of `argocd-agent-dev dev`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Runs the in-memory Kubernetes API test server (see docs/kube-test-server.md) until
    /// Ctrl-C or SIGTERM.
    KubeServer(KubeServerArgs),
}

/// Arguments of `argocd-agent-dev dev kube-server`.
#[derive(Debug, clap::Args)]
pub struct KubeServerArgs {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Where to write a kubeconfig pointing at the server.
    #[arg(long)]
    pub kubeconfig_out: Option<PathBuf>,
    /// Cluster, user and context name in the kubeconfig.
    #[arg(long, default_value = "kube-test-server")]
    pub context: String,
    /// Create missing namespaces on first use instead of answering 404.
    #[arg(long)]
    pub auto_create_namespaces: bool,
}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {
        Command::KubeServer(args) => kube_server(args).await,
    }
}

async fn kube_server(args: KubeServerArgs) -> crate::CmdResult {
    let options = ServerOptions {
        auto_create_namespaces: args.auto_create_namespaces,
        ..ServerOptions::default()
    };
    let server = KubeTestServer::start_on(args.listen, options)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    if let Some(path) = &args.kubeconfig_out {
        server
            .write_kubeconfig(path, &args.context)
            .map_err(|e| format!("cannot write kubeconfig {}: {e}", path.display()))?;
    }
    // The URL is the one line scripts read from stdout.
    println!("{}", server.url());
    wait_for_stop_signal().await?;
    server.shutdown().await;
    Ok(())
}

async fn wait_for_stop_signal() -> crate::CmdResult {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(|e| format!("cannot install SIGTERM handler: {e}"))?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map_err(|e| format!("cannot wait for Ctrl-C: {e}"))?,
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c()
        .await
        .map_err(|e| format!("cannot wait for Ctrl-C: {e}"))?;
    Ok(())
}
