//! `argocd-agentctl mesh`: prints the proxy and mesh configuration that puts the principal
//! behind Envoy, Istio or Linkerd (see docs/mesh.md).

use argocd_agent_identity::text::quoted;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use argocd_agent_identity::{SpiffeId, TrustDomain};

use argocd_agent_domain::RuleSet;
use argocd_agent_mesh::guard::{HeaderListenerPolicy, ListenAddr, check_listen_addr};
use argocd_agent_mesh::{
    AllowedAgents, EnvoyOptions, EnvoyTls, IstioOptions, LinkerdOptions, envoy_principal_config,
    istio_objects, linkerd_objects,
};

/// Subcommands of `argocd-agentctl mesh`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Envoy bootstrap: mTLS from agents, XFCC (SANITIZE_SET) to the principal's
    /// loopback header-auth listener.
    Envoy(EnvoyArgs),
    /// Istio PeerAuthentication, Sidecar, DestinationRule and AuthorizationPolicy.
    Istio(IstioArgs),
    /// Linkerd Server, MeshTLSAuthentication and AuthorizationPolicy.
    Linkerd(LinkerdArgs),
}

/// Which agents may connect: a whole trust domain or a list of SPIFFE IDs.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct AgentsArgs {
    /// Accept every SPIFFE ID of this trust domain (the principal's mapping rules decide).
    #[arg(long)]
    pub trust_domain: Option<String>,
    /// Accept exactly this agent SPIFFE ID (repeatable).
    #[arg(long = "agent-id", value_name = "SPIFFE_ID")]
    pub agent_ids: Vec<String>,
    /// Accept exactly the SPIFFE IDs of the `exact` rules in this identity rules file (the
    /// file the principal loads with --identity-rules), so the mesh admits the same agents
    /// as the principal. Pattern rules (template, regex) are refused: a mesh policy needs a
    /// finite list.
    #[arg(long = "agents-from-rules", value_name = "RULES_FILE")]
    pub rules_file: Option<PathBuf>,
}

/// Where Envoy gets its certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TlsMode {
    /// SDS from the SPIRE agent socket (rotates without restarts).
    Sds,
    /// PEM files (local tests, spiffe-helper).
    Files,
}

/// Flags of `mesh envoy`.
#[derive(Debug, clap::Args)]
pub struct EnvoyArgs {
    /// Address Envoy listens on for agents (mTLS).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// The principal's plaintext header-auth listener: a loopback `host:port` or
    /// `unix:/path`.
    #[arg(long, default_value = "127.0.0.1:8404")]
    pub upstream: String,
    /// Certificate source.
    #[arg(long, value_enum, default_value_t = TlsMode::Sds)]
    pub tls: TlsMode,
    /// SPIRE agent socket (with --tls sds).
    #[arg(long, default_value = "/run/spire/sockets/agent.sock")]
    pub sds_socket: PathBuf,
    /// Certificate chain PEM (with --tls files).
    #[arg(long)]
    pub cert: Option<PathBuf>,
    /// Private key PEM (with --tls files).
    #[arg(long)]
    pub key: Option<PathBuf>,
    /// Trust bundle PEM for verifying agents (with --tls files).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// Envoy admin address (keep it on loopback); none by default.
    #[arg(long)]
    pub admin: Option<SocketAddr>,
    /// Allowed agents.
    #[command(flatten)]
    pub agents: AgentsArgs,
}

type Labels = BTreeMap<String, String>;

/// Flags shared by the Kubernetes-object generators (`mesh istio`, `mesh linkerd`).
#[derive(Debug, clap::Args)]
pub struct PrincipalObjectArgs {
    /// Namespace of the principal.
    #[arg(long, default_value = "argocd")]
    pub namespace: String,
    /// Name of the generated objects.
    #[arg(long, default_value = "argocd-agent-principal")]
    pub name: String,
    /// Pod label selecting the principal, `key=value` (repeatable; default
    /// `app.kubernetes.io/name=argocd-agent-principal`).
    #[arg(long = "selector", value_name = "KEY=VALUE")]
    pub selector: Vec<String>,
}

