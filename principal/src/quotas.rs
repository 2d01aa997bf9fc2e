//! Tenants' Application quotas on the hub (`quotas.applications` across the tenant's hub
//! namespaces, `quotas.applicationsPerAgent` in one agent's hub namespace; see
//! [`argocd_agent_domain::tenant::Quotas`]).
//!
//! Every Application counts, whoever wrote it: hub-authored ones, autonomous agents' copies
//! and managed agents' app-of-apps children. Objects being deleted and objects labelled
//! ignore-sync do not. Counts come from the principal's watch cache of the hub, so every
//! replica counts the same.
//!
//! - An agent's write of a new Application over a quota is refused like the per-agent bounds
//!   ([`AGENT_APPLICATION_QUOTA`], [`TENANT_APPLICATION_QUOTA`]): an error event to the
//!   agent, `argocd_principal_events_refused_total{agent,reason}`,
//!   `argocd_principal_tenant_quota_refused_total{tenant,quota}` and a log line.
//! - A hub-authored Application cannot be refused (the principal is no admission webhook):
//!   the Applications of a scope are ordered by creation timestamp, then namespace, then
//!   name, and those past the quota that the agent does not hold yet are *held back*: not
//!   sent to the managed agent (one already sent is never held back), with the condition
//!   [`QUOTA_CONDITION`] in the hub copy's `status.conditions`, counted
//!   (`argocd_principal_applications_held_back_total{tenant,quota}`,
//!   `argocd_principal_applications_over_quota{tenant}`) and logged. The order is the same on
//!   every replica. When the count drops (an Application of the scope is deleted, or the
//!   quota raised), held-back Applications are re-evaluated and flow again, their condition
//!   removed.
//!
//! The evaluation runs in the worker of the agent concerned, so a tenant at its quota never
//! slows another tenant's agents.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use argocd_agent_domain::tenant::{Tenant, Tenants};
use argocd_agent_domain::{AgentName, Namespace, TenantName};
use argocd_agent_kubernetes::object::is_being_deleted;
use argocd_agent_kubernetes::{ObjectView, is_sync_ignored};
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::inbound::Refusal;
use crate::refusals::{AGENT_APPLICATION_QUOTA, TENANT_APPLICATION_QUOTA};

/// Condition type on a hub-authored Application held back by a quota. It ends in `Error`,
/// so Argo CD's UI and CLI show it as an error condition.
pub const QUOTA_CONDITION: &str = "QuotaExceededError";

/// Which quota an Application is measured against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaKind {
    /// `applicationsPerAgent`: the Applications of one agent's hub namespace.
    PerAgent,
    /// `applications`: the Applications of all the tenant's hub namespaces.
    Tenant,
}

impl QuotaKind {
    /// The field of the tenant's `quotas`.
    pub fn field(self) -> &'static str {
        match self {
            QuotaKind::PerAgent => "applicationsPerAgent",
            QuotaKind::Tenant => "applications",
        }
    }

    fn refusal_reason(self) -> &'static str {
        match self {
            QuotaKind::PerAgent => AGENT_APPLICATION_QUOTA,
            QuotaKind::Tenant => TENANT_APPLICATION_QUOTA,
        }
    }
}

/// A quota an Application is over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exceeded {
    /// The tenant.
    pub tenant: TenantName,
    /// Which quota.
    pub kind: QuotaKind,
    /// The quota.
    pub limit: u32,
    /// Applications counted in its scope now.
    pub count: usize,
}

impl Exceeded {
    /// The condition message on a held-back hub Application (stable for a given quota, so
    /// re-evaluating does not rewrite it).
    pub fn condition_message(&self, agent: &AgentName) -> String {
        format!(
            "quota exceeded: tenant \"{}\" quotas.{} is {}; this Application is not sent to agent \"{agent}\" until {} holds fewer Applications (the oldest are kept, by creation time then namespace and name)",
            self.tenant,
            self.kind.field(),
            self.limit,
            match self.kind {
                QuotaKind::PerAgent => "the agent's hub namespace",
                QuotaKind::Tenant => "the tenant",
            }
        )
    }
}

/// Whether `obj` counts towards a quota: not being deleted, not excluded from sync.
fn counts(obj: &DynamicObject) -> bool {
    !is_being_deleted(obj) && !is_sync_ignored(obj)
}

