//! `argocd-agentctl identity`: tools around SPIFFE identities and the mapping rules.

use std::path::PathBuf;

use argocd_agent_domain::AgentMode;
use argocd_agent_domain::mapping::RuleSet;
use argocd_agent_identity::SpiffeId;

/// Subcommands of `argocd-agentctl identity`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Show which mapping rule a SPIFFE ID matches and the agent, namespace and modes it
    /// maps to, or why it is denied (every rule tried). Exits non-zero when denied.
    Explain(ExplainArgs),
    /// Show the current SVID from the Workload API (or PEM files): SPIFFE ID, expiry, chain,
    /// bundle trust domains.
    Inspect(InspectArgs),
}

/// Arguments of `identity inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Workload API socket (default: SPIFFE_ENDPOINT_SOCKET), e.g. unix:///run/spire/agent.sock.
    /// The same flag name as the principal's and the agent's; `--socket` is kept as an alias.
    #[arg(
        long,
        env = "SPIFFE_ENDPOINT_SOCKET",
        visible_alias = "spire-agent-socket",
        alias = "socket"
    )]
    spiffe_endpoint_socket: Option<String>,
    /// SVID certificate chain (PEM) instead of the Workload API.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// SVID private key (PEM).
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Trust bundle (PEM), repeatable.
    #[arg(long = "root-ca")]
    root_ca: Vec<std::path::PathBuf>,
}

async fn inspect(args: InspectArgs) -> crate::CmdResult {
    use argocd_agent_identity::source::SvidSource;
    let source = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => SvidSource::pem_files(
            cert,
            key,
            args.root_ca.into_iter().map(|p| (None, p)).collect(),
            std::time::Duration::from_secs(3600),
        )?,
        _ => SvidSource::workload_api(args.spiffe_endpoint_socket).await?,
    };
    source
        .wait_ready(std::time::Duration::from_secs(15))
        .await?;
    println!("{}", argocd_agent_identity::source::inspect(&source).await);
    Ok(())
}

/// Arguments of `identity explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// The SPIFFE ID to explain, e.g. spiffe://example.org/ns/argocd/sa/edge-7.
    pub spiffe_id: String,
    /// YAML rules file (the same file the principal loads). Its rules come first.
    #[arg(long = "rules", value_name = "FILE")]
    pub rules: Option<PathBuf>,
    /// A rule in flag form, repeatable: `mtls:uri:<regex>`,
    /// `template:<template>=><agent>[,namespace=..][,mode=..][,trustDomains=a|b][,name=..]`,
    /// `exact:<spiffe-id>=><agent>[,namespace=..][,mode=..][,name=..]`.
    #[arg(long = "rule", value_name = "FLAG")]
    pub rule: Vec<String>,
    /// Also check that the agent may run in this mode (managed or autonomous).
    #[arg(long, value_name = "MODE")]
    pub mode: Option<AgentMode>,
}

/// Runs one subcommand.
pub async fn run(cmd: Command) -> crate::CmdResult {
    match cmd {
        Command::Explain(args) => explain(args),
        Command::Inspect(args) => inspect(args).await,
    }
}

fn explain(args: ExplainArgs) -> crate::CmdResult {
    let id = SpiffeId::parse(&args.spiffe_id)?;
    let file_rules = match &args.rules {
        Some(path) => RuleSet::from_file(path)?,
        None => RuleSet::default(),
    };
    let rules = file_rules.append(RuleSet::from_flags(&args.rule)?);
    let explanation = rules.explain(&id);
    println!("{explanation}");
    let identity = explanation.decision?;
    if let Some(mode) = args.mode {
        identity.check_mode(mode)?;
        println!("mode {mode}: allowed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(id: &str, rules: &[&str], mode: Option<AgentMode>) -> ExplainArgs {
        ExplainArgs {
            spiffe_id: id.to_owned(),
            rules: None,
            rule: rules.iter().map(|s| s.to_string()).collect(),
            mode,
        }
    }

    const SPIRE: &str = "template:spiffe://{trust_domain}/ns/{ns}/sa/{sa}=>{sa},mode=managed";

    #[test]
    fn explain_succeeds_for_a_mapped_id() {
        assert!(explain(args("spiffe://example.org/ns/a/sa/edge-1", &[SPIRE], None)).is_ok());
    }

    #[test]
    fn explain_fails_when_denied_so_the_exit_code_is_non_zero() {
        let err = explain(args("spiffe://example.org/other", &[SPIRE], None)).unwrap_err();
        assert!(err.to_string().contains("no rule matched"), "{err}");
        let err = explain(args("spiffe://example.org/other", &[], None)).unwrap_err();
        assert!(err.to_string().contains("no mapping rules"), "{err}");
    }

    #[test]
    fn explain_checks_the_mode_when_asked() {
        let id = "spiffe://example.org/ns/a/sa/edge-1";
        assert!(explain(args(id, &[SPIRE], Some(AgentMode::Managed))).is_ok());
        let err = explain(args(id, &[SPIRE], Some(AgentMode::Autonomous))).unwrap_err();
        assert!(
            err.to_string().contains("may not run in autonomous mode"),
            "{err}"
        );
    }

    #[test]
    fn explain_rejects_invalid_ids_rules_and_files() {
        assert!(explain(args("spiffe://example.org/x/", &[SPIRE], None)).is_err());
        assert!(explain(args("spiffe://example.org/x", &["nonsense"], None)).is_err());
        let mut a = args("spiffe://example.org/x", &[], None);
        a.rules = Some(PathBuf::from("/nonexistent/rules.yaml"));
        let err = explain(a).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/rules.yaml"), "{err}");
    }

    #[test]
    fn explain_reads_file_rules_before_flag_rules() {
        let path = std::env::temp_dir().join(format!("agentctl-rules-{}.yaml", std::process::id()));
        std::fs::write(
            &path,
            "rules:\n  - exact: spiffe://example.org/a\n    agent: from-file\n    mode: managed\n",
        )
        .unwrap();
        let mut a = args(
            "spiffe://example.org/a",
            &["exact:spiffe://example.org/a=>from-flag,mode=autonomous"],
            Some(AgentMode::Autonomous),
        );
        a.rules = Some(path.clone());
        // The file rule decides (managed only), so asking for autonomous fails.
        let res = explain(a);
        let _ = std::fs::remove_file(&path);
        let err = res.unwrap_err();
        assert!(err.to_string().contains("from-file"), "{err}");
    }
}