impl PrincipalObjectArgs {
    /// Namespace, name and (when given) pod selector of the generated objects.
    fn into_parts(self) -> Result<(String, String, Option<Labels>), Error> {
        let selector = selector(&self.selector)?;
        Ok((self.namespace, self.name, selector))
    }
}

/// Flags of `mesh istio`.
#[derive(Debug, clap::Args)]
pub struct IstioArgs {
    /// Where the principal runs and what the generated objects are called.
    #[command(flatten)]
    pub principal: PrincipalObjectArgs,
    /// Port agents connect to.
    #[arg(long, default_value_t = 8443)]
    pub port: u16,
    /// Port of the principal's header-auth listener on 127.0.0.1.
    #[arg(long, default_value_t = 8404)]
    pub upstream_port: u16,
    /// Service host for the DestinationRule (default `<name>.<namespace>.svc.cluster.local`).
    #[arg(long)]
    pub host: Option<String>,
    /// Allowed agents.
    #[command(flatten)]
    pub agents: AgentsArgs,
}

/// Flags of `mesh linkerd`.
#[derive(Debug, clap::Args)]
pub struct LinkerdArgs {
    /// Where the principal runs and what the generated objects are called.
    #[command(flatten)]
    pub principal: PrincipalObjectArgs,
    /// The principal's header-auth port.
    #[arg(long, default_value_t = 8443)]
    pub port: u16,
    /// Namespace of the Linkerd control plane.
    #[arg(long, default_value = "linkerd")]
    pub control_plane_ns: String,
    /// Allowed agents.
    #[command(flatten)]
    pub agents: AgentsArgs,
}

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The SPIFFE IDs of the `exact` rules of an identity rules file, each checked to be
/// admitted by the whole rule set (an earlier rule could shadow or deny it).
pub fn agent_ids_from_rules(text: &str) -> Result<Vec<SpiffeId>, Error> {
    let rules = RuleSet::from_yaml(text)?;
    let doc: serde_json::Value = serde_saphyr::from_str(text)?;
    let list = doc
        .get("rules")
        .and_then(serde_json::Value::as_array)
        .ok_or("the rules file has no rules list")?;
    let mut ids = Vec::new();
    for (i, rule) in list.iter().enumerate() {
        let name = rule
            .get("name")
            .and_then(serde_json::Value::as_str)
            .map_or_else(|| format!("rule-{}", i + 1), str::to_owned);
        let Some(exact) = rule.get("exact").and_then(serde_json::Value::as_str) else {
            return Err(format!(
                "rule {name} is a pattern, not one identity: a mesh policy generated from the rules needs exact rules only (or use --trust-domain / --agent-id)", name = quoted(&name)
            )
            .into());
        };
        let id = SpiffeId::parse(exact)?;
        rules.map(&id).map_err(|e| {
            format!(
                "rule {name}: {id} is not admitted by the rules: {e}",
                name = quoted(&name)
            )
        })?;
        ids.push(id);
    }
    if ids.is_empty() {
        return Err("the rules file admits no agent".into());
    }
    Ok(ids)
}

fn allowed(args: &AgentsArgs) -> Result<AllowedAgents, Error> {
    if let Some(td) = &args.trust_domain {
        return Ok(AllowedAgents::TrustDomain(TrustDomain::new(td)?));
    }
    if let Some(path) = &args.rules_file {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        return Ok(AllowedAgents::Ids(
            agent_ids_from_rules(&text).map_err(|e| format!("{}: {e}", path.display()))?,
        ));
    }
    let ids = args
        .agent_ids
        .iter()
        .map(|s| SpiffeId::parse(s))
        .collect::<Result<Vec<_>, _>>()?;
    if ids.is_empty() {
        return Err("give --trust-domain or at least one --agent-id".into());
    }
    Ok(AllowedAgents::Ids(ids))
}

