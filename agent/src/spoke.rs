//! The spoke side of synchronisation: what the agent does with its local Applications in
//! each mode, and with the events the principal sends.
//!
//! Managed: the principal's copy is the source of truth for `.spec`. The agent applies what
//! it receives, remembers it (`desired`), reverts local edits and deletions, and reports
//! status changes. Autonomous: the local copy is the source of truth; every local change is
//! published; operations (sync, terminate) requested on the hub are applied locally.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use argocd_agent_domain::resync::Checksums;
use argocd_agent_domain::{AgentMode, Namespace, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef, SendQueue};
use argocd_agent_kubernetes::object::{self, is_being_deleted, spec_checksum, status_checksum};
use argocd_agent_kubernetes::{Cache, Change, DeleteOutcome, Known, Resources};
use argocd_agent_proto::eventstream::{ResourceChecksum, ResyncState};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::error::SpokeError;
use crate::namespaces::{self, AllowedNamespaces, HubNameError};
use crate::objects::kinds::ConfigKinds;
use crate::policy::{self, Policies, RecreateAction, WritePlan};

pub use crate::managed::MANAGED_LABEL;
use crate::managed::{is_managed_copy, lock, name_of, restore, source_uid};

/// Mutable state of the spoke, behind one lock.
#[derive(Default)]
struct SpokeInner {
    /// The hub namespace, learned from the welcome.
    hub_namespace: Option<Namespace>,
    /// Managed: the last object the principal sent, by name.
    desired: HashMap<String, Arc<Value>>,
    /// Last status checksum reported, by name.
    sent_status: HashMap<String, String>,
    /// Autonomous: checksum of the last object published, by name.
    sent_object: HashMap<String, String>,
    /// What the last hello said this agent holds (Applications and configuration objects),
    /// so changes made while the handshake was in flight are published after the welcome.
    hello: Option<HelloState>,
    /// Managed: the hub's refresh request written on a local copy, by key, until the
    /// spoke's Argo CD removes it (then the principal is told, see [`REFRESHED_ANNOTATION`]).
    refresh_applied: HashMap<String, String>,
    /// Managed: the principal's delete of a copy that finalizers hold (the spoke's Argo CD
    /// is deleting its resources), by key: acknowledged only once the copy is gone, so the
    /// hub Application stays "deleting" for as long as the spoke's does.
    pending_deletes: HashMap<String, Event>,
    /// Where answers that come later than their event go: the current session's direct
    /// channel (`None` between sessions; the principal then sends the event again).
    late_replies: Option<tokio::sync::mpsc::Sender<Event>>,
}

/// What a hello reported, kept until its welcome.
struct HelloState {
    /// Applications: spec checksums.
    apps: Checksums,
    /// Autonomous Applications: status checksums (empty in managed mode).
    statuses: Checksums,
    config: Vec<ResourceChecksum>,
}

use object::REFRESHED_ANNOTATION;

