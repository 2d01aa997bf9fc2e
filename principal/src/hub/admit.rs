//! The hub side of [`crate::bounds`]: what an agent holds on the hub, and the check of an
//! authorized command against its bounds, its tenant's Application quotas and the rules for
//! a managed agent's spoke-authored children, before the command is applied.

use argocd_agent_identity::text;
use std::sync::Arc;

use argocd_agent_domain::{AgentMode, AgentName, Event, Namespace, ResourceKind, ResourceRef};
use argocd_agent_kubernetes::Change;
use argocd_agent_kubernetes::object::{self, is_being_deleted, value_weight};
use kube::api::DynamicObject;
use serde_json::Value;

use super::Hub;
use crate::apps::is_spoke_child_copy;
use crate::bounds::{
    Admitted, Holdings, agent_written, check_holdings, check_not_ignored, check_object_size,
    labelled_by, tracks_child,
};
use crate::inbound::{Command, Refusal};
use crate::refusals::{CHILD_NOT_TRACKED, PARENT_NOT_FOUND, PARENT_NOT_HELD, PROJECT_NOT_ALLOWED};
use crate::sessions::AgentState;

impl Hub {
    /// What the agent wrote on the hub, by the watch caches (Applications labelled with it
    /// in its namespace, its AppProject copies) and its writes of the last moments.
    pub fn holdings(&self, agent: &AgentName, ns: &Namespace) -> Holdings {
        let cache = &self.apps.cache;
        let mut held: Holdings = cache
            .list_namespace(ns.as_str())
            .into_iter()
            .filter(|o| labelled_by(o, agent))
            .map(|o| {
                let name = o.metadata.name.clone().unwrap_or_default();
                ((ResourceKind::Application, name), cache.object_size(&o))
            })
            .collect();
        let projects = &self.config.config.projects;
        let prefix = format!("{agent}-");
        for p in projects.list_namespace(self.config.config.namespace.as_str()) {
            let name = p.metadata.name.as_deref().unwrap_or_default();
            if let (true, Some(spoke)) = (labelled_by(&p, agent), name.strip_prefix(&prefix)) {
                held.insert(
                    (ResourceKind::AppProject, spoke.to_owned()),
                    projects.object_size(&p),
                );
            }
        }
        self.ledger.overlay(agent, &mut held);
        held
    }

    /// Checks an authorized command against the agent's bounds (and a managed agent's
    /// child against the children rules) before it is applied. `Ok(Some)`: record it once
    /// applied.
    pub fn admit(
        &self,
        state: &AgentState,
        event: &Event,
        command: &Command,
    ) -> Result<Option<Admitted>, Refusal> {
        let agent = &state.name;
        let bounds = &self.shared.bounds;
        if let (Some(obj), Some(resource)) = (event.object(), &event.resource) {
            check_object_size(bounds, agent, resource, value_weight(obj))?;
        }
        match command {
            Command::Upsert { resource, object } => {
                check_not_ignored(agent, resource, object)?;
                if state.mode() == AgentMode::Managed && resource.kind == ResourceKind::Application
                {
                    self.check_child(state, &resource.name, object)?;
                }
                let size = value_weight(object);
                let key = (resource.kind, resource.name.clone());
                let holdings = self.holdings(agent, &state.namespace());
                check_holdings(bounds, agent, &key, size, &holdings)?;
                if resource.kind == ResourceKind::Application && !holdings.contains_key(&key) {
                    self.check_application_quota(state, resource, &holdings)?;
                }
                Ok(Some(Admitted {
                    key,
                    size: Some(size),
                }))
            }
            Command::WriteStatus {
                resource, status, ..
            } => self.admit_status(state, resource, status),
            Command::Delete { resource } => Ok(Some(Admitted {
                key: (resource.kind, resource.name.clone()),
                size: None,
            })),
            Command::ResendCurrent { .. } => Ok(None),
        }
    }

    /// A new Application an agent writes on the hub: refused when its tenant's quotas
    /// (`applicationsPerAgent`, `applications`) are reached, counting every Application of
    /// the scope (see [`crate::quotas`]) and the agent's writes the watch has not seen yet.
    fn check_application_quota(
        &self,
        state: &AgentState,
        resource: &ResourceRef,
        holdings: &Holdings,
    ) -> Result<(), Refusal> {
        let identity = state.identity();
        if identity.tenant.is_none()
            || self
                .apps
                .cache
                .get(Some(resource.namespace.as_str()), &resource.name)
                .is_some()
        {
            return Ok(());
        }
        let ns = identity.namespace.as_str();
        let pending = holdings
            .keys()
            .filter(|(k, n)| {
                *k == ResourceKind::Application && self.apps.cache.get(Some(ns), n).is_none()
            })
            .count();
        let rules = self.config.tenants.current();
        crate::quotas::check_new_application(
            &self.apps.cache,
            rules.tenants(),
            identity.tenant.as_ref(),
            &resource.namespace,
            &state.name,
            &resource.name,
            pending,
        )
        .map_err(|(exceeded, refusal)| {
            self.shared.metrics
                .tenant_quota_refused(exceeded.tenant.as_str(), exceeded.kind.field());
            tracing::warn!(agent = %state.name, tenant = %exceeded.tenant, quota = exceeded.kind.field(),
                limit = exceeded.limit, count = exceeded.count, application = %resource.name,
                "new application over the tenant's quota refused");
            refusal
        })
    }

