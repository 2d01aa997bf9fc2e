//! `argocd-agentctl agent create|delete`: what one agent needs, rendered or applied.
//!
//! An agent here is a SPIFFE ID that the principal's mapping rules map to an agent name and
//! a hub namespace (docs/identity.md). Creating one means: the hub namespace (labelled with
//! the agent's name), an `exact` mapping rule named `agent-<name>` in the rules ConfigMap the
//! principal mounts, and on the spoke an identity for the agent's workload (a SPIRE
//! `ClusterSPIFFEID`, a cert-manager `Certificate` with the SPIFFE URI SAN, or nothing for a
//! mesh, whose identity is the service account's) plus a kustomize overlay of `deploy/`.
//! Upstream's `agent create` instead issues a client certificate from the principal's CA and
//! stores it in a cluster Secret; here the principal writes the cluster Secret itself when the
//! agent first connects (`--enable-self-cluster-registration`), and `delete` removes it.

use argocd_agent_identity::text::quoted;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use argocd_agent_domain::mapping::{DenyReason, RuleSet};
use argocd_agent_domain::{AgentName, Namespace};
use argocd_agent_identity::SpiffeId;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace as KubeNamespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The label that records which agent a hub namespace (and a cluster Secret) belongs to.
pub const AGENT_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";
/// The principal's rules ConfigMap in `deploy/principal` and its key.
pub const RULES_CONFIGMAP: &str = "argocd-agent-identity-rules";
/// The key of the rules file in [`RULES_CONFIGMAP`].
pub const RULES_KEY: &str = "rules.yaml";
/// Field manager of the writes `agent create` makes.
const MANAGER: &str = "argocd-agentctl";

/// Where the agent's workload gets its SPIFFE identity on the spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum IdentitySource {
    /// SPIRE with the SPIRE Controller Manager: a `ClusterSPIFFEID`; the agent reads its SVID
    /// from the Workload API (overlay `deploy/overlays/spire/agent`).
    Spire,
    /// cert-manager: a `Certificate` whose only SAN is the SPIFFE ID, written to the Secret
    /// `argocd-agent-svid` as PEM files (overlay `deploy/overlays/pem-files/agent`).
    CertManager,
    /// Istio: the mesh's identity of the agent's service account, `argocd-agent-agent-<name>`
    /// (overlay `deploy/overlays/istio/agent`).
    Mesh,
}

impl IdentitySource {
    fn overlay(self) -> &'static str {
        match self {
            IdentitySource::Spire => "spire",
            IdentitySource::CertManager => "pem-files",
            IdentitySource::Mesh => "istio",
        }
    }
}

/// The modes the mapping rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuleMode {
    /// The hub owns the Applications' specs.
    Managed,
    /// The spoke owns them.
    Autonomous,
    /// The agent chooses with `--agent-mode`.
    Both,
}

impl RuleMode {
    fn as_str(self) -> &'static str {
        match self {
            RuleMode::Managed => "managed",
            RuleMode::Autonomous => "autonomous",
            RuleMode::Both => "both",
        }
    }
}

/// Arguments of `agent create`.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// The agent's name (a DNS-1123 label).
    pub name: String,
    /// Where the agent's workload gets its identity.
    #[arg(long, value_enum, default_value_t = IdentitySource::Spire)]
    pub identity: IdentitySource,
    /// The agent's SPIFFE ID (default: from --trust-domain and --path-template).
    #[arg(long)]
    pub spiffe_id: Option<String>,
    /// Trust domain of the agent's ID (default for --identity mesh: cluster.local).
    #[arg(long)]
    pub trust_domain: Option<String>,
    /// Path of the agent's ID; `{agent}` is the name, `{namespace}` the spoke namespace.
    /// Default `/agent/{agent}` (`deploy/`'s convention), for a mesh
    /// `/ns/{namespace}/sa/argocd-agent-agent-{agent}`.
    #[arg(long)]
    pub path_template: Option<String>,
    /// The agent's hub namespace (default: the agent's name).
    #[arg(long)]
    pub hub_namespace: Option<String>,
    /// The modes the agent's rule allows.
    #[arg(long, value_enum, default_value_t = RuleMode::Managed)]
    pub mode: RuleMode,
    /// Argo CD's namespace on the spoke (where the agent runs).
    #[arg(long, default_value = "argocd")]
    pub spoke_namespace: String,
    /// The principal's address as the agent dials it (written to the overlay).
    #[arg(long)]
    pub principal_address: Option<String>,
    /// The principal's port (default 8443; needs --principal-address).
    #[arg(long)]
    pub principal_port: Option<u16>,
    /// The principal's SPIFFE ID, which the agent pins (default:
    /// `spiffe://<trust domain>/ns/argocd/sa/argocd-agent-principal`).
    #[arg(long)]
    pub principal_spiffe_id: Option<String>,
    /// cert-manager issuer of the agent's Certificate.
    #[arg(long, default_value = "spiffe-ca")]
    pub issuer: String,
    /// Kind of --issuer (`ClusterIssuer` or `Issuer`).
    #[arg(long, default_value = "ClusterIssuer")]
    pub issuer_kind: String,
    /// This project's `deploy/` directory (a path, or a kustomize remote URL such as
    /// `https://github.com/<org>/<repo>//deploy?ref=v0.1.0`) that the overlay builds on.
    #[arg(long, default_value = "deploy")]
    pub deploy_dir: String,
    /// Write the spoke overlay (kustomization.yaml and the identity object) into this
    /// directory.
    #[arg(long)]
    pub output_dir: Option<PathBuf>,
    /// Apply the hub's part (namespace, mapping rule) instead of printing it.
    #[arg(long)]
    pub apply: bool,
    /// The rules ConfigMap of the principal (in --namespace).
    #[arg(long, default_value = RULES_CONFIGMAP)]
    pub rules_configmap: String,
    /// The tenant the agent belongs to: refused unless the tenant is declared in the rules
    /// (--rules, or with --apply the rules ConfigMap), its `agents` patterns match the
    /// agent's SPIFFE ID and its `namespaces` the agent's hub namespace. Nothing is printed,
    /// written or applied when the check fails.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The mapping rules file (with its `tenants:` section) to check --tenant against;
    /// without it, --apply reads the rules ConfigMap.
    #[arg(long, requires = "tenant")]
    pub rules: Option<PathBuf>,
    /// The hub.
    #[command(flatten)]
    pub hub: crate::ctl::HubArgs,
}

/// Arguments of `agent delete`.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// The agent's name.
    pub name: String,
    /// Also delete the agent's hub namespace, with every Application in it.
    #[arg(long)]
    pub delete_namespace: bool,
    /// The agent's hub namespace (default: the one its rule names, else the agent's name).
    #[arg(long)]
    pub hub_namespace: Option<String>,
    /// The rules ConfigMap of the principal (in --namespace).
    #[arg(long, default_value = RULES_CONFIGMAP)]
    pub rules_configmap: String,
    /// The hub.
    #[command(flatten)]
    pub hub: crate::ctl::HubArgs,
}

/// Everything `agent create` renders, from its validated inputs.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The agent.
    pub agent: AgentName,
    /// Its hub namespace.
    pub hub_namespace: Namespace,
    /// Its SPIFFE ID.
    pub spiffe_id: SpiffeId,
    /// The principal's SPIFFE ID, which the agent pins.
    pub principal_spiffe_id: SpiffeId,
    /// The modes of its rule.
    pub mode: RuleMode,
    /// Its identity source.
    pub identity: IdentitySource,
    /// Argo CD's namespace on the spoke.
    pub spoke_namespace: Namespace,
    /// The principal's address and port, when given.
    pub principal: Option<(String, u16)>,
    /// cert-manager issuer name and kind.
    pub issuer: (String, String),
    /// The `deploy/` directory or URL.
    pub deploy_dir: String,
}

