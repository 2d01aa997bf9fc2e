//! `argocd-agentctl agent`: agents as a running principal sees them, through its admin API:
//! either the principal's local admin listener (`--admin-address` of the principal: loopback
//! TCP or a Unix socket, plaintext), or its agent listener over SVID mTLS, where the caller's
//! SPIFFE ID must match a mapping rule with `role: admin`.

use argocd_agent_identity::text::quoted;
use std::time::Duration;

use super::error::{AdminRefusal, ConnectError, KubeconfigError};

use argocd_agent_proto::admin::admin_client::AdminClient;
use argocd_agent_proto::admin::{
    AgentInfo, DisconnectAgentRequest, InspectAgentRequest, ListAgentsRequest,
};
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

/// Subcommands of `argocd-agentctl agent`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Every agent the principal has seen since it started, connected or not.
    List(ListArgs),
    /// One agent in detail. Exits non-zero if the principal does not know it.
    Inspect(NameArgs),
    /// Closes the agent's current session; the agent reconnects on its own (and resyncs).
    Disconnect(NameArgs),
    /// Writes a kubeconfig from the agent's Argo CD cluster secret on the hub, so kubectl
    /// reaches the agent's cluster through the principal's resource proxy exactly as
    /// argocd-server does.
    Kubeconfig(KubeconfigArgs),
    /// Onboards an agent: prints (or with --apply, applies on the hub) its hub namespace and
    /// mapping rule, and renders the spoke's identity object (SPIRE ClusterSPIFFEID or
    /// cert-manager Certificate) and kustomize overlay (--output-dir). Idempotent.
    Create(Box<crate::ctl::onboard::CreateArgs>),
    /// Removes what `create --apply` put on the hub: the mapping rule, the agent's cluster
    /// Secret, and with --delete-namespace its hub namespace. Idempotent.
    Delete(crate::ctl::onboard::DeleteArgs),
}

/// `argocd-agentctl agent kubeconfig`.
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// The agent.
    pub name: String,
    /// The hub holding the agent's cluster secret.
    #[command(flatten)]
    pub hub: crate::ctl::HubArgs,
    /// Write the kubeconfig to this file (mode 0600) instead of standard output. (`-o` is
    /// an output format everywhere else in argocd-agentctl, as in kubectl.)
    #[arg(long = "file", short = 'f', value_name = "FILE")]
    pub file: Option<std::path::PathBuf>,
    /// Ask the principal's admin API for a fresh token bound to the agent (and its tenant)
    /// instead of reading the cluster Secret on the hub: what a tenant's operator uses (with
    /// --principal-address and its SVID), for its tenant's agents only. Implied by
    /// --principal-address.
    #[arg(long)]
    pub from_principal: bool,
    /// Where the principal's admin API is (with --from-principal or --principal-address).
    #[command(flatten)]
    pub admin: AdminConn,
}

/// A kubeconfig document for the agent's cluster at `server` with `token`.
fn kubeconfig_doc(
    agent: &str,
    server: &str,
    token: &str,
    ca_b64: &str,
) -> Result<String, KubeconfigError> {
    let context = format!("agent-{agent}");
    let mut cluster = serde_json::json!({"server": server});
    if !ca_b64.is_empty() {
        cluster["certificate-authority-data"] = ca_b64.into();
    }
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": context, "cluster": cluster}],
        "users": [{"name": context, "user": {"token": token}}],
        "contexts": [{"name": context, "context": {"cluster": context, "user": context}}],
        "current-context": context,
    });
    // JSON is YAML; kubectl reads either.
    serde_json::to_string_pretty(&doc).map_err(KubeconfigError::Render)
}

/// A kubeconfig from the principal's admin API (`AgentKubeconfig`): a fresh token.
async fn kubeconfig_from_principal(a: &KubeconfigArgs) -> Result<String, KubeconfigError> {
    use base64::Engine as _;
    let mut client = connect(&a.admin).await.map_err(KubeconfigError::Connect)?;
    let answer = client
        .agent_kubeconfig(argocd_agent_proto::admin::AgentKubeconfigRequest {
            name: a.name.clone(),
        })
        .await
        .map_err(|s| {
            KubeconfigError::Refused(status(
                &format!("kubeconfig of agent {}", quoted(&a.name)),
                s,
            ))
        })?
        .into_inner();
    let ca = base64::engine::general_purpose::STANDARD.encode(answer.ca_pem.as_bytes());
    let ca = if answer.ca_pem.is_empty() {
        String::new()
    } else {
        ca
    };
    kubeconfig_doc(&a.name, &answer.server, &answer.token, &ca)
}

