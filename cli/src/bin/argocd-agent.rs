//! `argocd-agent`: the principal (hub) and the agent (spoke).
//!
//! Flags and environment variables follow upstream argocd-agent where the meaning is the
//! same (`--listen-port`, `--auth`, `--agent-mode`, `ARGOCD_PRINCIPAL_*`, `ARGOCD_AGENT_*`).

use argocd_agent_cli::CmdResult;
use argocd_agent_cli::args::{AgentArgs, Command, PrincipalArgs, TlsVersionArgs};
use argocd_agent_cli::telemetry::OtlpOptions;
use argocd_agent_identity::text;
use tokio_util::sync::CancellationToken;

fn shutdown_token() -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            let mut term =
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(s) => s,
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                        t.cancel();
                        return;
                    }
                };
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutting down");
        t.cancel();
    });
    token
}

/// Sets up logging and, when configured, trace export; runs `body`; flushes the traces.
async fn with_telemetry(
    log_level: &str,
    log_format: &str,
    otlp: OtlpOptions,
    notices: Vec<String>,
    body: impl Future<Output = CmdResult>,
) -> CmdResult {
    let telemetry = argocd_agent_cli::telemetry::init_provider(&otlp)?;
    argocd_agent_cli::logging::init_with_telemetry(
        log_level,
        log_format == "json",
        telemetry.as_ref(),
    );
    // Upstream settings accepted with a remark (see docs/migration.md, "Configuration").
    for n in notices {
        tracing::warn!("upstream setting: {n}");
    }
    let result = body.await;
    if let Some(t) = telemetry {
        t.shutdown().await;
    }
    result
}

/// Every listener and dialer of the process speaks the TLS versions and suites of
/// `--tls-min-version`, `--tls-max-version`, `--tls-ciphersuites` (TLS 1.3 only by default).
fn install_tls(tls: &TlsVersionArgs) -> CmdResult {
    let profile = tls.profile()?;
    tracing::info!(tls = %profile, "TLS versions");
    profile.install()?;
    Ok(())
}

async fn run_principal(a: PrincipalArgs, notices: Vec<String>) -> CmdResult {
    let otlp = OtlpOptions {
        address: a.otlp_address.clone(),
        insecure: a.otlp_insecure,
        default_service_name: "argocd-agent-principal",
    };
    let (level, format) = (a.log_level.clone(), a.log_format.clone());
    with_telemetry(&level, &format, otlp, notices, serve_principal(a)).await
}

async fn serve_principal(a: PrincipalArgs) -> CmdResult {
    install_tls(&a.tls)?;
    let config = a.config()?;
    let shutdown = shutdown_token();
    let running = argocd_agent_principal::start(config, shutdown).await?;
    tracing::info!(addr = %running.addr, metrics = %text::or_dash(running.metrics_addr), redis_proxy = %text::or_dash(running.redis_proxy_addr), admin = %text::or_dash(running.admin_addr.as_ref()), "principal started");
    running.wait().await?;
    Ok(())
}

async fn run_agent(a: AgentArgs, notices: Vec<String>) -> CmdResult {
    let otlp = OtlpOptions {
        address: a.otlp_address.clone(),
        insecure: a.otlp_insecure,
        default_service_name: "argocd-agent-agent",
    };
    let (level, format) = (a.log_level.clone(), a.log_format.clone());
    with_telemetry(&level, &format, otlp, notices, serve_agent(a)).await
}

async fn serve_agent(a: AgentArgs) -> CmdResult {
    install_tls(&a.tls)?;
    let config = a.config()?;
    let shutdown = shutdown_token();
    let running = argocd_agent_agent::start(config, shutdown).await?;
    tracing::info!(metrics = %text::or_dash(running.metrics_addr), "agent started");
    running.wait().await;
    Ok(())
}

#[tokio::main]
async fn main() {
    // `argocd_agent_build_info{git_revision}` reports the commit `--version` shows.
    argocd_agent_runtime::exposition::set_git_revision(argocd_agent_cli::version::GIT_COMMIT);
    // Our flags plus upstream argocd-agent's names (cli/src/upstream.rs).
    let parsed = argocd_agent_cli::upstream::parse();
    let notices = parsed.notices;
    let result = match parsed.cli.command {
        Command::Principal(a) => run_principal(*a, notices).await,
        Command::Agent(a) => run_agent(*a, notices).await,
    };
    if let Err(e) = result {
        eprintln!("error: {}", argocd_agent_domain::error_chain(&*e));
        std::process::exit(1);
    }
}