/// Refuses flags `agent create` would ignore: the principal's address, port and ID with
/// `--identity mesh` (the mesh overlay dials the principal's Service through the sidecar and
/// pins no SVID), and a port without an address.
fn refuse_ignored_flags(a: &CreateArgs) -> Result<(), PlanError> {
    if a.identity == IdentitySource::Mesh {
        let ignored: Vec<&str> = [
            ("--principal-address", a.principal_address.is_some()),
            ("--principal-port", a.principal_port.is_some()),
            ("--principal-spiffe-id", a.principal_spiffe_id.is_some()),
        ]
        .into_iter()
        .filter_map(|(flag, given)| given.then_some(flag))
        .collect();
        if !ignored.is_empty() {
            return Err(PlanError::MeshIgnores(ignored.join(", ")));
        }
    }
    if a.principal_port.is_some() && a.principal_address.is_none() {
        return Err(PlanError::PortWithoutAddress);
    }
    Ok(())
}

/// A local `--deploy-dir` must hold the overlay the spoke overlay builds on (a remote URL is
/// kustomize's to fetch).
fn check_deploy_dir(plan: &Plan) -> Result<(), PlanError> {
    if plan.deploy_dir.contains("://") {
        return Ok(());
    }
    let overlay = Path::new(&plan.deploy_dir)
        .join("overlays")
        .join(plan.identity.overlay())
        .join("agent");
    if overlay.join("kustomization.yaml").is_file() {
        return Ok(());
    }
    Err(PlanError::DeployDir {
        dir: plan.deploy_dir.clone(),
        wanted: Path::new("overlays")
            .join(plan.identity.overlay())
            .join("agent/kustomization.yaml"),
    })
}

/// Why `agent create`'s flags make no plan. Messages carry their cause (no `source`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The agent name is invalid.
    #[error("agent name: {0}")]
    AgentName(argocd_agent_identity::id::IdError),
    /// A flag's value is invalid.
    #[error("{0}: {1}")]
    Flag(&'static str, argocd_agent_identity::id::IdError),
    /// The principal's default ID is invalid.
    #[error("{0}")]
    PrincipalId(argocd_agent_identity::id::IdError),
    /// Neither `--spiffe-id` nor `--trust-domain`.
    #[error("give the agent's SPIFFE ID with --spiffe-id, or its trust domain with --trust-domain")]
    NoId,
    /// `--identity mesh` with an ID that is not the agent's service account.
    #[error("--identity mesh: the mesh names the agent by its service account, so its ID must end in {} (the overlay renames the service account with nameSuffix -{agent}); got {id}", quoted(.sa))]
    MeshId {
        /// The path suffix it must end in.
        sa: String,
        /// The agent.
        agent: String,
        /// The ID given.
        id: String,
    },
    /// `--identity mesh` with flags it does not use.
    #[error(
        "--identity mesh: {0} not used: the mesh overlay dials the principal's Service (deploy/overlays/<mesh>/agent sets agent.server.address) and the sidecar, not the agent, verifies the principal; change the address in that overlay"
    )]
    MeshIgnores(String),
    /// `--principal-port` alone.
    #[error("--principal-port needs --principal-address (the overlay writes both or neither)")]
    PortWithoutAddress,
    /// `--issuer-kind` is neither ClusterIssuer nor Issuer.
    #[error("--issuer-kind {}: use ClusterIssuer or Issuer", quoted(.0))]
    IssuerKind(String),
    /// A local `--deploy-dir` without the overlay.
    #[error("--deploy-dir {dir}: no {} there; give this project's deploy/ directory (a path) or a kustomize remote URL (https://github.com/<org>/<repo>//deploy?ref=<tag>)", .wanted.display())]
    DeployDir {
        /// The directory given.
        dir: String,
        /// The overlay's kustomization it lacks, relative to it.
        wanted: PathBuf,
    },
}

/// Why the spoke overlay cannot be written. Messages carry their cause (no `source`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OverlayError {
    /// The directory cannot be created.
    #[error("creating {}: {cause}", dir.display())]
    Create {
        /// The directory.
        dir: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// A file cannot be written.
    #[error("writing {}: {cause}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
}

/// Why the agent's mapping rule cannot be put in or taken out. Messages carry their cause
/// (no `source`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleEditError {
    /// The rules as they are do not load.
    #[error("the current rules do not load: {0}")]
    CurrentRules(argocd_agent_domain::mapping::RuleError),
    /// The agent's ID maps to another agent already.
    #[error("{id} already maps to agent {} (rule {}); delete that agent or rule first", quoted(.agent), quoted(.rule))]
    IdTaken {
        /// The agent's SPIFFE ID.
        id: String,
        /// The agent it maps to.
        agent: String,
        /// The rule that maps it.
        rule: String,
    },
    /// The agent's ID is an operator's.
    #[error("{id} is an operator identity: {denied}")]
    OperatorId {
        /// The agent's SPIFFE ID.
        id: String,
        /// The rules' answer.
        denied: Box<argocd_agent_domain::mapping::MappingDenied>,
    },
    /// The hub namespace is another agent's.
    #[error("hub namespace {} belongs to agent {} (rule {}); choose another with --hub-namespace", quoted(.namespace), quoted(.agent), quoted(.rule))]
    NamespaceTaken {
        /// The hub namespace.
        namespace: String,
        /// The agent it belongs to.
        agent: String,
        /// The rule that gives it to that agent.
        rule: String,
    },
    /// The rules with the agent's rule put in do not load.
    #[error("the new rules do not load: {0}")]
    NewRules(argocd_agent_domain::mapping::RuleError),
    /// The rules with the agent's rule put in refuse the agent.
    #[error("the new rules do not admit the agent: {0}")]
    NotAdmitted(Box<argocd_agent_domain::mapping::MappingDenied>),
    /// The rules with the agent's rule put in map it elsewhere.
    #[error("the new rules map {id} to {mapped}, not agent {} in {}", quoted(.agent), quoted(.namespace))]
    MappedElsewhere {
        /// The agent's SPIFFE ID.
        id: String,
        /// Where it maps.
        mapped: Box<argocd_agent_domain::AgentIdentity>,
        /// The agent.
        agent: String,
        /// Its hub namespace.
        namespace: String,
    },
    /// The rule of the agent's name maps another agent.
    #[error("rule {} maps agent {}, not {}; not removing it", quoted(.rule), quoted(.found), quoted(.agent))]
    OtherAgentsRule {
        /// The rule's name.
        rule: String,
        /// The agent it maps.
        found: String,
        /// The agent being deleted.
        agent: String,
    },
}

/// Why the rules document of a rules ConfigMap cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RulesDocError {
    /// It is not YAML.
    #[error("not YAML: {0}")]
    NotYaml(Box<serde_saphyr::Error>),
    /// It has no `rules` list.
    #[error("has no `rules:` list")]
    NoRulesList,
}

