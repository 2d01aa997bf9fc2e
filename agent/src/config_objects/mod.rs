//! Argo CD's configuration objects on the spoke: AppProjects, repository Secrets and the
//! GPG keys ConfigMap.
//!
//! Managed: the principal sends the set this agent must hold; the agent writes each copy
//! (labelled [`MANAGED_LABEL`]), reverts local edits and deletions of those copies, and
//! deletes them when told. Objects without the label are local and left alone, except that a
//! copy from the principal replaces (adopts) a local object of the same name.
//! Autonomous: the agent's own AppProjects are published to the principal; repositories
//! and GPG keys stay local.

use std::collections::HashMap;
use std::sync::Arc;

use argocd_agent_domain::{AgentMode, Namespace, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef};
use argocd_agent_kubernetes::object::{self, content_checksum, is_being_deleted};
use argocd_agent_kubernetes::{Change, Kind};
use argocd_agent_proto::eventstream::ResourceChecksum;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::error::SpokeError;
use crate::managed::{MANAGED_LABEL, is_managed_copy, lock, name_of, restore, source_uid};
use crate::spoke::Spoke;

/// The configuration kinds and what the agent knows of their objects.
pub mod kinds;

pub use kinds::{ConfigKind, ConfigKinds, REPOSITORY_SELECTOR, kinds_for};

fn as_value(obj: &DynamicObject) -> Value {
    serde_json::to_value(object::strip_for_transfer(obj)).unwrap_or(Value::Null)
}

fn checksum(kind: ResourceKind, obj: &Value) -> String {
    content_checksum(Kind::from(kind), obj)
}

/// What an event about a configuration object asks of the spoke.
#[derive(Debug, Clone, PartialEq)]
enum ConfigCommand {
    Upsert(Arc<Value>),
    Delete,
    Republish,
}

/// Decides what an event from the principal about a configuration object means for a spoke
/// in `mode` whose hub namespace is `hub_ns`, without side effects.
fn plan_config(
    mode: AgentMode,
    hub_ns: Option<&Namespace>,
    event: &Event,
    resource: &ResourceRef,
) -> Result<ConfigCommand, SpokeError> {
    if Some(&resource.namespace) != hub_ns {
        return Err(SpokeError::WrongNamespace(resource.to_string()));
    }
    if !kinds_for(mode).contains(&resource.kind) {
        return Err(SpokeError::NotAccepted { ty: event.ty, mode });
    }
    match (mode, event.ty) {
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate) => {
            let obj = event.object().cloned().unwrap_or_default();
            if obj.pointer("/metadata/name").and_then(Value::as_str) != Some(resource.name.as_str())
            {
                return Err(SpokeError::NameMismatch(resource.name.clone()));
            }
            Ok(ConfigCommand::Upsert(obj))
        }
        (AgentMode::Managed, EventType::Delete) => Ok(ConfigCommand::Delete),
        (AgentMode::Autonomous, EventType::RequestUpdate) => Ok(ConfigCommand::Republish),
        (mode, ty) => Err(SpokeError::NotAccepted { ty, mode }),
    }
}

impl Spoke {
    fn config_objects(&self, kind: ResourceKind) -> Vec<Arc<DynamicObject>> {
        let Some(k) = self.config.get(kind) else {
            return Vec::new();
        };
        k.cache
            .list_namespace(self.namespace.as_str())
            .into_iter()
            .filter(|o| !argocd_agent_kubernetes::is_sync_ignored(o) && !is_being_deleted(o))
            .filter(|o| self.mode == AgentMode::Autonomous || is_managed_copy(o))
            .collect()
    }

    /// Checksums of the configuration objects this agent holds, for the hello: managed
    /// agents report the copies they received, autonomous agents their own projects.
    pub fn config_checksums(&self) -> Vec<ResourceChecksum> {
        let mut out = Vec::new();
        for &kind in kinds_for(self.mode) {
            for o in self.config_objects(kind) {
                out.push(ResourceChecksum {
                    kind: kind.as_str().to_owned(),
                    name: name_of(&o),
                    spec_checksum: checksum(kind, &as_value(&o)),
                    version: String::new(),
                    source_uid: source_uid(&o).unwrap_or_default(),
                    status_checksum: String::new(),
                });
            }
        }
        out
    }