/// Managed: the labels and annotations of a copy that the hub decides (every one but
/// the agent's own label and the spoke-owned annotations, [`object::spoke_owned_key`]),
/// as JSON, to compare a local copy with the principal's object.
fn hub_metadata(obj: &Value) -> Value {
    let pick = |field: &str, skip: &dyn Fn(&str) -> bool| -> serde_json::Map<String, Value> {
        obj.get("metadata")
            .and_then(|m| m.get(field))
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| !skip(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    json!({
        "labels": pick("labels", &|k| k == MANAGED_LABEL),
        "annotations": pick("annotations", &object::spoke_owned_key),
    })
}

/// Why an autonomous agent's Application has no hub name.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HubNameRefusal {
    /// Its hub name is the name of an Application in the Argo CD namespace, which keeps it.
    Collision(String),
    /// Its hub name would not be a valid name.
    Name(HubNameError),
}

/// The agent's local state.
pub struct Spoke {
    /// Managed (the hub's copies are written here) or autonomous (published to the hub).
    pub mode: AgentMode,
    /// The Argo CD namespace on the spoke.
    pub namespace: Namespace,
    /// CloudEvents `source` of our events.
    pub source: String,
    /// Writes the spoke's Applications.
    pub apps: Resources,
    /// The watched Applications (managed across namespaces: only the managed copies).
    pub cache: Cache,
    /// Events to the principal.
    pub queue: SendQueue,
    /// AppProjects, repositories and GPG keys.
    pub(crate) config: ConfigKinds,
    /// Adoption, source-UID mismatch and recreate policies (managed mode).
    pub policies: Policies,
    /// Destination-based mapping (managed mode): Applications keep their hub namespace on
    /// the spoke, so the agent works across namespaces.
    pub by_destination: bool,
    /// Managed mode: Applications an app-of-apps parent creates here are not published
    /// (`--ignore-unmanaged-apps`).
    pub ignore_unmanaged_apps: bool,
    /// The namespaces whose Applications the agent takes: its Argo CD namespace and
    /// `--allowed-namespaces` (managed with destination-based mapping, and autonomous).
    pub allowed: AllowedNamespaces,
    /// Managed with destination-based mapping: create a missing namespace before writing a
    /// copy into it (`--create-namespace`).
    pub create_namespace: bool,
    /// Namespaces on the spoke (to create them, or to tell a missing one).
    pub namespace_api: Option<Resources>,
    /// The agent's metrics.
    pub metrics: crate::metrics::Metrics,
    /// This cluster's Redis, when the agent serves the principal's Redis proxy.
    pub redis: Option<Arc<crate::redis::SpokeRedis>>,
    /// The resource proxy, when the agent serves it.
    pub proxy: Option<Arc<crate::proxy::Proxy>>,
    /// Where the agent's request handlers run (the agent's tracker, drained on shutdown).
    pub tasks: tokio_util::task::TaskTracker,
    inner: Mutex<SpokeInner>,
    /// Spoke-authored children of managed copies (app-of-apps), see [`crate::children`].
    pub(crate) children: Mutex<crate::children::state::ChildState>,
    /// The spoke guard in force ([`crate::guard`]; none by default).
    pub guard: Arc<crate::guard::LiveGuard>,
    /// What the guard refused ([`crate::guard::refused`]).
    pub(crate) guard_state: Mutex<crate::guard::refused::GuardState>,
}

/// Wire form of a local object (server-managed metadata removed).
fn wire(obj: &DynamicObject) -> Arc<Value> {
    Arc::new(serde_json::to_value(object::strip_for_transfer(obj)).unwrap_or(Value::Null))
}

impl crate::redis::HeldApps for Spoke {
    fn redis_instance(&self, resource: &ResourceRef) -> Option<String> {
        Spoke::redis_instance(self, resource)
    }

    fn tree_namespaces(&self) -> Option<crate::redis::TreeNamespaces> {
        Spoke::tree_namespaces(self)
    }
}

impl crate::proxy::dispatch::Host for Spoke {
    fn source(&self) -> &str {
        &self.source
    }

    fn tasks(&self) -> &tokio_util::task::TaskTracker {
        &self.tasks
    }

    fn proxy(&self) -> Option<Arc<crate::proxy::Proxy>> {
        self.proxy.clone()
    }

    fn apps(&self) -> crate::proxy::Apps {
        crate::proxy::Apps::from_facts(self.held_application_facts())
    }
}

impl Spoke {
    /// A spoke with the default policies, no Redis, no resource proxy and fresh metrics.
    pub fn new(
        mode: AgentMode,
        namespace: Namespace,
        source: String,
        apps: Resources,
        cache: Cache,
        queue: SendQueue,
        config: ConfigKinds,
    ) -> Spoke {
        Spoke {
            mode,
            allowed: AllowedNamespaces::only(namespace.as_str()),
            create_namespace: false,
            namespace_api: None,
            namespace,
            source,
            apps,
            cache,
            queue,
            config,
            policies: Policies::default(),
            by_destination: false,
            ignore_unmanaged_apps: false,
            metrics: crate::metrics::Metrics::new(),
            proxy: None,
            redis: None,
            tasks: tokio_util::task::TaskTracker::new(),
            inner: Mutex::new(SpokeInner::default()),
            children: Mutex::default(),
            guard: Arc::default(),
            guard_state: Mutex::default(),
        }
    }

    fn inner(&self) -> MutexGuard<'_, SpokeInner> {
        lock(&self.inner)
    }

    pub(crate) fn relevant(&self, obj: &DynamicObject) -> bool {
        self.takes_namespace(obj.metadata.namespace.as_deref().unwrap_or_default())
            && match self.mode {
                AgentMode::Managed => is_managed_copy(obj),
                AgentMode::Autonomous => true,
            }
    }

    /// Whether the agent takes Applications in `ns`: its Argo CD namespace, and with
    /// destination-based mapping or as an autonomous agent the `--allowed-namespaces`.
    fn takes_namespace(&self, ns: &str) -> bool {
        if self.mode == AgentMode::Managed && !self.by_destination {
            ns == self.namespace.as_str()
        } else {
            self.allowed.allows(ns)
        }
    }

    /// Whether the agent's Applications may be in other namespaces than its Argo CD one.
    fn watches_all(&self) -> bool {
        self.across_namespaces()
            || (self.mode == AgentMode::Autonomous && self.allowed.has_patterns())
    }

    /// Autonomous: the hub name of a local Application ([`namespaces::hub_name`]), or why it
    /// has none. An Application of the Argo CD namespace named like the hub name of another
    /// namespace's Application keeps the name; the other is not published.
    fn hub_key(&self, obj: &DynamicObject) -> Result<String, HubNameRefusal> {
        let argocd = self.namespace.as_str();
        let ns = obj.metadata.namespace.as_deref().unwrap_or(argocd);
        let hub = namespaces::hub_name(argocd, ns, &name_of(obj)).map_err(HubNameRefusal::Name)?;
        if ns != argocd && self.cache.get(Some(argocd), &hub).is_some() {
            return Err(HubNameRefusal::Collision(hub));
        }
        Ok(hub)
    }

    /// Autonomous: `(namespace, name)` of the local Application published as `hub`, if
    /// there is one: the Argo CD namespace's Application of that name, else the
    /// `<namespace>.<name>` reading of it in an allowed namespace.
    fn hub_owner(&self, hub: &str) -> Option<(String, String)> {
        let argocd = self.namespace.as_str();
        if self.cache.get(Some(argocd), hub).is_some() {
            return Some((argocd.to_owned(), hub.to_owned()));
        }
        let (ns, name) = namespaces::split_hub_name(hub)?;
        (ns != argocd && self.allowed.allows(ns) && self.cache.get(Some(ns), name).is_some())
            .then(|| (ns.to_owned(), name.to_owned()))
    }

    /// Autonomous: tells (log and metric) why a local Application is not published.
    fn report_unpublished(&self, obj: &DynamicObject, why: &HubNameRefusal) {
        let ns = obj.metadata.namespace.as_deref().unwrap_or_default();
        let name = name_of(obj);
        match why {
            HubNameRefusal::Collision(hub) => {
                self.metrics.refused("name_collision");
                tracing::warn!(namespace = ns, %name, hub_name = %hub,
                    "application not published: an application of its hub name exists in the Argo CD namespace and keeps the name");
            }
            HubNameRefusal::Name(e) => {
                self.metrics.refused("name_too_long");
                tracing::warn!(namespace = ns, %name, error = %e, "application not published");
            }
        }
    }

    /// Whether Applications live in their hub namespaces (destination-based mapping).
    fn across_namespaces(&self) -> bool {
        self.by_destination && self.mode == AgentMode::Managed
    }

    /// Key of a local Application in the spoke's maps and the hello: its name, or
    /// `<namespace>/<name>` with destination-based mapping (as the principal keys them).
    fn key_of(&self, obj: &DynamicObject) -> String {
        if self.across_namespaces() {
            format!(
                "{}/{}",
                obj.metadata.namespace.as_deref().unwrap_or_default(),
                name_of(obj)
            )
        } else {
            name_of(obj)
        }
    }

    /// The key ([`Spoke::key_of`]) of the local Application `ns`/`name`.
    pub(crate) fn key_for(&self, ns: &str, name: &str) -> String {
        if self.across_namespaces() {
            format!("{ns}/{name}")
        } else {
            name.to_owned()
        }
    }

    /// Forgets the status last reported for `key`, so the next report goes out.
    pub(crate) fn forget_sent_status(&self, key: &str) {
        self.inner().sent_status.remove(key);
    }

    /// Sends `event` beside the queue on the current session (dropped, with a debug line,
    /// between sessions or when the channel is full: what it asks for comes again with
    /// the next resync).
    pub(crate) fn send_direct(&self, event: Event) {
        let sent = match &self.inner().late_replies {
            Some(tx) => tx.try_send(event).is_ok(),
            None => false,
        };
        if !sent {
            tracing::debug!("event beside the queue not sent: no session");
        }
    }

    /// Reports the status of `obj` now, even if unchanged.
    pub(crate) fn report_status_forced(&self, obj: &DynamicObject) {
        self.forget_sent_status(&self.key_of(obj));
        self.report_status(obj);
    }

    /// The hub reference of a key of [`Spoke::key_of`].
    pub(crate) fn key_ref(&self, key: &str) -> Option<ResourceRef> {
        match key.split_once('/') {
            Some((ns, name)) if self.across_namespaces() => Some(ResourceRef::new(
                ResourceKind::Application,
                Namespace::new(ns).ok()?,
                name,
            )),
            Some(_) => None,
            None => self.app_ref(key),
        }
    }

    /// `(namespace, name)` on the spoke of an Application the principal names: its hub
    /// namespace and name with destination-based mapping; an autonomous agent's
    /// Application published under that hub name ([`Spoke::hub_owner`]); else the name in
    /// the agent's Argo CD namespace.
    pub(crate) fn local_target(&self, resource: &ResourceRef) -> (String, String) {
        if self.across_namespaces() {
            return (
                resource.namespace.as_str().to_owned(),
                resource.name.clone(),
            );
        }
        if self.mode == AgentMode::Autonomous
            && let Some(target) = self.hub_owner(&resource.name)
        {
            return target;
        }
        (self.namespace.as_str().to_owned(), resource.name.clone())
    }

    /// Argo CD's instance name (the part of its cache keys naming an Application) of the
    /// local copy of the Application the principal names, if this agent holds it: the name
    /// in Argo CD's namespace, `<namespace>_<name>` elsewhere.
    pub fn redis_instance(&self, resource: &ResourceRef) -> Option<String> {
        crate::redis::instance_name(
            resource,
            self.across_namespaces(),
            self.hub_namespace().as_ref(),
            &self.namespace,
            |r| {
                let (ns, name) = self.local_target(r);
                self.cache
                    .get(Some(&ns), &name)
                    .is_some_and(|o| self.relevant(&o))
                    .then_some((ns, name))
            },
        )
    }

    /// Where the Applications a resource tree names are on the hub, for the Redis answers
    /// (`None` with destination-based mapping, where hub and spoke namespaces are the same,
    /// or before the first welcome).
    pub(crate) fn tree_namespaces(&self) -> Option<crate::redis::TreeNamespaces> {
        if self.across_namespaces() {
            return None;
        }
        Some(crate::redis::TreeNamespaces {
            hub: self.hub_namespace()?.to_string(),
            argocd: self.namespace.to_string(),
            allowed: (self.mode == AgentMode::Autonomous).then(|| self.allowed.clone()),
        })
    }

    /// `(namespace, name)` of the Applications this agent holds (for the resource proxy's
    /// "managed by Argo CD on this spoke").
    pub fn held_applications(&self) -> Vec<(String, String)> {
        self.local()
            .into_values()
            .map(|o| {
                (
                    o.metadata.namespace.clone().unwrap_or_default(),
                    name_of(&o),
                )
            })
            .collect()
    }

    /// What the resource proxy needs to know of each Application this agent holds: its
    /// namespace and name, its destination namespace and the objects in its status.
    pub fn held_application_facts(&self) -> Vec<crate::proxy::rules::AppFacts> {
        self.local()
            .into_values()
            .map(|o| {
                crate::proxy::rules::AppFacts::from_application(
                    o.metadata.namespace.as_deref().unwrap_or_default(),
                    &name_of(&o),
                    &o.data,
                )
            })
            .collect()
    }

    /// Applications this agent holds.
    pub fn app_count(&self) -> usize {
        self.local().len()
    }

    /// Local objects that take part in sync, by key.
    fn local(&self) -> HashMap<String, Arc<DynamicObject>> {
        let objects = if self.watches_all() {
            self.cache.list()
        } else {
            self.cache.list_namespace(self.namespace.as_str())
        };
        objects
            .into_iter()
            .filter(|o| self.relevant(o) && !argocd_agent_kubernetes::is_sync_ignored(o))
            .filter_map(|o| {
                let key = match self.mode {
                    AgentMode::Autonomous => self.hub_key(&o).ok()?,
                    AgentMode::Managed => self.key_of(&o),
                };
                Some((key, o))
            })
            .collect()
    }

    /// Spec and status checksums for the hello (what this agent holds), from one read of
    /// the cache. Status
    /// checksums only in autonomous mode, where the principal compares them (a managed
    /// agent reports every status after each welcome instead).
    fn hello_checksums(&self) -> (Checksums, Checksums) {
        let mut specs = Checksums::new();
        let mut statuses = Checksums::new();
        for (n, o) in self.local() {
            if is_being_deleted(&o) {
                continue;
            }
            if self.mode == AgentMode::Autonomous {
                statuses.insert(n.clone(), status_checksum(&o));
            }
            specs.insert(n, spec_checksum(&o));
        }
        (specs, statuses)
    }

    /// Managed: the hub UID each local copy was made from (its source-uid annotation).
    pub fn source_uids(&self) -> argocd_agent_domain::resync::SourceUids {
        self.local()
            .into_iter()
            .filter_map(|(n, o)| Some((n, source_uid(&o)?)))
            .collect()
    }

    /// After a restart, the local managed copies are the best knowledge of what the
    /// principal wants until it says otherwise (resync corrects differences).
    pub fn seed_desired(&self) {
        if self.mode != AgentMode::Managed {
            return;
        }
        self.seed_config_desired();
        let local = self.local();
        let mut inner = self.inner();
        for (name, obj) in local {
            inner.desired.entry(name).or_insert_with(|| wire(&obj));
        }
    }

    /// The hub namespace the principal assigned us (after the first welcome).
    pub fn hub_namespace(&self) -> Option<Namespace> {
        self.inner().hub_namespace.clone()
    }

    fn app_ref(&self, name: &str) -> Option<ResourceRef> {
        Some(ResourceRef::new(
            ResourceKind::Application,
            self.hub_namespace()?,
            name,
        ))
    }

    pub(crate) fn push(&self, event: Event) {
        let (ty, kind) = (event.ty.verb(), event.resource.as_ref().map(|r| r.kind));
        if let Err(e) = self.queue.push(event) {
            self.metrics.discarded(ty, kind);
            tracing::warn!(error = %e, "event to principal dropped");
        }
    }

    fn push_delete(&self, name: &str) {
        if let Some(r) = self.app_ref(name) {
            self.push(Event::resource(
                &self.source,
                EventType::Delete,
                r,
                Payload::None,
            ));
        }
    }

    /// Called after each welcome: remember the hub namespace, report what the principal
    /// needs from us.
    pub fn after_welcome(&self, hub_namespace: Namespace) {
        let hello = {
            let mut inner = self.inner();
            inner.hub_namespace = Some(hub_namespace);
            inner.sent_status.clear();
            inner.sent_object.clear();
            inner.hello.take()
        };
        self.reset_published_config();
        match self.mode {
            AgentMode::Managed => {
                for obj in self.local().values() {
                    self.report_status(obj);
                }
                self.report_guard_refusals();
                self.publish_children();
            }
            AgentMode::Autonomous => {
                if let Some(said) = hello {
                    self.publish_changed_since_hello(&said.apps, &said.statuses);
                    self.publish_config_changed_since_hello(&said.config);
                }
            }
        }
    }

    /// The resync state for the hello, remembered until the welcome. Autonomous agents
    /// report each Application's status checksum too: the status is theirs, and a status
    /// change the hub missed (made while this agent was down, say) is requested again.
    pub fn hello_state(&self) -> ResyncState {
        let (state, said) = self.view();
        self.inner().hello = Some(said);
        state
    }

    /// What this agent holds now, as a periodic resync request reports it (as the hello
    /// does, without remembering it: the welcome that uses the hello's is long past).
    /// A managed agent reports, per copy, the checksum of the status it last sent (its
    /// statuses are the hub copy's): the principal asks again for those its copy lacks.
    pub fn resync_view(&self) -> ResyncState {
        let mut state = self.view().0;
        if self.mode == AgentMode::Managed {
            let inner = self.inner();
            for r in state
                .resources
                .iter_mut()
                .filter(|r| r.kind == ResourceKind::Application.as_str())
            {
                if let Some(sum) = inner.sent_status.get(&r.name) {
                    r.status_checksum = sum.clone();
                }
            }
        }
        state
    }

    fn view(&self) -> (ResyncState, HelloState) {
        let (apps, statuses) = self.hello_checksums();
        let config = self.config_checksums();
        let mut state = argocd_agent_domain::resync::to_state("Application", &apps);
        let uids = self.source_uids();
        for r in &mut state.resources {
            r.source_uid = uids.get(&r.name).cloned().unwrap_or_default();
            r.status_checksum = statuses.get(&r.name).cloned().unwrap_or_default();
        }
        state.resources.extend(config.iter().cloned());
        state.resources.extend(self.children_hello());
        let said = HelloState {
            apps,
            statuses,
            config,
        };
        (state, said)
    }

    /// Autonomous: local changes the principal cannot know from the hello (made while the
    /// handshake was in flight, when there was no hub namespace to publish them under),
    /// status changes included.
    fn publish_changed_since_hello(&self, said: &Checksums, said_status: &Checksums) {
        let local = self.local();
        for (name, obj) in &local {
            if is_being_deleted(obj) {
                continue;
            }
            if said.get(name) != Some(&spec_checksum(obj))
                || said_status.get(name) != Some(&status_checksum(obj))
            {
                self.publish(obj);
            }
        }
        for name in said.keys().filter(|n| !local.contains_key(*n)) {
            self.push_delete(name);
        }
    }

    fn report_status(&self, obj: &DynamicObject) {
        self.report_status_with(obj, None);
    }

    /// Managed: whether the spoke's Argo CD has carried out the hub's refresh request
    /// written on the copy `key` (it removed the annotation, as its application controller
    /// does after reconciling: argoproj/argo-cd `controller/appcontroller.go`,
    /// `processAppRefreshQueueItem`). Returns the request's value, once; what is reverted
    /// to from then on has no refresh request.
    fn refresh_done(&self, key: &str, obj: &DynamicObject) -> Option<String> {
        let has = obj
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(object::REFRESH_ANNOTATION));
        if has {
            return None;
        }
        let mut inner = self.inner();
        let value = inner.refresh_applied.remove(key)?;
        if let Some(d) = inner.desired.get_mut(key)
            && let Some(a) = Arc::make_mut(d)
                .pointer_mut("/metadata/annotations")
                .and_then(Value::as_object_mut)
        {
            a.remove(object::REFRESH_ANNOTATION);
        }
        Some(value)
    }

    /// Reports the status of `obj` when it changed, or when `refreshed` says the hub's
    /// refresh request was carried out.
    fn report_status_with(&self, obj: &DynamicObject, refreshed: Option<String>) {
        let key = self.key_of(obj);
        let name = name_of(obj);
        let guard_condition = self.guard_condition(&key);
        let Some(mut status) = object::status(obj)
            .cloned()
            .or_else(|| (refreshed.is_some() || guard_condition.is_some()).then(|| json!({})))
        else {
            return;
        };
        if let Some(c) = guard_condition {
            add_condition(&mut status, c);
        }
        let Some(r) = self.key_ref(&key) else { return };
        let sum = object::checksum_of(&status);
        if self.inner().sent_status.insert(key, sum.clone()) == Some(sum) && refreshed.is_none() {
            return;
        }
        // A managed copy names the hub object it was made from, so the principal can tell
        // the status of a copy it has since replaced.
        let mut metadata = json!({ "name": name });
        if let Some(uid) = source_uid(obj) {
            metadata["annotations"] = json!({ object::SOURCE_UID_ANNOTATION: uid });
        }
        if let Some(value) = refreshed {
            metadata["annotations"][REFRESHED_ANNOTATION] = Value::String(value);
        }
        self.push(Event::resource(
            &self.source,
            EventType::StatusUpdate,
            r,
            Payload::Object(Arc::new(json!({"metadata": metadata, "status": status}))),
        ));
    }

    /// Managed: the principal asks for a copy's status again; it is sent even if this
    /// agent sent the same before (that one was lost on the way).
    fn report_status_again(&self, resource: &ResourceRef) {
        let (ns, name) = self.local_target(resource);
        self.inner().sent_status.remove(&self.key_for(&ns, &name));
        match self.cache.get(Some(&ns), &name) {
            Some(obj) if !is_being_deleted(&obj) => self.report_status(&obj),
            _ => {
                tracing::debug!(object = %resource, "status asked for of a copy this agent does not hold")
            }
        }
    }

    /// Autonomous: publishes a local Application under its hub name.
    fn publish(&self, obj: &DynamicObject) {
        let Ok(hub) = self.hub_key(obj) else { return };
        let Some(r) = self.app_ref(&hub) else { return };
        let mut w = Arc::unwrap_or_clone(wire(obj));
        w["metadata"]["namespace"] = Value::String(r.namespace.to_string());
        w["metadata"]["name"] = Value::String(hub.clone());
        let sum = object::checksum_of(&w);
        if self.inner().sent_object.insert(hub, sum.clone()) == Some(sum) {
            return;
        }
        self.push(Event::resource(
            &self.source,
            EventType::SpecUpdate,
            r,
            Payload::Object(Arc::new(w)),
        ));
    }

    /// Handles a change of a local Application.
    /// Span `agent.local_change`: the root of the trace of what the change sends up
    /// (status, or an autonomous agent's object).
    pub async fn on_local_change(&self, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        if !self.takes_namespace(obj.metadata.namespace.as_deref().unwrap_or_default()) {
            return;
        }
        if deleted {
            self.deleted_locally(&self.key_of(&obj));
        }
        let span = tracing::info_span!(parent: None, "agent.local_change",
            source = %self.source,
            "object.kind" = ResourceKind::Application.as_str(),
            "object.namespace" = obj.metadata.namespace.as_deref().unwrap_or_default(),
            "object.name" = obj.metadata.name.as_deref().unwrap_or_default(),
            change = if deleted { "deleted" } else { "applied" });
        async {
            match self.mode {
                AgentMode::Managed => {
                    let has_desired = self.inner().desired.contains_key(&self.key_of(&obj));
                    if self.is_child_candidate(&obj, has_desired) {
                        self.on_child_change(&obj, deleted).await;
                    } else {
                        self.on_managed_change(&obj, deleted).await;
                        self.after_parent_change(&obj, deleted);
                    }
                }
                AgentMode::Autonomous => self.on_autonomous_change(&obj, deleted),
            }
        }
        .instrument(span)
        .await
    }

    /// Managed: local edits and deletions are reverted; status goes up.
    async fn on_managed_change(&self, obj: &DynamicObject, deleted: bool) {
        let name = self.key_of(obj);
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let desired = self.inner().desired.get(&name).cloned();
        let Some(desired) = desired else { return };
        if is_being_deleted(obj) && !deleted {
            return;
        }
        let what = if deleted {
            "deletion"
        } else if spec_checksum(obj)
            != object::checksum_of(desired.get("spec").unwrap_or(&Value::Null))
            || !is_managed_copy(obj)
            || hub_metadata(&wire(obj)) != hub_metadata(&desired)
        {
            "edit"
        } else {
            let refreshed = self.refresh_done(&name, obj);
            self.report_status_with(obj, refreshed);
            return;
        };
        tracing::info!(name = %name, "reverting local {what} of managed application");
        let known = self.cache.known(Some(&ns), &name_of(obj));
        match self.upsert_local(&desired, &ns, known).await {
            Ok(()) if deleted => self.after_recreate(&ns, &name_of(obj)).await,
            Ok(()) => {}
            Err(e) => tracing::warn!(name = %name, error = %e, "could not revert local {what}"),
        }
        if !deleted {
            self.report_status(obj);
        }
    }

    /// `--on-application-recreate`: what follows the recreation of a locally deleted
    /// Application.
    async fn after_recreate(&self, ns: &str, name: &str) {
        let ns = Some(ns);
        let result = match self.policies.on_recreate {
            RecreateAction::Ignore => return,
            RecreateAction::ClearStatus => match self.apps.get(ns, name).await {
                Ok(Some(cur)) => match object::status(&cur) {
                    Some(status) if status.get("operationState").is_some() => {
                        let mut status = status.clone();
                        if let Some(m) = status.as_object_mut() {
                            m.remove("operationState");
                        }
                        self.apps.replace_status(ns, name, status).await.map(|_| ())
                    }
                    _ => Ok(()),
                },
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
            RecreateAction::Resync => self
                .apps
                .patch_merge(
                    ns,
                    name,
                    &json!({"operation": {"initiatedBy": {"username": "argocd-agent"}, "sync": {}}}),
                )
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {
                tracing::info!(%name, action = %self.policies.on_recreate, "recreated application handled")
            }
            Err(e) => {
                tracing::warn!(%name, action = %self.policies.on_recreate, error = %argocd_agent_domain::error_chain(&e), "could not handle recreated application")
            }
        }
    }

    /// Managed: before the principal's object is written over a local one, applies the
    /// adoption and source-UID mismatch policies ([`policy::plan_write`]). Returns whether
    /// it deleted the local object (the watch cache still holds it until the watch says so).
    pub(crate) async fn prepare_write(
        &self,
        resources: &Resources,
        local: Option<Arc<DynamicObject>>,
        incoming: &Value,
    ) -> Result<bool, SpokeError> {
        let is_ours = local.as_deref().is_some_and(is_managed_copy);
        match policy::plan_write(&self.policies, local.as_deref(), is_ours, incoming) {
            WritePlan::Upsert => Ok(false),
            WritePlan::Refuse(why) => Err(SpokeError::AdoptionRefused(why)),
            WritePlan::Recreate => {
                let name = local.as_deref().map(name_of).unwrap_or_default();
                let ns = local
                    .as_deref()
                    .and_then(|l| l.metadata.namespace.clone())
                    .unwrap_or_else(|| self.namespace.to_string());
                tracing::info!(kind = %resources.kind(), %name, "the hub object was recreated: recreating the local copy");
                match resources.delete(Some(&ns), &name).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.is_not_found() => Ok(true),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Autonomous: every local change is published, under the Application's hub name.
    fn on_autonomous_change(&self, obj: &DynamicObject, deleted: bool) {
        if argocd_agent_kubernetes::is_sync_ignored(obj) {
            return;
        }
        let hub = match self.hub_key(obj) {
            Ok(hub) => hub,
            Err(why) => {
                if !deleted {
                    self.report_unpublished(obj, &why);
                }
                return;
            }
        };
        if deleted {
            self.inner().sent_object.remove(&hub);
            // The hub name passes to another namespace's Application (`x`/`y` once the Argo
            // CD namespace's `x.y` is gone), or the hub copy goes.
            let next = self
                .hub_owner(&hub)
                .and_then(|(ns, name)| self.cache.get(Some(&ns), &name))
                .filter(|o| !is_being_deleted(o) && !argocd_agent_kubernetes::is_sync_ignored(o));
            match next {
                Some(next) => self.publish(&next),
                None => self.push_delete(&hub),
            }
            return;
        }
        if !is_being_deleted(obj) {
            self.warn_takeover(obj, &hub);
            self.publish(obj);
        }
    }

    /// Autonomous: an Application of the Argo CD namespace published for the first time
    /// under a hub name another namespace's Application had: that one is published no more.
    fn warn_takeover(&self, obj: &DynamicObject, hub: &str) {
        if obj.metadata.namespace.as_deref() != Some(self.namespace.as_str())
            || self.inner().sent_object.contains_key(hub)
        {
            return;
        }
        if let Some((ns, name)) = namespaces::split_hub_name(hub)
            && ns != self.namespace.as_str()
            && self.allowed.allows(ns)
            && self.cache.get(Some(ns), name).is_some()
        {
            self.metrics.refused("name_collision");
            tracing::warn!(hub_name = %hub, namespace = ns, %name,
                "the Argo CD namespace's application takes the hub name: the other namespace's application is not published");
        }
    }

    /// Creates or updates the local copy of a managed Application from the principal's object.
    /// `known` is what the watch cache says of the local object ([`Known::Unknown`] when the
    /// cache cannot be trusted, e.g. right after this agent deleted it).
    async fn upsert_local(
        &self,
        incoming: &Value,
        ns: &str,
        known: Known,
    ) -> Result<(), SpokeError> {
        let mut copy = object::received_copy(incoming, ns, (MANAGED_LABEL, "true"))
            .map_err(SpokeError::NotAnObject)?;
        if name_of(&copy).is_empty() {
            return Err(SpokeError::NoName);
        }
        // Status is the spoke's own; the operation comes as its own event. The hub's
        // notification state and last-applied record are the hub's: the spoke keeps its own.
        if let Some(a) = copy.metadata.annotations.as_mut() {
            a.retain(|k, _| !object::side_local_key(k));
        }
        object::take_field(&mut copy, "status");
        object::take_field(&mut copy, "operation");
        self.apps
            .upsert_copy_keeping(&copy, &["spec"], known, &object::spoke_owned_key)
            .instrument(spoke_write_span("upsert", ns, &name_of(&copy)))
            .await?;
        Ok(())
    }

    async fn delete_local(&self, ns: &str, name: &str) -> Result<DeleteOutcome, SpokeError> {
        match self
            .apps
            .delete(Some(ns), name)
            .instrument(spoke_write_span("delete", ns, name))
            .await
        {
            Ok(outcome) => Ok(outcome),
            Err(e) if e.is_not_found() => Ok(DeleteOutcome::NotFound),
            Err(e) => Err(e.into()),
        }
    }

    /// Managed: deletes the copy of `resource` the principal asked to delete. Returns its
    /// key when finalizers hold it (the spoke's Argo CD deletes its resources first).
    async fn delete_copy(&self, resource: &ResourceRef) -> Result<Option<String>, SpokeError> {
        let (ns, name) = self.local_target(resource);
        let (ns, name) = (ns.as_str(), name.as_str());
        let key = self.key_for(ns, name);
        {
            let mut inner = self.inner();
            inner.desired.remove(&key);
            inner.sent_status.remove(&key);
        }
        self.guard_forget_app(&key);
        match self.delete_local(ns, name).await? {
            DeleteOutcome::Pending => Ok(Some(key)),
            DeleteOutcome::Deleted | DeleteOutcome::NotFound => Ok(None),
        }
    }

    /// Acknowledges `event` (a delete) once the copy `key` is gone; at once if it already is.
    fn ack_when_gone(&self, key: String, event: &Event) {
        let (ns, name) = match key.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (self.namespace.as_str().to_owned(), key.clone()),
        };
        tracing::info!(name = %key, "copy held by finalizers: acknowledged once the spoke's Argo CD has deleted it");
        self.inner()
            .pending_deletes
            .insert(key.clone(), event.clone());
        // Gone meanwhile (the watch reported it before the entry above existed).
        if self.cache.get(Some(ns.as_str()), &name).is_none() {
            self.deleted_locally(&key);
        }
    }

    /// A local copy is gone: a delete waiting for that is acknowledged now.
    fn deleted_locally(&self, key: &str) {
        let mut inner = self.inner();
        let Some(event) = inner.pending_deletes.remove(key) else {
            return;
        };
        let ack = event.ack(&self.source);
        match &inner.late_replies {
            Some(tx) if tx.try_send(ack).is_ok() => {}
            // No session, or its channel full: the principal sends the delete again and
            // finds the copy gone.
            _ => tracing::debug!(name = %key, "late acknowledgement not sent"),
        }
    }

    /// The current session's channel for answers that come later than their event.
    pub(crate) fn set_late_replies(&self, tx: Option<tokio::sync::mpsc::Sender<Event>>) {
        self.inner().late_replies = tx;
    }

    /// Handles one event from the principal. Returns the reply to send, if any.
    pub async fn on_principal_event(&self, event: &Event) -> Option<Event> {
        let resource = event.resource.as_ref()?;
        if resource.kind != ResourceKind::Application {
            return self.on_config_event(event, resource).await;
        }
        if self.across_namespaces()
            && self.hub_namespace().is_some()
            && let Some(result) = outside_allowed(&self.allowed, event, resource)
        {
            if result.is_ok() {
                tracing::info!(object = %resource, "delete of an application in a namespace this agent does not take: nothing to delete");
            }
            return Some(self.answer(event, resource, result));
        }
        let planned = plan(
            self.mode,
            self.hub_namespace().as_ref(),
            self.across_namespaces(),
            event,
        );
        if matches!(planned, Ok(Command::Upsert(_) | Command::SetOperation(_)))
            && let Some(refusal) = self.guard_app_event(event)
        {
            return Some(self.refuse_app_event(event, resource, refusal));
        }
        let result = match planned {
            Ok(Command::Republish) => {
                self.republish(&resource.name);
                return None;
            }
            Ok(Command::ReportStatus) => {
                self.report_status_again(resource);
                return None;
            }
            Ok(Command::Delete) => {
                let span = tracing::info_span!("agent.apply", command = "delete");
                match self.delete_copy(resource).instrument(span).await {
                    Ok(Some(key)) => {
                        self.ack_when_gone(key, event);
                        return None;
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Ok(command) => {
                let span = tracing::info_span!("agent.apply", command = command.name());
                let upsert = matches!(command, Command::Upsert(_));
                let result = self.apply(resource, command).instrument(span).await;
                if upsert && result.is_ok() {
                    self.guard_accepted_app(resource);
                }
                result
            }
            Err(e) => Err(e),
        };
        Some(self.answer(event, resource, result))
    }

    /// The answer to an event from the principal: `processed`, or an `error` naming the
    /// object (never the payload, which may be a Secret) and the cause.
    pub(crate) fn answer(
        &self,
        event: &Event,
        resource: &ResourceRef,
        result: Result<(), SpokeError>,
    ) -> Event {
        match result {
            Ok(()) => event.ack(&self.source),
            Err(e) => {
                let message = argocd_agent_domain::error_chain(&e);
                tracing::warn!(object = %resource, r#type = %event.ty, error = %message, "could not apply event");
                let reason = match e {
                    SpokeError::WrongNamespace(_) => "Forbidden",
                    SpokeError::NamespaceNotPermitted { .. } => {
                        self.metrics.refused("namespace_not_permitted");
                        "Forbidden"
                    }
                    SpokeError::NamespaceMissing(_) => {
                        self.metrics.refused("namespace_missing");
                        "ApplyFailed"
                    }
                    _ => "ApplyFailed",
                };
                event.error_reply(&self.source, reason, message)
            }
        }
    }

    /// Autonomous: the principal asks for one application again, by hub name.
    fn republish(&self, hub: &str) {
        self.inner().sent_object.remove(hub);
        let local = self
            .hub_owner(hub)
            .and_then(|(ns, name)| self.cache.get(Some(&ns), &name));
        match local {
            Some(obj) if !is_being_deleted(&obj) => self.publish(&obj),
            _ => self.push_delete(hub),
        }
    }

    async fn apply(&self, resource: &ResourceRef, command: Command) -> Result<(), SpokeError> {
        let (ns, name) = self.local_target(resource);
        let (ns, name) = (ns.as_str(), name.as_str());
        match command {
            Command::Upsert(obj) => self.apply_upsert(ns, name, obj).await,
            Command::Refresh(value) => {
                self.apps
                    .patch_merge(
                        Some(ns),
                        name,
                        &json!({"metadata": {"annotations": {object::REFRESH_ANNOTATION: value}}}),
                    )
                    .instrument(spoke_write_span("refresh", ns, name))
                    .await?;
                Ok(())
            }
            Command::Delete => self.delete_copy(resource).await.map(|_| ()),
            Command::SetOperation(op) => {
                self.apps
                    .patch_merge(Some(ns), name, &json!({"operation": op}))
                    .instrument(spoke_write_span("set-operation", ns, name))
                    .await?;
                Ok(())
            }
            Command::TerminateOperation => {
                self.apps
                    .terminate_operation(ns, name)
                    .instrument(spoke_write_span("terminate-operation", ns, name))
                    .await?;
                Ok(())
            }
            Command::Republish | Command::ReportStatus => Ok(()),
        }
    }
}

impl Spoke {
    /// Managed: writes the principal's object as the local copy `ns`/`name`.
    async fn apply_upsert(&self, ns: &str, name: &str, obj: Arc<Value>) -> Result<(), SpokeError> {
        let key = self.key_for(ns, name);
        let local = self.cache.get(Some(ns), name);
        if local.is_none() && self.across_namespaces() && self.create_namespace {
            self.ensure_namespace(ns).await?;
        }
        // What local changes are reverted to from now on, set before a recreate
        // deletes the local copy: the watch may report that deletion (and revert
        // it) before the delete call returns here, and a revert to the previous
        // object would overwrite this write.
        let previous = self.inner().desired.insert(key.clone(), obj.clone());
        let deleted = match self.prepare_write(&self.apps, local, &obj).await {
            Ok(deleted) => deleted,
            Err(e) => {
                restore(&mut self.inner().desired, key, previous);
                return Err(e);
            }
        };
        let known = if deleted {
            Known::Unknown
        } else {
            self.cache.known(Some(ns), name)
        };
        if let Err(e) = self.upsert_local(&obj, ns, known).await {
            return Err(self.explain_write_error(ns, e).await);
        }
        if let Some(v) = object::annotation_of(&obj, object::REFRESH_ANNOTATION) {
            self.inner().refresh_applied.insert(key, v.to_owned());
        }
        Ok(())
    }

    /// `--create-namespace`: creates namespace `ns` unless it exists.
    async fn ensure_namespace(&self, ns: &str) -> Result<(), SpokeError> {
        let Some(api) = &self.namespace_api else {
            return Ok(());
        };
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        }))
        .map_err(SpokeError::NotAnObject)?;
        match api.create(&obj).await {
            Ok(_) => {
                tracing::info!(
                    namespace = ns,
                    "created namespace for a managed application"
                );
                Ok(())
            }
            Err(e) if e.is_already_exists() => Ok(()),
            Err(source) => Err(SpokeError::CreateNamespace {
                namespace: ns.to_owned(),
                source: Box::new(source),
            }),
        }
    }

    /// A write of a copy in `ns` the API server answered "not found": said as a missing
    /// namespace when that is why.
    async fn explain_write_error(&self, ns: &str, e: SpokeError) -> SpokeError {
        let not_found = matches!(&e, SpokeError::Kube(k) if k.is_not_found());
        match &self.namespace_api {
            Some(api) if not_found && self.across_namespaces() => match api.get(None, ns).await {
                Ok(None) => SpokeError::NamespaceMissing(ns.to_owned()),
                _ => e,
            },
            _ => e,
        }
    }
}

/// Adds `condition` to `status.conditions` (replacing one of its type).
fn add_condition(status: &mut Value, condition: Value) {
    if !status.is_object() {
        *status = json!({});
    }
    let ty = condition.get("type").cloned();
    let conditions = &mut status["conditions"];
    if !conditions.is_array() {
        *conditions = json!([]);
    }
    if let Some(list) = conditions.as_array_mut() {
        list.retain(|c| c.get("type") != ty.as_ref());
        list.push(condition);
    }
}

/// Managed with destination-based mapping: the answer to an event for an Application in a
/// namespace the agent does not take (`None`: the namespace is allowed). A delete is done
/// (the agent holds nothing there); anything else is refused.
fn outside_allowed(
    allowed: &AllowedNamespaces,
    event: &Event,
    resource: &ResourceRef,
) -> Option<Result<(), SpokeError>> {
    if allowed.allows(resource.namespace.as_str()) {
        return None;
    }
    if event.ty == EventType::Delete {
        return Some(Ok(()));
    }
    Some(Err(SpokeError::NamespaceNotPermitted {
        namespace: resource.namespace.as_str().to_owned(),
        allowed: allowed.describe(),
    }))
}

/// Span `agent.spoke_write` around one write to the spoke's API server.
fn spoke_write_span(op: &'static str, ns: &str, name: &str) -> tracing::Span {
    tracing::info_span!(
        "agent.spoke_write",
        op,
        "object.kind" = ResourceKind::Application.as_str(),
        "object.namespace" = ns,
        "object.name" = name
    )
}

/// What an event from the principal asks of the spoke.
#[derive(Debug, Clone, PartialEq)]
enum Command {
    /// Managed: create or update the local copy.
    Upsert(Arc<Value>),
    /// Managed: delete the local copy.
    Delete,
    /// Set `.operation` (a sync requested on the hub).
    SetOperation(Value),
    /// Terminate the running operation.
    TerminateOperation,
    /// Autonomous: publish the local object again (or its deletion).
    Republish,
    /// Managed: report the local copy's status again (a periodic resync found the hub's
    /// copy holding another status than the one this agent last sent).
    ReportStatus,
    /// Autonomous: a refresh requested on the hub copy (`normal` or `hard`), written as
    /// Argo CD's refresh annotation on the local Application.
    Refresh(String),
}

impl Command {
    /// For span fields.
    fn name(&self) -> &'static str {
        match self {
            Command::Upsert(_) => "upsert",
            Command::Delete => "delete",
            Command::SetOperation(_) => "set-operation",
            Command::TerminateOperation => "terminate-operation",
            Command::Republish => "republish",
            Command::ReportStatus => "report-status",
            Command::Refresh(_) => "refresh",
        }
    }
}

/// Decides what an event from the principal means for a spoke in `mode` whose hub namespace
/// is `hub_ns`, without side effects.
/// With `across_namespaces` (destination-based mapping, managed) any hub namespace is
/// accepted once the principal has welcomed us.
fn plan(
    mode: AgentMode,
    hub_ns: Option<&Namespace>,
    across_namespaces: bool,
    event: &Event,
) -> Result<Command, SpokeError> {
    let Some(resource) = &event.resource else {
        return Err(SpokeError::NotAccepted { ty: event.ty, mode });
    };
    let namespace_ok = match hub_ns {
        Some(_) if across_namespaces && mode == AgentMode::Managed => true,
        Some(ns) => *ns == resource.namespace,
        None => false,
    };
    if !namespace_ok {
        return Err(SpokeError::WrongNamespace(resource.to_string()));
    }
    match (mode, event.ty) {
        (AgentMode::Managed, EventType::Create | EventType::SpecUpdate) => {
            let obj = event.object().cloned().unwrap_or_default();
            if obj.pointer("/metadata/name").and_then(Value::as_str) != Some(resource.name.as_str())
            {
                return Err(SpokeError::NameMismatch(resource.name.clone()));
            }
            Ok(Command::Upsert(obj))
        }
        (AgentMode::Managed, EventType::Delete) => Ok(Command::Delete),
        (_, EventType::SetOperation) => Ok(Command::SetOperation(
            event
                .object()
                .and_then(|o| o.get("operation").cloned())
                .unwrap_or(Value::Null),
        )),
        (_, EventType::TerminateOperation) => Ok(Command::TerminateOperation),
        (AgentMode::Autonomous, EventType::RequestUpdate) => Ok(Command::Republish),
        (AgentMode::Managed, EventType::RequestUpdate) => Ok(Command::ReportStatus),
        // The principal carries a refresh requested on the hub copy as a spec-update whose
        // object holds nothing but the name and the refresh annotation (an older agent
        // refuses it, and the hub copy keeps its request).
        (AgentMode::Autonomous, EventType::SpecUpdate) => event
            .object()
            .and_then(|o| refresh_request(o))
            .map(Command::Refresh)
            .ok_or(SpokeError::NotAccepted { ty: event.ty, mode }),
        (mode, ty) => Err(SpokeError::NotAccepted { ty, mode }),
    }
}

/// The refresh value of a refresh request (an object with no `spec`, only metadata
/// carrying [`object::REFRESH_ANNOTATION`]).
fn refresh_request(obj: &Value) -> Option<String> {
    if obj.get("spec").is_some() {
        return None;
    }
    object::annotation_of(obj, object::REFRESH_ANNOTATION).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    fn event(ty: EventType, ns_: &str, payload: Payload) -> Event {
        Event::resource(
            "principal",
            ty,
            ResourceRef::new(ResourceKind::Application, ns(ns_), "guestbook"),
            payload,
        )
    }

    fn app(name: &str) -> Payload {
        Payload::Object(Arc::new(json!({"metadata": {"name": name}, "spec": {}})))
    }

    #[test]
    fn managed_spoke_applies_specs_and_deletes_from_its_hub_namespace() {
        let hub = ns("edge-1");
        let e = event(EventType::SpecUpdate, "edge-1", app("guestbook"));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), false, &e),
            Ok(Command::Upsert(_))
        ));
        let e = event(EventType::Delete, "edge-1", Payload::None);
        assert_eq!(
            plan(AgentMode::Managed, Some(&hub), false, &e).unwrap(),
            Command::Delete
        );
    }

    #[test]
    fn events_for_another_hub_namespace_are_refused_in_both_modes() {
        let hub = ns("edge-1");
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            let e = event(EventType::SetOperation, "edge-2", Payload::None);
            assert!(matches!(
                plan(mode, Some(&hub), false, &e),
                Err(SpokeError::WrongNamespace(_))
            ));
            // Before the first welcome nothing is accepted.
            assert!(matches!(
                plan(mode, None, false, &e),
                Err(SpokeError::WrongNamespace(_))
            ));
        }
    }

    #[test]
    fn autonomous_spoke_refuses_spec_and_delete_from_the_hub() {
        let hub = ns("edge-1");
        for ty in [EventType::Create, EventType::SpecUpdate, EventType::Delete] {
            let e = event(ty, "edge-1", app("guestbook"));
            assert!(
                matches!(
                    plan(AgentMode::Autonomous, Some(&hub), false, &e),
                    Err(SpokeError::NotAccepted { .. })
                ),
                "{ty}"
            );
        }
    }

    #[test]
    fn operations_reach_both_modes_and_request_update_asks_each_mode_for_its_own() {
        let hub = ns("edge-1");
        let op = Payload::Object(Arc::new(json!({"operation": {"sync": {}}})));
        for mode in [AgentMode::Managed, AgentMode::Autonomous] {
            let e = event(EventType::SetOperation, "edge-1", op.clone());
            assert_eq!(
                plan(mode, Some(&hub), false, &e).unwrap(),
                Command::SetOperation(json!({"sync": {}}))
            );
            let e = event(EventType::TerminateOperation, "edge-1", Payload::None);
            assert_eq!(
                plan(mode, Some(&hub), false, &e).unwrap(),
                Command::TerminateOperation
            );
        }
        let e = event(EventType::RequestUpdate, "edge-1", Payload::None);
        assert_eq!(
            plan(AgentMode::Autonomous, Some(&hub), false, &e).unwrap(),
            Command::Republish
        );
        // A managed agent owns only the status: the principal asks for that again.
        assert_eq!(
            plan(AgentMode::Managed, Some(&hub), false, &e).unwrap(),
            Command::ReportStatus
        );
    }

    #[test]
    fn destination_mapping_accepts_any_hub_namespace_for_managed_agents_only() {
        let hub = ns("edge-1");
        let e = event(EventType::SpecUpdate, "team-apps", app("guestbook"));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), true, &e),
            Ok(Command::Upsert(_))
        ));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), false, &e),
            Err(SpokeError::WrongNamespace(_))
        ));
        assert!(matches!(
            plan(AgentMode::Managed, None, true, &e),
            Err(SpokeError::WrongNamespace(_))
        ));
        let op = event(EventType::SetOperation, "team-apps", Payload::None);
        assert!(matches!(
            plan(AgentMode::Autonomous, Some(&hub), true, &op),
            Err(SpokeError::WrongNamespace(_))
        ));
    }

    #[test]
    fn autonomous_spoke_takes_a_refresh_request_from_the_hub() {
        let hub = ns("edge-1");
        let req = Payload::Object(Arc::new(json!({"metadata": {"name": "guestbook",
            "annotations": {object::REFRESH_ANNOTATION: "hard"}}})));
        let e = event(EventType::SpecUpdate, "edge-1", req);
        assert_eq!(
            plan(AgentMode::Autonomous, Some(&hub), false, &e).unwrap(),
            Command::Refresh("hard".into())
        );
        // With a spec it is an object, which an autonomous spoke never takes from the hub.
        let obj = Payload::Object(Arc::new(json!({"metadata": {"name": "guestbook",
            "annotations": {object::REFRESH_ANNOTATION: "hard"}}, "spec": {}})));
        let e = event(EventType::SpecUpdate, "edge-1", obj);
        assert!(plan(AgentMode::Autonomous, Some(&hub), false, &e).is_err());
    }

    #[test]
    fn the_hub_decides_labels_and_annotations_but_not_the_spokes_own() {
        let hub = json!({"metadata": {"labels": {"team": "a"},
            "annotations": {"owner": "x", object::REFRESH_ANNOTATION: "normal"}}});
        let local = json!({"metadata": {"labels": {"team": "a", MANAGED_LABEL: "true"},
            "annotations": {"owner": "x", object::NOTIFIED_ANNOTATION: "{}"}}});
        // The agent's label, the spoke's notification state and a refresh request (carried
        // out and removed by the spoke's Argo CD) are no drift.
        assert_eq!(hub_metadata(&hub), hub_metadata(&local));
        let edited = json!({"metadata": {"labels": {"team": "b", MANAGED_LABEL: "true"},
            "annotations": {"owner": "x"}}});
        assert_ne!(hub_metadata(&hub), hub_metadata(&edited));
    }

    #[test]
    fn destination_mapping_refuses_namespaces_not_allowed_but_takes_their_deletes() {
        let allowed = AllowedNamespaces::new("argocd", &["team-*".to_string()]).unwrap();
        for ns_ in ["argocd", "team-a"] {
            let e = event(EventType::SpecUpdate, ns_, app("guestbook"));
            assert!(outside_allowed(&allowed, &e, e.resource.as_ref().unwrap()).is_none());
        }
        for ty in [
            EventType::Create,
            EventType::SpecUpdate,
            EventType::SetOperation,
            EventType::TerminateOperation,
        ] {
            let e = event(ty, "prod", app("guestbook"));
            match outside_allowed(&allowed, &e, e.resource.as_ref().unwrap()) {
                Some(Err(err @ SpokeError::NamespaceNotPermitted { .. })) => {
                    let m = err.to_string();
                    assert!(
                        m.contains("namespace prod is not permitted")
                            && m.contains("--allowed-namespaces (team-*)"),
                        "{m}"
                    );
                }
                other => panic!("{ty}: {other:?}"),
            }
        }
        // Nothing is held there: a delete is done at once.
        let e = event(EventType::Delete, "prod", Payload::None);
        assert!(matches!(
            outside_allowed(&allowed, &e, e.resource.as_ref().unwrap()),
            Some(Ok(()))
        ));
    }

    #[test]
    fn payload_naming_another_object_is_refused() {
        let hub = ns("edge-1");
        let e = event(EventType::SpecUpdate, "edge-1", app("other"));
        assert!(matches!(
            plan(AgentMode::Managed, Some(&hub), false, &e),
            Err(SpokeError::NameMismatch(_))
        ));
    }
}