/// Why `agent create --apply` or `agent delete` stopped. Messages carry their cause (no
/// `source`), except the wrapped errors, which are their cause's.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OnboardError {
    /// The agent's mapping rule.
    #[error(transparent)]
    Rule(#[from] RuleEditError),
    /// The hub cannot be reached.
    #[error(transparent)]
    Hub(#[from] crate::ctl::error::HubClientError),
    /// The agent name is invalid.
    #[error("agent name: {0}")]
    AgentName(argocd_agent_identity::id::IdError),
    /// A request to the hub's API server failed.
    #[error("{what}: {}", argocd_agent_domain::error_chain(.cause))]
    Kube {
        /// What was being done (`reading ConfigMap <name>`).
        what: String,
        /// Why it failed.
        cause: kube::Error,
    },
    /// Writing the rules ConfigMap failed.
    #[error("{}", argocd_agent_domain::error_chain(.0))]
    WriteRules(kube::Error),
    /// The rules ConfigMap changed under every attempt to write it.
    #[error("the rules ConfigMap kept changing under us (5 conflicts); try again")]
    KeptChanging,
    /// The rules ConfigMap's document cannot be read.
    #[error("ConfigMap {name} key {RULES_KEY}: {problem}")]
    RulesDoc {
        /// The ConfigMap.
        name: String,
        /// What is wrong with it.
        problem: RulesDocError,
    },
    /// The hub namespace is being deleted.
    #[error("namespace {0} is being deleted; wait until it is gone")]
    NamespaceDeleting(String),
    /// The hub namespace is labelled for another agent.
    #[error("namespace {namespace} belongs to agent {} (label {AGENT_LABEL}); choose another with --hub-namespace", quoted(.owner))]
    NamespaceOwned {
        /// The hub namespace.
        namespace: String,
        /// The agent it is labelled for.
        owner: String,
    },
    /// The namespace object cannot be built.
    #[error(transparent)]
    NamespaceObject(#[from] serde_json::Error),
    /// The cluster Secret of the agent's name is not labelled for it.
    #[error("Secret {namespace}/{name} is not agent {agent}'s cluster Secret (label {AGENT_LABEL} is {}); not deleting it", label_text(.owner))]
    NotAgentsSecret {
        /// Argo CD's namespace.
        namespace: String,
        /// The Secret.
        name: String,
        /// The agent.
        agent: String,
        /// The Secret's agent label.
        owner: Option<String>,
    },
    /// The hub namespace to delete is not labelled for the agent.
    #[error("namespace {namespace} is not labelled for agent {agent} ({AGENT_LABEL} is {}); not deleting it", label_text(.owner))]
    NotAgentsNamespace {
        /// The hub namespace.
        namespace: String,
        /// The agent.
        agent: String,
        /// The namespace's agent label.
        owner: Option<String>,
    },
}

/// An agent label's value as the messages give it: quoted, or `not set`.
fn label_text(owner: &Option<String>) -> String {
    owner
        .as_deref()
        .map_or_else(|| "not set".to_owned(), |o| quoted(o).to_string())
}

/// The name of the mapping rule `agent create` writes for `agent`.
pub fn rule_name(agent: &AgentName) -> String {
    format!("agent-{agent}")
}

impl Plan {
    /// Checks the inputs of `agent create` and derives the defaults.
    pub fn new(a: &CreateArgs) -> Result<Plan, PlanError> {
        let agent = AgentName::new(&a.name).map_err(PlanError::AgentName)?;
        let hub_namespace = Namespace::new(a.hub_namespace.as_deref().unwrap_or(&a.name))
            .map_err(|e| PlanError::Flag("--hub-namespace", e))?;
        let spoke_namespace = Namespace::new(&a.spoke_namespace)
            .map_err(|e| PlanError::Flag("--spoke-namespace", e))?;
        let spiffe_id = match (&a.spiffe_id, &a.trust_domain) {
            (Some(id), _) => SpiffeId::parse(id).map_err(|e| PlanError::Flag("--spiffe-id", e))?,
            (None, td) => {
                let td = match (td, a.identity) {
                    (Some(td), _) => td.as_str(),
                    (None, IdentitySource::Mesh) => "cluster.local",
                    (None, _) => {
                        return Err(PlanError::NoId);
                    }
                };
                let template = a.path_template.as_deref().unwrap_or(match a.identity {
                    IdentitySource::Mesh => "/ns/{namespace}/sa/argocd-agent-agent-{agent}",
                    _ => "/agent/{agent}",
                });
                let path = template
                    .replace("{agent}", agent.as_str())
                    .replace("{namespace}", spoke_namespace.as_str());
                SpiffeId::parse(&format!("spiffe://{td}{path}"))
                    .map_err(|e| PlanError::Flag("--trust-domain / --path-template", e))?
            }
        };
        if a.identity == IdentitySource::Mesh {
            let sa = format!("/sa/argocd-agent-agent-{agent}");
            if !spiffe_id.as_str().ends_with(&sa) {
                return Err(PlanError::MeshId {
                    sa,
                    agent: agent.to_string(),
                    id: spiffe_id.as_str().to_owned(),
                });
            }
        }
        refuse_ignored_flags(a)?;
        let principal_spiffe_id = match &a.principal_spiffe_id {
            Some(id) => {
                SpiffeId::parse(id).map_err(|e| PlanError::Flag("--principal-spiffe-id", e))?
            }
            None => SpiffeId::parse(&format!(
                "spiffe://{}/ns/argocd/sa/argocd-agent-principal",
                spiffe_id.trust_domain().as_str()
            ))
            .map_err(PlanError::PrincipalId)?,
        };
        if !matches!(a.issuer_kind.as_str(), "ClusterIssuer" | "Issuer") {
            return Err(PlanError::IssuerKind(a.issuer_kind.clone()));
        }
        Ok(Plan {
            agent,
            hub_namespace,
            spiffe_id,
            principal_spiffe_id,
            mode: a.mode,
            identity: a.identity,
            spoke_namespace,
            principal: a
                .principal_address
                .clone()
                .map(|addr| (addr, a.principal_port.unwrap_or(8443))),
            issuer: (a.issuer.clone(), a.issuer_kind.clone()),
            deploy_dir: a.deploy_dir.clone(),
        })
    }

    /// The agent's mapping rule, as an entry of the rules file.
    pub fn rule(&self) -> Value {
        json!({
            "name": rule_name(&self.agent),
            "exact": self.spiffe_id.as_str(),
            "agent": self.agent.as_str(),
            "namespace": self.hub_namespace.as_str(),
            "mode": self.mode.as_str(),
        })
    }

    /// The hub namespace, labelled with the agent's name.
    pub fn namespace(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {
                "name": self.hub_namespace.as_str(),
                "labels": {AGENT_LABEL: self.agent.as_str()},
            },
        })
    }

    /// The spoke object that gives the agent's workload its identity (none for a mesh).
    pub fn identity_object(&self) -> Option<(&'static str, Value)> {
        let labels =
            json!({"app.kubernetes.io/part-of": "argocd-agent", AGENT_LABEL: self.agent.as_str()});
        match self.identity {
            IdentitySource::Spire => Some((
                "clusterspiffeid.yaml",
                json!({
                    "apiVersion": "spire.spiffe.io/v1alpha1",
                    "kind": "ClusterSPIFFEID",
                    "metadata": {"name": format!("argocd-agent-{}", self.agent), "labels": labels},
                    "spec": {
                        // The controller fills in its own trust domain, which must be the ID's.
                        "spiffeIDTemplate": format!("spiffe://{{{{ .TrustDomain }}}}{}", self.spiffe_id.path()),
                        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "argocd-agent-agent"}},
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": self.spoke_namespace.as_str()}},
                    },
                }),
            )),
            IdentitySource::CertManager => Some((
                "certificate.yaml",
                json!({
                    "apiVersion": "cert-manager.io/v1",
                    "kind": "Certificate",
                    "metadata": {"name": "argocd-agent-svid", "namespace": self.spoke_namespace.as_str(), "labels": labels},
                    "spec": {
                        "secretName": "argocd-agent-svid",
                        "uris": [self.spiffe_id.as_str()],
                        "usages": ["digital signature", "key encipherment", "client auth"],
                        "duration": "24h",
                        "renewBefore": "8h",
                        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
                        "issuerRef": {"name": self.issuer.0, "kind": self.issuer.1, "group": "cert-manager.io"},
                    },
                }),
            )),
            IdentitySource::Mesh => None,
        }
    }

    /// The overlay's `resources:` entry for `deploy/overlays/<kind>/agent`, relative to
    /// `output_dir` when both are local paths.
    fn base(&self, output_dir: Option<&Path>) -> String {
        let overlay = format!("overlays/{}/agent", self.identity.overlay());
        if self.deploy_dir.contains("://") {
            let (url, query) = self
                .deploy_dir
                .split_once('?')
                .map_or((self.deploy_dir.as_str(), None), |(u, q)| (u, Some(q)));
            let url = format!("{}/{overlay}", url.trim_end_matches('/'));
            return query.map_or(url.clone(), |q| format!("{url}?{q}"));
        }
        let target = Path::new(&self.deploy_dir).join(&overlay);
        match output_dir {
            Some(out) => relative(out, &target).display().to_string(),
            None => target.display().to_string(),
        }
    }

    /// The overlay's `kustomization.yaml`.
    pub fn kustomization(&self, output_dir: Option<&Path>) -> String {
        let agent_mode = match self.mode {
            RuleMode::Autonomous => "autonomous",
            _ => "managed",
        };
        let mut ops =
            vec![json!({"op": "replace", "path": "/data/agent.mode", "value": agent_mode})];
        let mut target = json!({"kind": "ConfigMap", "name": "argocd-agent-params"});
        if self.identity == IdentitySource::Mesh {
            // nameSuffix renames the ConfigMap too; there is only one in the base.
            target = json!({"kind": "ConfigMap"});
        } else {
            if let Some((addr, port)) = &self.principal {
                ops.push(
                    json!({"op": "replace", "path": "/data/agent.server.address", "value": addr}),
                );
                ops.push(json!({"op": "replace", "path": "/data/agent.server.port", "value": port.to_string()}));
            }
            ops.push(json!({"op": "replace", "path": "/data/agent.principal.spiffe-id", "value": self.principal_spiffe_id.as_str()}));
        }
        let patch = serde_saphyr::to_string(&ops).unwrap_or_default();
        let mut resources = vec![self.base(output_dir)];
        if let Some((file, _)) = self.identity_object() {
            resources.push(file.to_string());
        }
        let mut doc = json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "namespace": self.spoke_namespace.as_str(),
            "resources": resources,
            "patches": [{"target": target, "patch": patch}],
        });
        if self.identity == IdentitySource::Mesh {
            doc["nameSuffix"] = format!("-{}", self.agent).into();
        }
        format!(
            "# Agent {} ({}), written by argocd-agentctl agent create.\n# Apply on the agent's cluster: kubectl apply -k <this directory>\n{}",
            self.agent,
            self.spiffe_id.as_str(),
            yaml(&doc)
        )
    }

    /// The overlay's files: `kustomization.yaml` and the identity object's file.
    pub fn overlay_files(&self, output_dir: Option<&Path>) -> Vec<(String, String)> {
        let mut files = vec![(
            "kustomization.yaml".to_string(),
            self.kustomization(output_dir),
        )];
        if let Some((file, obj)) = self.identity_object() {
            files.push((file.to_string(), yaml(&obj)));
        }
        files
    }

    /// Everything as one multi-document YAML stream: the hub's namespace, the rule (as a
    /// comment: it belongs in a file inside a ConfigMap), the spoke's identity object.
    pub fn render(&self, rules_configmap: &str, argocd_namespace: &str) -> String {
        let rule = yaml(&json!({"rules": [self.rule()]}));
        let commented: String = rule.lines().map(|l| format!("#   {l}\n")).collect();
        let mut out = format!(
            "# Hub: the agent's namespace.\n{}---\n# Hub: the agent's mapping rule, for {RULES_KEY} in ConfigMap {argocd_namespace}/{rules_configmap}\n# (above any broader rule matching the same ID; `agent create --apply` places it):\n{commented}",
            yaml(&self.namespace())
        );
        if let Some((_, obj)) = self.identity_object() {
            out.push_str(&format!(
                "---\n# Spoke: the agent workload's identity (also in the --output-dir overlay).\n{}",
                yaml(&obj)
            ));
        }
        out
    }
}

