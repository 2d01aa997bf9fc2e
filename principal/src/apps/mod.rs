//! Applications on the hub and the agents that serve them: routing of hub changes to one
//! worker per agent ([`Applications::route`]), managed and autonomous change handling
//! (`changes`), resync (`resync`), and the writes agents' events cause (`writes`).
//!
//! Managed agents: the hub copy is the source of truth for `.spec`; changes become events in
//! the agent's queue; the agent's status lands in the hub copy's `/status`.
//! Autonomous agents: the agent's copy is the source of truth; hub edits are reverted from
//! the last object the agent sent (`desired`).

mod changes;
pub mod owners;
mod quota;
mod resync;
mod writes;

use argocd_agent_identity::text;
use std::collections::HashMap;
use std::sync::Arc;

use argocd_agent_domain::{AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef};
use argocd_agent_kubernetes::object::{self, is_being_deleted};
use argocd_agent_kubernetes::{AGENT_NAME_LABEL, Change, ObjectStore, ObjectView};
use kube::api::DynamicObject;
use serde_json::Value;

use crate::inbound::OwnerRecord;
use crate::metrics::Metrics;
use crate::projects;
use crate::sessions::{AgentState, Sessions};
use argocd_agent_domain::tenant::Claim;

pub use owners::AppOwners;

/// What the session does after a command was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// Acknowledge the event.
    Ack,
    /// Send nothing (the answer is an event in the agent's queue).
    Silent,
    /// A delete of an object the hub does not have: answered with an error event
    /// `NotFound` naming the event, which the agent takes as done (a delete resent after a
    /// lost acknowledgement ends there too, instead of being retried).
    NotFound,
}

fn app_ref(namespace: &Namespace, name: &str) -> ResourceRef {
    ResourceRef::new(ResourceKind::Application, namespace.clone(), name)
}

/// Wire form of a hub object: server-managed metadata removed, namespace = hub namespace.
fn for_wire(obj: &DynamicObject) -> Arc<Value> {
    let stripped = object::strip_for_transfer(obj);
    Arc::new(serde_json::to_value(&stripped).unwrap_or(Value::Null))
}

/// `spec.destination.name` of an Application.
pub fn destination_of(obj: &DynamicObject) -> Option<&str> {
    obj.data
        .pointer("/spec/destination/name")
        .and_then(Value::as_str)
        .filter(|d| !d.is_empty())
}

/// The reference of a hub Application (its own namespace and name).
fn obj_ref(obj: &DynamicObject) -> Option<ResourceRef> {
    let ns = Namespace::new(obj.metadata.namespace.as_deref()?).ok()?;
    Some(app_ref(&ns, obj.metadata.name.as_deref()?))
}

fn name_of(obj: &DynamicObject) -> String {
    obj.metadata.name.clone().unwrap_or_default()
}

fn value_checksum(v: Option<&Value>) -> String {
    object::checksum_of(v.unwrap_or(&Value::Null))
}

/// Autonomous: an agent's Application as the hub holds it, its project renamed to the hub
/// copy of the agent's project (`<agent>-<project>`).
fn hub_form(agent: &AgentName, app: &Value) -> Value {
    let mut out = app.clone();
    if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut) {
        let project = spec
            .get("project")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let renamed = projects::hub_project_ref(agent, project);
        spec.insert("project".into(), Value::String(renamed));
    }
    out
}

/// A managed agent's spoke-authored Application in the hub form: as the spoke holds it
/// (its project is a hub project already); an autonomous agent's in [`hub_form`].
fn hub_form_in(mode: AgentMode, agent: &AgentName, app: &Value) -> Value {
    match mode {
        AgentMode::Autonomous => hub_form(agent, app),
        AgentMode::Managed => app.clone(),
    }
}

/// Whether `obj` is the read-only hub copy of an Application an app-of-apps parent created
/// on some managed agent's spoke (it carries an agent label and the parent annotation).
pub fn is_spoke_child_copy(obj: &DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(AGENT_NAME_LABEL))
        && obj
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(object::PARENT_ANNOTATION))
}

/// Whether `obj` is a hub copy that `agent` wrote (autonomous mode).
fn written_by(obj: &DynamicObject, agent: &AgentName) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(AGENT_NAME_LABEL))
        .is_some_and(|l| l == agent.as_str())
}

