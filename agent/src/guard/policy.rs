//! The guard policy: as written ([`GuardSpec`]), compiled ([`Guard`]), and every source in
//! force ([`GuardSet`]).

use std::sync::Arc;

use argocd_agent_domain::pattern;
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;

/// The key of the guard policy in its ConfigMap's `data`.
pub const CONFIGMAP_KEY: &str = "guard.yaml";
/// The name of the ConfigMap of Argo CD's GPG keys, the only ConfigMap the principal sends.
pub const GPG_KEYS_CONFIGMAP: &str = "argocd-gpg-keys-cm";
/// The Argo CD condition type a refused Application gets on the hub (Argo CD's own type for
/// a spec it will not reconcile, `ApplicationConditionInvalidSpecError`).
pub const CONDITION_TYPE: &str = "InvalidSpecError";

/// One destination rule as written: globs over the Application's (or project's)
/// destination; a field left out matches anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DestinationSpec {
    /// Glob over `destination.server`.
    #[serde(default)]
    pub server: Option<String>,
    /// Glob over `destination.name`.
    #[serde(default)]
    pub name: Option<String>,
    /// Glob over `destination.namespace` (an empty namespace is matched as `""`).
    #[serde(default)]
    pub namespace: Option<String>,
}

/// What repository Secrets from the hub may do on this spoke.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RepositoryMode {
    /// Written when their `url` is an allowed repository (the default).
    #[default]
    Hub,
    /// Never written: repository credentials are this cluster's own.
    LocalOnly,
}

/// The guard policy as written (the YAML document, or what the flags say).
///
/// Every list is optional: left out, the rule does not restrict. `!pattern` entries of
/// `sourceRepos` and `projects` deny what they match.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GuardSpec {
    /// Allowed source repositories (globs, as Argo CD's `sourceRepos`).
    #[serde(default)]
    pub source_repos: Option<Vec<String>>,
    /// Allowed destinations.
    #[serde(default)]
    pub destinations: Option<Vec<DestinationSpec>>,
    /// Allowed project names (globs).
    #[serde(default)]
    pub projects: Option<Vec<String>>,
    /// Whether cluster-scoped resources may be deployed (default `true`); `false` empties
    /// every project's `clusterResourceWhitelist`.
    #[serde(default)]
    pub cluster_resources: Option<bool>,
    /// Every project written here must name `destinationServiceAccounts` (Argo CD's sync
    /// impersonation); a project without them is refused.
    #[serde(default)]
    pub require_destination_service_accounts: Option<bool>,
    /// The `destinationServiceAccounts` of every project written here (replacing the
    /// hub's): the hub cannot choose whom the spoke's Argo CD impersonates.
    #[serde(default)]
    pub destination_service_accounts: Option<Vec<Value>>,
    /// `hub` (default) or `local-only`.
    #[serde(default)]
    pub repositories: Option<RepositoryMode>,
}

/// Why a guard policy is refused; the message names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GuardError {
    /// The YAML does not parse or has an unknown field.
    #[error("{origin}: {message}")]
    Yaml {
        /// Where the policy came from (file path, ConfigMap).
        origin: String,
        /// The parser's message (it names the field).
        message: String,
    },
    /// A field's value is refused.
    #[error("{origin}: {field}: {message}")]
    Field {
        /// Where the policy came from.
        origin: String,
        /// The field, as written (`sourceRepos[2]`).
        field: String,
        /// Why.
        message: String,
    },
}

/// A list of globs with `!` denials: a value is allowed when an allow pattern matches it
/// and no deny pattern does.
#[derive(Debug, Clone)]
pub struct GlobList {
    pub(super) allow: Vec<(String, Regex)>,
    pub(super) deny: Vec<(String, Regex)>,
}