fn yaml(v: &Value) -> String {
    serde_saphyr::to_string(v).unwrap_or_else(|e| format!("# cannot render: {e}\n"))
}

/// `target` relative to directory `from` (both made absolute against the current directory).
fn relative(from: &Path, target: &Path) -> PathBuf {
    let abs = |p: &Path| {
        let p = if p.is_absolute() {
            p.to_path_buf()
        } else {
            std::env::current_dir().unwrap_or_default().join(p)
        };
        // Lexical normalisation: `.` dropped, `..` pops.
        let mut out = PathBuf::new();
        for c in p.components() {
            match c {
                std::path::Component::CurDir => {}
                std::path::Component::ParentDir => {
                    out.pop();
                }
                c => out.push(c),
            }
        }
        out
    };
    let (from, target) = (abs(from), abs(target));
    let common = from
        .components()
        .zip(target.components())
        .take_while(|(a, b)| a == b)
        .count();
    let mut out = PathBuf::new();
    for _ in from.components().skip(common) {
        out.push("..");
    }
    for c in target.components().skip(common) {
        out.push(c);
    }
    out
}

/// The rules document of a rules ConfigMap as a JSON value with a `rules` list.
fn parse_rules_doc(text: &str) -> Result<Value, RulesDocError> {
    let blank = text
        .lines()
        .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
    if blank {
        return Ok(json!({"rules": []}));
    }
    let doc: Value =
        serde_saphyr::from_str(text).map_err(|e| RulesDocError::NotYaml(Box::new(e)))?;
    match doc.get("rules") {
        Some(Value::Array(_)) => Ok(doc),
        Some(Value::Null) => Ok(json!({"rules": []})),
        _ => Err(RulesDocError::NoRulesList),
    }
}

fn rules_of(doc: &Value) -> &[Value] {
    doc["rules"].as_array().map(Vec::as_slice).unwrap_or(&[])
}

fn rule_set(rules: &[Value]) -> Result<RuleSet, argocd_agent_domain::mapping::RuleError> {
    RuleSet::from_yaml(&yaml(&json!({"rules": rules})))
}

