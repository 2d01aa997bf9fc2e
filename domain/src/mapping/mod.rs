//! Mapping rules: which agent (and which hub namespace) a SPIFFE ID is.
//!
//! Rules are ordered; the first rule whose pattern matches decides; an ID no rule matches is
//! denied. Three kinds of rule exist:
//!
//! - **template**: `spiffe://{trust_domain}/ns/{ns}/sa/{sa}`. Each `{name}` placeholder in
//!   the path matches text inside one path segment; `{trust_domain}` may only stand for the
//!   whole trust domain. The `agent` and `namespace` output templates use the placeholders,
//!   e.g. agent `{sa}`, namespace `argocd-{sa}`.
//! - **regex** (upstream `mtls:uri:<regex>`): anchored over the whole ID; the first capture
//!   group is the agent name (outputs may also use `{1}`, `{2}`, named groups `{name}`).
//! - **exact**: one SPIFFE ID to one agent.
//!
//! A rule with `role: admin` maps to no agent: the IDs it matches are operators, who may call
//! the principal's admin API (`argocd-agentctl agent ...`) over the mTLS listener and may never
//! open an agent stream. Agent rules grant no admin access. First match decides for both.
//!
//! The namespace defaults to the agent name (as upstream). Every rule may restrict the trust
//! domains it applies to (`trustDomains`) and the modes the agent may run in (`mode`).
//! A rule that matches but renders an invalid agent name or namespace **denies**: it does not
//! fall through to later rules, because a later, broader rule would otherwise silently grant
//! an identity the operator meant to handle specially. A rule that matches an ID from a trust
//! domain it does not list is skipped and evaluation continues.
//!
//! ## YAML
//!
//! ```yaml
//! rules:
//!   - name: spire-k8s
//!     template: "spiffe://{trust_domain}/ns/{ns}/sa/{sa}"
//!     agent: "{sa}"
//!     namespace: "argocd-{sa}"
//!     trustDomains: ["example.org"]
//!     mode: both
//!   - name: legacy
//!     regex: "^spiffe://example.org/agent/([a-z0-9-]+)$"
//!   - exact: "spiffe://example.org/special"
//!     agent: edge-1
//!     mode: autonomous
//!   - name: operators
//!     template: "spiffe://example.org/ns/platform/sa/{sa}"
//!     role: admin
//! ```
//!
//! ## Flags
//!
//! - `mtls:uri:<regex>`
//! - `template:<template>=><agent>[,namespace=<t>][,mode=<m>][,trustDomains=<a>|<b>][,name=<n>]`
//! - `exact:<spiffe-id>=><agent>[,namespace=<t>][,mode=<m>][,name=<n>]`
//! - `admin:<spiffe-id>[,name=<n>]` (an operator; `role=admin` also works as an option of
//!   `template:` and `exact:` rules with an empty agent, e.g. `template:<t>=>,role=admin`)
//!
//! File rules come first, then flag rules. Unnamed file rules are called `rule-<n>`, unnamed
//! flag rules `flag-<n>` (1-based).

// Denials are the rare path and carry everything a log line needs (identity, object,
// reason); boxing them would only add noise at every call site.
#![allow(clippy::result_large_err)]

mod live;
mod rule;

use argocd_agent_identity::text::quoted;
use std::fmt;
use std::path::PathBuf;

use crate::client::ClientIdentity;
use crate::names::{AgentMode, AgentName, AllowedModes, Namespace, TenantName};
use crate::tenant::{TenantError, TenantRefusal, TenantSpec, Tenants};
use argocd_agent_identity::id::{SpiffeId, TrustDomain};

pub use live::{LiveRules, RevokeCallback, SessionLister};
use rule::{Rule, RuleMatch, RuleSpec, Target};

/// Rule name recorded for identities that come from an upstream-style
/// `header:<name>:<regex>` capture (no mapping rule applies to them).
pub const HEADER_NAME_RULE: &str = "header-name";