impl GlobList {
    pub(super) fn compile(
        patterns: &[String],
        field: &str,
        origin: &str,
    ) -> Result<GlobList, GuardError> {
        let mut list = GlobList {
            allow: Vec::new(),
            deny: Vec::new(),
        };
        for (i, p) in patterns.iter().enumerate() {
            let p = p.trim();
            let (target, text) = match p.strip_prefix('!') {
                Some(rest) => (&mut list.deny, rest),
                None => (&mut list.allow, p),
            };
            if text.is_empty() {
                return Err(field_error(
                    origin,
                    format!("{field}[{i}]"),
                    "empty pattern",
                ));
            }
            let re = pattern::compile_glob(text).map_err(|e| {
                field_error(
                    origin,
                    format!("{field}[{i}]"),
                    &argocd_agent_domain::error_chain(&e),
                )
            })?;
            target.push((text.to_owned(), re));
        }
        if list.allow.is_empty() {
            return Err(field_error(
                origin,
                field.to_owned(),
                "no allow pattern: leave the field out to allow everything, or name what is allowed",
            ));
        }
        Ok(list)
    }

    /// Whether `value` is allowed.
    pub fn allows(&self, value: &str) -> bool {
        self.allow.iter().any(|(_, r)| r.is_match(value))
            && !self.deny.iter().any(|(_, r)| r.is_match(value))
    }

    /// The patterns, as written (`!` for denials), for messages.
    pub fn describe(&self) -> String {
        self.allow
            .iter()
            .map(|(p, _)| p.clone())
            .chain(self.deny.iter().map(|(p, _)| format!("!{p}")))
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub(super) fn allow_patterns(&self) -> impl Iterator<Item = &str> {
        self.allow.iter().map(|(p, _)| p.as_str())
    }

    pub(super) fn deny_patterns(&self) -> impl Iterator<Item = &str> {
        self.deny.iter().map(|(p, _)| p.as_str())
    }
}

fn field_error(origin: &str, field: String, message: &str) -> GuardError {
    GuardError::Field {
        origin: origin.to_owned(),
        field,
        message: message.to_owned(),
    }
}

/// One compiled destination rule.
#[derive(Debug, Clone)]
pub struct DestinationRule {
    pub(super) server: Option<(String, Regex)>,
    pub(super) name: Option<(String, Regex)>,
    pub(super) namespace: Option<(String, Regex)>,
}

impl DestinationRule {
    pub(super) fn compile(
        spec: &DestinationSpec,
        field: &str,
        origin: &str,
    ) -> Result<Self, GuardError> {
        let one = |v: &Option<String>, sub: &str| -> Result<Option<(String, Regex)>, GuardError> {
            let Some(p) = v else { return Ok(None) };
            let re = pattern::compile_glob(p.trim()).map_err(|e| {
                field_error(
                    origin,
                    format!("{field}.{sub}"),
                    &argocd_agent_domain::error_chain(&e),
                )
            })?;
            Ok(Some((p.trim().to_owned(), re)))
        };
        Ok(DestinationRule {
            server: one(&spec.server, "server")?,
            name: one(&spec.name, "name")?,
            namespace: one(&spec.namespace, "namespace")?,
        })
    }

