//! What mapping decides for a caller: the agent it is ([`AgentIdentity`]), the operator it is
//! ([`AdminGrant`]), or why it is refused ([`MappingDenied`], [`DenyReason`]).

use argocd_agent_identity::text::quoted;
use std::fmt;

use crate::client::ClientIdentity;
use crate::names::{AgentMode, AgentName, AllowedModes, Namespace, TenantName};
use crate::tenant::TenantRefusal;

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