type OrderKey = (Option<jiff::Timestamp>, String, String);

fn order_key(obj: &DynamicObject) -> OrderKey {
    (
        obj.metadata.creation_timestamp.as_ref().map(|t| t.0),
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// `obj`'s place among the counted Applications of `scope` (0: the oldest), and how many
/// are counted. `obj` need not be counted itself.
pub fn rank<'a>(
    obj: &DynamicObject,
    scope: impl IntoIterator<Item = &'a Arc<DynamicObject>>,
) -> (usize, usize) {
    let key = order_key(obj);
    let (mut before, mut total) = (0, 0);
    for o in scope.into_iter().filter(|o| counts(o)) {
        total += 1;
        if order_key(o) < key {
            before += 1;
        }
    }
    (before, total)
}

/// Where the hub's Applications are read from: the watch cache (or a list, in tests).
pub trait Apps {
    /// Every Application.
    fn all(&self) -> Vec<Arc<DynamicObject>>;
    /// The Applications of hub namespace `ns`.
    fn in_namespace(&self, ns: &str) -> Vec<Arc<DynamicObject>>;
}

impl Apps for Arc<dyn ObjectView> {
    fn all(&self) -> Vec<Arc<DynamicObject>> {
        self.list()
    }
    fn in_namespace(&self, ns: &str) -> Vec<Arc<DynamicObject>> {
        self.list_namespace(ns)
    }
}

impl Apps for [Arc<DynamicObject>] {
    fn all(&self) -> Vec<Arc<DynamicObject>> {
        self.to_vec()
    }
    fn in_namespace(&self, ns: &str) -> Vec<Arc<DynamicObject>> {
        self.iter()
            .filter(|o| o.metadata.namespace.as_deref() == Some(ns))
            .cloned()
            .collect()
    }
}

/// The Applications in a hub namespace of `tenant`.
fn tenant_scope(cache: &(impl Apps + ?Sized), tenant: &Tenant) -> Vec<Arc<DynamicObject>> {
    cache
        .all()
        .into_iter()
        .filter(|o| {
            o.metadata
                .namespace
                .as_deref()
                .and_then(|ns| Namespace::new(ns).ok())
                .is_some_and(|ns| tenant.owns_namespace(&ns))
        })
        .collect()
}

/// The quotas that apply to the Applications of agent namespace `ns` of `tenant`, with the
/// scope each one counts.
fn scopes(
    cache: &(impl Apps + ?Sized),
    tenant: &Tenant,
    ns: &Namespace,
) -> Vec<(QuotaKind, u32, Vec<Arc<DynamicObject>>)> {
    let q = &tenant.quotas;
    let mut out = Vec::new();
    if let Some(limit) = q.applications_per_agent {
        out.push((QuotaKind::PerAgent, limit, cache.in_namespace(ns.as_str())));
    }
    if let Some(limit) = q.applications {
        out.push((QuotaKind::Tenant, limit, tenant_scope(cache, tenant)));
    }
    out
}

/// Whether the hub Application `obj`, meant for an agent of `tenant` whose hub namespace is
/// `ns`, is past a quota (the first one it is past, per-agent first).
pub fn held_back(
    cache: &(impl Apps + ?Sized),
    tenants: &Tenants,
    tenant: Option<&TenantName>,
    ns: &Namespace,
    obj: &DynamicObject,
) -> Option<Exceeded> {
    let t = tenants.get(tenant?)?;
    scopes(cache, t, ns)
        .into_iter()
        .find_map(|(kind, limit, scope)| {
            let (before, count) = rank(obj, &scope);
            (before >= limit as usize).then(|| Exceeded {
                tenant: t.name.clone(),
                kind,
                limit,
                count,
            })
        })
}

/// Refuses an agent's write of a new Application into `ns` when a quota of its tenant is
/// reached; `pending` counts the agent's new Applications written but not yet in the cache.
pub fn check_new_application(
    cache: &(impl Apps + ?Sized),
    tenants: &Tenants,
    tenant: Option<&TenantName>,
    ns: &Namespace,
    agent: &AgentName,
    name: &str,
    pending: usize,
) -> Result<(), (Exceeded, Refusal)> {
    let Some(t) = tenant.and_then(|t| tenants.get(t)) else {
        return Ok(());
    };
    for (kind, limit, scope) in scopes(cache, t, ns) {
        let count = scope.iter().filter(|o| counts(o)).count() + pending;
        if count < limit as usize {
            continue;
        }
        let exceeded = Exceeded {
            tenant: t.name.clone(),
            kind,
            limit,
            count,
        };
        let message = format!(
            "agent \"{agent}\" of tenant \"{}\": {} holds {count} Applications on the hub, the most quotas.{} ({limit}) allows: application \"{name}\" refused",
            t.name,
            match kind {
                QuotaKind::PerAgent => format!("hub namespace \"{ns}\""),
                QuotaKind::Tenant => "the tenant".to_owned(),
            },
            kind.field(),
        );
        let reason = kind.refusal_reason();
        return Err((
            exceeded,
            Refusal {
                reason,
                metric: reason,
                message,
            },
        ));
    }
    Ok(())
}

/// `status` with the quota condition set to `message` (`Some`) or removed (`None`); `None`
/// when that changes nothing.
pub fn with_condition(status: Option<&Value>, message: Option<&str>) -> Option<Value> {
    let mut status = status.cloned().unwrap_or_else(|| json!({}));
    let obj = status.as_object_mut()?;
    let conditions: Vec<Value> = obj
        .get("conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let ours = |c: &Value| c.get("type").and_then(Value::as_str) == Some(QUOTA_CONDITION);
    let current = conditions
        .iter()
        .find(|c| ours(c))
        .and_then(|c| c.get("message"))
        .and_then(Value::as_str);
    if current == message {
        return None;
    }
    let mut kept: Vec<Value> = conditions.into_iter().filter(|c| !ours(c)).collect();
    if let Some(m) = message {
        kept.push(json!({
            "type": QUOTA_CONDITION,
            "message": m,
            "lastTransitionTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        }));
    }
    if kept.is_empty() {
        obj.remove("conditions");
    } else {
        obj.insert("conditions".into(), Value::Array(kept));
    }
    Some(status)
}

/// The hub Applications held back from each agent (by the key the agent's maps use), and
/// the tenant of each agent that has some.
#[derive(Debug, Default)]
pub struct HeldBack {
    held: Mutex<HeldMap>,
}

/// Each agent's tenant and held-back Application keys.
type HeldMap = HashMap<AgentName, (Option<TenantName>, BTreeSet<String>)>;

impl HeldBack {
    fn lock(&self) -> std::sync::MutexGuard<'_, HeldMap> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `key` as held back from `agent`; `true` when it was not yet.
    pub fn hold(&self, agent: &AgentName, tenant: Option<&TenantName>, key: &str) -> bool {
        let mut held = self.lock();
        let entry = held
            .entry(agent.clone())
            .or_insert_with(|| (tenant.cloned(), BTreeSet::new()));
        entry.1.insert(key.to_owned())
    }

    /// Forgets `key` held back from `agent`; `true` when it was.
    pub fn release(&self, agent: &AgentName, key: &str) -> bool {
        let mut held = self.lock();
        let Some(entry) = held.get_mut(agent) else {
            return false;
        };
        let was = entry.1.remove(key);
        if entry.1.is_empty() {
            held.remove(agent);
        }
        was
    }

    /// Whether `key` is held back from `agent`.
    pub fn is_held(&self, agent: &AgentName, key: &str) -> bool {
        self.lock().get(agent).is_some_and(|e| e.1.contains(key))
    }

    /// Every agent with held-back Applications, its tenant and their keys.
    pub fn snapshot(&self) -> Vec<(AgentName, Option<TenantName>, Vec<String>)> {
        self.lock()
            .iter()
            .map(|(a, (t, keys))| (a.clone(), t.clone(), keys.iter().cloned().collect()))
            .collect()
    }

    /// Held-back Applications of `tenant` (agents connected to this replica).
    pub fn count_of(&self, tenant: &TenantName) -> usize {
        self.lock()
            .values()
            .filter(|(t, _)| t.as_ref() == Some(tenant))
            .map(|(_, k)| k.len())
            .sum()
    }

    /// Whether nothing is held back.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests;