    pub(super) fn describe(&self) -> String {
        let f =
            |v: &Option<(String, Regex)>| v.as_ref().map_or("*", |(p, _)| p.as_str()).to_owned();
        format!(
            "server={} name={} namespace={}",
            f(&self.server),
            f(&self.name),
            f(&self.namespace)
        )
    }
}

/// One source of the guard, compiled.
#[derive(Debug, Clone)]
pub struct Guard {
    /// Where it came from (`--guard-file /etc/guard.yaml`, `ConfigMap argocd/x`, `flags`).
    pub origin: String,
    pub(super) source_repos: Option<GlobList>,
    pub(super) destinations: Option<Vec<DestinationRule>>,
    pub(super) projects: Option<GlobList>,
    pub(super) cluster_resources: bool,
    pub(super) require_service_accounts: bool,
    pub(super) service_accounts: Option<Vec<Value>>,
    pub(super) repositories: RepositoryMode,
}

impl Guard {
    /// Compiles `spec`; errors name `origin` and the field.
    pub fn compile(spec: &GuardSpec, origin: &str) -> Result<Guard, GuardError> {
        let list = |v: &Option<Vec<String>>, field: &str| {
            v.as_ref()
                .map(|p| GlobList::compile(p, field, origin))
                .transpose()
        };
        let destinations = match &spec.destinations {
            None => None,
            Some(d) if d.is_empty() => {
                return Err(field_error(
                    origin,
                    "destinations".into(),
                    "no destination: leave the field out to allow every destination",
                ));
            }
            Some(d) => Some(
                d.iter()
                    .enumerate()
                    .map(|(i, s)| {
                        DestinationRule::compile(s, &format!("destinations[{i}]"), origin)
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        if let Some(accounts) = &spec.destination_service_accounts {
            check_service_accounts(accounts, origin)?;
        }
        Ok(Guard {
            origin: origin.to_owned(),
            source_repos: list(
                &spec.source_repos.as_ref().map(|p| {
                    p.iter()
                        .map(|r| match r.trim().strip_prefix('!') {
                            Some(d) => format!("!{}", normalize_repo(d)),
                            None => normalize_repo(r),
                        })
                        .collect()
                }),
                "sourceRepos",
            )?,
            destinations,
            projects: list(&spec.projects, "projects")?,
            cluster_resources: spec.cluster_resources.unwrap_or(true),
            require_service_accounts: spec.require_destination_service_accounts.unwrap_or(false),
            service_accounts: spec.destination_service_accounts.clone(),
            repositories: spec.repositories.unwrap_or_default(),
        })
    }

    /// Parses and compiles a YAML policy document.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Guard, GuardError> {
        let blank = text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        let spec: GuardSpec = if blank {
            return Err(GuardError::Yaml {
                origin: origin.to_owned(),
                message: "the policy is empty; write `{}` for a guard that restricts nothing"
                    .into(),
            });
        } else {
            serde_saphyr::from_str(text).map_err(|e| GuardError::Yaml {
                origin: origin.to_owned(),
                message: e.to_string(),
            })?
        };
        Guard::compile(&spec, origin)
    }
}

/// `destinationServiceAccounts` entries must be objects naming `defaultServiceAccount`.
fn check_service_accounts(accounts: &[Value], origin: &str) -> Result<(), GuardError> {
    if accounts.is_empty() {
        return Err(field_error(
            origin,
            "destinationServiceAccounts".into(),
            "empty: leave the field out, or name at least one service account",
        ));
    }
    for (i, a) in accounts.iter().enumerate() {
        let sa = a.get("defaultServiceAccount").and_then(Value::as_str);
        if !a.is_object() || sa.is_none_or(str::is_empty) {
            return Err(field_error(
                origin,
                format!("destinationServiceAccounts[{i}]"),
                "needs defaultServiceAccount (and server, namespace as Argo CD's AppProject)",
            ));
        }
    }
    Ok(())
}

/// Every guard source in force; empty: no guard (the agent behaves as without one).
#[derive(Debug, Clone, Default)]
pub struct GuardSet {
    /// The sources; each must allow a write.
    pub guards: Vec<Arc<Guard>>,
    /// The guard's own ConfigMap in the agent's namespace, never written from the hub.
    pub configmap: Option<String>,
}

impl GuardSet {
    /// Whether any rule is in force (or a guard ConfigMap is configured, even if absent).
    pub fn is_active(&self) -> bool {
        !self.guards.is_empty() || self.configmap.is_some()
    }
}

/// Why the guard refused something the hub sent: the rule and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The rule's name (metric label): `source-repos`, `destinations`, `projects`,
    /// `cluster-resources`, `destination-service-accounts`, `repositories`,
    /// `guard-configmap`.
    pub rule: &'static str,
    /// What was refused and why, naming the guard source.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "refused by the spoke guard (rule {}): {}",
            self.rule, self.message
        )
    }
}

/// Argo CD's `ApplicationCondition` for a refusal, first seen at `since` (RFC 3339).
pub fn condition(refusal: &Refusal, since: &str) -> Value {
    serde_json::json!({
        "type": CONDITION_TYPE,
        "message": refusal.to_string(),
        "lastTransitionTime": since,
    })
}

/// Now, as Kubernetes writes times (RFC 3339, seconds, UTC).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// A repository URL as Argo CD compares them (`git.NormalizeGitURL`, in short): trimmed,
/// lower case, without a trailing `/` or `.git`.
pub fn normalize_repo(url: &str) -> String {
    let u = url.trim().to_lowercase();
    let u = u.trim_end_matches('/');
    u.strip_suffix(".git").unwrap_or(u).to_owned()
}
