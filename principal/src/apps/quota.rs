//! Managed agents' hub-authored Applications past a tenant's quota: held back, marked with
//! a condition, released when the count drops (see [`crate::quotas`]).

use std::collections::HashSet;
use std::sync::Arc;

use argocd_agent_domain::{Namespace, ResourceKind};
use argocd_agent_kubernetes::Change;
use argocd_agent_kubernetes::object::{self, is_being_deleted};
use kube::api::DynamicObject;
use tracing::Instrument;

use super::{Applications, hub_write_span, obj_ref};
use crate::error::chain;
use crate::quotas::{self, Exceeded};
use crate::sessions::AgentState;

impl Applications {
    /// The quota the hub Application `obj` of the managed agent `state` is past, if any.
    pub(crate) fn quota_verdict(
        &self,
        state: &AgentState,
        obj: &DynamicObject,
    ) -> Option<Exceeded> {
        let identity = state.identity();
        let tenant = identity.tenant.as_ref()?;
        let rules = self.tenants.current();
        let ns = obj
            .metadata
            .namespace
            .as_deref()
            .and_then(|n| Namespace::new(n).ok())?;
        quotas::held_back(&self.cache, rules.tenants(), Some(tenant), &ns, obj)
    }

    /// Managed agent, hub change of a hub-authored Application: `true` when it is held back
    /// by a quota (nothing is sent; the condition is written once, counted and logged).
    /// An Application within its quotas again loses the condition and is sent as usual.
    /// One already sent to the agent is never held back (so the steady state, status
    /// updates included, costs no count).
    pub(crate) async fn hold_back(&self, state: &AgentState, obj: &Arc<DynamicObject>) -> bool {
        if is_being_deleted(obj) {
            return false;
        }
        let key = self.app_key(obj);
        if state.inner().has_sent_spec(&key) && !self.held.is_held(&state.name, &key) {
            return false;
        }
        let verdict = self.quota_verdict(state, obj);
        let Some(exceeded) = verdict else {
            if self.held.release(&state.name, &key) {
                tracing::info!(agent = %state.name, application = %key,
                    "application within its tenant's quotas again: sent to the agent");
                self.set_quota_condition(obj, None).await;
                self.update_over_quota_gauge(state);
            }
            return false;
        };
        let message = exceeded.condition_message(&state.name);
        if self.held.hold(&state.name, Some(&exceeded.tenant), &key) {
            self.metrics
                .quota
                .held_back
                .get_or_create(&crate::metrics::QuotaLabels {
                    tenant: exceeded.tenant.to_string(),
                    quota: exceeded.kind.field().into(),
                })
                .inc();
            tracing::warn!(agent = %state.name, application = %key, tenant = %exceeded.tenant,
                quota = exceeded.kind.field(), limit = exceeded.limit, count = exceeded.count,
                "hub application past its tenant's quota: held back from the agent");
            self.update_over_quota_gauge(state);
        }
        self.set_quota_condition(obj, Some(&message)).await;
        true
    }

    fn update_over_quota_gauge(&self, state: &AgentState) {
        if let Some(t) = state.identity().tenant {
            self.metrics
                .quota
                .over_quota
                .get_or_create(&crate::metrics::TenantLabels {
                    tenant: t.to_string(),
                })
                .set(self.held.count_of(&t) as i64);
        }
    }

    /// Writes (or removes, `None`) the quota condition in the hub copy's status, when that
    /// changes it.
    async fn set_quota_condition(&self, obj: &DynamicObject, message: Option<&str>) {
        let Some(resource) = obj_ref(obj) else { return };
        let ns = Some(resource.namespace.as_str());
        let current = self.cache.get(ns, &resource.name);
        let status = current
            .as_deref()
            .and_then(object::status)
            .or(object::status(obj));
        let Some(status) = quotas::with_condition(status, message) else {
            return;
        };
        if let Err(e) = self
            .apps
            .replace_status(ns, &resource.name, status)
            .instrument(hub_write_span("status", &resource))
            .await
        {
            self.metrics.hub_write_errors.inc();
            tracing::warn!(%resource, error = %chain(&e), "could not write the quota condition");
        }
    }

    /// Resync of a managed agent: drops the Applications past a quota that the agent does
    /// not hold (`holds`) from `objects`, and hands each to the agent's worker, which marks
    /// it. Returns their keys.
    pub(crate) fn split_held_back(
        &self,
        state: &AgentState,
        objects: &mut std::collections::HashMap<String, Arc<DynamicObject>>,
        holds: impl Fn(&str) -> bool,
    ) -> HashSet<String> {
        if state.identity().tenant.is_none() {
            return HashSet::new();
        }
        let over: HashSet<String> = objects
            .iter()
            .filter(|(k, o)| {
                !holds(k) && !is_being_deleted(o) && self.quota_verdict(state, o).is_some()
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &over {
            if let Some(o) = objects.remove(key) {
                state.push_change(ResourceKind::Application, key.clone(), Change::Applied(o));
            }
        }
        over
    }

    /// An Application left (deleted, or being deleted): the held-back Applications of the
    /// agents it may have counted against (same hub namespace, or same tenant) are
    /// re-evaluated in their workers.
    pub(crate) fn recheck_held_back(&self, gone: &DynamicObject) {
        if self.held.is_empty() {
            return;
        }
        let Some(ns) = gone.metadata.namespace.as_deref() else {
            return;
        };
        let rules = self.tenants.current();
        let owner = Namespace::new(ns).ok().and_then(|n| {
            rules
                .tenants()
                .iter()
                .find(|t| t.owns_namespace(&n))
                .map(|t| t.name.clone())
        });
        for (agent, tenant, keys) in self.held.snapshot() {
            let Some(state) = self.agent(&agent) else {
                continue;
            };
            let same_tenant = owner.is_some() && tenant == owner;
            if !same_tenant && state.namespace().as_str() != ns {
                continue;
            }
            self.requeue(&state, keys);
        }
    }

    fn requeue(&self, state: &AgentState, keys: impl IntoIterator<Item = String>) {
        let ns = state.namespace();
        for key in keys {
            let Some(r) = self.key_ref(&ns, &key) else {
                continue;
            };
            if let Some(o) = self.cache.get(Some(r.namespace.as_str()), &r.name) {
                state.push_change(ResourceKind::Application, key, Change::Applied(o));
            }
        }
    }

    /// The rules were reloaded (quotas may have changed): every held-back Application is
    /// re-evaluated in its agent's worker.
    pub fn quotas_reloaded(&self) {
        for (agent, _, keys) in self.held.snapshot() {
            if let Some(state) = self.agent(&agent) {
                self.requeue(&state, keys);
            }
        }
    }
}
