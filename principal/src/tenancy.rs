//! Which hub configuration objects an agent may receive once tenants are declared
//! (`tenants:` in the mapping rules file; see [`argocd_agent_domain::tenant`]).
//!
//! Distribution keeps its own rules (a project's destinations, a repository's project) and
//! tenancy narrows them: an object a tenant claims (by name, or a GPG key by key ID) reaches
//! that tenant's agents only, however wide the project's destination globs are; an object no
//! tenant claims is the platform's and reaches every agent its own rules select. Without any
//! tenant declared every object is the platform's: nothing changes.
//!
//! The tenants are read from the live rules on each evaluation, so a reload that moves an
//! object's ownership takes effect with the next evaluation; [`crate::hub::watch_reloads`]
//! starts one for every connected managed agent, which deletes what the agent may no longer
//! hold.

use std::sync::Arc;

use argocd_agent_domain::mapping::RuleSet;
use argocd_agent_domain::tenant::{Claim, Tenants};
use argocd_agent_domain::{AgentName, Namespace, TenantName};
use serde_json::Value;
use tokio::sync::watch;

/// Label on an agent's cluster Secret naming its tenant (absent for agents of no tenant),
/// for ApplicationSet cluster generators that select a tenant's clusters.
pub const TENANT_LABEL: &str = "argocd-agent.argoproj-labs.io/tenant";

/// The mapping rules in force, for the tenants they declare.
#[derive(Debug, Clone)]
pub struct TenantView {
    rules: watch::Receiver<Arc<RuleSet>>,
}

impl TenantView {
    /// Follows the live rules behind `rules`.
    pub fn new(rules: watch::Receiver<Arc<RuleSet>>) -> TenantView {
        TenantView { rules }
    }

    /// Fixed rules (tests, tools): no reload.
    pub fn fixed(rules: RuleSet) -> TenantView {
        let (_tx, rx) = watch::channel(Arc::new(rules));
        TenantView { rules: rx }
    }

    /// No tenant at all: every object is the platform's.
    pub fn none() -> TenantView {
        TenantView::fixed(RuleSet::default())
    }

    /// The rules in force now (their [`RuleSet::tenants`]).
    pub fn current(&self) -> Arc<RuleSet> {
        self.rules.borrow().clone()
    }

    /// A receiver that sees every future change of the rules.
    pub fn subscribe(&self) -> watch::Receiver<Arc<RuleSet>> {
        let mut rx = self.rules.clone();
        rx.mark_unchanged();
        rx
    }
}

impl Default for TenantView {
    fn default() -> Self {
        TenantView::none()
    }
}

/// The agent a set of configuration objects is worked out for: its name, hub namespace and
/// tenant, with the tenants in force.
#[derive(Debug, Clone, Copy)]
pub struct Audience<'a> {
    /// The agent.
    pub agent: &'a AgentName,
    /// Its hub namespace.
    pub namespace: &'a Namespace,
    /// Its tenant (`None`: no tenant).
    pub tenant: Option<&'a TenantName>,
    /// Every tenant of the hub now.
    pub tenants: &'a Tenants,
}

impl Audience<'_> {
    /// Whether the object of `kind` called `name` is the platform's or this agent's
    /// tenant's (see [`Tenants::visible_to`]).
    pub fn may_see(&self, kind: Claim, name: &str) -> bool {
        self.tenants.visible_to(kind, name, self.tenant)
    }
}

/// The claim a repository Secret is judged by: `repoCreds` for a credential template
/// (`argocd.argoproj.io/secret-type: repo-creds`), `repositories` otherwise.
pub fn repository_claim(secret: &Value) -> Claim {
    let kind = secret
        .pointer("/metadata/labels")
        .and_then(|l| l.get(argocd_agent_kubernetes::SECRET_TYPE_LABEL))
        .and_then(Value::as_str);
    match kind {
        Some("repo-creds") => Claim::RepoCreds,
        _ => Claim::Repository,
    }
}

/// The agent's copy of the GPG keys ConfigMap: only the keys (entries of `data` and
/// `binaryData`, named by key ID as Argo CD names them) the agent may see. Returns the
/// object untouched when no tenant is declared.
pub fn gpg_keys_for(cm: &Arc<Value>, audience: &Audience<'_>) -> Arc<Value> {
    if audience.tenants.is_empty() {
        return cm.clone();
    }
    let hidden = |map: Option<&Value>| {
        map.and_then(Value::as_object)
            .is_some_and(|m| m.keys().any(|id| !audience.may_see(Claim::GpgKey, id)))
    };
    if !hidden(cm.get("data")) && !hidden(cm.get("binaryData")) {
        return cm.clone();
    }
    let mut out = (**cm).clone();
    for field in ["data", "binaryData"] {
        if let Some(m) = out.get_mut(field).and_then(Value::as_object_mut) {
            m.retain(|id, _| audience.may_see(Claim::GpgKey, id));
        }
    }
    Arc::new(out)
}

#[cfg(test)]
mod tests;
