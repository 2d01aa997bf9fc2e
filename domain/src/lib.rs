//! The Argo CD agent's domain, shared by principal and agent: agent names and modes, who a
//! caller is before and after mapping (the rules from a SPIFFE ID or mesh header to an agent
//! and its hub namespace), per-message authorization, the typed event model and its
//! CloudEvents encoding, the per-peer delivery queue, and the resync plan.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Functions under 80 lines (the threshold is in clippy.toml); unit tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod authz;
pub mod client;
pub mod event;
pub mod mapping;
pub mod names;
pub mod pattern;
pub mod proxy;
pub mod queue;
pub mod resync;
pub mod rpc;
pub mod sync;
pub mod tenant;
pub mod trace;

pub use authz::{Action, Denied, ObjectRef, Owner, authorize};
pub use client::ClientIdentity;
pub use event::{Event, EventError, EventType, JsonObject, LazyObject, Payload, ResourceRef};
pub use mapping::{
    AdminGrant, AdminScope, AgentIdentity, LiveRules, MappingDenied, RuleError, RuleProblem,
    RuleSet,
};
pub use names::{AgentMode, AgentName, AllowedModes, Namespace, ResourceKind, TenantName};
pub use queue::{QueueError, QueueLimits, SendQueue, SharedRtt};
pub use tenant::{Tenant, Tenants};

pub use argocd_agent_identity::text::{or_dash, quoted, quoted_list};

/// Formats an error with its chain of causes, `outer: inner: root`, each cause once: the
/// message of the error events peers send each other, and of log lines.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    argocd_agent_identity::error_chain(err)
}