/// The agent a caller maps to, attached to a session.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AgentIdentity {
    /// The verified caller (usually its SPIFFE ID).
    pub client: ClientIdentity,
    /// The agent it is.
    pub agent: AgentName,
    /// The hub namespace that agent owns.
    pub namespace: Namespace,
    /// The modes the agent may run in.
    pub allowed_modes: AllowedModes,
    /// The name of the rule that produced this mapping (for logs).
    pub rule: String,
    /// The tenant the agent belongs to (`None`: no tenant, the platform's).
    pub tenant: Option<TenantName>,
}

impl AgentIdentity {
    /// Checks that the agent may run in `mode`.
    pub fn check_mode(&self, mode: AgentMode) -> Result<(), MappingDenied> {
        if self.allowed_modes.allows(mode) {
            return Ok(());
        }
        Err(MappingDenied {
            client: self.client.clone(),
            reason: DenyReason::ModeNotAllowed {
                rule: self.rule.clone(),
                agent: self.agent.clone(),
                mode,
                allowed: self.allowed_modes,
            },
        })
    }
}

impl fmt::Display for AgentIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "agent \"{}\" ({}) namespace \"{}\" modes {} (rule \"{}\")",
            self.agent, self.client, self.namespace, self.allowed_modes, self.rule
        )?;
        match &self.tenant {
            Some(t) => write!(f, " tenant \"{t}\""),
            None => Ok(()),
        }
    }
}

/// What an operator may see and act on through the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminScope {
    /// Every agent (a `role: admin` rule).
    Platform,
    /// The agents of one tenant (the tenant's `admins`).
    Tenant(TenantName),
}

impl AdminScope {
    /// Whether an agent of `tenant` (`None`: of no tenant) is within this scope.
    pub fn covers(&self, tenant: Option<&TenantName>) -> bool {
        match self {
            AdminScope::Platform => true,
            AdminScope::Tenant(mine) => tenant == Some(mine),
        }
    }
}

impl fmt::Display for AdminScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminScope::Platform => f.write_str("platform"),
            AdminScope::Tenant(t) => write!(f, "tenant {t}"),
        }
    }
}

/// An operator admitted to the admin API: by which rule (or tenant), over what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminGrant {
    /// The admin rule's name, or `tenant <name>` for a tenant's operator.
    pub rule: String,
    /// What it may see and act on.
    pub scope: AdminScope,
}

/// Why a SPIFFE ID is not (or no longer) admitted as an agent.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DenyReason {
    /// No rule matched (`tried` rules were tried; 0 means none are configured).
    NoRuleMatched {
        /// How many rules were tried.
        tried: usize,
    },
    /// A matching rule rendered an agent name that is not a DNS-1123 label.
    InvalidAgentName {
        /// The rule.
        rule: String,
        /// The rendered value.
        value: String,
        /// Which rule of DNS-1123 failed.
        reason: String,
    },
    /// A matching rule rendered a namespace that is not a DNS-1123 label.
    InvalidNamespace {
        /// The rule.
        rule: String,
        /// The rendered value.
        value: String,
        /// Which rule of DNS-1123 failed.
        reason: String,
    },
    /// The agent connected in a mode its rule does not allow.
    ModeNotAllowed {
        /// The rule.
        rule: String,
        /// The agent.
        agent: AgentName,
        /// The mode the agent asked for.
        mode: AgentMode,
        /// What the rule allows.
        allowed: AllowedModes,
    },
    /// After a rules change the ID maps to a different agent or namespace.
    Remapped {
        /// The rule that now matches.
        rule: String,
        /// The agent and namespace of the live session.
        was: (AgentName, Namespace),
        /// The agent and namespace it maps to now.
        now: (AgentName, Namespace),
    },
    /// The matching rule gives the admin role: an operator identity never connects as an
    /// agent.
    AdminRole {
        /// The rule.
        rule: String,
    },
    /// The caller asked for the admin API but its identity has no admin rule.
    NotAdmin {
        /// The agent rule that matched it, if any.
        rule: Option<String>,
    },
    /// After a rules change the ID's rule allows fewer modes than before; the session is
    /// closed so the agent reconnects and its mode is checked again.
    ModesNarrowed {
        /// The rule that now matches.
        rule: String,
        /// What was allowed when the session started.
        was: AllowedModes,
        /// What is allowed now.
        now: AllowedModes,
    },
    /// The rules mapped the ID, but its tenant keeps it out (see [`TenantRefusal`]).
    Tenant(TenantRefusal),
    /// After a rules change the ID belongs to another tenant (or to none, or newly to one).
    TenantChanged {
        /// The session's tenant.
        was: Option<TenantName>,
        /// The tenant now.
        now: Option<TenantName>,
    },
}