    /// After a restart, the local managed copies are the best knowledge of what the
    /// principal wants until resync says otherwise.
    pub(crate) fn seed_config_desired(&self) {
        if self.mode != AgentMode::Managed {
            return;
        }
        for &kind in kinds_for(self.mode) {
            for o in self.config_objects(kind) {
                lock(&self.config.desired)
                    .entry((kind, name_of(&o)))
                    .or_insert_with(|| Arc::new(as_value(&o)));
            }
        }
    }

    /// Autonomous: local projects the principal cannot know from the hello (changed while
    /// the handshake was in flight).
    pub(crate) fn publish_config_changed_since_hello(&self, said: &[ResourceChecksum]) {
        for &kind in kinds_for(self.mode) {
            let local = self.config_objects(kind);
            let said_of_kind: HashMap<&str, &str> = said
                .iter()
                .filter(|r| r.kind == kind.as_str())
                .map(|r| (r.name.as_str(), r.spec_checksum.as_str()))
                .collect();
            for o in &local {
                let name = name_of(o);
                if said_of_kind.get(name.as_str()).copied()
                    != Some(checksum(kind, &as_value(o)).as_str())
                {
                    self.publish_config(kind, o);
                }
            }
            for name in said_of_kind.keys() {
                if !local.iter().any(|o| name_of(o) == *name) {
                    self.push_config_delete(kind, name);
                }
            }
        }
    }

    /// Managed: the configuration objects the principal sent that this spoke holds.
    pub(crate) fn desired_config_keys(&self) -> Vec<(ResourceKind, String)> {
        lock(&self.config.desired).keys().cloned().collect()
    }

    /// Forgets what was published (after a reconnect everything is compared again).
    pub(crate) fn reset_published_config(&self) {
        lock(&self.config.published).clear();
    }

    /// Handles one event from the principal about a configuration object.
    pub(crate) async fn on_config_event(
        &self,
        event: &Event,
        resource: &ResourceRef,
    ) -> Option<Event> {
        let result = match plan_config(self.mode, self.hub_namespace().as_ref(), event, resource) {
            Ok(ConfigCommand::Republish) => {
                self.republish_config(resource.kind, &resource.name);
                return None;
            }
            Ok(ConfigCommand::Upsert(obj)) => match self.guard_config(resource.kind, obj) {
                Ok(obj) => {
                    let result = self.apply_config_upsert(resource, obj).await;
                    if result.is_ok() {
                        self.guard_accepted_config(resource.kind, &resource.name);
                    }
                    result
                }
                Err(refusal) => return Some(self.refuse_config_event(event, resource, refusal)),
            },
            Ok(ConfigCommand::Delete) => {
                if resource.kind == ResourceKind::GpgKeys
                    && let Err(refusal) = self.guard.current().check_configmap(&resource.name)
                {
                    return Some(self.refuse_config_event(event, resource, refusal));
                }
                lock(&self.config.desired).remove(&(resource.kind, resource.name.clone()));
                self.delete_config(resource.kind, &resource.name).await
            }
            Err(e) => Err(e),
        };
        Some(self.answer(event, resource, result))
    }

    async fn apply_config_upsert(
        &self,
        resource: &ResourceRef,
        obj: Arc<Value>,
    ) -> Result<(), SpokeError> {
        // Set before a recreate deletes the local copy (see `Spoke::apply`): a revert of
        // that deletion must restore this object, not the previous one.
        let key = (resource.kind, resource.name.clone());
        let previous = lock(&self.config.desired).insert(key.clone(), obj.clone());
        if let Some(k) = self.config.get(resource.kind) {
            let local = k.cache.get(Some(self.namespace.as_str()), &resource.name);
            if let Err(e) = self.prepare_write(k.resources.as_ref(), local, &obj).await {
                restore(&mut lock(&self.config.desired), key, previous);
                return Err(e);
            }
        }
        self.upsert_config(resource.kind, &obj).await
    }

