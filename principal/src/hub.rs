//! The hub side of synchronisation: per-agent state that outlives sessions, the watch of
//! hub Applications across agent namespaces, and the writes that inbound events cause.
//!
//! Managed agents: the hub copy is the source of truth for `.spec`; changes become events in
//! the agent's queue; the agent's status lands in the hub copy's `/status`.
//! Autonomous agents: the agent's copy is the source of truth; hub edits are reverted from
//! the last object the agent sent (`desired`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use argocd_agent_identity::mapping::AgentIdentity;
use argocd_agent_identity::names::AgentMode;
use argocd_agent_kubernetes::object::{self, is_being_deleted, spec_checksum};
use argocd_agent_kubernetes::{Cache, Change, Mutation, Resources};
use argocd_agent_sync::queue::{Lane, QueueKey};
use argocd_agent_sync::resync::Checksums;
use argocd_agent_sync::{Event, EventType, Payload, ResourceKind, ResourceRef, SendQueue};
use futures::{Stream, StreamExt};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// Label put on hub copies of autonomous agents' Applications (and checked for ownership).
pub const AGENT_NAME_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";

/// State of one agent, kept across its sessions.
pub struct AgentState {
    pub identity: Mutex<AgentIdentity>,
    pub mode: Mutex<AgentMode>,
    pub queue: SendQueue,
    /// Cancels the current session (replaced, revoked, or shut down).
    pub session: Mutex<Option<(u64, CancellationToken)>>,
    /// Autonomous: the last object the agent sent, by name (what hub edits are reverted to).
    pub desired: Mutex<HashMap<String, Arc<Value>>>,
    /// Managed: spec checksum last sent, by name (so hub status writes are not echoed back).
    pub sent_spec: Mutex<HashMap<String, String>>,
    /// Operations already forwarded, by name -> checksum of `.operation`.
    pub sent_operation: Mutex<HashMap<String, String>>,
}