/// The rules with the agent's rule put in (replacing one of the same name), where it decides
/// for its ID: before the first existing rule that matches the ID. Refuses when the ID is
/// another agent's, or the hub namespace is another agent's, under the existing rules.
pub fn upsert_rule(existing: &[Value], plan: &Plan) -> Result<Vec<Value>, RuleEditError> {
    let name = rule_name(&plan.agent);
    let others: Vec<Value> = existing
        .iter()
        .filter(|r| r["name"].as_str() != Some(name.as_str()))
        .cloned()
        .collect();
    let current = rule_set(&others).map_err(RuleEditError::CurrentRules)?;
    match current.map(&plan.spiffe_id) {
        Ok(found) if found.agent != plan.agent => {
            return Err(RuleEditError::IdTaken {
                id: plan.spiffe_id.as_str().to_owned(),
                agent: found.agent.to_string(),
                rule: found.rule,
            });
        }
        Err(denied) if matches!(denied.reason, DenyReason::AdminRole { .. }) => {
            return Err(RuleEditError::OperatorId {
                id: plan.spiffe_id.as_str().to_owned(),
                denied: Box::new(denied),
            });
        }
        _ => {}
    }
    for r in &others {
        let agent = r["agent"].as_str();
        let ns = r["namespace"].as_str().or(agent);
        if ns == Some(plan.hub_namespace.as_str())
            && agent.is_some_and(|a| a != plan.agent.as_str())
        {
            return Err(RuleEditError::NamespaceTaken {
                namespace: plan.hub_namespace.to_string(),
                agent: agent.unwrap_or_default().to_owned(),
                rule: r["name"].as_str().unwrap_or("?").to_owned(),
            });
        }
    }
    let matches = |r: &Value| {
        rule_set(std::slice::from_ref(r)).is_ok_and(|one| {
            !matches!(
                one.map(&plan.spiffe_id),
                Err(ref d) if matches!(d.reason, DenyReason::NoRuleMatched { .. })
            )
        })
    };
    let at = others.iter().position(matches).unwrap_or(others.len());
    let mut rules = others;
    rules.insert(at, plan.rule());
    let set = rule_set(&rules).map_err(RuleEditError::NewRules)?;
    let mapped = set
        .map(&plan.spiffe_id)
        .map_err(|e| RuleEditError::NotAdmitted(Box::new(e)))?;
    if mapped.agent != plan.agent || mapped.namespace != plan.hub_namespace {
        return Err(RuleEditError::MappedElsewhere {
            id: plan.spiffe_id.as_str().to_owned(),
            mapped: Box::new(mapped),
            agent: plan.agent.to_string(),
            namespace: plan.hub_namespace.to_string(),
        });
    }
    Ok(rules)
}

/// The rules without the agent's rule, and the hub namespace it named. Refuses to remove a
/// rule of that name that maps another agent.
pub fn remove_rule(
    existing: &[Value],
    agent: &AgentName,
) -> Result<(Vec<Value>, Option<String>), RuleEditError> {
    let name = rule_name(agent);
    let mut namespace = None;
    let mut kept = Vec::with_capacity(existing.len());
    for r in existing {
        if r["name"].as_str() == Some(name.as_str()) {
            if r["agent"].as_str() != Some(agent.as_str()) {
                return Err(RuleEditError::OtherAgentsRule {
                    rule: name,
                    found: r["agent"].as_str().unwrap_or("?").to_owned(),
                    agent: agent.to_string(),
                });
            }
            namespace = Some(
                r["namespace"]
                    .as_str()
                    .unwrap_or(agent.as_str())
                    .to_string(),
            );
        } else {
            kept.push(r.clone());
        }
    }
    Ok((kept, namespace))
}

/// After the agent's rule is gone: the rule of `rules` that still admits `id`, as a warning
/// naming it (the principal keeps accepting the agent through it), or none.
pub fn still_admitted(rules: &[Value], id: &str) -> Option<String> {
    let id = SpiffeId::parse(id).ok()?;
    let set = rule_set(rules).ok()?;
    let found = set.map(&id).ok()?;
    Some(format!(
        "warning: rule {} still admits {} (agent {}, hub namespace {}): the principal keeps accepting it; narrow or remove that rule, or block the ID (argocd-agentctl blocklist add)",
        quoted(&found.rule),
        id.as_str(),
        quoted(&found.agent.as_str()),
        quoted(&found.namespace.as_str())
    ))
}

fn kube_err(what: String) -> impl FnOnce(kube::Error) -> OnboardError {
    move |cause| OnboardError::Kube { what, cause }
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Reads the rules document of the ConfigMap (None: no ConfigMap).
async fn read_rules(
    api: &Api<ConfigMap>,
    name: &str,
) -> Result<Option<(ConfigMap, Value)>, OnboardError> {
    let cm = match api
        .get_opt(name)
        .await
        .map_err(kube_err(format!("reading ConfigMap {name}")))?
    {
        Some(cm) => cm,
        None => return Ok(None),
    };
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(RULES_KEY))
        .cloned()
        .unwrap_or_default();
    let doc = parse_rules_doc(&text).map_err(|problem| OnboardError::RulesDoc {
        name: name.to_owned(),
        problem,
    })?;
    Ok(Some((cm, doc)))
}

/// Writes `rules` into the ConfigMap read as `cm` (replace with its resourceVersion, so a
/// concurrent edit is a conflict, not lost), or creates it.
async fn write_rules(
    api: &Api<ConfigMap>,
    name: &str,
    cm: Option<ConfigMap>,
    mut doc: Value,
    rules: Vec<Value>,
) -> Result<(), kube::Error> {
    doc["rules"] = Value::Array(rules);
    let text = yaml(&doc);
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..Default::default()
    };
    match cm {
        Some(mut cm) => {
            cm.data
                .get_or_insert_with(BTreeMap::new)
                .insert(RULES_KEY.into(), text);
            api.replace(name, &pp, &cm).await.map(|_| ())
        }
        None => {
            let mut cm = ConfigMap::default();
            cm.metadata.name = Some(name.into());
            cm.data = Some(BTreeMap::from([(RULES_KEY.to_string(), text)]));
            api.create(&pp, &cm).await.map(|_| ())
        }
    }
}

/// Retries `f` on a write conflict (someone else edited the ConfigMap in between).
async fn with_conflict_retry<T, F, Fut>(mut f: F) -> Result<T, OnboardError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Result<T, kube::Error>, OnboardError>>,
{
    for _ in 0..5 {
        match f().await? {
            Ok(done) => return Ok(done),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => return Err(OnboardError::WriteRules(e)),
        }
    }
    Err(OnboardError::KeptChanging)
}

/// Creates the hub namespace or adopts an unlabelled one; refuses one of another agent.
async fn ensure_namespace(api: &Api<KubeNamespace>, plan: &Plan) -> Result<String, OnboardError> {
    let ns = plan.hub_namespace.as_str();
    let what = format!("namespace {ns}");
    match api
        .get_opt(ns)
        .await
        .map_err(kube_err(format!("reading {what}")))?
    {
        Some(existing) => {
            check_namespace_owner(&existing, &plan.agent)?;
            if owner_label(&existing).is_some() {
                return Ok(format!(
                    "namespace {ns}: exists, labelled for agent {}",
                    plan.agent
                ));
            }
            let patch = json!({"metadata": {"labels": {AGENT_LABEL: plan.agent.as_str()}}});
            api.patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(kube_err(format!("labelling {what}")))?;
            Ok(format!(
                "namespace {ns}: existed without an agent label; labelled for agent {}",
                plan.agent
            ))
        }
        None => {
            let obj: KubeNamespace = serde_json::from_value(plan.namespace())?;
            let pp = PostParams {
                field_manager: Some(MANAGER.into()),
                ..Default::default()
            };
            match api.create(&pp, &obj).await {
                Ok(_) => Ok(format!("namespace {ns}: created")),
                // Created in between (e.g. by the principal): check it again.
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    let existing = api
                        .get(ns)
                        .await
                        .map_err(kube_err(format!("reading {what}")))?;
                    check_namespace_owner(&existing, &plan.agent)?;
                    Ok(format!("namespace {ns}: exists"))
                }
                Err(e) => Err(kube_err(format!("creating {what}"))(e)),
            }
        }
    }
}