impl DenyReason {
    /// A short stable code for metrics labels.
    pub fn code(&self) -> &'static str {
        match self {
            DenyReason::NoRuleMatched { .. } => "NoRuleMatched",
            DenyReason::InvalidAgentName { .. } => "InvalidAgentName",
            DenyReason::InvalidNamespace { .. } => "InvalidNamespace",
            DenyReason::ModeNotAllowed { .. } => "ModeNotAllowed",
            DenyReason::Remapped { .. } => "Remapped",
            DenyReason::ModesNarrowed { .. } => "ModesNarrowed",
            DenyReason::AdminRole { .. } => "AdminRole",
            DenyReason::NotAdmin { .. } => "NotAdmin",
            DenyReason::Tenant(TenantRefusal::NamespaceNotOwned { .. }) => "TenantNamespace",
            DenyReason::Tenant(TenantRefusal::NamespaceOfTenant { .. }) => "NamespaceOfTenant",
            DenyReason::Tenant(TenantRefusal::TenantAdmin { .. }) => "TenantAdmin",
            DenyReason::TenantChanged { .. } => "TenantChanged",
        }
    }
}

impl fmt::Display for DenyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DenyReason::NoRuleMatched { tried: 0 } => {
                f.write_str("no mapping rules are configured")
            }
            DenyReason::NoRuleMatched { tried } => {
                write!(f, "no rule matched ({tried} tried)")
            }
            DenyReason::InvalidAgentName {
                rule,
                value,
                reason,
            } => write!(
                f,
                "rule \"{rule}\" produced invalid agent name {value}: {reason}", value = quoted(&value)
            ),
            DenyReason::InvalidNamespace {
                rule,
                value,
                reason,
            } => write!(
                f,
                "rule \"{rule}\" produced invalid namespace {value}: {reason}", value = quoted(&value)
            ),
            DenyReason::ModeNotAllowed {
                rule,
                agent,
                mode,
                allowed,
            } => write!(
                f,
                "agent \"{agent}\" may not run in {mode} mode: rule \"{rule}\" allows {allowed}"
            ),
            DenyReason::Remapped { rule, was, now } => write!(
                f,
                "rule \"{rule}\" now maps it to agent \"{}\" namespace \"{}\" (session is agent \"{}\" namespace \"{}\")",
                now.0, now.1, was.0, was.1
            ),
            DenyReason::AdminRole { rule } => write!(
                f,
                "rule \"{rule}\" gives the admin role: an operator identity may call the admin API but never connect as an agent"
            ),
            DenyReason::NotAdmin { rule: Some(rule) } => write!(
                f,
                "the admin API needs a rule with role: admin; this identity matches agent rule \"{rule}\""
            ),
            DenyReason::NotAdmin { rule: None } => {
                f.write_str("the admin API needs a rule with role: admin; this identity is no SPIFFE ID an admin rule can match")
            }
            DenyReason::ModesNarrowed { rule, was, now } => write!(
                f,
                "rule \"{rule}\" now allows mode {now} (session started under {was})"
            ),
            DenyReason::Tenant(refusal) => refusal.fmt(f),
            DenyReason::TenantChanged { was, now } => {
                let show = |t: &Option<TenantName>| match t {
                    Some(t) => format!("tenant \"{t}\""),
                    None => "no tenant".to_owned(),
                };
                write!(f, "the identity now belongs to {} (session started under {})", show(now), show(was))
            }
        }
    }
}

/// A caller was refused as an agent; names the caller and the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} denied: {reason}", .client.describe())]
pub struct MappingDenied {
    /// The refused caller.
    pub client: ClientIdentity,
    /// Why.
    pub reason: DenyReason,
}