/// The agent's cluster secret (found by the agent-name label) as a kubeconfig.
pub async fn kubeconfig(a: &KubeconfigArgs) -> Result<String, KubeconfigError> {
    if a.from_principal || a.admin.over_mtls() {
        return kubeconfig_from_principal(a).await;
    }
    use k8s_openapi::api::core::v1::Secret;
    let api: kube::Api<Secret> = kube::Api::namespaced(
        a.hub.client().await.map_err(KubeconfigError::Hub)?,
        &a.hub.namespace,
    );
    let selector = format!(
        "argocd.argoproj.io/secret-type=cluster,argocd-agent.argoproj-labs.io/agent-name={}",
        a.name
    );
    let list = api
        .list(&kube::api::ListParams::default().labels(&selector))
        .await
        .map_err(|cause| KubeconfigError::List {
            namespace: a.hub.namespace.clone(),
            cause,
        })?;
    let secret = match list.items.as_slice() {
        [one] => one,
        [] => {
            return Err(KubeconfigError::NoSecret {
                agent: a.name.clone(),
                namespace: a.hub.namespace.clone(),
            });
        }
        many => {
            return Err(KubeconfigError::ManySecrets {
                count: many.len(),
                agent: a.name.clone(),
            });
        }
    };
    let field = |k: &str| {
        secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| KubeconfigError::NoField(k.to_owned()))
    };
    let server = field("server")?;
    let config: serde_json::Value =
        serde_json::from_str(&field("config")?).map_err(KubeconfigError::ConfigNotJson)?;
    let token = config
        .get("bearerToken")
        .and_then(|t| t.as_str())
        .ok_or(KubeconfigError::NoToken)?;
    let ca = config
        .pointer("/tlsClientConfig/caData")
        .and_then(|t| t.as_str())
        .unwrap_or_default();
    kubeconfig_doc(&a.name, &server, token, ca)
}

/// Where the principal's admin API is, with an output format.
#[derive(Debug, clap::Args)]
pub(crate) struct AdminArgs {
    #[command(flatten)]
    pub(crate) conn: AdminConn,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,
}

/// Where the principal's admin API is.
#[derive(Debug, Default, clap::Args)]
pub struct AdminConn {
    /// The principal's admin API: `host:port` (reach a pod's with `kubectl port-forward`)
    /// or `unix:///path` (with `kubectl exec`).
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_PRINCIPAL_ADMIN_ADDRESS",
        default_value = "127.0.0.1:8001"
    )]
    principal_admin_address: String,
    /// The principal's agent listener (`host:port`), dialled over mTLS with this workload's
    /// X.509-SVID from the Workload API; its SPIFFE ID needs a mapping rule with
    /// `role: admin`. Replaces --principal-admin-address.
    #[arg(
        long,
        env = "ARGOCD_AGENTCTL_PRINCIPAL_ADDRESS",
        conflicts_with = "principal_admin_address"
    )]
    principal_address: Option<String>,
    /// The Workload API socket (`unix:///path`) for --principal-address; defaults to
    /// SPIFFE_ENDPOINT_SOCKET.
    #[arg(long, requires = "principal_address")]
    spiffe_endpoint_socket: Option<String>,
    /// The principal's SPIFFE ID (pins the server for --principal-address).
    #[arg(long, requires = "principal_address")]
    principal_spiffe_id: Option<String>,
    /// Accept any principal SVID from this trust domain instead of pinning one SPIFFE ID.
    #[arg(
        long,
        requires = "principal_address",
        conflicts_with = "principal_spiffe_id"
    )]
    principal_trust_domain: Option<String>,
}

impl AdminConn {
    /// Whether the agent listener (mTLS with this workload's SVID) was chosen.
    pub(crate) fn over_mtls(&self) -> bool {
        self.principal_address.is_some()
    }
}

/// Output formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Output {
    Table,
    Json,
    Yaml,
}