fn owner_label(ns: &KubeNamespace) -> Option<&str> {
    ns.metadata
        .labels
        .as_ref()?
        .get(AGENT_LABEL)
        .map(String::as_str)
}

fn check_namespace_owner(ns: &KubeNamespace, agent: &AgentName) -> Result<(), OnboardError> {
    let name = ns.metadata.name.clone().unwrap_or_default();
    if ns.metadata.deletion_timestamp.is_some() {
        return Err(OnboardError::NamespaceDeleting(name));
    }
    match owner_label(ns) {
        Some(owner) if owner != agent.as_str() => Err(OnboardError::NamespaceOwned {
            namespace: name,
            owner: owner.to_owned(),
        }),
        _ => Ok(()),
    }
}

/// `agent create --apply`: the hub's namespace and mapping rule. Returns what was done.
pub async fn apply(
    plan: &Plan,
    hub: &crate::ctl::HubArgs,
    rules_cm: &str,
) -> Result<Vec<String>, OnboardError> {
    let client = hub.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &hub.namespace);
    let nss: Api<KubeNamespace> = Api::all(client);
    // Check the rules first: nothing is written for an agent the rules would refuse.
    let (_, doc) = read_rules(&cms, rules_cm)
        .await?
        .unwrap_or((ConfigMap::default(), json!({"rules": []})));
    upsert_rule(rules_of(&doc), plan)?;
    let mut done = vec![ensure_namespace(&nss, plan).await?];
    let rule = with_conflict_retry(|| async {
        let (cm, doc) = match read_rules(&cms, rules_cm).await? {
            Some((cm, doc)) => (Some(cm), doc),
            None => (None, json!({"rules": []})),
        };
        let before = rules_of(&doc).to_vec();
        let rules = upsert_rule(&before, plan)?;
        if rules == before {
            return Ok(Ok(format!("rule {}: unchanged", rule_name(&plan.agent))));
        }
        let created = cm.is_none();
        Ok(write_rules(&cms, rules_cm, cm, doc, rules).await.map(|()| {
            format!(
                "rule {}: {} ConfigMap {}/{rules_cm} ({} -> agent {}, namespace {}, mode {})",
                rule_name(&plan.agent),
                if created {
                    "written to new"
                } else {
                    "written to"
                },
                hub.namespace,
                plan.spiffe_id.as_str(),
                plan.agent,
                plan.hub_namespace,
                plan.mode.as_str()
            )
        }))
    })
    .await?;
    done.push(rule);
    Ok(done)
}

/// `agent delete`: the rule, the cluster Secret and (when asked) the namespace.
pub async fn delete(a: &DeleteArgs) -> Result<Vec<String>, OnboardError> {
    let agent = AgentName::new(&a.name).map_err(OnboardError::AgentName)?;
    let client = a.hub.client().await?;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &a.hub.namespace);
    let cm_name = a.rules_configmap.as_str();
    let (rule, rule_ns, warning) = with_conflict_retry(|| async {
        let Some((cm, doc)) = read_rules(&cms, cm_name).await? else {
            return Ok(Ok((
                format!(
                    "rule {}: no ConfigMap {cm_name}; nothing to remove",
                    rule_name(&agent)
                ),
                None,
                None,
            )));
        };
        let before = rules_of(&doc).to_vec();
        let id = before
            .iter()
            .find(|r| r["name"].as_str() == Some(rule_name(&agent).as_str()))
            .and_then(|r| r["exact"].as_str().map(str::to_owned));
        let (rules, ns) = remove_rule(&before, &agent)?;
        if rules.len() == before.len() {
            return Ok(Ok((
                format!("rule {}: already absent", rule_name(&agent)),
                ns,
                None,
            )));
        }
        let warning = id.and_then(|id| still_admitted(&rules, &id));
        Ok(write_rules(&cms, cm_name, Some(cm), doc, rules)
            .await
            .map(|()| {
                (
                    format!(
                        "rule {}: removed from ConfigMap {}/{cm_name}",
                        rule_name(&agent),
                        a.hub.namespace
                    ),
                    ns,
                    warning,
                )
            }))
    })
    .await?;
    let mut done = vec![rule];
    done.extend(warning);
    done.push(delete_cluster_secret(&client, &a.hub.namespace, &agent).await?);
    let ns = a
        .hub_namespace
        .clone()
        .or(rule_ns)
        .unwrap_or_else(|| agent.to_string());
    done.push(delete_namespace(&client, &ns, &agent, a.delete_namespace).await?);
    Ok(done)
}

async fn delete_cluster_secret(
    client: &kube::Client,
    argocd_ns: &str,
    agent: &AgentName,
) -> Result<String, OnboardError> {
    let api: Api<Secret> = Api::namespaced(client.clone(), argocd_ns);
    let name = format!("cluster-{agent}");
    let Some(secret) = api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("reading Secret {name}")))?
    else {
        return Ok(format!("cluster Secret {argocd_ns}/{name}: already absent"));
    };
    let owner = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AGENT_LABEL));
    if owner.map(String::as_str) != Some(agent.as_str()) {
        return Err(OnboardError::NotAgentsSecret {
            namespace: argocd_ns.to_owned(),
            name,
            agent: agent.to_string(),
            owner: owner.cloned(),
        });
    }
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => Ok(format!("cluster Secret {argocd_ns}/{name}: deleted")),
        Err(e) if is_not_found(&e) => {
            Ok(format!("cluster Secret {argocd_ns}/{name}: already absent"))
        }
        Err(e) => Err(kube_err(format!("deleting Secret {name}"))(e)),
    }
}

async fn delete_namespace(
    client: &kube::Client,
    ns: &str,
    agent: &AgentName,
    really: bool,
) -> Result<String, OnboardError> {
    let nss: Api<KubeNamespace> = Api::all(client.clone());
    let Some(existing) = nss
        .get_opt(ns)
        .await
        .map_err(kube_err(format!("reading namespace {ns}")))?
    else {
        return Ok(format!("namespace {ns}: already absent"));
    };
    let apps_api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        ns,
        &kube::api::ApiResource {
            group: "argoproj.io".into(),
            version: "v1alpha1".into(),
            api_version: "argoproj.io/v1alpha1".into(),
            kind: "Application".into(),
            plural: "applications".into(),
        },
    );
    let apps: Vec<String> = match apps_api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|o| o.metadata.name)
            .collect(),
        Err(e) if is_not_found(&e) => Vec::new(),
        Err(e) => return Err(kube_err(format!("listing Applications in {ns}"))(e)),
    };
    if !really {
        return Ok(format!(
            "namespace {ns}: kept ({} Applications); pass --delete-namespace to delete it",
            apps.len()
        ));
    }
    if owner_label(&existing) != Some(agent.as_str()) {
        return Err(OnboardError::NotAgentsNamespace {
            namespace: ns.to_owned(),
            agent: agent.to_string(),
            owner: owner_label(&existing).map(str::to_owned),
        });
    }
    if existing.metadata.deletion_timestamp.is_some() {
        return Ok(format!("namespace {ns}: already being deleted"));
    }
    if !apps.is_empty() {
        eprintln!(
            "WARNING: deleting namespace {ns} deletes its {} Applications on the hub: {}",
            apps.len(),
            apps.join(", ")
        );
    }
    match nss.delete(ns, &DeleteParams::default()).await {
        Ok(_) => Ok(format!("namespace {ns}: deleted")),
        Err(e) if is_not_found(&e) => Ok(format!("namespace {ns}: already absent")),
        Err(e) => Err(kube_err(format!("deleting namespace {ns}"))(e)),
    }
}