/// A rule file or flag that cannot be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// The YAML does not parse or has the wrong shape.
    #[error("mapping rules YAML: {0}")]
    Yaml(String),
    /// One rule of a YAML document is invalid.
    #[error("mapping rule {index} (\"{name}\"): {reason}")]
    Rule {
        /// 1-based position in the file.
        index: usize,
        /// Its name (given or default).
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// One tenant of a YAML document is invalid.
    #[error("mapping rules YAML: {0}")]
    Tenant(#[from] TenantError),
    /// One rule flag is invalid.
    #[error("mapping rule flag {flag}: {reason}", flag = quoted(.flag))]
    Flag {
        /// The flag as given (truncated when very long).
        flag: String,
        /// What is wrong.
        reason: String,
    },
    /// The rules file cannot be read.
    #[error("mapping rules file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// [`LiveRules::start`] was called outside a tokio runtime.
    #[error("LiveRules::start must be called inside a tokio runtime")]
    NoRuntime,
    /// The rules file is invalid.
    #[error("mapping rules file {}: {source}", path.display())]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong in it.
        source: Box<RuleError>,
    },
}

/// The top level of a rules file. `rules` is required so that an empty (or truncated while
/// being written) file is an error, not "deny everyone".
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    rules: Vec<RuleSpec>,
    #[serde(default)]
    tenants: Vec<TenantSpec>,
}

/// Finds a rule whose name an earlier rule already uses: names exist to tell rules apart
/// in logs. Returns its 1-based index, its name and the reason.
fn duplicate_name(rules: &[Rule]) -> Option<(usize, String, String)> {
    let mut seen = std::collections::BTreeMap::new();
    for (i, r) in rules.iter().enumerate() {
        if let Some(first) = seen.insert(r.name.as_str(), i + 1) {
            return Some((
                i + 1,
                r.name.clone(),
                format!("rule name \"{}\" is already used by rule {first}", r.name),
            ));
        }
    }
    None
}

/// An ordered, immutable list of mapping rules. Cheap to share in an `Arc`.
#[derive(Debug, Clone, Default)]
pub struct RuleSet {
    rules: Vec<Rule>,
    prefilter: Prefilter,
    tenants: std::sync::Arc<Tenants>,
}

/// Every template and regex rule's pattern in one `RegexSet`, so an ID is scanned once for
/// all of them instead of once per rule (1,000 template rules cost ~6 ms per ID one by one,
/// see docs/benchmarks.md); only the rules it says match run their own regex for captures.
#[derive(Debug, Clone, Default)]
struct Prefilter {
    set: Option<regex::RegexSet>,
    /// Rule index -> index in `set` (exact rules have none).
    of_rule: Vec<Option<usize>>,
}

impl Prefilter {
    fn new(rules: &[Rule]) -> Prefilter {
        let mut patterns = Vec::new();
        let of_rule = rules
            .iter()
            .map(|r| {
                r.matcher.pattern().map(|p| {
                    patterns.push(p.to_owned());
                    patterns.len() - 1
                })
            })
            .collect();
        // A set too large for the regex crate's limits falls back to one regex per rule.
        let set = (!patterns.is_empty())
            .then(|| regex::RegexSet::new(&patterns).ok())
            .flatten();
        Prefilter { set, of_rule }
    }
}

impl RuleSet {
    fn from_rules(rules: Vec<Rule>) -> RuleSet {
        let prefilter = Prefilter::new(&rules);
        RuleSet {
            rules,
            prefilter,
            tenants: Default::default(),
        }
    }

    /// The tenants declared with these rules (empty when none is).
    pub fn tenants(&self) -> &Tenants {
        &self.tenants
    }

    /// Which patterns match `id` (one pass over all of them).
    fn hits(&self, id: &SpiffeId) -> Option<regex::SetMatches> {
        self.prefilter.set.as_ref().map(|s| s.matches(id.as_str()))
    }

    /// Whether rule `i` can match, given [`RuleSet::hits`]: exact rules always can.
    fn may_match(&self, hits: &Option<regex::SetMatches>, i: usize) -> bool {
        match (hits, self.prefilter.of_rule.get(i).copied().flatten()) {
            (Some(hits), Some(si)) => hits.matched(si),
            _ => true,
        }
    }
}