    /// A status written onto an Application the agent wrote counts in its bytes.
    fn admit_status(
        &self,
        state: &AgentState,
        resource: &ResourceRef,
        status: &Value,
    ) -> Result<Option<Admitted>, Refusal> {
        let cache = &self.apps.cache;
        let Some(cur) = cache
            .get(Some(resource.namespace.as_str()), &resource.name)
            .filter(|o| labelled_by(o, &state.name))
        else {
            return Ok(None);
        };
        let old_status = object::status(&cur).map_or(0, value_weight);
        let size = (cache.object_size(&cur) + value_weight(status)).saturating_sub(old_status);
        let key = (ResourceKind::Application, resource.name.clone());
        let holdings = self.holdings(&state.name, &state.namespace());
        check_holdings(&self.shared.bounds, &state.name, &key, size, &holdings)?;
        Ok(Some(Admitted {
            key,
            size: Some(size),
        }))
    }

    /// The hub Application named `parent` that the hub sends the managed agent `state`
    /// (`Err`: the refusal), with destination-based mapping wherever it lives.
    fn held_parent(
        &self,
        state: &AgentState,
        child: &str,
        parent: &str,
    ) -> Result<Arc<DynamicObject>, Refusal> {
        let ns = state.namespace();
        let found = if self.apps.routes_by_destination(state) {
            let own = self.apps.cache.get(Some(ns.as_str()), parent);
            own.or_else(|| {
                self.apps
                    .managed_objects(state)
                    .into_values()
                    .find(|o| o.metadata.name.as_deref() == Some(parent))
            })
        } else {
            self.apps.cache.get(Some(ns.as_str()), parent)
        };
        let agent = &state.name;
        let Some(found) = found else {
            return Err(Refusal {
                reason: "Forbidden",
                metric: PARENT_NOT_FOUND,
                message: format!(
                    "agent \"{agent}\" sent child application \"{child}\" of parent \"{parent}\", which is no Application on the hub"
                ),
            });
        };
        let sent = !agent_written(&found)
            && !is_spoke_child_copy(&found)
            && !is_being_deleted(&found)
            && (!self.apps.routes_by_destination(state)
                || crate::apps::destination_of(&found) == Some(agent.as_str()));
        if !sent {
            return Err(Refusal {
                reason: "Forbidden",
                metric: PARENT_NOT_HELD,
                message: format!(
                    "agent \"{agent}\" sent child application \"{child}\" of parent \"{parent}\", which is not an Application the hub sends this agent"
                ),
            });
        }
        Ok(found)
    }

    /// A managed agent's spoke-authored child (`object`, named `child`): its parent must be
    /// an Application the hub sends this agent, its project one the hub sends this agent,
    /// and the parent's status must list it (see the module docs).
    pub fn check_child(
        &self,
        state: &AgentState,
        child: &str,
        object: &Value,
    ) -> Result<(), Refusal> {
        let parent_name =
            object::annotation_of(object, object::PARENT_ANNOTATION).unwrap_or_default();
        let parent = self.held_parent(state, child, parent_name)?;
        let agent = &state.name;
        let project = object
            .pointer("/spec/project")
            .and_then(Value::as_str)
            .filter(|p| !p.is_empty())
            .unwrap_or(crate::projects::DEFAULT_PROJECT);
        if !self.config.sends_project(state, project) {
            return Err(Refusal {
                reason: "Forbidden",
                metric: PROJECT_NOT_ALLOWED,
                message: format!(
                    "agent \"{agent}\" sent child application \"{child}\" in project \"{project}\", which the hub does not send this agent"
                ),
            });
        }
        if !tracks_child(&parent, child) {
            return Err(Refusal {
                reason: argocd_agent_domain::event::REASON_UNAVAILABLE,
                metric: CHILD_NOT_TRACKED,
                message: format!(
                    "agent \"{agent}\" sent child application \"{child}\", which the status of its parent \"{parent_name}\" on the hub does not list (yet): resend later"
                ),
            });
        }
        Ok(())
    }

    /// Hands a hub change of an Application to the agent's handling, except the hub edit or
    /// deletion of a spoke-authored child that is no longer a child by the rules (its parent
    /// gone or no longer tracking it, its project no longer sent): that one is not reverted
    /// and the agent's copy of it is forgotten.
    pub(crate) async fn on_app_change(&self, state: &AgentState, change: Change) {
        if let Change::Applied(obj) | Change::Deleted(obj) = &change
            && state.mode() == AgentMode::Managed
            && is_spoke_child_copy(obj)
            && labelled_by(obj, &state.name)
        {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let desired = state.inner().desired_app(&name);
            if let Some(desired) = desired
                && let Err(r) = self.check_child(state, &name, &desired)
            {
                state.inner().forget_desired_app(&name);
                self.shared.metrics.refused(&state.name, r.metric);
                tracing::warn!(application = %name, reason = r.metric, message = %text::quoted(&r.message),
                    "hub change of an application that is no longer a child: not reverted");
                return;
            }
        }
        self.apps.on_hub_change(state, change).await;
    }
}