/// Writes the overlay files into `dir` (created if needed).
fn write_overlay(plan: &Plan, dir: &Path) -> Result<Vec<String>, OverlayError> {
    std::fs::create_dir_all(dir).map_err(|cause| OverlayError::Create {
        dir: dir.to_owned(),
        cause,
    })?;
    let mut done = Vec::new();
    for (file, text) in plan.overlay_files(Some(dir)) {
        let path = dir.join(&file);
        if let Err(cause) = std::fs::write(&path, text) {
            return Err(OverlayError::Write { path, cause });
        }
        done.push(format!("wrote {}", path.display()));
    }
    Ok(done)
}

/// Runs `agent create`.
pub async fn run_create(a: CreateArgs) -> crate::CmdResult {
    let plan = Plan::new(&a)?;
    if let Some(tenant) = &a.tenant {
        check_tenant(&a, &plan, tenant).await?;
        eprintln!(
            "tenant {tenant}: {} and hub namespace {} are within the tenant",
            plan.spiffe_id.as_str(),
            plan.hub_namespace
        );
    }
    let mut notes = Vec::new();
    if let Some(dir) = &a.output_dir {
        check_deploy_dir(&plan)?;
        notes.extend(write_overlay(&plan, dir)?);
    }
    if a.apply {
        for line in apply(&plan, &a.hub, &a.rules_configmap).await? {
            println!("{line}");
        }
    } else {
        print!("{}", plan.render(&a.rules_configmap, &a.hub.namespace));
    }
    for n in notes {
        eprintln!("{n}");
    }
    if plan.principal.is_none() && plan.identity != IdentitySource::Mesh && a.output_dir.is_some() {
        eprintln!(
            "note: no --principal-address: the overlay keeps the base's agent.server.address"
        );
    }
    Ok(())
}

/// `agent create --tenant`: the tenant must take the agent's ID and hub namespace, by the
/// rules of --rules, or with --apply those of the rules ConfigMap.
async fn check_tenant(a: &CreateArgs, plan: &Plan, tenant: &str) -> crate::CmdResult {
    let (text, source) = match (&a.rules, a.apply) {
        (Some(path), _) => (
            std::fs::read_to_string(path)
                .map_err(|e| format!("--rules {}: {e}", path.display()))?,
            path.display().to_string(),
        ),
        (None, true) => {
            let cms: Api<ConfigMap> = Api::namespaced(a.hub.client().await?, &a.hub.namespace);
            let doc = read_rules(&cms, &a.rules_configmap)
                .await?
                .map(|(_, doc)| doc)
                .unwrap_or_else(|| json!({"rules": []}));
            (
                serde_json::to_string(&doc)?,
                format!("ConfigMap {}/{}", a.hub.namespace, a.rules_configmap),
            )
        }
        (None, false) => {
            return Err(format!(
                "--tenant {tenant}: give the rules to check it against (--rules <file>), or --apply to read them from ConfigMap {}/{}",
                a.hub.namespace, a.rules_configmap
            )
            .into());
        }
    };
    crate::ctl::tenant::check_membership(
        &text,
        &source,
        tenant,
        &plan.spiffe_id,
        &plan.hub_namespace,
    )?;
    Ok(())
}