/// Autonomous: the hub copy of the Application `incoming` an agent reports, in its hub
/// namespace `ns`, labelled with the agent. The agent's finalizers and owner references
/// are dropped: they belong to its cluster (an update keeps what the hub copy has).
fn hub_copy_of_agent_app(
    agent: &AgentName,
    mode: AgentMode,
    ns: &Namespace,
    incoming: &Value,
) -> Result<DynamicObject, serde_json::Error> {
    let mut copy = object::received_copy(
        &hub_form_in(mode, agent, incoming),
        ns.as_str(),
        (AGENT_NAME_LABEL, agent.as_str()),
    )?;
    object::drop_foreign_bindings(&mut copy);
    Ok(copy)
}

/// Autonomous: the inverse of [`hub_form`].
fn agent_form(agent: &AgentName, app: &Value) -> Value {
    let mut out = app.clone();
    if let Some(spec) = out.get_mut("spec").and_then(Value::as_object_mut)
        && let Some(project) = spec.get("project").and_then(Value::as_str)
    {
        let original = projects::spoke_project_ref(agent, project).to_owned();
        spec.insert("project".into(), Value::String(original));
    }
    out
}

/// The hub's Applications and what flows between them and the agents.
pub struct Applications {
    /// CloudEvents `source` of events we send (our SPIFFE ID when we have one).
    pub source: String,
    /// Writes the hub's Applications.
    pub apps: Arc<dyn ObjectStore>,
    /// The hub's Applications, watched.
    pub cache: Arc<dyn ObjectView>,
    /// Where hub writes, write errors and queued events are counted.
    pub metrics: Metrics,
    /// Destination-based mapping: a managed agent's Applications are those whose
    /// `spec.destination.name` names it, in any hub namespace.
    pub by_destination: bool,
    /// Which agent serves each Application.
    pub owners: Arc<AppOwners>,
    sessions: Arc<Sessions>,
    /// The tenants in force, for their Application quotas (see [`crate::quotas`]).
    tenants: crate::tenancy::TenantView,
    /// Hub-authored Applications held back from their agents by a quota.
    held: crate::quotas::HeldBack,
}

impl Applications {
    /// The router of the Applications in `cache`, written with `apps`.
    pub fn new(
        source: String,
        apps: Arc<dyn ObjectStore>,
        cache: Arc<dyn ObjectView>,
        metrics: Metrics,
        by_destination: bool,
        sessions: Arc<Sessions>,
        tenants: crate::tenancy::TenantView,
    ) -> Applications {
        Applications {
            owners: Arc::new(AppOwners::new(
                cache.clone(),
                by_destination,
                sessions.clone(),
            )),
            source,
            apps,
            cache,
            metrics,
            by_destination,
            sessions,
            tenants,
            held: Default::default(),
        }
    }

    fn agent(&self, name: &AgentName) -> Option<Arc<AgentState>> {
        self.sessions.agent(name)
    }

    fn agent_for_namespace(&self, ns: &Namespace) -> Option<Arc<AgentState>> {
        self.sessions.agent_for_namespace(ns)
    }

    /// Queues an event for the agent (see [`AgentState::enqueue`]).
    pub(crate) fn push(&self, state: &AgentState, event: Event) {
        state.enqueue(event, &self.metrics);
    }

    /// Key of a managed agent's Application in its maps and resync checksums: the name, or
    /// `<namespace>/<name>` with destination-based mapping (an agent's Applications may then
    /// live in several hub namespaces; `/` never occurs in names).
    pub(crate) fn app_key(&self, obj: &DynamicObject) -> String {
        let name = name_of(obj);
        if self.by_destination {
            format!(
                "{}/{name}",
                obj.metadata.namespace.as_deref().unwrap_or_default()
            )
        } else {
            name
        }
    }

    /// The reference a key of [`Hub::app_key`] stands for.
    pub(crate) fn key_ref(&self, ns: &Namespace, key: &str) -> Option<ResourceRef> {
        match key.split_once('/') {
            Some((kns, name)) if self.by_destination => {
                Some(app_ref(&Namespace::new(kns).ok()?, name))
            }
            Some(_) => None,
            None => Some(app_ref(ns, key)),
        }
    }

    /// Whether the Applications of `state` are chosen by destination rather than namespace.
    pub(crate) fn routes_by_destination(&self, state: &AgentState) -> bool {
        self.by_destination && state.mode() == AgentMode::Managed
    }