    async fn upsert_config(&self, kind: ResourceKind, incoming: &Value) -> Result<(), SpokeError> {
        let Some(k) = self.config.get(kind) else {
            return Err(SpokeError::NotAccepted {
                ty: EventType::SpecUpdate,
                mode: self.mode,
            });
        };
        let copy =
            object::received_copy(incoming, self.namespace.as_str(), (MANAGED_LABEL, "true"))
                .map_err(SpokeError::NotAnObject)?;
        if name_of(&copy).is_empty() {
            return Err(SpokeError::NoName);
        }
        k.resources
            .upsert_copy(&copy, Kind::from(kind).content_fields())
            .await?;
        Ok(())
    }

    /// Deletes a copy received from the principal; local objects without the label stay.
    async fn delete_config(&self, kind: ResourceKind, name: &str) -> Result<(), SpokeError> {
        let Some(k) = self.config.get(kind) else {
            return Ok(());
        };
        let ns = Some(self.namespace.as_str());
        match k.resources.get(ns, name).await? {
            Some(o) if is_managed_copy(&o) => match k.resources.delete(ns, name).await {
                Ok(_) => Ok(()),
                Err(e) if e.is_not_found() => Ok(()),
                Err(e) => Err(e.into()),
            },
            _ => Ok(()),
        }
    }

    /// Handles a change of a local configuration object.
    pub async fn on_local_config_change(&self, kind: ResourceKind, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        if obj.metadata.namespace.as_deref() != Some(self.namespace.as_str()) {
            return;
        }
        match self.mode {
            AgentMode::Managed => self.revert_config(kind, &obj, deleted).await,
            AgentMode::Autonomous => {
                if argocd_agent_kubernetes::is_sync_ignored(&obj) || deleted {
                    let name = name_of(&obj);
                    if lock(&self.config.published)
                        .remove(&(kind, name.clone()))
                        .is_some()
                        || deleted
                    {
                        self.push_config_delete(kind, &name);
                    }
                } else if !is_being_deleted(&obj) {
                    self.publish_config(kind, &obj);
                }
            }
        }
    }

    /// Managed: local edits and deletions of a copy from the principal are reverted.
    async fn revert_config(&self, kind: ResourceKind, obj: &DynamicObject, deleted: bool) {
        let name = name_of(obj);
        let desired = lock(&self.config.desired)
            .get(&(kind, name.clone()))
            .cloned();
        let Some(desired) = desired else { return };
        if is_being_deleted(obj) && !deleted {
            return;
        }
        let what = if deleted {
            "deletion"
        } else if checksum(kind, &as_value(obj)) != checksum(kind, &desired)
            || !is_managed_copy(obj)
        {
            "edit"
        } else {
            return;
        };
        tracing::info!(%kind, %name, "reverting local {what} of an object the principal manages");
        if let Err(e) = self.upsert_config(kind, &desired).await {
            tracing::warn!(%kind, %name, error = %argocd_agent_domain::error_chain(&e), "could not revert local {what}");
        }
    }

    fn config_ref(&self, kind: ResourceKind, name: &str) -> Option<ResourceRef> {
        Some(ResourceRef::new(kind, self.hub_namespace()?, name))
    }

    fn push_config_delete(&self, kind: ResourceKind, name: &str) {
        if let Some(r) = self.config_ref(kind, name)
            && let Err(e) = self.queue.push(Event::resource(
                &self.source,
                EventType::Delete,
                r,
                Payload::None,
            ))
        {
            tracing::warn!(error = %e, "event to principal dropped");
        }
    }