impl RuleSet {
    /// Parses a YAML rules document (see the module docs for the format).
    pub fn from_yaml(text: &str) -> Result<RuleSet, RuleError> {
        let blank = text
            .lines()
            .all(|l| l.trim().is_empty() || l.trim_start().starts_with('#'));
        if blank {
            return Err(RuleError::Yaml(
                "the document is empty; write `rules: []` to deny every SPIFFE ID".into(),
            ));
        }
        let file: RuleFile =
            serde_saphyr::from_str(text).map_err(|e| RuleError::Yaml(e.to_string()))?;
        let mut rules = Vec::with_capacity(file.rules.len());
        for (i, spec) in file.rules.into_iter().enumerate() {
            let index = i + 1;
            let default_name = format!("rule-{index}");
            let shown = spec.name.clone().unwrap_or_else(|| default_name.clone());
            let rule = rule::compile(spec, default_name).map_err(|reason| RuleError::Rule {
                index,
                name: shown,
                reason,
            })?;
            rules.push(rule);
        }
        if let Some((index, name, reason)) = duplicate_name(&rules) {
            return Err(RuleError::Rule {
                index,
                name,
                reason,
            });
        }
        let tenants = Tenants::from_specs(file.tenants)?;
        let mut set = RuleSet::from_rules(rules);
        set.tenants = std::sync::Arc::new(tenants);
        Ok(set)
    }

    /// Reads and parses a YAML rules file; errors name the file.
    pub fn from_file(path: &std::path::Path) -> Result<RuleSet, RuleError> {
        let text = std::fs::read_to_string(path).map_err(|source| RuleError::Read {
            path: path.to_owned(),
            source,
        })?;
        RuleSet::from_yaml(&text).map_err(|e| RuleError::File {
            path: path.to_owned(),
            source: Box::new(e),
        })
    }

    /// Parses rule flags (see the module docs for the syntax), in order.
    pub fn from_flags(flags: &[String]) -> Result<RuleSet, RuleError> {
        let mut rules = Vec::with_capacity(flags.len());
        for (i, flag) in flags.iter().enumerate() {
            rules.push(rule::parse_flag(flag, format!("flag-{}", i + 1))?);
        }
        if let Some((index, _, reason)) = duplicate_name(&rules) {
            return Err(RuleError::Flag {
                flag: argocd_agent_identity::id::quote(&flags[index - 1]),
                reason,
            });
        }
        Ok(RuleSet::from_rules(rules))
    }

    /// This set's rules followed by `other`'s.
    /// Tenants come from the file only (flags declare none): `self`'s are kept.
    pub fn append(mut self, other: RuleSet) -> RuleSet {
        self.rules.extend(other.rules);
        let tenants = self.tenants;
        let mut set = RuleSet::from_rules(self.rules);
        set.tenants = tenants;
        set
    }

    /// Whether there are no rules (every ID is denied).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// How many rules there are.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// Maps `id` to an agent: the first matching rule decides; no match denies.
    pub fn map(&self, id: &SpiffeId) -> Result<AgentIdentity, MappingDenied> {
        self.evaluate(id, None)
    }

    /// Maps any caller: a SPIFFE ID through the rules ([`RuleSet::map`]); an agent name from
    /// an upstream-style header capture is its own agent and hub namespace, in either mode.
    pub fn map_client(&self, client: &ClientIdentity) -> Result<AgentIdentity, MappingDenied> {
        match client {
            ClientIdentity::Spiffe(id) => self.map(id),
            ClientIdentity::AgentName(agent) => {
                let namespace = Namespace::new(agent.as_str()).map_err(|e| MappingDenied {
                    client: client.clone(),
                    reason: DenyReason::InvalidNamespace {
                        rule: HEADER_NAME_RULE.into(),
                        value: agent.to_string(),
                        reason: e.to_string(),
                    },
                })?;
                let tenant =
                    self.tenants
                        .check_agent(None, &namespace)
                        .map_err(|r| MappingDenied {
                            client: client.clone(),
                            reason: DenyReason::Tenant(r),
                        })?;
                Ok(AgentIdentity {
                    client: client.clone(),
                    agent: agent.clone(),
                    namespace,
                    allowed_modes: AllowedModes::Both,
                    rule: HEADER_NAME_RULE.into(),
                    tenant,
                })
            }
        }
    }