    /// A managed agent's hub Applications by key: those in its hub namespace, or with
    /// destination-based mapping those whose destination names it.
    pub(crate) fn managed_objects(
        &self,
        state: &AgentState,
    ) -> HashMap<String, Arc<DynamicObject>> {
        // Spoke-authored children come from the agents; they are never sent down.
        if !self.routes_by_destination(state) {
            let mut objects = self.hub_objects(&state.namespace());
            objects.retain(|_, o| !is_spoke_child_copy(o));
            return objects;
        }
        let partition = &self.sessions.partition;
        let rules = self.tenants.current();
        let tenant = state.identity().tenant;
        self.cache
            .list()
            .into_iter()
            .filter(|o| !argocd_agent_kubernetes::is_sync_ignored(o) && !is_spoke_child_copy(o))
            .filter(|o| {
                o.metadata.namespace.as_deref().is_some_and(|ns| {
                    partition.allows_namespace(ns)
                        && rules
                            .tenants()
                            .visible_to(Claim::Namespace, ns, tenant.as_ref())
                })
            })
            .filter(|o| destination_of(o) == Some(state.name.as_str()))
            .map(|o| (self.app_key(&o), o))
            .collect()
    }

    /// Hub objects of one namespace by name.
    pub fn hub_objects(&self, ns: &Namespace) -> HashMap<String, Arc<DynamicObject>> {
        self.cache
            .list_namespace(ns.as_str())
            .into_iter()
            .filter(|o| !argocd_agent_kubernetes::is_sync_ignored(o))
            .map(|o| (name_of(&o), o))
            .collect()
    }

    /// What the hub records about the owner of the Application an event would write: the
    /// agent label of the hub copy, if there is one.
    pub fn owner_record(&self, resource: &ResourceRef) -> OwnerRecord {
        match self
            .cache
            .get(Some(resource.namespace.as_str()), &resource.name)
        {
            None => OwnerRecord::Absent,
            Some(o) => match o
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(AGENT_NAME_LABEL))
            {
                Some(l) => OwnerRecord::Label(l.clone()),
                None => OwnerRecord::Unlabelled,
            },
        }
    }

    /// Queues the current hub copy of `resource` for the agent (a delete when it is gone).
    pub fn send_current(&self, state: &AgentState, resource: ResourceRef) {
        let event = match self
            .cache
            .get(Some(resource.namespace.as_str()), &resource.name)
        {
            Some(obj) if self.oversized(state, &resource, &obj) => return,
            Some(obj) if !is_being_deleted(&obj) => Event::resource(
                &self.source,
                EventType::SpecUpdate,
                resource,
                self.managed_wire(&obj),
            ),
            _ => Event::resource(&self.source, EventType::Delete, resource, Payload::None),
        };
        self.push(state, event);
    }

    /// Whether `obj` is cached as a stub (an agent-written object over the size bound,
    /// written before the bound existed): it is never sent; counted and logged.
    fn oversized(
        &self,
        state: &AgentState,
        resource: &ResourceRef,
        obj: &Arc<DynamicObject>,
    ) -> bool {
        if !self.cache.is_stub(obj) {
            return false;
        }
        let size = self.cache.object_size(obj);
        self.metrics
            .refused(&state.name, crate::refusals::OBJECT_TOO_LARGE);
        tracing::warn!(%resource, size, "hub object over the object size bound: not sent to the agent");
        true
    }

    pub(crate) fn push_delete(&self, state: &AgentState, resource: ResourceRef) {
        self.push(
            state,
            Event::resource(&self.source, EventType::Delete, resource, Payload::None),
        );
    }

    /// Wire form of a hub object for a managed agent: [`for_wire`] plus the hub UID
    /// (`argocd.argoproj.io/source-uid`), without `.status`, which the agent never takes
    /// (its copy's status is the spoke's own). The queued event shares the watch cache's
    /// copy; its JSON is written when the first event of this version is sent and kept
    /// with the version in the cache, so every agent, resend and resync that sends the
    /// same version sends the same bytes.
    fn managed_wire(&self, obj: &Arc<DynamicObject>) -> Payload {
        Payload::Lazy(self.cache.managed_json(obj))
    }

    pub(crate) fn push_spec(&self, state: &AgentState, obj: &Arc<DynamicObject>) {
        let Some(resource) = obj_ref(obj) else { return };
        if self.oversized(state, &resource, obj) {
            return;
        }
        self.push(
            state,
            Event::resource(
                &self.source,
                EventType::SpecUpdate,
                resource,
                self.managed_wire(obj),
            ),
        );
    }

    /// Hands one hub change to the worker of the agent that owns its namespace.
    pub fn route(&self, change: Change) {
        let (obj, what) = match &change {
            Change::Applied(o) => (o, "applied"),
            Change::Deleted(o) => (o, "deleted"),
            Change::Synced => return,
        };
        // The root of a hub change's trace; the inbox keeps it as the handling's parent.
        let span = tracing::info_span!(parent: None, "principal.route",
            "object.kind" = ResourceKind::Application.as_str(),
            "object.namespace" = obj.metadata.namespace.as_deref().unwrap_or_default(),
            "object.name" = obj.metadata.name.as_deref().unwrap_or_default(),
            change = what);
        let _entered = span.enter();
        let Some(ns) = obj
            .metadata
            .namespace
            .as_deref()
            .and_then(|n| Namespace::new(n).ok())
        else {
            return;
        };
        if matches!(change, Change::Deleted(_)) || is_being_deleted(obj) {
            self.recheck_held_back(obj);
        }
        let by_namespace = self.agent_for_namespace(&ns);
        // A spoke-authored child goes to the agent that wrote it (to revert hub edits), by
        // namespace whatever the mapping, and never to the agent its destination names.
        if is_spoke_child_copy(obj) {
            if let Some(state) = by_namespace.filter(|s| written_by(obj, &s.name)) {
                state.push_change(ResourceKind::Application, name_of(obj), change);
            }
            return;
        }
        if !self.by_destination
            || by_namespace
                .as_ref()
                .is_some_and(|s| s.mode() == AgentMode::Autonomous)
        {
            if let Some(state) = by_namespace {
                state.push_change(ResourceKind::Application, name_of(obj), change);
            }
            return;
        }
        self.route_by_destination(ns, change);
    }

    /// Destination-based mapping: the Application goes to the managed agent its destination
    /// names; when that changes, the previous agent gets a deletion.
    pub(crate) fn route_by_destination(&self, ns: Namespace, change: Change) {
        let (obj, deleted) = match &change {
            Change::Applied(o) => (o.clone(), false),
            Change::Deleted(o) => (o.clone(), true),
            Change::Synced => return,
        };
        let key = (ns.to_string(), name_of(&obj));
        let rules = self.tenants.current();
        let target = if deleted {
            None
        } else {
            destination_of(&obj)
                .and_then(|d| AgentName::new(d).ok())
                .and_then(|d| self.agent(&d))
                .filter(|s| s.mode() == AgentMode::Managed)
                // A tenant's namespace sends to that tenant's agents only.
                .filter(|s| {
                    let visible = rules.tenants().visible_to(
                        Claim::Namespace,
                        ns.as_str(),
                        s.identity().tenant.as_ref(),
                    );
                    if !visible {
                        tracing::warn!(application = %name_of(&obj), namespace = %ns, agent = %s.name,
                            "destination names an agent of another tenant than the namespace's: not sent");
                    }
                    visible
                })
        };
        let previous = {
            let mut placements = self.owners.placements();
            match &target {
                Some(t) => placements.insert(key.clone(), t.name.clone()),
                None => placements.remove(&key),
            }
        };
        let app_key = self.app_key(&obj);
        if let Some(prev) = previous.filter(|p| target.as_ref().is_none_or(|t| &t.name != p))
            && let Some(prev_state) = self.agent(&prev)
        {
            tracing::info!(application = %app_key, from = %prev, to = %text::or_dash(target.as_ref().map(|t| &t.name)),
                "destination changed: deleting the application on the previous agent");
            prev_state.push_change(
                ResourceKind::Application,
                app_key.clone(),
                Change::Deleted(obj.clone()),
            );
        }
        if let Some(t) = target {
            t.push_change(ResourceKind::Application, app_key, change);
        }
    }
}