fn selector(pairs: &[String]) -> Result<Option<BTreeMap<String, String>>, Error> {
    if pairs.is_empty() {
        return Ok(None);
    }
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(format!("--selector {p}: expected key=value", p = quoted(&p)).into()),
        })
        .collect::<Result<BTreeMap<_, _>, Error>>()
        .map(Some)
}

fn upstream(value: &str) -> Result<ListenAddr, Error> {
    let addr = match value.strip_prefix("unix:") {
        Some(path) if !path.is_empty() => ListenAddr::Unix(path.into()),
        Some(_) => return Err("--upstream unix: needs a path".into()),
        None => ListenAddr::Tcp(value.parse().map_err(|e| {
            format!(
                "--upstream {value}: expected host:port or unix:/path ({e})",
                value = quoted(&value)
            )
        })?),
    };
    // The principal refuses header auth anywhere else; say so now rather than at deploy.
    check_listen_addr(&addr, &HeaderListenerPolicy::default())?;
    Ok(addr)
}

/// Builds the YAML a subcommand prints.
pub fn render(cmd: Command) -> Result<String, Error> {
    match cmd {
        Command::Envoy(a) => {
            let tls = match a.tls {
                TlsMode::Sds => EnvoyTls::Sds {
                    socket: a.sds_socket,
                },
                TlsMode::Files => match (a.cert, a.key, a.ca) {
                    (Some(cert), Some(key), Some(ca)) => EnvoyTls::Files { cert, key, ca },
                    _ => return Err("--tls files needs --cert, --key and --ca".into()),
                },
            };
            let mut opts = EnvoyOptions::new(tls, allowed(&a.agents)?);
            opts.listen = a.listen;
            opts.upstream = upstream(&a.upstream)?;
            opts.admin = a.admin;
            Ok(envoy_principal_config(opts))
        }
        Command::Istio(a) => {
            let mut opts = IstioOptions::new(allowed(&a.agents)?);
            let (namespace, name, sel) = a.principal.into_parts()?;
            opts.host = a
                .host
                .unwrap_or_else(|| format!("{name}.{namespace}.svc.cluster.local"));
            opts.namespace = namespace;
            opts.name = name;
            if let Some(sel) = sel {
                opts.selector = sel;
            }
            opts.port = a.port;
            opts.upstream_port = a.upstream_port;
            Ok(istio_objects(opts))
        }
        Command::Linkerd(a) => {
            let mut opts = LinkerdOptions::new(allowed(&a.agents)?);
            let (namespace, name, sel) = a.principal.into_parts()?;
            opts.namespace = namespace;
            opts.name = name;
            if let Some(sel) = sel {
                opts.selector = sel;
            }
            opts.port = a.port;
            opts.control_plane_ns = a.control_plane_ns;
            Ok(linkerd_objects(opts))
        }
    }
}