    /// Whether `client` may call the admin API, and over what. A tenant's operator (its
    /// `admins` patterns) is admitted for that tenant only, whatever the rules say: the
    /// narrower grant wins. Otherwise the first rule that matches its SPIFFE ID decides, and
    /// only a `role: admin` rule allows, over every agent.
    pub fn authorize_admin(&self, client: &ClientIdentity) -> Result<AdminGrant, MappingDenied> {
        let denied = |reason| MappingDenied {
            client: client.clone(),
            reason,
        };
        let ClientIdentity::Spiffe(id) = client else {
            return Err(denied(DenyReason::NotAdmin { rule: None }));
        };
        if let Some(t) = self.tenants.of_admin(id) {
            return Ok(AdminGrant {
                rule: format!("tenant {}", t.name),
                scope: AdminScope::Tenant(t.name.clone()),
            });
        }
        let hits = self.hits(id);
        for (i, rule) in self.rules.iter().enumerate() {
            if !self.may_match(&hits, i) {
                continue;
            }
            match rule.apply(id) {
                RuleMatch::NoMatch | RuleMatch::TrustDomainNotAllowed => continue,
                RuleMatch::Admin => {
                    return Ok(AdminGrant {
                        rule: rule.name.clone(),
                        scope: AdminScope::Platform,
                    });
                }
                RuleMatch::Mapped(..) | RuleMatch::Invalid(_) => {
                    return Err(denied(DenyReason::NotAdmin {
                        rule: Some(rule.name.clone()),
                    }));
                }
            }
        }
        Err(denied(DenyReason::NoRuleMatched {
            tried: self.rules.len(),
        }))
    }

    /// Whether any rule gives the admin role, or any tenant names operators.
    pub fn has_admin_rules(&self) -> bool {
        self.rules.iter().any(|r| matches!(r.target, Target::Admin))
            || self.tenants.iter().any(|t| !t.admin_patterns().is_empty())
    }

    /// Like [`RuleSet::map`], and records what every rule did.
    pub fn explain(&self, id: &SpiffeId) -> Explanation {
        let mut steps = Vec::with_capacity(self.rules.len());
        let decision = self.evaluate(id, Some(&mut steps));
        Explanation {
            spiffe_id: id.clone(),
            steps,
            decision,
        }
    }

    fn evaluate(
        &self,
        id: &SpiffeId,
        mut steps: Option<&mut Vec<RuleStep>>,
    ) -> Result<AgentIdentity, MappingDenied> {
        let explaining = steps.is_some();
        let hits = self.hits(id);
        let mut record = |rule: &Rule, outcome: StepOutcome| {
            if let Some(steps) = steps.as_deref_mut() {
                steps.push(RuleStep {
                    rule: rule.name.clone(),
                    pattern: rule.matcher.to_string(),
                    outcome,
                });
            }
        };
        let mut decision = None;
        for (i, rule) in self.rules.iter().enumerate() {
            if decision.is_some() {
                if !explaining {
                    break;
                }
                record(rule, StepOutcome::NotEvaluated);
                continue;
            }
            let outcome = if self.may_match(&hits, i) {
                rule.apply(id)
            } else {
                RuleMatch::NoMatch
            };
            match outcome {
                RuleMatch::NoMatch => record(rule, StepOutcome::NoMatch),
                RuleMatch::TrustDomainNotAllowed => record(
                    rule,
                    StepOutcome::TrustDomainNotAllowed {
                        trust_domain: id.trust_domain().clone(),
                        allowed: rule.trust_domains.clone(),
                    },
                ),
                RuleMatch::Invalid(reason) => {
                    record(rule, StepOutcome::Denied(reason.clone()));
                    decision = Some(Err(MappingDenied {
                        client: id.clone().into(),
                        reason,
                    }));
                }
                RuleMatch::Admin => {
                    let reason = DenyReason::AdminRole {
                        rule: rule.name.clone(),
                    };
                    record(rule, StepOutcome::Denied(reason.clone()));
                    decision = Some(Err(MappingDenied {
                        client: id.clone().into(),
                        reason,
                    }));
                }
                RuleMatch::Mapped(agent, namespace, allowed_modes) => {
                    match self.tenants.check_agent(Some(id), &namespace) {
                        Ok(tenant) => {
                            record(rule, StepOutcome::Matched);
                            decision = Some(Ok(AgentIdentity {
                                client: id.clone().into(),
                                agent,
                                namespace,
                                allowed_modes,
                                rule: rule.name.clone(),
                                tenant,
                            }));
                        }
                        Err(refusal) => {
                            let reason = DenyReason::Tenant(refusal);
                            record(rule, StepOutcome::Denied(reason.clone()));
                            decision = Some(Err(MappingDenied {
                                client: id.clone().into(),
                                reason,
                            }));
                        }
                    }
                }
            }
        }
        decision.unwrap_or_else(|| {
            Err(MappingDenied {
                client: id.clone().into(),
                reason: DenyReason::NoRuleMatched {
                    tried: self.rules.len(),
                },
            })
        })
    }
}

