//! `argocd-agentctl tenant`: the tenants of a hub, from a mapping rules file (offline,
//! `--rules`) or from a running principal's admin API (with their agents and quota use).
//! A tenant's operator sees its own tenant only.

use argocd_agent_identity::text::quoted;
use std::path::PathBuf;

use argocd_agent_domain::mapping::RuleSet;
use argocd_agent_domain::tenant::{Claim, Quotas, Tenant};
use argocd_agent_domain::{Namespace, TenantName};
use argocd_agent_identity::SpiffeId;
use argocd_agent_proto::admin::{ListTenantsRequest, QuotaUse, TenantInfo};
use serde::Serialize;

use crate::ctl::agent::{AdminArgs, Output};

/// Subcommands of `argocd-agentctl tenant`.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Every tenant: agents' and operators' SPIFFE ID patterns, namespaces, quotas, and
    /// (from a principal) agents connected and quota use.
    List(ListArgs),
    /// One tenant in detail. Exits non-zero if it is not declared (or not the caller's).
    Inspect(InspectArgs),
}

/// Arguments of `tenant list`.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Read the tenants from this mapping rules file instead of asking a principal.
    #[arg(long)]
    rules: Option<PathBuf>,
    #[command(flatten)]
    admin: AdminArgs,
}

/// Arguments of `tenant inspect`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The tenant's name.
    name: String,
    /// Read the tenants from this mapping rules file instead of asking a principal.
    #[arg(long)]
    rules: Option<PathBuf>,
    #[command(flatten)]
    admin: AdminArgs,
}

/// Why a tenant check or listing failed.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// The rules file could not be read or is invalid.
    #[error(transparent)]
    Rules(#[from] argocd_agent_domain::mapping::RuleError),
    /// No such tenant.
    #[error("tenant {name} is not declared in {source_name} (declared: {declared})", name = quoted(.name))]
    Unknown {
        /// The name asked for.
        name: String,
        /// Where the tenants were read.
        source_name: String,
        /// The declared tenants' names.
        declared: String,
    },
    /// The agent's SPIFFE ID is not one of the tenant's agents.
    #[error(
        "agent SPIFFE ID {id} is not one of tenant {tenant}'s agents (its agents patterns: {patterns}); choose --spiffe-id/--path-template to match, or add a pattern to the tenant", tenant = quoted(.tenant)
    )]
    NotTenantAgent {
        /// The tenant.
        tenant: String,
        /// The agent's ID.
        id: String,
        /// The tenant's agent patterns.
        patterns: String,
    },
    /// The agent's hub namespace is not one of the tenant's namespaces.
    #[error(
        "hub namespace {namespace} is not one of tenant {tenant}'s namespaces ({patterns}); choose --hub-namespace to match", namespace = quoted(.namespace), tenant = quoted(.tenant)
    )]
    NotTenantNamespace {
        /// The tenant.
        tenant: String,
        /// The agent's hub namespace.
        namespace: String,
        /// The tenant's namespace patterns.
        patterns: String,
    },
}

fn joined(p: &[argocd_agent_domain::tenant::Pattern]) -> String {
    p.iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks that `tenant`, declared in the rules `text` (read from `source_name`), takes an
/// agent with SPIFFE ID `id` in hub namespace `namespace`: what `agent create --tenant`
/// verifies before printing or applying anything.
pub fn check_membership(
    text: &str,
    source_name: &str,
    tenant: &str,
    id: &SpiffeId,
    namespace: &Namespace,
) -> Result<(), TenantError> {
    let rules = RuleSet::from_yaml(text)?;
    let found = TenantName::new(tenant)
        .ok()
        .and_then(|n| rules.tenants().get(&n).cloned());
    let Some(t) = found else {
        let declared: Vec<String> = rules.tenants().iter().map(|t| t.name.to_string()).collect();
        return Err(TenantError::Unknown {
            name: tenant.into(),
            source_name: source_name.into(),
            declared: if declared.is_empty() {
                "none".into()
            } else {
                declared.join(", ")
            },
        });
    };
    if !t.has_agent(id) {
        return Err(TenantError::NotTenantAgent {
            tenant: tenant.into(),
            id: id.to_string(),
            patterns: joined(t.agent_patterns()),
        });
    }
    if !t.owns_namespace(namespace) {
        return Err(TenantError::NotTenantNamespace {
            tenant: tenant.into(),
            namespace: namespace.to_string(),
            patterns: joined(t.patterns(Claim::Namespace)),
        });
    }
    Ok(())
}

/// One quota as printed: its limit (absent: none) and, from a principal, its use.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct QuotaView {
    name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    used: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    refused: Option<u64>,
}