/// Runs one subcommand: prints the generated YAML to stdout.
pub async fn run(cmd: Command) -> crate::CmdResult {
    print!("{}", render(cmd)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Command,
    }

    fn render_args(args: &[&str]) -> Result<String, Error> {
        let cli = Cli::try_parse_from(std::iter::once("mesh").chain(args.iter().copied()))?;
        render(cli.cmd)
    }

    #[test]
    fn envoy_command_prints_sds_bootstrap() {
        let out = render_args(&["envoy", "--trust-domain", "edge.example"]).unwrap();
        assert!(out.contains("SANITIZE_SET"), "{out}");
        assert!(out.contains("spiffe://edge.example/"), "{out}");
        assert!(out.contains("/run/spire/sockets/agent.sock"), "{out}");
    }

    #[test]
    fn envoy_command_refuses_non_loopback_upstream_and_incomplete_files() {
        let err = render_args(&[
            "envoy",
            "--trust-domain",
            "td",
            "--upstream",
            "0.0.0.0:8404",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("not a loopback address"), "{err}");
        let err = render_args(&[
            "envoy",
            "--trust-domain",
            "td",
            "--tls",
            "files",
            "--cert",
            "c",
        ])
        .unwrap_err();
        assert!(err.to_string().contains("--cert, --key and --ca"), "{err}");
    }

    #[test]
    fn agents_are_required_and_validated() {
        assert!(render_args(&["istio"]).is_err());
        assert!(render_args(&["istio", "--agent-id", "not-spiffe"]).is_err());
        let out = render_args(&[
            "istio",
            "--agent-id",
            "spiffe://edge.example/ns/argocd/sa/agent-1",
            "--selector",
            "app=principal",
        ])
        .unwrap();
        assert!(out.contains("edge.example/ns/argocd/sa/agent-1"), "{out}");
        assert!(out.contains("app: principal"), "{out}");
    }

    const EXACT_RULES: &str = "rules:\n  - name: edge-1\n    exact: spiffe://cluster.local/ns/argocd/sa/edge-1\n    agent: edge-1\n  - name: edge-2\n    exact: spiffe://cluster.local/ns/argocd/sa/edge-2\n    agent: edge-2\n";

    #[test]
    fn mesh_policy_from_rules_admits_exactly_the_exact_rule_ids() {
        let ids = agent_ids_from_rules(EXACT_RULES).unwrap();
        let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
        assert_eq!(
            ids,
            [
                "spiffe://cluster.local/ns/argocd/sa/edge-1",
                "spiffe://cluster.local/ns/argocd/sa/edge-2"
            ]
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rules.yaml");
        std::fs::write(&file, EXACT_RULES).unwrap();
        let out = render_args(&["istio", "--agents-from-rules", file.to_str().unwrap()]).unwrap();
        assert!(out.contains("cluster.local/ns/argocd/sa/edge-1"), "{out}");
        assert!(out.contains("cluster.local/ns/argocd/sa/edge-2"), "{out}");
        assert!(!out.contains("cluster.local/*"), "{out}");
        let out = render_args(&["linkerd", "--agents-from-rules", file.to_str().unwrap()]).unwrap();
        assert!(
            out.contains("edge-2.argocd.serviceaccount.identity.linkerd.cluster.local"),
            "{out}"
        );
        assert!(!out.contains("\"*."), "{out}");
    }

    #[test]
    fn mesh_policy_from_rules_refuses_pattern_rules_and_denied_ids() {
        let pattern = "rules:\n  - name: any-sa\n    template: \"spiffe://{trust_domain}/ns/{ns}/sa/{sa}\"\n    agent: \"{sa}\"\n";
        let err = agent_ids_from_rules(pattern).unwrap_err().to_string();
        assert!(err.contains("\"any-sa\" is a pattern"), "{err}");
        // An exact rule the principal would still deny (here: its namespace renders as
        // "cluster.local", not a DNS-1123 label) must not be admitted by the mesh.
        let denied = "rules:\n  - name: edge-1\n    exact: spiffe://cluster.local/ns/argocd/sa/edge-1\n    agent: edge-1\n    namespace: \"{trust_domain}\"\n";
        RuleSet::from_yaml(denied).expect("the rules themselves load");
        let err = agent_ids_from_rules(denied).unwrap_err().to_string();
        assert!(err.contains("is not admitted by the rules"), "{err}");
        assert!(agent_ids_from_rules("rules: []\n").is_err());
    }

    #[test]
    fn linkerd_command_prints_policy_objects() {
        let out = render_args(&[
            "linkerd",
            "--agent-id",
            "spiffe://cluster.local/ns/edge/sa/agent-1",
        ])
        .unwrap();
        assert!(
            out.contains("agent-1.edge.serviceaccount.identity.linkerd.cluster.local"),
            "{out}"
        );
        assert!(out.contains("MeshTLSAuthentication"), "{out}");
    }
}