/// Arguments of `agent list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    admin: AdminArgs,
}

/// Arguments of `agent inspect` and `agent disconnect`.
#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// The agent's name.
    name: String,
    #[command(flatten)]
    admin: AdminArgs,
}

/// One agent, as printed (JSON / YAML field names are stable).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Agent {
    pub name: String,
    pub mode: String,
    /// The client identity the agent authenticated with (its SPIFFE ID).
    pub client: String,
    /// The mapping rule that mapped it.
    pub rule: String,
    pub namespace: String,
    pub connected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected_since: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_event: Option<String>,
    pub queue_depth: u64,
    pub in_flight: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub svid_expiry: Option<String>,
    /// The agent's tenant (absent: no tenant).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

fn time(ms: i64) -> Option<String> {
    (ms > 0)
        .then(|| jiff::Timestamp::from_millisecond(ms).ok())
        .flatten()
        .map(|t| t.round(jiff::Unit::Second).unwrap_or(t).to_string())
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

impl From<AgentInfo> for Agent {
    fn from(a: AgentInfo) -> Self {
        Agent {
            name: a.name,
            mode: a.mode,
            client: a.client,
            rule: a.rule,
            namespace: a.namespace,
            connected: a.connected,
            connected_since: time(a.connected_since_unix_ms),
            remote_address: non_empty(a.remote_address),
            agent_version: non_empty(a.agent_version),
            last_event: time(a.last_event_unix_ms),
            queue_depth: a.queue_depth,
            in_flight: a.in_flight,
            svid_expiry: time(a.svid_expiry_unix_ms),
            tenant: non_empty(a.tenant),
        }
    }
}

/// The agents as a table: a header, then one row per agent, columns aligned.
pub(crate) fn table(agents: &[Agent]) -> String {
    let header = [
        "NAME",
        "TENANT",
        "MODE",
        "CONNECTED",
        "SINCE",
        "VERSION",
        "QUEUE",
        "NAMESPACE",
        "RULE",
        "CLIENT",
    ];
    let dash = || "-".to_string();
    let rows: Vec<Vec<String>> = agents
        .iter()
        .map(|a| {
            vec![
                a.name.clone(),
                a.tenant.clone().unwrap_or_else(dash),
                a.mode.clone(),
                a.connected.to_string(),
                a.connected_since.clone().unwrap_or_else(dash),
                a.agent_version.clone().unwrap_or_else(dash),
                format!("{}/{}", a.queue_depth, a.in_flight),
                a.namespace.clone(),
                a.rule.clone(),
                a.client.clone(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: Vec<String>| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}   "));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    for row in rows {
        out.push_str(&line(row));
    }
    out
}

/// One agent in detail, `key: value` lines.
pub(crate) fn details(a: &Agent) -> String {
    let dash = || "-".to_string();
    let fields = [
        ("Name", a.name.clone()),
        ("Tenant", a.tenant.clone().unwrap_or_else(dash)),
        ("Mode", a.mode.clone()),
        ("Client (SPIFFE ID)", a.client.clone()),
        ("Mapping rule", a.rule.clone()),
        ("Hub namespace", a.namespace.clone()),
        ("Connected", a.connected.to_string()),
        (
            "Connected since",
            a.connected_since.clone().unwrap_or_else(dash),
        ),
        (
            "Remote address",
            a.remote_address.clone().unwrap_or_else(dash),
        ),
        (
            "Agent version",
            a.agent_version.clone().unwrap_or_else(dash),
        ),
        ("Last event", a.last_event.clone().unwrap_or_else(dash)),
        ("Queue depth", a.queue_depth.to_string()),
        ("In flight", a.in_flight.to_string()),
        ("SVID expiry", a.svid_expiry.clone().unwrap_or_else(dash)),
    ];
    let w = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    fields
        .iter()
        .map(|(k, v)| format!("{:<w$} {v}\n", format!("{k}:")))
        .collect()
}

fn render<T: Serialize>(
    value: &T,
    output: Output,
    table: impl FnOnce() -> String,
) -> crate::CmdResult {
    let text = match output {
        Output::Table => table(),
        Output::Json => serde_json::to_string_pretty(value)? + "\n",
        Output::Yaml => serde_saphyr::to_string(value)?,
    };
    print!("{text}");
    Ok(())
}

/// A client of the admin API; keeps the SVID source of an mTLS connection alive.
pub(crate) struct Client {
    api: AdminClient<Channel>,
    _svid: Option<argocd_agent_identity::source::SvidSource>,
}

impl std::ops::Deref for Client {
    type Target = AdminClient<Channel>;
    fn deref(&self) -> &Self::Target {
        &self.api
    }
}

impl std::ops::DerefMut for Client {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.api
    }
}

/// Connects where `args` say: the agent listener over mTLS, or the local admin listener.
pub(crate) async fn connect(args: &AdminConn) -> Result<Client, ConnectError> {
    match &args.principal_address {
        Some(address) => connect_mtls(address, args).await,
        None => Ok(Client {
            api: connect_local(&args.principal_admin_address).await?,
            _svid: None,
        }),
    }
}

/// Dials the principal's agent listener with this workload's SVID.
async fn connect_mtls(address: &str, args: &AdminConn) -> Result<Client, ConnectError> {
    use argocd_agent_identity::tls::PeerPolicy;
    let policy = match (&args.principal_spiffe_id, &args.principal_trust_domain) {
        (Some(id), _) => PeerPolicy::Exact(
            argocd_agent_identity::SpiffeId::parse(id).map_err(ConnectError::SpiffeId)?,
        ),
        (None, Some(td)) => PeerPolicy::TrustDomains(vec![
            argocd_agent_identity::TrustDomain::new(td).map_err(ConnectError::TrustDomain)?,
        ]),
        (None, None) => {
            return Err(ConnectError::Unpinned);
        }
    };
    let source = argocd_agent_identity::source::SvidConfig::WorkloadApi {
        endpoint: args.spiffe_endpoint_socket.clone(),
    }
    .load(Duration::from_secs(10))
    .await
    .map_err(ConnectError::NoSvid)?;
    let config =
        argocd_agent_identity::tls::client_config(&source, policy).map_err(ConnectError::Tls)?;
    let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
    let channel = argocd_agent_identity::transport::connect(
        address,
        config,
        host,
        argocd_agent_identity::transport::ChannelOptions::default(),
    )
    .await
    .map_err(|e| ConnectError::Unreachable {
        address: address.to_owned(),
        chain: argocd_agent_domain::error_chain(&e),
    })?;
    Ok(Client {
        api: AdminClient::new(channel),
        _svid: Some(source),
    })
}

/// Connects to the local admin API at `address` (`host:port` or `unix:///path`).
async fn connect_local(address: &str) -> Result<AdminClient<Channel>, ConnectError> {
    let unreachable = |e: &dyn std::error::Error| ConnectError::AdminUnreachable {
        address: address.to_owned(),
        chain: argocd_agent_domain::error_chain(e),
    };
    let channel = if let Some(path) = address.strip_prefix("unix://") {
        let path = std::path::PathBuf::from(path);
        Endpoint::from_static("http://admin.local")
            .connect_timeout(Duration::from_secs(5))
            .connect_with_connector(tower::service_fn(move |_: http_uri::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| unreachable(&e))?
    } else {
        if address.contains("://") {
            return Err(ConnectError::AdminScheme(address.to_owned()));
        }
        Endpoint::from_shared(format!("http://{address}"))
            .map_err(|cause| ConnectError::AdminAddress {
                address: address.to_owned(),
                cause,
            })?
            .connect_timeout(Duration::from_secs(5))
            .connect()
            .await
            .map_err(|e| unreachable(&e))?
    };
    Ok(AdminClient::new(channel))
}

/// Writes a file only its owner can read (it holds a credential).
fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    opts.open(path)?.write_all(text.as_bytes())
}

/// The admin API's refusal as one line.
pub(crate) fn status(what: &str, s: tonic::Status) -> AdminRefusal {
    AdminRefusal {
        what: what.to_owned(),
        status: s,
    }
}

/// A gRPC status code as the Go and Rust clients name it (`PermissionDenied`), which is
/// what the docs show.
pub(super) fn code_name(code: tonic::Code) -> String {
    argocd_agent_identity::text::status_code(code)
        .split('_')
        .map(|w| {
            let mut c = w.chars();
            c.next().map_or_else(String::new, |f| {
                f.to_string() + &c.as_str().to_ascii_lowercase()
            })
        })
        .collect()
}

mod http_uri {
    pub use tonic::codegen::http::Uri;
}

/// Runs an `agent` subcommand.
pub async fn run(command: Command) -> crate::CmdResult {
    match command {
        Command::Create(a) => crate::ctl::onboard::run_create(*a).await,
        Command::Delete(a) => crate::ctl::onboard::run_delete(a).await,
        Command::Kubeconfig(a) => {
            let text = kubeconfig(&a).await?;
            match &a.file {
                None => println!("{text}"),
                Some(path) => {
                    write_private(path, &text)
                        .map_err(|e| format!("writing {}: {e}", path.display()))?;
                    eprintln!("wrote {} (context agent-{})", path.display(), a.name);
                }
            }
            Ok(())
        }
        Command::List(a) => {
            let mut client = connect(&a.admin.conn).await?;
            let agents: Vec<Agent> = client
                .list_agents(ListAgentsRequest {})
                .await
                .map_err(|s| status("listing agents", s))?
                .into_inner()
                .agents
                .into_iter()
                .map(Agent::from)
                .collect();
            render(&agents, a.admin.output, || table(&agents))
        }
        Command::Inspect(a) => {
            let mut client = connect(&a.admin.conn).await?;
            let agent: Agent = client
                .inspect_agent(InspectAgentRequest {
                    name: a.name.clone(),
                })
                .await
                .map_err(|s| status(&format!("inspecting agent {}", quoted(&a.name)), s))?
                .into_inner()
                .into();
            render(&agent, a.admin.output, || details(&agent))
        }
        Command::Disconnect(a) => {
            let mut client = connect(&a.admin.conn).await?;
            let was_connected = client
                .disconnect_agent(DisconnectAgentRequest {
                    name: a.name.clone(),
                })
                .await
                .map_err(|s| status(&format!("disconnecting agent {}", quoted(&a.name)), s))?
                .into_inner()
                .was_connected;
            #[derive(Serialize)]
            #[serde(rename_all = "camelCase")]
            struct Disconnected<'a> {
                name: &'a str,
                was_connected: bool,
            }
            let out = Disconnected {
                name: &a.name,
                was_connected,
            };
            render(&out, a.admin.output, || {
                if was_connected {
                    format!(
                        "{}: session closed (the agent reconnects on its own)\n",
                        a.name
                    )
                } else {
                    format!("{}: was not connected; nothing to close\n", a.name)
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(name: &str, connected: bool) -> Agent {
        Agent::from(AgentInfo {
            name: name.into(),
            mode: "managed".into(),
            client: format!("spiffe://example.org/ns/agents/sa/{name}"),
            rule: "rule-0".into(),
            namespace: name.into(),
            connected,
            connected_since_unix_ms: if connected { 1_700_000_000_123 } else { 0 },
            agent_version: "0.1.0".into(),
            queue_depth: 2,
            in_flight: 1,
            ..Default::default()
        })
    }

    #[test]
    fn times_are_rfc3339_and_unknowns_are_left_out() {
        let a = agent("edge-1", true);
        assert_eq!(a.connected_since.as_deref(), Some("2023-11-14T22:13:20Z"));
        let json = serde_json::to_value(agent("edge-2", false)).unwrap();
        assert!(json.get("connectedSince").is_none(), "{json}");
        assert!(json.get("remoteAddress").is_none(), "{json}");
        assert_eq!(json["queueDepth"], 2);
    }

    #[test]
    fn table_has_a_header_and_aligned_rows() {
        let t = table(&[agent("edge-1", true), agent("a-much-longer-name", false)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("NAME "), "{t}");
        let col = lines[0].find("MODE").unwrap();
        assert_eq!(lines[1].find("managed"), Some(col), "{t}");
        assert_eq!(lines[2].find("managed"), Some(col), "{t}");
        assert!(lines[2].contains("false"), "{t}");
        assert!(lines[1].contains("2/1"), "{t}");
    }

    #[test]
    fn details_name_every_field() {
        let d = details(&agent("edge-1", false));
        assert!(d.contains("Client (SPIFFE ID):"), "{d}");
        assert!(d.contains("Connected since:"), "{d}");
        assert!(d.contains("Mapping rule:"), "{d}");
    }
}