/// One tenant as printed (JSON / YAML field names are stable).
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct TenantView {
    name: String,
    agent_patterns: Vec<String>,
    namespaces: Vec<String>,
    admin_patterns: Vec<String>,
    quotas: Vec<QuotaView>,
    /// From a principal: the tenant's agents it has seen.
    #[serde(skip_serializing_if = "Option::is_none")]
    agents: Option<Vec<String>>,
    /// From a principal: those connected to it.
    #[serde(skip_serializing_if = "Option::is_none")]
    connected: Option<Vec<String>>,
    /// From a principal: agents connected across every replica.
    #[serde(skip_serializing_if = "Option::is_none")]
    agents_connected: Option<u32>,
}

fn declared(q: &Quotas) -> Vec<QuotaView> {
    let view = |name: &str, limit: Option<f64>| QuotaView {
        name: name.into(),
        limit,
        used: None,
        refused: None,
    };
    vec![
        view("agents", q.agents.map(f64::from)),
        view("applications", q.applications.map(f64::from)),
        view(
            "applicationsPerAgent",
            q.applications_per_agent.map(f64::from),
        ),
        view("eventsPerSecond", q.events_per_second),
        view("eventsBurst", q.events_burst.map(f64::from)),
        view(
            "proxyRequestsInFlight",
            q.proxy_requests_in_flight.map(f64::from),
        ),
    ]
}

impl From<&Tenant> for TenantView {
    fn from(t: &Tenant) -> Self {
        let show = |p: &[argocd_agent_domain::tenant::Pattern]| {
            p.iter().map(|p| p.to_string()).collect::<Vec<_>>()
        };
        TenantView {
            name: t.name.to_string(),
            agent_patterns: show(t.agent_patterns()),
            namespaces: show(t.patterns(Claim::Namespace)),
            admin_patterns: show(t.admin_patterns()),
            quotas: declared(&t.quotas),
            agents: None,
            connected: None,
            agents_connected: None,
        }
    }
}

fn used(q: &QuotaUse) -> QuotaView {
    QuotaView {
        name: q.name.clone(),
        limit: (q.limit > 0.0).then_some(q.limit),
        used: (q.used >= 0.0).then_some(q.used),
        refused: Some(q.refused),
    }
}

impl From<TenantInfo> for TenantView {
    fn from(t: TenantInfo) -> Self {
        TenantView {
            name: t.name,
            agent_patterns: t.agent_patterns,
            namespaces: t.namespaces,
            admin_patterns: t.admin_patterns,
            quotas: t.quotas.iter().map(used).collect(),
            agents: Some(t.agents),
            connected: Some(t.connected),
            agents_connected: Some(t.agents_connected),
        }
    }
}

fn quota_cell(q: &QuotaView) -> Option<String> {
    let limit = q.limit.map(|l| l.to_string());
    match (&limit, q.used) {
        (None, None) => None,
        (Some(l), Some(u)) => Some(format!("{}={u}/{l}", q.name)),
        (Some(l), None) => Some(format!("{}={l}", q.name)),
        (None, Some(u)) => Some(format!("{}={u}/-", q.name)),
    }
}

/// The tenants as a table.
pub(crate) fn table(tenants: &[TenantView]) -> String {
    let mut out = String::from("NAME\tCONNECTED\tNAMESPACES\tQUOTAS\n");
    for t in tenants {
        let quotas: Vec<String> = t.quotas.iter().filter_map(quota_cell).collect();
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            t.name,
            t.agents_connected.map_or("-".into(), |n| n.to_string()),
            t.namespaces.join(","),
            if quotas.is_empty() {
                "-".into()
            } else {
                quotas.join(" ")
            },
        ));
    }
    out
}

/// One tenant in detail.
pub(crate) fn details(t: &TenantView) -> String {
    let list = |v: &[String]| {
        if v.is_empty() {
            "-".to_string()
        } else {
            v.join(", ")
        }
    };
    let mut out = format!(
        "Name:        {}\nAgents (IDs): {}\nNamespaces:  {}\nAdmins (IDs): {}\n",
        t.name,
        list(&t.agent_patterns),
        list(&t.namespaces),
        list(&t.admin_patterns)
    );
    if let Some(n) = t.agents_connected {
        out.push_str(&format!("Connected:   {n} (all replicas)\n"));
    }
    if let Some(a) = &t.agents {
        out.push_str(&format!("Agents seen: {}\n", list(a)));
    }
    out.push_str("Quotas:\n");
    for q in &t.quotas {
        let limit = q.limit.map_or("none".into(), |l| l.to_string());
        let used = q.used.map_or(String::new(), |u| format!(", used {u}"));
        let refused = q
            .refused
            .map_or(String::new(), |r| format!(", refused {r}"));
        out.push_str(&format!("  {}: {limit}{used}{refused}\n", q.name));
    }
    out
}