/// Runs `agent delete`; warnings go to standard error.
pub async fn run_delete(a: DeleteArgs) -> crate::CmdResult {
    for line in delete(&a).await? {
        if line.starts_with("warning: ") {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: CreateArgs,
    }

    fn plan(args: &[&str]) -> Result<Plan, String> {
        let t = T::try_parse_from(std::iter::once("t").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        Plan::new(&t.a).map_err(|e| e.to_string())
    }

    #[test]
    fn ids_follow_the_deploy_conventions_per_identity_source() {
        let p = plan(&["edge-1", "--trust-domain", "example.org"]).unwrap();
        assert_eq!(p.spiffe_id.as_str(), "spiffe://example.org/agent/edge-1");
        assert_eq!(p.hub_namespace.as_str(), "edge-1");
        assert_eq!(
            p.principal_spiffe_id.as_str(),
            "spiffe://example.org/ns/argocd/sa/argocd-agent-principal"
        );
        let m = plan(&["edge-2", "--identity", "mesh"]).unwrap();
        assert_eq!(
            m.spiffe_id.as_str(),
            "spiffe://cluster.local/ns/argocd/sa/argocd-agent-agent-edge-2"
        );
        let e = plan(&[
            "edge-3",
            "--identity",
            "mesh",
            "--spiffe-id",
            "spiffe://cluster.local/ns/argocd/sa/other",
        ])
        .unwrap_err();
        assert!(e.contains("argocd-agent-agent-edge-3"), "{e}");
    }

    #[test]
    fn bad_names_and_missing_ids_are_refused_clearly() {
        let e = plan(&["Edge_1", "--trust-domain", "example.org"]).unwrap_err();
        assert!(
            e.starts_with("agent name:") && e.contains("DNS-1123"),
            "{e}"
        );
        let e = plan(&["edge-1"]).unwrap_err();
        assert!(
            e.contains("--spiffe-id") && e.contains("--trust-domain"),
            "{e}"
        );
        let e = plan(&["edge-1", "--spiffe-id", "spiffe://Example.org/x"]).unwrap_err();
        assert!(e.starts_with("--spiffe-id:"), "{e}");
        let e = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--hub-namespace=x-",
        ])
        .unwrap_err();
        assert!(e.starts_with("--hub-namespace:"), "{e}");
    }

    #[test]
    fn the_rendered_rule_loads_and_admits_exactly_the_agent() {
        let p = plan(&[
            "edge-1",
            "--spiffe-id",
            "spiffe://example.org/c/edge-1",
            "--hub-namespace",
            "hub-edge-1",
            "--mode",
            "autonomous",
        ])
        .unwrap();
        let set = rule_set(&[p.rule()]).unwrap();
        let id = set.map(&p.spiffe_id).unwrap();
        assert_eq!(
            (id.agent.as_str(), id.namespace.as_str(), id.rule.as_str()),
            ("edge-1", "hub-edge-1", "agent-edge-1")
        );
        id.check_mode(argocd_agent_domain::AgentMode::Autonomous)
            .unwrap();
        assert!(
            id.check_mode(argocd_agent_domain::AgentMode::Managed)
                .is_err()
        );
        assert!(
            set.map(&SpiffeId::parse("spiffe://example.org/c/edge-2").unwrap())
                .is_err()
        );
    }

    #[test]
    fn the_rule_goes_before_a_broader_rule_that_would_decide_otherwise() {
        let existing: Vec<Value> = parse_rules_doc(
            "rules:\n  - name: pinned\n    exact: spiffe://example.org/special\n    agent: special\n  - name: all\n    template: \"spiffe://example.org/agent/{sa}\"\n    agent: \"x-{sa}\"\n",
        )
        .map(|d| rules_of(&d).to_vec())
        .unwrap();
        let p = plan(&["edge-1", "--trust-domain", "example.org"]).unwrap();
        let rules = upsert_rule(&existing, &p).unwrap_err().to_string();
        // The broad rule maps the ID to another agent: refused, not shadowed.
        assert!(rules.contains("x-edge-1"), "{rules}");
        let existing: Vec<Value> = parse_rules_doc(
            "rules:\n  - name: pinned\n    exact: spiffe://example.org/special\n    agent: special\n  - name: all\n    template: \"spiffe://example.org/agent/{agent}\"\n    namespace: \"other-{agent}\"\n",
        )
        .map(|d| rules_of(&d).to_vec())
        .unwrap();
        let rules = upsert_rule(&existing, &p).unwrap();
        let names: Vec<&str> = rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["pinned", "agent-edge-1", "all"]);
        // Idempotent: a second upsert changes nothing.
        assert_eq!(upsert_rule(&rules, &p).unwrap(), rules);
        let (removed, ns) = remove_rule(&rules, &p.agent).unwrap();
        assert_eq!(ns.as_deref(), Some("edge-1"));
        assert_eq!(removed.len(), 2);
        assert_eq!(remove_rule(&removed, &p.agent).unwrap().0, removed);
    }

    #[test]
    fn a_namespace_or_id_of_another_agent_is_refused() {
        let existing: Vec<Value> = parse_rules_doc(
            "rules:\n  - name: agent-edge-9\n    exact: spiffe://example.org/agent/edge-9\n    agent: edge-9\n    namespace: shared\n",
        )
        .map(|d| rules_of(&d).to_vec())
        .unwrap();
        let p = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--hub-namespace",
            "shared",
        ])
        .unwrap();
        let e = upsert_rule(&existing, &p).unwrap_err().to_string();
        assert!(e.contains("belongs to agent \"edge-9\""), "{e}");
        let p = plan(&["edge-1", "--spiffe-id", "spiffe://example.org/agent/edge-9"]).unwrap();
        let e = upsert_rule(&existing, &p).unwrap_err().to_string();
        assert!(e.contains("already maps to agent \"edge-9\""), "{e}");
        let e = remove_rule(&existing, &AgentName::new("edge-1").unwrap()).unwrap();
        assert_eq!(e.0.len(), 1, "another agent's rule is never removed");
    }

    #[test]
    fn overlays_point_at_deploy_and_carry_the_identity() {
        let p = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--principal-address",
            "hub.example.com",
            "--deploy-dir",
            "/src/deploy",
        ])
        .unwrap();
        let k = p.kustomization(Some(Path::new("/src/clusters/edge-1")));
        assert!(k.contains("../../deploy/overlays/spire/agent"), "{k}");
        assert!(
            k.contains("clusterspiffeid.yaml") && k.contains("hub.example.com"),
            "{k}"
        );
        let (_, csid) = p.identity_object().unwrap();
        assert_eq!(
            csid["spec"]["spiffeIDTemplate"],
            "spiffe://{{ .TrustDomain }}/agent/edge-1"
        );
        let c = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--identity",
            "cert-manager",
            "--deploy-dir",
            "https://github.com/o/r//deploy?ref=v1",
        ])
        .unwrap();
        let k = c.kustomization(Some(Path::new("/x")));
        assert!(
            k.contains("https://github.com/o/r//deploy/overlays/pem-files/agent?ref=v1"),
            "{k}"
        );
        let (_, cert) = c.identity_object().unwrap();
        assert_eq!(cert["spec"]["uris"][0], "spiffe://example.org/agent/edge-1");
        let m = plan(&["edge-1", "--identity", "mesh"]).unwrap();
        assert!(m.identity_object().is_none());
        assert!(m.kustomization(None).contains("nameSuffix: -edge-1"));
        let out = p.render(RULES_CONFIGMAP, "argocd");
        assert_eq!(out.matches("\n---\n").count(), 2, "{out}");
        assert!(
            out.contains("#       exact: spiffe://example.org/agent/edge-1")
                || out.contains("#     exact: spiffe://example.org/agent/edge-1"),
            "{out}"
        );
    }

    #[test]
    fn flags_create_would_ignore_are_refused_by_name() {
        for (args, flag) in [
            (
                &[
                    "edge-1",
                    "--identity",
                    "mesh",
                    "--principal-address",
                    "hub.example.org",
                ][..],
                "--principal-address",
            ),
            (
                &["edge-1", "--identity", "mesh", "--principal-port", "443"],
                "--principal-port",
            ),
            (
                &[
                    "edge-1",
                    "--identity",
                    "mesh",
                    "--principal-spiffe-id",
                    "spiffe://cluster.local/p",
                ],
                "--principal-spiffe-id",
            ),
        ] {
            let err = plan(args).unwrap_err();
            assert!(
                err.starts_with("--identity mesh: ") && err.contains(flag),
                "{args:?}: {err}"
            );
        }
        let err = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--principal-port",
            "443",
        ])
        .unwrap_err();
        assert!(
            err.contains("--principal-port needs --principal-address"),
            "{err}"
        );
        let p = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--principal-address",
            "hub.example.org",
            "--principal-port",
            "443",
        ])
        .unwrap();
        assert_eq!(p.principal, Some(("hub.example.org".to_string(), 443)));
    }

    #[test]
    fn a_deploy_dir_without_the_overlay_is_refused() {
        let missing = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--deploy-dir",
            "/nonexistent",
        ])
        .unwrap();
        let err = check_deploy_dir(&missing).unwrap_err().to_string();
        assert!(
            err.starts_with(
                "--deploy-dir /nonexistent: no overlays/spire/agent/kustomization.yaml there"
            ),
            "{err}"
        );
        let shipped = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
        for identity in ["spire", "cert-manager", "mesh"] {
            let p = plan(&[
                "edge-1",
                "--trust-domain",
                "example.org",
                "--identity",
                identity,
                "--deploy-dir",
                shipped,
            ]);
            let p = p
                .or_else(|_| plan(&["edge-1", "--identity", identity, "--deploy-dir", shipped]))
                .unwrap();
            check_deploy_dir(&p).unwrap_or_else(|e| panic!("{identity}: {e}"));
        }
        let remote = plan(&[
            "edge-1",
            "--trust-domain",
            "example.org",
            "--deploy-dir",
            "https://github.com/o/r//deploy?ref=v1",
        ])
        .unwrap();
        assert!(check_deploy_dir(&remote).is_ok());
    }

    #[test]
    fn delete_names_the_rule_that_still_admits_the_agent() {
        // The shipped rules (deploy/principal/rules-cm.yaml) after `agent delete edge-1`
        // removed the exact rule `agent create` wrote: agent-path still maps the ID.
        let shipped: Vec<Value> = serde_json::from_value(json!([
            {"name": "agent-path", "template": "spiffe://{trust_domain}/agent/{agent}", "trustDomains": ["example.org"]},
            {"name": "spire-k8s", "template": "spiffe://{trust_domain}/ns/{ns}/sa/{sa}", "agent": "{sa}", "namespace": "argocd-{sa}", "trustDomains": ["example.org"], "mode": "both"},
        ]))
        .unwrap();
        let w = still_admitted(&shipped, "spiffe://example.org/agent/edge-1").expect("a warning");
        assert!(w.starts_with("warning: rule \"agent-path\" still admits spiffe://example.org/agent/edge-1 (agent \"edge-1\""), "{w}");
        assert_eq!(
            still_admitted(&shipped, "spiffe://other.org/agent/edge-1"),
            None
        );
        assert_eq!(
            still_admitted(&[], "spiffe://example.org/agent/edge-1"),
            None
        );
    }
}