/// What one rule did with an ID.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StepOutcome {
    /// The pattern did not match.
    NoMatch,
    /// The pattern matched but the ID's trust domain is not in the rule's list; skipped.
    TrustDomainNotAllowed {
        /// The ID's trust domain.
        trust_domain: TrustDomain,
        /// The rule's list.
        allowed: Vec<TrustDomain>,
    },
    /// The rule matched and decided: allowed.
    Matched,
    /// The rule matched and decided: denied.
    Denied(DenyReason),
    /// An earlier rule decided.
    NotEvaluated,
}

/// One line of an [`Explanation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleStep {
    /// The rule's name.
    pub rule: String,
    /// The rule's pattern, e.g. `template spiffe://{trust_domain}/ns/{ns}/sa/{sa}`.
    pub pattern: String,
    /// What it did.
    pub outcome: StepOutcome,
}

/// Every rule tried for one ID and the final decision (for `identity explain` and logs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Explanation {
    /// The ID.
    pub spiffe_id: SpiffeId,
    /// One entry per rule, in order.
    pub steps: Vec<RuleStep>,
    /// What [`RuleSet::map`] returns.
    pub decision: Result<AgentIdentity, MappingDenied>,
}

impl Explanation {
    /// Whether the ID was allowed.
    pub fn is_allowed(&self) -> bool {
        self.decision.is_ok()
    }
}

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "SPIFFE ID: {}", self.spiffe_id)?;
        if self.steps.is_empty() {
            writeln!(f, "rules: none configured")?;
        } else {
            writeln!(f, "rules:")?;
        }
        for (i, s) in self.steps.iter().enumerate() {
            let what = match &s.outcome {
                StepOutcome::NoMatch => "no match".to_owned(),
                StepOutcome::TrustDomainNotAllowed {
                    trust_domain,
                    allowed,
                } => {
                    let list: Vec<&str> = allowed.iter().map(TrustDomain::as_str).collect();
                    format!(
                        "skipped: trust domain \"{trust_domain}\" is not in trustDomains [{}]",
                        list.join(", ")
                    )
                }
                StepOutcome::Matched => "MATCHED".to_owned(),
                StepOutcome::Denied(reason) => format!("matched, DENIED: {reason}"),
                StepOutcome::NotEvaluated => "not evaluated (an earlier rule decided)".to_owned(),
            };
            writeln!(f, "  {}. {} ({}): {what}", i + 1, s.rule, s.pattern)?;
        }
        match &self.decision {
            Ok(id) => {
                writeln!(f, "decision: ALLOWED")?;
                writeln!(f, "  rule:          {}", id.rule)?;
                writeln!(f, "  agent:         {}", id.agent)?;
                writeln!(f, "  namespace:     {}", id.namespace)?;
                if let Some(t) = &id.tenant {
                    writeln!(f, "  tenant:        {t}")?;
                }
                write!(f, "  allowed modes: {}", id.allowed_modes)
            }
            Err(d) => write!(f, "decision: DENIED: {}", d.reason),
        }
    }
}