/// The tenants from a rules file, or from the principal.
async fn tenants(
    rules: Option<&PathBuf>,
    admin: &AdminArgs,
) -> Result<Vec<TenantView>, crate::BoxError> {
    if let Some(path) = rules {
        let set = RuleSet::from_file(path)?;
        return Ok(set.tenants().iter().map(TenantView::from).collect());
    }
    let mut client = crate::ctl::agent::connect(&admin.conn).await?;
    let list = client
        .list_tenants(ListTenantsRequest {})
        .await
        .map_err(|s| crate::ctl::agent::status("listing tenants", s))?
        .into_inner()
        .tenants;
    Ok(list.into_iter().map(TenantView::from).collect())
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

/// Runs a `tenant` subcommand.
pub async fn run(command: Command) -> crate::CmdResult {
    match command {
        Command::List(a) => {
            let list = tenants(a.rules.as_ref(), &a.admin).await?;
            render(&list, a.admin.output, || table(&list))
        }
        Command::Inspect(a) => {
            let list = tenants(a.rules.as_ref(), &a.admin).await?;
            let Some(t) = list.iter().find(|t| t.name == a.name) else {
                let names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
                return Err(format!(
                    "tenant {} is not declared{} (tenants in scope: {})",
                    quoted(&a.name),
                    a.rules
                        .as_ref()
                        .map_or(String::new(), |p| format!(" in {}", p.display())),
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(", ")
                    }
                )
                .into());
            };
            render(t, a.admin.output, || details(t))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = r#"
rules:
  - name: spire
    template: "spiffe://example.org/ns/{ns}/sa/{sa}"
    agent: "{sa}"
    namespace: "{ns}-{sa}"
tenants:
  - name: team-a
    agents: ["spiffe://example.org/ns/team-a/sa/{sa}"]
    namespaces: ["team-a-*"]
    admins: ["spiffe://example.org/ops/alice"]
    quotas:
      agents: 2
      proxyRequestsInFlight: 4
"#;

    fn id(s: &str) -> SpiffeId {
        SpiffeId::parse(s).unwrap()
    }

    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    #[test]
    fn membership_needs_the_tenant_its_agent_id_and_its_namespace() {
        let ok = check_membership(
            RULES,
            "rules.yaml",
            "team-a",
            &id("spiffe://example.org/ns/team-a/sa/edge-1"),
            &ns("team-a-edge-1"),
        );
        assert!(ok.is_ok(), "{ok:?}");
        let unknown = check_membership(
            RULES,
            "rules.yaml",
            "team-z",
            &id("spiffe://example.org/ns/team-a/sa/edge-1"),
            &ns("team-a-edge-1"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            unknown.contains("\"team-z\" is not declared in rules.yaml (declared: team-a)"),
            "{unknown}"
        );
        let id_err = check_membership(
            RULES,
            "rules.yaml",
            "team-a",
            &id("spiffe://example.org/ns/team-b/sa/edge-1"),
            &ns("team-a-edge-1"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            id_err.contains("is not one of tenant \"team-a\"'s agents"),
            "{id_err}"
        );
        let ns_err = check_membership(
            RULES,
            "rules.yaml",
            "team-a",
            &id("spiffe://example.org/ns/team-a/sa/edge-1"),
            &ns("edge-1"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            ns_err.contains(
                "hub namespace \"edge-1\" is not one of tenant \"team-a\"'s namespaces (team-a-*)"
            ),
            "{ns_err}"
        );
    }

    #[test]
    fn offline_views_show_patterns_and_declared_quotas() {
        let set = RuleSet::from_yaml(RULES).unwrap();
        let views: Vec<TenantView> = set.tenants().iter().map(TenantView::from).collect();
        let t = table(&views);
        assert!(
            t.starts_with("NAME\tCONNECTED\tNAMESPACES\tQUOTAS\n"),
            "{t}"
        );
        assert!(
            t.contains("team-a\t-\tteam-a-*\tagents=2 proxyRequestsInFlight=4"),
            "{t}"
        );
        let d = details(&views[0]);
        assert!(
            d.contains("Admins (IDs): spiffe://example.org/ops/alice"),
            "{d}"
        );
        assert!(d.contains("  eventsPerSecond: none"), "{d}");
    }
}
