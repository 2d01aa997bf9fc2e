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

mod decision;
mod error;
mod explain;
mod live;
mod rule;
mod set;

pub use decision::{
    AdminGrant, AdminScope, AgentIdentity, DenyReason, HEADER_NAME_RULE, MappingDenied,
};
pub use error::{RuleError, RuleProblem};
pub use explain::{Explanation, RuleStep, StepOutcome};
pub use live::{LiveRules, RevokeCallback, SessionLister};
pub use set::RuleSet;
