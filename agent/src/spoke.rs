//! The spoke side of synchronisation: what the agent does with its local Applications in
//! each mode, and with the events the principal sends.
//!
//! Managed: the principal's copy is the source of truth for `.spec`. The agent applies what
//! it receives, remembers it (`desired`), reverts local edits and deletions, and reports
//! status changes. Autonomous: the local copy is the source of truth; every local change is
//! published; operations (sync, terminate) requested on the hub are applied locally.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_identity::names::AgentMode;
use argocd_agent_kubernetes::object::{self, is_being_deleted, spec_checksum};
use argocd_agent_kubernetes::{Cache, Change, Mutation, Resources};
use argocd_agent_sync::resync::Checksums;
use argocd_agent_sync::{Event, EventType, Payload, ResourceKind, ResourceRef, SendQueue};
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// Label the agent puts on Applications it received from the principal (managed mode).
pub const MANAGED_LABEL: &str = "argocd-agent.argoproj-labs.io/managed-by-principal";

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a task panicked mid-update; the data stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The agent's local state.
pub struct Spoke {
    pub mode: AgentMode,
    /// The Argo CD namespace on the spoke.
    pub namespace: String,
    pub source: String,
    pub apps: Resources,
    pub cache: Cache,
    /// Events to the principal.
    pub queue: SendQueue,
    /// The hub namespace, learned from the welcome.
    pub hub_namespace: Mutex<Option<String>>,
    /// Managed: the last object the principal sent, by name.
    desired: Mutex<HashMap<String, Arc<Value>>>,
    /// Last status checksum reported, by name.
    sent_status: Mutex<HashMap<String, String>>,
    /// Autonomous: checksum of the last object published, by name.
    sent_object: Mutex<HashMap<String, String>>,
}

fn name_of(obj: &DynamicObject) -> String {
    obj.metadata.name.clone().unwrap_or_default()
}

fn is_managed_copy(obj: &DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(MANAGED_LABEL))
}

impl Spoke {
    pub fn new(
        mode: AgentMode,
        namespace: String,
        source: String,
        apps: Resources,
        cache: Cache,
        queue: SendQueue,
    ) -> Spoke {
        Spoke {
            mode,
            namespace,
            source,
            apps,
            cache,
            queue,
            hub_namespace: Mutex::new(None),
            desired: Mutex::new(HashMap::new()),
            sent_status: Mutex::new(HashMap::new()),
            sent_object: Mutex::new(HashMap::new()),
        }
    }

    fn relevant(&self, obj: &DynamicObject) -> bool {
        match self.mode {
            AgentMode::Managed => is_managed_copy(obj),
            AgentMode::Autonomous => true,
        }
    }

    /// Local objects that take part in sync, by name.
    fn local(&self) -> HashMap<String, Arc<DynamicObject>> {
        self.cache
            .list_namespace(&self.namespace)
            .into_iter()
            .filter(|o| self.relevant(o) && !argocd_agent_kubernetes::is_sync_ignored(o))
            .map(|o| (name_of(&o), o))
            .collect()
    }