/// Span `principal.hub_write` around one write to the hub's API server.
fn hub_write_span(op: &'static str, resource: &ResourceRef) -> tracing::Span {
    tracing::info_span!(
        "principal.hub_write",
        op,
        "object.kind" = resource.kind.as_str(),
        "object.namespace" = resource.namespace.as_str(),
        "object.name" = resource.name.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hub_copy_of_an_agent_app_drops_its_finalizers_and_owners() {
        let agent = AgentName::new("edge-7").unwrap();
        let ns = Namespace::new("argocd-edge-7").unwrap();
        let incoming = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {
                "name": "guestbook", "namespace": "argocd",
                "finalizers": ["resources-finalizer.argocd.argoproj.io", "example.com/block-forever"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
                                     "uid": "0f6e7c3a-0000-0000-0000-000000000000"}],
                "labels": {"team": "a"}
            },
            "spec": {"project": "default"}
        });
        let copy = hub_copy_of_agent_app(&agent, AgentMode::Autonomous, &ns, &incoming).unwrap();
        assert_eq!(copy.metadata.finalizers, None);
        assert_eq!(copy.metadata.owner_references, None);
        assert_eq!(copy.metadata.namespace.as_deref(), Some("argocd-edge-7"));
        let labels = copy.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("team").map(String::as_str), Some("a"));
        assert_eq!(
            labels.get(AGENT_NAME_LABEL).map(String::as_str),
            Some("edge-7")
        );
        assert_eq!(copy.data["spec"]["project"], json!("edge-7-default"));
    }
}