impl AgentState {
    pub fn namespace(&self) -> String {
        lock(&self.identity).namespace.as_str().to_owned()
    }
    pub fn agent(&self) -> String {
        lock(&self.identity).agent.as_str().to_owned()
    }
    pub fn mode(&self) -> AgentMode {
        *lock(&self.mode)
    }
    pub fn is_connected(&self) -> bool {
        lock(&self.session).is_some()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a task panicked mid-update; the data stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Shared state of the principal.
pub struct Hub {
    pub source: String,
    pub apps: Resources,
    pub cache: Cache,
    pub agents: Mutex<HashMap<String, Arc<AgentState>>>,
    pub by_namespace: Mutex<HashMap<String, String>>,
    pub metrics: Metrics,
    pub queue_limits: argocd_agent_sync::QueueLimits,
    pub create_namespace: bool,
    pub namespace_labels: BTreeMap<String, String>,
    pub namespaces: Resources,
}

fn app_ref(namespace: &str, name: &str) -> ResourceRef {
    ResourceRef {
        kind: ResourceKind::Application,
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// Wire form of a hub object: server-managed metadata removed, namespace = hub namespace.
fn for_wire(obj: &DynamicObject) -> Arc<Value> {
    let stripped = object::strip_for_transfer(obj);
    Arc::new(serde_json::to_value(&stripped).unwrap_or(Value::Null))
}

fn name_of(obj: &DynamicObject) -> String {
    obj.metadata.name.clone().unwrap_or_default()
}

fn value_checksum(v: Option<&Value>) -> String {
    object::checksum_of(v.unwrap_or(&Value::Null))
}

impl Hub {
    pub fn agent(&self, name: &str) -> Option<Arc<AgentState>> {
        lock(&self.agents).get(name).cloned()
    }

    fn agent_for_namespace(&self, ns: &str) -> Option<Arc<AgentState>> {
        let name = lock(&self.by_namespace).get(ns).cloned()?;
        self.agent(&name)
    }

    /// Registers (or refreshes) an agent and returns its state. A new session replaces the
    /// old one: the old session's token is cancelled.
    pub fn attach(
        &self,
        identity: AgentIdentity,
        mode: AgentMode,
        session_id: u64,
        token: CancellationToken,
    ) -> Arc<AgentState> {
        let name = identity.agent.as_str().to_owned();
        let ns = identity.namespace.as_str().to_owned();
        let mut agents = lock(&self.agents);
        let state = agents
            .entry(name.clone())
            .or_insert_with(|| {
                Arc::new(AgentState {
                    identity: Mutex::new(identity.clone()),
                    mode: Mutex::new(mode),
                    queue: SendQueue::new(self.queue_limits.clone()),
                    session: Mutex::new(None),
                    desired: Mutex::new(HashMap::new()),
                    sent_spec: Mutex::new(HashMap::new()),
                    sent_operation: Mutex::new(HashMap::new()),
                })
            })
            .clone();
        drop(agents);
        let old_mode = std::mem::replace(&mut *lock(&state.mode), mode);
        if old_mode != mode {
            lock(&state.desired).clear();
            lock(&state.sent_spec).clear();
        }
        *lock(&state.identity) = identity;
        if let Some((_, old)) = lock(&state.session).replace((session_id, token)) {
            tracing::info!(agent = %name, "new session replaces the previous one");
            old.cancel();
        }
        lock(&self.by_namespace).insert(ns, name);
        state
    }

    /// Forgets the session if it is still the current one.
    pub fn detach(&self, state: &AgentState, session_id: u64) {
        let mut s = lock(&state.session);
        if s.as_ref().map(|(id, _)| *id) == Some(session_id) {
            *s = None;
        }
    }

    /// Live sessions' identities (for revocation checks).
    pub fn connected_identities(&self) -> Vec<AgentIdentity> {
        lock(&self.agents)
            .values()
            .filter(|a| a.is_connected())
            .map(|a| lock(&a.identity).clone())
            .collect()
    }

    /// Closes the current session of `agent`, if any.
    pub fn disconnect(&self, agent: &str) {
        if let Some(state) = self.agent(agent)
            && let Some((_, token)) = lock(&state.session).take()
        {
            token.cancel();
        }
    }

    /// Creates the agent's hub namespace when configured to.
    pub async fn ensure_namespace(&self, ns: &str, agent: &str) {
        if !self.create_namespace {
            return;
        }
        let mut labels = self.namespace_labels.clone();
        labels.insert(AGENT_NAME_LABEL.into(), agent.into());
        match self.namespaces.ensure_namespace(ns, labels).await {
            Ok(true) => tracing::info!(namespace = ns, agent, "created hub namespace for agent"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(namespace = ns, agent, error = %e, "could not create namespace")
            }
        }
    }

    fn push(&self, state: &AgentState, event: Event) {
        if let Err(e) = state.queue.push(event) {
            self.metrics.queue_full.inc();
            tracing::warn!(agent = %state.agent(), error = %e, "event dropped");
        }
    }

    /// Hub objects of one namespace by name.
    pub fn hub_objects(&self, ns: &str) -> HashMap<String, Arc<DynamicObject>> {
        self.cache
            .list_namespace(ns)
            .into_iter()
            .filter(|o| !argocd_agent_kubernetes::is_sync_ignored(o))
            .map(|o| (name_of(&o), o))
            .collect()
    }

    /// Spec checksums of hub objects (those being deleted count as gone).
    fn checksums(objects: &HashMap<String, Arc<DynamicObject>>) -> Checksums {
        objects
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| (n.clone(), spec_checksum(o)))
            .collect()
    }

    /// Queues the current hub copy of `resource` for the agent (a delete when it is gone).
    pub fn send_current(&self, state: &AgentState, resource: ResourceRef) {
        let event = match self.cache.get(Some(&resource.namespace), &resource.name) {
            Some(obj) if !is_being_deleted(&obj) => Event::resource(
                &self.source,
                EventType::SpecUpdate,
                resource,
                Payload::Object(for_wire(&obj)),
            ),
            _ => Event::resource(&self.source, EventType::Delete, resource, Payload::None),
        };
        self.push(state, event);
    }

    /// Queues everything a managed agent needs to converge on the hub state.
    pub fn resync_managed(&self, state: &AgentState, agent_state: &Checksums) {
        let ns = state.namespace();
        let objects = self.hub_objects(&ns);
        let hub = Self::checksums(&objects);
        let plan = argocd_agent_sync::resync::plan(&hub, agent_state);
        tracing::info!(agent = %state.agent(), send = plan.send.len(), delete = plan.delete.len(),
            "resync (managed): hub is the source");
        let mut sent = lock(&state.sent_spec);
        sent.clear();
        for (name, sum) in &hub {
            sent.insert(name.clone(), sum.clone());
        }
        drop(sent);
        for name in plan.send {
            if let Some(obj) = objects.get(&name) {
                self.push(
                    state,
                    Event::resource(
                        &self.source,
                        EventType::SpecUpdate,
                        app_ref(&ns, &name),
                        Payload::Object(for_wire(obj)),
                    ),
                );
            }
        }
        for name in plan.delete {
            self.push(
                state,
                Event::resource(
                    &self.source,
                    EventType::Delete,
                    app_ref(&ns, &name),
                    Payload::None,
                ),
            );
        }
        // Objects being deleted on the hub: the agent deletes its copy, then we finish.
        for (name, obj) in &objects {
            if is_being_deleted(obj) {
                self.push(
                    state,
                    Event::resource(
                        &self.source,
                        EventType::Delete,
                        app_ref(&ns, name),
                        Payload::None,
                    ),
                );
            }
        }
        for obj in objects.values() {
            self.forward_operation(state, obj);
        }
    }

    /// Autonomous agent reconnected: ask for what differs, delete what it no longer has.
    pub async fn resync_autonomous(
        &self,
        state: &AgentState,
        agent_state: &Checksums,
    ) -> Vec<Event> {
        let ns = state.namespace();
        let objects = self.hub_objects(&ns);
        let hub = Self::checksums(&objects);
        let plan = argocd_agent_sync::resync::plan(agent_state, &hub);
        tracing::info!(agent = %state.agent(), request = plan.send.len(), delete = plan.delete.len(),
            "resync (autonomous): agent is the source");
        {
            let mut desired = lock(&state.desired);
            desired.retain(|n, _| agent_state.contains_key(n));
            for (name, obj) in &objects {
                if agent_state.get(name) == hub.get(name) && !desired.contains_key(name) {
                    desired.insert(name.clone(), for_wire(obj));
                }
            }
        }
        for name in &plan.delete {
            self.delete_hub_copy(&ns, name).await;
        }
        plan.send
            .into_iter()
            .map(|name| {
                Event::resource(
                    &self.source,
                    EventType::RequestUpdate,
                    app_ref(&ns, &name),
                    Payload::None,
                )
            })
            .collect()
    }

    /// Removes an autonomous agent's hub copy (finalizers first: the spoke already deleted it).
    async fn delete_hub_copy(&self, ns: &str, name: &str) {
        if let Err(e) = self.apps.remove_finalizers(Some(ns), name).await
            && !e.is_not_found()
        {
            tracing::warn!(namespace = ns, name, error = %e, "could not remove finalizers");
        }
        if let Err(e) = self.apps.delete(Some(ns), name).await
            && !e.is_not_found()
        {
            self.metrics.hub_write_errors.inc();
            tracing::warn!(namespace = ns, name, error = %e, "could not delete hub copy");
        }
    }

    /// Sends a hub-side `.operation` to the agent once.
    fn forward_operation(&self, state: &AgentState, obj: &DynamicObject) {
        let name = name_of(obj);
        let ns = state.namespace();
        let Some(op) = object::operation(obj).filter(|v| !v.is_null()) else {
            lock(&state.sent_operation).remove(&name);
            return;
        };
        let sum = value_checksum(Some(op));
        if lock(&state.sent_operation).get(&name) == Some(&sum) {
            return;
        }
        lock(&state.sent_operation).insert(name.clone(), sum);
        let terminating = obj
            .data
            .pointer("/status/operationState/phase")
            .and_then(Value::as_str)
            == Some("Terminating");
        let ty = if terminating {
            EventType::TerminateOperation
        } else {
            EventType::SetOperation
        };
        self.push(
            state,
            Event::resource(
                &self.source,
                ty,
                app_ref(&ns, &name),
                Payload::Object(Arc::new(json!({ "operation": op }))),
            ),
        );
    }

    /// Handles one change of a hub Application.
    pub async fn on_hub_change(&self, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        let Some(ns) = obj.metadata.namespace.clone() else {
            return;
        };
        let Some(state) = self.agent_for_namespace(&ns) else {
            return;
        };
        let name = name_of(&obj);
        match state.mode() {
            AgentMode::Managed => {
                if deleted || is_being_deleted(&obj) {
                    lock(&state.sent_spec).remove(&name);
                    lock(&state.sent_operation).remove(&name);
                    self.push(
                        &state,
                        Event::resource(
                            &self.source,
                            EventType::Delete,
                            app_ref(&ns, &name),
                            Payload::None,
                        ),
                    );
                    return;
                }
                let sum = spec_checksum(&obj);
                let changed = lock(&state.sent_spec).get(&name) != Some(&sum);
                if changed {
                    lock(&state.sent_spec).insert(name.clone(), sum);
                    self.push(
                        &state,
                        Event::resource(
                            &self.source,
                            EventType::SpecUpdate,
                            app_ref(&ns, &name),
                            Payload::Object(for_wire(&obj)),
                        ),
                    );
                }
                self.forward_operation(&state, &obj);
            }
            AgentMode::Autonomous => {
                let desired = lock(&state.desired).get(&name).cloned();
                let Some(desired) = desired else { return };
                if deleted || is_being_deleted(&obj) {
                    if is_being_deleted(&obj) && !deleted {
                        // Hub deletion of an autonomous app: revert by letting it go and
                        // recreating it from the agent's copy.
                        let _ = self.apps.remove_finalizers(Some(&ns), &name).await;
                        return;
                    }
                    tracing::info!(agent = %state.agent(), namespace = %ns, name = %name,
                        "reverting hub deletion of autonomous application");
                    if let Err(e) = self.upsert_from_agent(&ns, &state.agent(), &desired).await {
                        tracing::warn!(namespace = %ns, name = %name, error = %e, "could not revert hub deletion");
                    }
                    return;
                }
                let want = value_checksum(desired.get("spec"));
                if spec_checksum(&obj) != want {
                    tracing::info!(agent = %state.agent(), namespace = %ns, name = %name,
                        "reverting hub edit of autonomous application");
                    if let Err(e) = self.upsert_from_agent(&ns, &state.agent(), &desired).await {
                        tracing::warn!(namespace = %ns, name = %name, error = %e, "could not revert hub edit");
                    }
                }
                self.forward_operation(&state, &obj);
            }
        }
    }

    /// Writes an object received from an autonomous agent into its hub namespace.
    pub async fn upsert_from_agent(
        &self,
        ns: &str,
        agent: &str,
        incoming: &Value,
    ) -> Result<(), String> {
        let name = incoming
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let mut obj: DynamicObject = serde_json::from_value(incoming.clone())
            .map_err(|e| format!("not a Kubernetes object: {e}"))?;
        obj.metadata.namespace = Some(ns.to_owned());
        obj.metadata.resource_version = None;
        obj.metadata.uid = None;
        obj.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(AGENT_NAME_LABEL.into(), agent.into());
        if obj.types.is_none() {
            obj.types = Some(kube::api::TypeMeta {
                api_version: "argoproj.io/v1alpha1".into(),
                kind: "Application".into(),
            });
        }
        let status = obj.data.get("status").cloned();
        let existing = self
            .apps
            .get(Some(ns), &name)
            .await
            .map_err(|e| e.to_string())?;
        match existing {
            None => {
                if let Some(map) = obj.data.as_object_mut() {
                    map.remove("status");
                }
                self.apps.create(&obj).await.map_err(|e| {
                    self.metrics.hub_write_errors.inc();
                    e.to_string()
                })?;
            }
            Some(_) => {
                let want = obj.clone();
                self.apps
                    .update_with(Some(ns), &name, move |cur| {
                        let before = cur.data.clone();
                        let before_meta = (
                            cur.metadata.labels.clone(),
                            cur.metadata.annotations.clone(),
                        );
                        for key in ["spec", "operation"] {
                            match want.data.get(key) {
                                Some(v) => {
                                    cur.data[key] = v.clone();
                                }
                                None => {
                                    if let Some(m) = cur.data.as_object_mut() {
                                        m.remove(key);
                                    }
                                }
                            }
                        }
                        cur.metadata.labels = want.metadata.labels.clone();
                        cur.metadata.annotations = want.metadata.annotations.clone();
                        if cur.data == before
                            && (
                                cur.metadata.labels.clone(),
                                cur.metadata.annotations.clone(),
                            ) == before_meta
                        {
                            Mutation::Unchanged
                        } else {
                            Mutation::Changed
                        }
                    })
                    .await
                    .map_err(|e| {
                        self.metrics.hub_write_errors.inc();
                        e.to_string()
                    })?;
            }
        }
        if let Some(status) = status.filter(|s| !s.is_null()) {
            self.write_status(ns, &name, status).await?;
        }
        Ok(())
    }

    /// Writes `.status` of a hub Application through the status subresource.
    pub async fn write_status(&self, ns: &str, name: &str, status: Value) -> Result<(), String> {
        if let Some(cur) = self.cache.get(Some(ns), name)
            && object::status(&cur) == Some(&status)
        {
            return Ok(());
        }
        self.apps
            .replace_status(Some(ns), name, status)
            .await
            .map(|_| ())
            .map_err(|e| {
                self.metrics.hub_write_errors.inc();
                e.to_string()
            })
    }

    /// Called when the agent acknowledged an event of ours.
    pub async fn on_ack(&self, state: &AgentState, key: QueueKey, ty: EventType) {
        let ns = key.resource.namespace.clone();
        let name = key.resource.name.clone();
        match key.lane {
            Lane::Operation => {
                // Delivered: the hub copy's `.operation` has done its job (the hub runs no
                // application controller for agent namespaces); the agent reports progress
                // in `.status.operationState`.
                if let Err(e) = self
                    .apps
                    .patch_merge(Some(&ns), &name, &json!({"operation": null}))
                    .await
                    && !e.is_not_found()
                {
                    tracing::warn!(namespace = %ns, name = %name, error = %e, "could not clear operation");
                }
            }
            Lane::Object if ty == EventType::Delete && state.mode() == AgentMode::Managed => {
                // The spoke deleted its copy: finish a pending hub deletion.
                if let Some(obj) = self.cache.get(Some(&ns), &name)
                    && is_being_deleted(&obj)
                {
                    let _ = self.apps.remove_finalizers(Some(&ns), &name).await;
                }
            }
            _ => {}
        }
    }

    /// Autonomous agent deleted an application.
    pub async fn delete_from_agent(&self, state: &AgentState, name: &str) {
        let ns = state.namespace();
        lock(&state.desired).remove(name);
        lock(&state.sent_operation).remove(name);
        self.delete_hub_copy(&ns, name).await;
    }
}

/// Runs the hub watch until the stream ends, routing changes to agents.
pub async fn run_hub_watch(hub: Arc<Hub>, changes: impl Stream<Item = Change> + Send + 'static) {
    futures::pin_mut!(changes);
    while let Some(change) = changes.next().await {
        hub.on_hub_change(change).await;
    }
    tracing::warn!("hub watch ended");
}