    /// Checksums for the hello (what this agent holds).
    pub fn checksums(&self) -> Checksums {
        self.local()
            .into_iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| (n, spec_checksum(&o)))
            .collect()
    }

    /// After a restart, the local managed copies are the best knowledge of what the
    /// principal wants until it says otherwise (resync corrects differences).
    pub fn seed_desired(&self) {
        if self.mode != AgentMode::Managed {
            return;
        }
        let mut desired = lock(&self.desired);
        for (name, obj) in self.local() {
            desired.entry(name).or_insert_with(|| wire(&obj));
        }
    }

    fn hub_ns(&self) -> Option<String> {
        lock(&self.hub_namespace).clone()
    }

    fn app_ref(&self, name: &str) -> Option<ResourceRef> {
        Some(ResourceRef {
            kind: ResourceKind::Application,
            namespace: self.hub_ns()?,
            name: name.into(),
        })
    }

    fn push(&self, event: Event) {
        if let Err(e) = self.queue.push(event) {
            tracing::warn!(error = %e, "event to principal dropped");
        }
    }

    /// Called after the welcome: report what the principal needs from us.
    pub fn after_welcome(&self) {
        lock(&self.sent_status).clear();
        lock(&self.sent_object).clear();
        if self.mode == AgentMode::Managed {
            for obj in self.local().values() {
                self.report_status(obj);
            }
        }
    }

    fn report_status(&self, obj: &DynamicObject) {
        let name = name_of(obj);
        let Some(status) = object::status(obj).cloned() else {
            return;
        };
        let sum = object::checksum_of(&status);
        if lock(&self.sent_status).get(&name) == Some(&sum) {
            return;
        }
        let Some(r) = self.app_ref(&name) else { return };
        lock(&self.sent_status).insert(name.clone(), sum);
        self.push(Event::resource(
            &self.source,
            EventType::StatusUpdate,
            r,
            Payload::Object(Arc::new(
                json!({"metadata": {"name": name}, "status": status}),
            )),
        ));
    }

    fn publish(&self, obj: &DynamicObject) {
        let name = name_of(obj);
        let mut w = (*wire(obj)).clone();
        let Some(hub_ns) = self.hub_ns() else { return };
        w["metadata"]["namespace"] = Value::String(hub_ns);
        let sum = object::checksum_of(&w);
        if lock(&self.sent_object).get(&name) == Some(&sum) {
            return;
        }
        let Some(r) = self.app_ref(&name) else { return };
        lock(&self.sent_object).insert(name, sum);
        self.push(Event::resource(
            &self.source,
            EventType::SpecUpdate,
            r,
            Payload::Object(Arc::new(w)),
        ));
    }

    /// Handles a change of a local Application.
    pub async fn on_local_change(&self, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        if obj.metadata.namespace.as_deref() != Some(self.namespace.as_str()) {
            return;
        }
        let name = name_of(&obj);
        match self.mode {
            AgentMode::Managed => {
                let desired = lock(&self.desired).get(&name).cloned();
                let Some(desired) = desired else { return };
                if deleted {
                    tracing::info!(name = %name, "reverting local deletion of managed application");
                    if let Err(e) = self.upsert_local(&desired).await {
                        tracing::warn!(name = %name, error = %e, "could not recreate");
                    }
                    return;
                }
                if is_being_deleted(&obj) {
                    return;
                }
                let want = object::checksum_of(desired.get("spec").unwrap_or(&Value::Null));
                if spec_checksum(&obj) != want || !is_managed_copy(&obj) {
                    tracing::info!(name = %name, "reverting local edit of managed application");
                    if let Err(e) = self.upsert_local(&desired).await {
                        tracing::warn!(name = %name, error = %e, "could not revert");
                    }
                }
                self.report_status(&obj);
            }
            AgentMode::Autonomous => {
                if argocd_agent_kubernetes::is_sync_ignored(&obj) {
                    return;
                }
                if deleted {
                    lock(&self.sent_object).remove(&name);
                    if let Some(r) = self.app_ref(&name) {
                        self.push(Event::resource(
                            &self.source,
                            EventType::Delete,
                            r,
                            Payload::None,
                        ));
                    }
                    return;
                }
                if is_being_deleted(&obj) {
                    return;
                }
                self.publish(&obj);
            }
        }
    }

    /// Creates or updates the local copy of a managed Application from the principal's object.
    async fn upsert_local(&self, incoming: &Value) -> Result<(), String> {
        let mut obj: DynamicObject = serde_json::from_value(incoming.clone())
            .map_err(|e| format!("not a Kubernetes object: {e}"))?;
        let name = name_of(&obj);
        if name.is_empty() {
            return Err("object has no name".into());
        }
        obj.metadata.namespace = Some(self.namespace.clone());
        obj.metadata.resource_version = None;
        obj.metadata.uid = None;
        obj.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(MANAGED_LABEL.into(), "true".into());
        if obj.types.is_none() {
            obj.types = Some(kube::api::TypeMeta {
                api_version: "argoproj.io/v1alpha1".into(),
                kind: "Application".into(),
            });
        }
        if let Some(m) = obj.data.as_object_mut() {
            // Status is the spoke's own; the operation comes as its own event.
            m.remove("status");
            m.remove("operation");
        }
        let ns = self.namespace.clone();
        match self
            .apps
            .get(Some(&ns), &name)
            .await
            .map_err(|e| e.to_string())?
        {
            None => {
                self.apps.create(&obj).await.map_err(|e| e.to_string())?;
            }
            Some(_) => {
                let want = obj;
                self.apps
                    .update_with(Some(&ns), &name, move |cur| {
                        let before = (
                            cur.data.get("spec").cloned(),
                            cur.metadata.labels.clone(),
                            cur.metadata.annotations.clone(),
                        );
                        cur.data["spec"] = want.data.get("spec").cloned().unwrap_or(Value::Null);
                        cur.metadata.labels = want.metadata.labels.clone();
                        cur.metadata.annotations = want.metadata.annotations.clone();
                        let after = (
                            cur.data.get("spec").cloned(),
                            cur.metadata.labels.clone(),
                            cur.metadata.annotations.clone(),
                        );
                        if before == after {
                            Mutation::Unchanged
                        } else {
                            Mutation::Changed
                        }
                    })
                    .await
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    async fn delete_local(&self, name: &str) -> Result<(), String> {
        match self.apps.delete(Some(&self.namespace), name).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_not_found() => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Handles one event from the principal. Returns the reply to send, if any.
    pub async fn on_principal_event(&self, event: &Event) -> Option<Event> {
        let resource = event.resource.clone()?;
        if Some(resource.namespace.as_str()) != self.hub_ns().as_deref() {
            return Some(event.error_reply(
                &self.source,
                "Forbidden",
                format!("{resource} is not in this agent's hub namespace"),
            ));
        }
        let name = resource.name.clone();
        let result: Result<(), String> = match (self.mode, event.ty) {
            (AgentMode::Managed, EventType::Create | EventType::SpecUpdate) => {
                let obj = event.object().cloned().unwrap_or_default();
                if obj.pointer("/metadata/name").and_then(Value::as_str) != Some(name.as_str()) {
                    Err("payload does not name the event's resource".into())
                } else {
                    lock(&self.desired).insert(name.clone(), obj.clone());
                    self.upsert_local(&obj).await
                }
            }
            (AgentMode::Managed, EventType::Delete) => {
                lock(&self.desired).remove(&name);
                lock(&self.sent_status).remove(&name);
                self.delete_local(&name).await
            }
            (_, EventType::SetOperation) => {
                let op = event
                    .object()
                    .and_then(|o| o.get("operation").cloned())
                    .unwrap_or(Value::Null);
                self.apps
                    .patch_merge(Some(&self.namespace), &name, &json!({"operation": op}))
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            (_, EventType::TerminateOperation) => {
                self.apps.replace_status_field(&self.namespace, &name).await
            }
            (AgentMode::Autonomous, EventType::RequestUpdate) => {
                lock(&self.sent_object).remove(&name);
                match self.cache.get(Some(&self.namespace), &name) {
                    Some(obj) if !is_being_deleted(&obj) => self.publish(&obj),
                    _ => {
                        if let Some(r) = self.app_ref(&name) {
                            self.push(Event::resource(
                                &self.source,
                                EventType::Delete,
                                r,
                                Payload::None,
                            ));
                        }
                    }
                }
                return None;
            }
            (mode, ty) => Err(format!("{ty} is not accepted by a {mode} agent")),
        };
        Some(match result {
            Ok(()) => event.ack(&self.source),
            Err(message) => {
                tracing::warn!(object = %resource, r#type = %event.ty, error = %message, "could not apply event");
                event.error_reply(&self.source, "ApplyFailed", message)
            }
        })
    }
}

/// Wire form of a local object (server-managed metadata removed).
fn wire(obj: &DynamicObject) -> Arc<Value> {
    Arc::new(serde_json::to_value(object::strip_for_transfer(obj)).unwrap_or(Value::Null))
}

/// Terminating an operation = setting the operation state's phase, as `argocd app terminate-op`.
trait TerminateOperation {
    async fn replace_status_field(&self, ns: &str, name: &str) -> Result<(), String>;
}

impl TerminateOperation for Resources {
    async fn replace_status_field(&self, ns: &str, name: &str) -> Result<(), String> {
        let Some(cur) = self.get(Some(ns), name).await.map_err(|e| e.to_string())? else {
            return Err(format!("application {ns}/{name} not found"));
        };
        let mut status = object::status(&cur).cloned().unwrap_or_else(|| json!({}));
        status["operationState"]["phase"] = Value::String("Terminating".into());
        self.replace_status(Some(ns), name, status)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }
}