    /// Autonomous: publishes a local project (once per content).
    fn publish_config(&self, kind: ResourceKind, obj: &DynamicObject) {
        let name = name_of(obj);
        let Some(r) = self.config_ref(kind, &name) else {
            return;
        };
        let mut w = as_value(obj);
        w["metadata"]["namespace"] = Value::String(r.namespace.to_string());
        let sum = object::checksum_of(&w);
        if lock(&self.config.published).insert((kind, name), sum.clone()) == Some(sum) {
            return;
        }
        self.push(Event::resource(
            &self.source,
            EventType::SpecUpdate,
            r,
            Payload::Object(Arc::new(w)),
        ));
    }

    /// Autonomous: the principal asks for one project again.
    fn republish_config(&self, kind: ResourceKind, name: &str) {
        lock(&self.config.published).remove(&(kind, name.to_owned()));
        let current = self
            .config
            .get(kind)
            .and_then(|k| k.cache.get(Some(self.namespace.as_str()), name))
            .filter(|o| !is_being_deleted(o) && !argocd_agent_kubernetes::is_sync_ignored(o));
        match current {
            Some(o) => self.publish_config(kind, &o),
            None => self.push_config_delete(kind, name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    fn event(kind: ResourceKind, ty: EventType, ns_: &str, name: &str) -> (Event, ResourceRef) {
        let r = ResourceRef::new(kind, ns(ns_), "team");
        let e = Event::resource(
            "principal",
            ty,
            r.clone(),
            Payload::Object(Arc::new(json!({"metadata": {"name": name}, "spec": {}}))),
        );
        (e, r)
    }

    #[test]
    fn managed_spoke_takes_every_config_kind_from_its_hub_namespace() {
        let hub = ns("edge-1");
        for kind in [
            ResourceKind::AppProject,
            ResourceKind::Repository,
            ResourceKind::GpgKeys,
        ] {
            let (e, r) = event(kind, EventType::SpecUpdate, "edge-1", "team");
            assert!(matches!(
                plan_config(AgentMode::Managed, Some(&hub), &e, &r),
                Ok(ConfigCommand::Upsert(_))
            ));
            let (e, r) = event(kind, EventType::Delete, "edge-1", "team");
            assert_eq!(
                plan_config(AgentMode::Managed, Some(&hub), &e, &r).unwrap(),
                ConfigCommand::Delete
            );
            let (e, r) = event(kind, EventType::SpecUpdate, "edge-2", "team");
            assert!(matches!(
                plan_config(AgentMode::Managed, Some(&hub), &e, &r),
                Err(SpokeError::WrongNamespace(_))
            ));
            let (e, r) = event(kind, EventType::SpecUpdate, "edge-1", "other");
            assert!(matches!(
                plan_config(AgentMode::Managed, Some(&hub), &e, &r),
                Err(SpokeError::NameMismatch(_))
            ));
        }
    }

    #[test]
    fn autonomous_spoke_takes_no_config_from_the_hub_and_republishes_projects() {
        let hub = ns("edge-1");
        for kind in [
            ResourceKind::AppProject,
            ResourceKind::Repository,
            ResourceKind::GpgKeys,
        ] {
            for ty in [EventType::SpecUpdate, EventType::Delete] {
                let (e, r) = event(kind, ty, "edge-1", "team");
                assert!(matches!(
                    plan_config(AgentMode::Autonomous, Some(&hub), &e, &r),
                    Err(SpokeError::NotAccepted { .. })
                ));
            }
        }
        let (e, r) = event(
            ResourceKind::AppProject,
            EventType::RequestUpdate,
            "edge-1",
            "team",
        );
        assert_eq!(
            plan_config(AgentMode::Autonomous, Some(&hub), &e, &r).unwrap(),
            ConfigCommand::Republish
        );
        let (e, r) = event(
            ResourceKind::Repository,
            EventType::RequestUpdate,
            "edge-1",
            "team",
        );
        assert!(plan_config(AgentMode::Autonomous, Some(&hub), &e, &r).is_err());
    }
}
