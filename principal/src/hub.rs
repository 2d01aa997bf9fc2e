//! The hub side of synchronisation: per-agent state that outlives sessions, hub changes
//! routed to one worker per agent, and the writes that agents' events cause.
//!
//! Managed agents: the hub copy is the source of truth for `.spec`; changes become events in
//! the agent's queue; the agent's status lands in the hub copy's `/status`.
//! Autonomous agents: the agent's copy is the source of truth; hub edits are reverted from
//! the last object the agent sent (`desired`).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use argocd_agent_identity::{AgentIdentity, AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_kubernetes::object::{self, is_being_deleted, spec_checksum};
use argocd_agent_kubernetes::{Cache, Change, Resources, UpsertOutcome};
use argocd_agent_sync::queue::{Lane, QueueKey};
use argocd_agent_sync::resync::Checksums;
use argocd_agent_sync::{
    Event, EventType, JsonObject, LazyObject, Payload, QueueLimits, ResourceRef, SendQueue,
};
use futures::{Stream, StreamExt};
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::error::{ApplyError, chain};
use crate::inbound::Command;
use crate::metrics::{HubWrite, Metrics};
use crate::objects::{ConfigKey, ConfigObjects, OwnerRecord};
use crate::projects;

/// Label put on hub copies of autonomous agents' Applications (and checked for ownership).
pub const AGENT_NAME_LABEL: &str = "argocd-agent.argoproj-labs.io/agent-name";

type InboxKey = (ResourceKind, String);
/// A hub change and the span that routed it.
type Routed = (Change, tracing::Span);

/// Hub changes waiting for one agent's worker, coalesced by kind and object name: only the
/// newest change of an object matters (every handler acts on the object's current state),
/// so the inbox never holds more entries than the agent has objects. A change of the hub's
/// configuration objects is one flag: the worker re-evaluates the agent's whole set.
#[derive(Default)]
struct ChangeInbox {
    /// With each change, the span that routed it (the parent of its handling).
    pending: Mutex<(VecDeque<InboxKey>, HashMap<InboxKey, Routed>)>,
    config_dirty: AtomicBool,
    notify: Notify,
}

impl ChangeInbox {
    fn push(&self, key: InboxKey, change: Change) {
        let origin = tracing::Span::current();
        let mut guard = lock(&self.pending);
        let (order, latest) = &mut *guard;
        if latest.insert(key.clone(), (change, origin)).is_none() {
            order.push_back(key);
        }
        drop(guard);
        self.notify.notify_one();
    }

    fn drain(&self) -> Vec<(InboxKey, Change, tracing::Span)> {
        let mut guard = lock(&self.pending);
        let (order, latest) = &mut *guard;
        order
            .drain(..)
            .filter_map(|k| latest.remove(&k).map(|(c, origin)| (k, c, origin)))
            .collect()
    }

    fn mark_config_dirty(&self) {
        self.config_dirty.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    fn take_config_dirty(&self) -> bool {
        self.config_dirty.swap(false, Ordering::AcqRel)
    }
}

/// Mutable state of one agent, behind one lock.
pub(crate) struct AgentInner {
    identity: AgentIdentity,
    mode: AgentMode,
    /// The current session: its id and the token that closes it.
    session: Option<(u64, CancellationToken)>,
    /// Autonomous: the last object the agent sent, by name (what hub edits are reverted to).
    desired: HashMap<String, Arc<Value>>,
    /// Managed: spec checksum last sent, by name (so hub status writes are not echoed back).
    sent_spec: HashMap<String, String>,
    /// Operations already forwarded, by name -> checksum of `.operation`.
    sent_operation: HashMap<String, String>,
    /// Names whose terminate request (phase `Terminating` on the hub) was forwarded.
    sent_terminate: std::collections::HashSet<String>,
    /// Managed: configuration objects last sent (kind, name) -> content checksum.
    pub(crate) sent_config: HashMap<ConfigKey, String>,
    /// Autonomous: the agent's projects as it sent them, by their name on the spoke.
    pub(crate) desired_projects: HashMap<String, Arc<Value>>,
    /// What the operator API shows about the current (or last) session.
    session_info: SessionInfo,
    /// Why the principal closed the current session, told to the agent.
    close_reason: Option<String>,
}

/// What is known about an agent's current (or last) session, for the operator API.
#[derive(Debug, Clone, Default)]
pub struct SessionInfo {
    pub connected_since: Option<std::time::SystemTime>,
    /// The peer address (the sidecar's or the ingress's when one sits in front).
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The agent's version, from its hello.
    pub agent_version: String,
    /// notAfter of the client certificate, when the session is mutual TLS.
    pub svid_expiry: Option<std::time::SystemTime>,
    /// SHA-256 of the client certificate, when the session is mutual TLS (blocklist).
    pub fingerprint: Option<String>,
}

/// State of one agent, kept across its sessions.
pub struct AgentState {
    /// The agent's name (fixed: a new name is a new agent).
    pub name: AgentName,
    /// Events to the agent.
    pub queue: SendQueue,
    inner: Mutex<AgentInner>,
    inbox: ChangeInbox,
    /// Last event received from the agent, Unix milliseconds (0: none yet).
    last_event_ms: AtomicI64,
    /// Requests to the current session (none while disconnected).
    link: Mutex<Option<Arc<crate::link::AgentLink>>>,
    /// The agent's inbound event rate limit: per agent, not per session, so reconnecting
    /// does not refill it.
    limiter: Mutex<crate::ratelimit::EventLimiter>,
}

impl AgentState {
    pub(crate) fn inner(&self) -> MutexGuard<'_, AgentInner> {
        lock(&self.inner)
    }
    /// Hands a hub change of one of this agent's objects to its worker.
    pub(crate) fn push_change(&self, kind: ResourceKind, name: String, change: Change) {
        self.inbox.push((kind, name), change);
    }
    /// Tells the worker to re-evaluate the agent's configuration objects.
    pub(crate) fn mark_config_dirty(&self) {
        self.inbox.mark_config_dirty();
    }
    /// Takes one token of the agent's inbound event rate limit.
    pub fn check_rate(&self) -> crate::ratelimit::Verdict {
        lock(&self.limiter).check(std::time::Instant::now())
    }
    /// The agent's hub namespace.
    pub fn namespace(&self) -> Namespace {
        self.inner().identity.namespace.clone()
    }
    /// Why the principal closed the session, if it said (taken once).
    pub(crate) fn take_close_reason(&self) -> Option<String> {
        self.inner().close_reason.take()
    }
    /// The identity of its latest session.
    pub fn identity(&self) -> AgentIdentity {
        self.inner().identity.clone()
    }
    /// The mode of its latest session.
    pub fn mode(&self) -> AgentMode {
        self.inner().mode
    }
    /// The request link of the current session, if connected.
    pub fn link(&self) -> Option<Arc<crate::link::AgentLink>> {
        lock(&self.link).clone()
    }
    /// Installs the request link of a new session (failing the previous one's requests).
    pub fn set_link(&self, link: Arc<crate::link::AgentLink>) {
        if let Some(old) = lock(&self.link).replace(link) {
            old.close();
        }
    }
    /// Removes the link of session `session_id`, if still current, failing its requests.
    pub fn clear_link(&self, session_id: u64) {
        let mut guard = lock(&self.link);
        if guard.as_ref().is_some_and(|l| l.session_id == session_id)
            && let Some(old) = guard.take()
        {
            old.close();
        }
    }
    /// Whether a session is open.
    pub fn is_connected(&self) -> bool {
        self.inner().session.is_some()
    }
    /// Records what the operator API shows about session `session_id`, if it is current.
    pub fn set_session_info(&self, session_id: u64, info: SessionInfo) {
        let mut inner = self.inner();
        if inner.session.as_ref().map(|(id, _)| *id) == Some(session_id) {
            inner.session_info = info;
        }
    }
    /// What is known about the current (or last) session.
    pub fn session_info(&self) -> SessionInfo {
        self.inner().session_info.clone()
    }
    /// Records that an event was received from the agent now.
    pub fn touch(&self) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        self.last_event_ms.store(now, Ordering::Relaxed);
    }
    /// When the last event was received from the agent.
    pub fn last_event(&self) -> Option<std::time::SystemTime> {
        let ms = self.last_event_ms.load(Ordering::Relaxed);
        (ms > 0)
            .then(|| std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.unsigned_abs()))
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means a task panicked mid-update; the data stays usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Agents by name and by hub namespace, changed together under one lock.
#[derive(Default)]
struct Registry {
    agents: HashMap<AgentName, Arc<AgentState>>,
    by_namespace: HashMap<Namespace, AgentName>,
}

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

/// Shared state of the principal.
pub struct Hub {
    /// CloudEvents `source` of events we send (our SPIFFE ID when we have one).
    pub source: String,
    /// Identities that may not connect (the `argocd-agent-blocklist` ConfigMap).
    pub blocklist: crate::blocklist::LiveBlocklist,
    pub apps: Resources,
    pub namespaces: Resources,
    pub cache: Cache,
    pub metrics: Metrics,
    pub queue_limits: QueueLimits,
    /// Each agent's inbound event rate limit.
    pub event_rate: crate::ratelimit::EventRate,
    pub create_namespace: bool,
    namespace_cache: Option<Cache>,
    pub namespace_labels: BTreeMap<String, String>,
    /// AppProjects, repositories and GPG keys.
    pub config: ConfigObjects,
    /// Destination-based mapping: a managed agent's Applications are those whose
    /// `spec.destination.name` names it, in any hub namespace.
    pub by_destination: bool,
    /// Destination-based mapping: the agent each Application was last routed to, so a
    /// destination change becomes a delete on the old agent and a create on the new one.
    placements: Mutex<HashMap<(String, String), AgentName>>,
    registry: Mutex<Registry>,
    /// Per-agent workers; drained on shutdown.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

/// Everything [`Hub::new`] needs.
pub struct HubParts {
    pub source: String,
    pub apps: Resources,
    pub namespaces: Resources,
    pub cache: Cache,
    pub metrics: Metrics,
    pub queue_limits: QueueLimits,
    /// Each agent's inbound event rate limit (`--agent-event-rate`, `--agent-event-burst`).
    pub event_rate: crate::ratelimit::EventRate,
    pub create_namespace: bool,
    /// The hub's namespaces (watched when `create_namespace` is set): a namespace known to
    /// exist costs no API call on connect.
    pub namespace_cache: Option<Cache>,
    pub namespace_labels: BTreeMap<String, String>,
    pub config: ConfigObjects,
    pub by_destination: bool,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
}

fn app_ref(namespace: &Namespace, name: &str) -> ResourceRef {
    ResourceRef::new(ResourceKind::Application, namespace.clone(), name)
}

/// Wire form of a hub object: server-managed metadata removed, namespace = hub namespace.
fn for_wire(obj: &DynamicObject) -> Arc<Value> {
    let stripped = object::strip_for_transfer(obj);
    Arc::new(serde_json::to_value(&stripped).unwrap_or(Value::Null))
}

/// Wire form of a hub object for a managed agent: [`for_wire`] plus the hub UID
/// (`argocd.argoproj.io/source-uid`). The queued event shares the watch cache's copy and
/// writes the JSON when it is sent.
fn for_managed_wire(obj: &Arc<DynamicObject>) -> Payload {
    Payload::Lazy(LazyObject::new(ManagedWire(obj.clone())))
}

/// A hub object as a managed agent receives it, written when sent.
#[derive(Debug)]
struct ManagedWire(Arc<DynamicObject>);

impl JsonObject for ManagedWire {
    fn write_json(&self, out: &mut Vec<u8>) {
        object::write_stamped_for_transfer(&self.0, out);
    }
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
    ns: &Namespace,
    incoming: &Value,
) -> Result<DynamicObject, serde_json::Error> {
    let mut copy = object::received_copy(
        &hub_form(agent, incoming),
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

impl Hub {
    /// A hub with no agents yet.
    pub fn new(parts: HubParts) -> Hub {
        Hub {
            source: parts.source,
            apps: parts.apps,
            namespaces: parts.namespaces,
            cache: parts.cache,
            metrics: parts.metrics,
            queue_limits: parts.queue_limits,
            event_rate: parts.event_rate,
            create_namespace: parts.create_namespace,
            namespace_cache: parts.namespace_cache,
            namespace_labels: parts.namespace_labels,
            config: parts.config,
            by_destination: parts.by_destination,
            blocklist: crate::blocklist::LiveBlocklist::default(),
            placements: Mutex::new(HashMap::new()),
            registry: Mutex::new(Registry::default()),
            tasks: parts.tasks,
            shutdown: parts.shutdown,
        }
    }

    /// Key of a managed agent's Application in its maps and resync checksums: the name, or
    /// `<namespace>/<name>` with destination-based mapping (an agent's Applications may then
    /// live in several hub namespaces; `/` never occurs in names).
    fn app_key(&self, obj: &DynamicObject) -> String {
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
    fn key_ref(&self, ns: &Namespace, key: &str) -> Option<ResourceRef> {
        match key.split_once('/') {
            Some((kns, name)) if self.by_destination => {
                Some(app_ref(&Namespace::new(kns).ok()?, name))
            }
            Some(_) => None,
            None => Some(app_ref(ns, key)),
        }
    }

    /// Whether the Applications of `state` are chosen by destination rather than namespace.
    fn routes_by_destination(&self, state: &AgentState) -> bool {
        self.by_destination && state.mode() == AgentMode::Managed
    }

    /// A managed agent's hub Applications by key: those in its hub namespace, or with
    /// destination-based mapping those whose destination names it.
    fn managed_objects(&self, state: &AgentState) -> HashMap<String, Arc<DynamicObject>> {
        if !self.routes_by_destination(state) {
            return self.hub_objects(&state.namespace());
        }
        self.cache
            .list()
            .into_iter()
            .filter(|o| !argocd_agent_kubernetes::is_sync_ignored(o))
            .filter(|o| destination_of(o) == Some(state.name.as_str()))
            .map(|o| (self.app_key(&o), o))
            .collect()
    }

    /// The state of agent `name`, if it ever connected.
    pub fn agent(&self, name: &AgentName) -> Option<Arc<AgentState>> {
        lock(&self.registry).agents.get(name).cloned()
    }

    /// The agent that serves Application `ns/name`: with destination-based mapping the
    /// managed agent it was placed on, otherwise the agent owning hub namespace `ns`.
    /// `None` when the Application does not exist or nobody owns it.
    pub fn app_owner(&self, ns: &Namespace, name: &str) -> Option<Arc<AgentState>> {
        self.cache.get(Some(ns.as_str()), name)?;
        let by_namespace = self.agent_for_namespace(ns);
        if !self.by_destination
            || by_namespace
                .as_ref()
                .is_some_and(|s| s.mode() == AgentMode::Autonomous)
        {
            return by_namespace;
        }
        let placed = lock(&self.placements)
            .get(&(ns.to_string(), name.to_owned()))
            .cloned()?;
        self.agent(&placed)
    }

    /// Every agent that ever connected.
    pub fn agents(&self) -> Vec<Arc<AgentState>> {
        lock(&self.registry).agents.values().cloned().collect()
    }

    fn agent_for_namespace(&self, ns: &Namespace) -> Option<Arc<AgentState>> {
        let registry = lock(&self.registry);
        let name = registry.by_namespace.get(ns)?;
        registry.agents.get(name).cloned()
    }

    /// What the hub records about the owner of the object an event of `agent` about
    /// `resource` would write: the Application in its hub namespace, or for AppProjects the
    /// hub copy `<agent>-<name>` in Argo CD's namespace. Other kinds are never written.
    pub fn owner_record(&self, agent: &AgentName, resource: &ResourceRef) -> OwnerRecord {
        match resource.kind {
            ResourceKind::Application => {
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
            ResourceKind::AppProject => self.config.project_owner(agent, &resource.name),
            ResourceKind::Repository | ResourceKind::GpgKeys => OwnerRecord::Absent,
        }
    }

    /// Registers (or refreshes) an agent and returns its state. A new session replaces the
    /// old one: the old session's token is cancelled.
    pub fn attach(
        self: &Arc<Self>,
        identity: AgentIdentity,
        mode: AgentMode,
        session_id: u64,
        token: CancellationToken,
    ) -> Arc<AgentState> {
        let name = identity.agent.clone();
        let ns = identity.namespace.clone();
        let mut registry = lock(&self.registry);
        let state = match registry.agents.get(&name) {
            Some(s) => s.clone(),
            None => {
                let state = Arc::new(AgentState {
                    name: name.clone(),
                    queue: SendQueue::new(self.queue_limits.clone()),
                    inner: Mutex::new(AgentInner {
                        identity: identity.clone(),
                        mode,
                        session: None,
                        desired: HashMap::new(),
                        sent_spec: HashMap::new(),
                        sent_operation: HashMap::new(),
                        sent_terminate: Default::default(),
                        sent_config: HashMap::new(),
                        desired_projects: HashMap::new(),
                        session_info: SessionInfo::default(),
                        close_reason: None,
                    }),
                    inbox: ChangeInbox::default(),
                    last_event_ms: AtomicI64::new(0),
                    link: Mutex::new(None),
                    limiter: Mutex::new(crate::ratelimit::EventLimiter::new(
                        self.event_rate,
                        std::time::Instant::now(),
                    )),
                });
                registry.agents.insert(name.clone(), state.clone());
                self.spawn_worker(state.clone());
                state
            }
        };
        let old_session = {
            let mut inner = state.inner();
            if inner.mode != mode {
                inner.desired.clear();
                inner.sent_spec.clear();
                inner.sent_config.clear();
                inner.desired_projects.clear();
            }
            inner.mode = mode;
            // The rules may now map this agent to another namespace: forget the old route.
            if inner.identity.namespace != ns {
                registry.by_namespace.remove(&inner.identity.namespace);
            }
            inner.identity = identity;
            inner.session.replace((session_id, token))
        };
        registry.by_namespace.insert(ns, name.clone());
        drop(registry);
        if let Some((_, old)) = old_session {
            tracing::info!(agent = %name, "new session replaces the previous one");
            old.cancel();
        }
        state
    }

    /// Forgets the session if it is still the current one.
    pub fn detach(&self, state: &AgentState, session_id: u64) {
        let mut inner = state.inner();
        if inner.session.as_ref().map(|(id, _)| *id) == Some(session_id) {
            inner.session = None;
        }
    }

    /// Live sessions' identities (for revocation checks).
    pub fn connected_identities(&self) -> Vec<AgentIdentity> {
        lock(&self.registry)
            .agents
            .values()
            .filter_map(|a| {
                let inner = a.inner();
                inner.session.is_some().then(|| inner.identity.clone())
            })
            .collect()
    }

    /// Closes the current session of `agent`, if any; returns whether one was open.
    pub fn disconnect(&self, agent: &AgentName) -> bool {
        self.close_session(agent, None)
    }

    /// Closes the current session of `agent` telling it `reason` (the agent logs it and
    /// reconnects); returns whether one was open.
    pub fn close_session(&self, agent: &AgentName, reason: Option<String>) -> bool {
        if let Some(state) = self.agent(agent) {
            let mut inner = state.inner();
            if let Some((_, token)) = inner.session.take() {
                inner.close_reason = reason;
                token.cancel();
                return true;
            }
        }
        false
    }

    /// Creates the agent's hub namespace when configured to.
    pub async fn ensure_namespace(&self, ns: &Namespace, agent: &AgentName) {
        if !self.create_namespace {
            return;
        }
        if let Some(cache) = &self.namespace_cache
            && cache.is_synced()
            && cache.get(None, ns.as_str()).is_some()
        {
            return;
        }
        let mut labels = self.namespace_labels.clone();
        labels.insert(AGENT_NAME_LABEL.into(), agent.to_string());
        match self.namespaces.ensure_namespace(ns.as_str(), labels).await {
            Ok(true) => tracing::info!(namespace = %ns, %agent, "created hub namespace for agent"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(namespace = %ns, %agent, error = %chain(&e), "could not create namespace")
            }
        }
    }

    /// Queues an event for the agent. Span `principal.enqueue`: a child of the span the
    /// event was created in; the queued event carries its context, so the eventual send
    /// (maybe much later, maybe resent) joins the same trace.
    pub(crate) fn push(&self, state: &AgentState, mut event: Event) {
        let span = argocd_agent_sync::event_span!("principal.enqueue", &event, agent = %state.name);
        argocd_agent_sync::trace::inject_span(&mut event, &span);
        let _entered = span.enter();
        if let Err(e) = state.queue.push(event) {
            self.metrics.queue_full.inc();
            tracing::warn!(agent = %state.name, error = %e, "event dropped");
        }
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

    /// Spec checksums of hub objects (those being deleted count as gone), each computed
    /// once per version by the watch cache.
    fn checksums(&self, objects: &HashMap<String, Arc<DynamicObject>>) -> Checksums {
        objects
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| (n.clone(), self.cache.spec_checksum(o)))
            .collect()
    }

    /// Autonomous: checksums of hub copies in the agent's form (project names as on the
    /// spoke), comparable with the checksums the agent sends.
    fn agent_form_checksums(
        agent: &AgentName,
        objects: &HashMap<String, Arc<DynamicObject>>,
    ) -> Checksums {
        objects
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| {
                let v = agent_form(agent, &for_wire(o));
                (n.clone(), value_checksum(v.get("spec")))
            })
            .collect()
    }

    /// Queues the current hub copy of `resource` for the agent (a delete when it is gone).
    pub fn send_current(&self, state: &AgentState, resource: ResourceRef) {
        let event = match self
            .cache
            .get(Some(resource.namespace.as_str()), &resource.name)
        {
            Some(obj) if !is_being_deleted(&obj) => Event::resource(
                &self.source,
                EventType::SpecUpdate,
                resource,
                for_managed_wire(&obj),
            ),
            _ => Event::resource(&self.source, EventType::Delete, resource, Payload::None),
        };
        self.push(state, event);
    }

    fn push_delete(&self, state: &AgentState, resource: ResourceRef) {
        self.push(
            state,
            Event::resource(&self.source, EventType::Delete, resource, Payload::None),
        );
    }

    fn push_spec(&self, state: &AgentState, obj: &Arc<DynamicObject>) {
        let Some(resource) = obj_ref(obj) else { return };
        self.push(
            state,
            Event::resource(
                &self.source,
                EventType::SpecUpdate,
                resource,
                for_managed_wire(obj),
            ),
        );
    }

    /// Queues everything a managed agent needs to converge on the hub state.
    pub fn resync_managed(
        &self,
        state: &AgentState,
        agent_state: &Checksums,
        agent_uids: &argocd_agent_sync::resync::SourceUids,
    ) {
        let ns = state.namespace();
        let objects = self.managed_objects(state);
        let hub = self.checksums(&objects);
        let mut plan = argocd_agent_sync::resync::plan(&hub, agent_state);
        let hub_uids = objects
            .iter()
            .filter_map(|(n, o)| Some((n.clone(), o.metadata.uid.clone()?)))
            .collect();
        for name in argocd_agent_sync::resync::stale_copies(&hub_uids, agent_uids) {
            if !plan.send.contains(&name) {
                plan.send.push(name);
            }
        }
        tracing::info!(agent = %state.name, send = plan.send.len(), delete = plan.delete.len(),
            "resync (managed): hub is the source");
        if self.routes_by_destination(state) {
            // Known from now on, so a later destination change deletes this agent's copy.
            let mut placements = lock(&self.placements);
            for obj in objects.values() {
                if let (Some(ns), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) {
                    placements.insert((ns.clone(), name.clone()), state.name.clone());
                }
            }
        }
        state.inner().sent_spec = hub.iter().map(|(n, s)| (n.clone(), s.clone())).collect();
        for key in plan.send {
            if let Some(obj) = objects.get(&key) {
                self.push_spec(state, obj);
            }
        }
        for key in plan.delete {
            if let Some(r) = self.key_ref(&ns, &key) {
                self.push_delete(state, r);
            }
        }
        // Objects being deleted on the hub: the agent deletes its copy, then we finish.
        for obj in objects.values() {
            if is_being_deleted(obj)
                && let Some(r) = obj_ref(obj)
            {
                self.push_delete(state, r);
            }
        }
        for obj in objects.values() {
            self.forward_operation(state, obj);
        }
    }

    /// Autonomous agent reconnected: ask for what differs, delete what it no longer has.
    ///
    /// `agent_state` is `None` for an agent that sent no resync state (one of the previous
    /// protocol version): what it holds is unknown, so none of its hub copies is deleted
    /// (nor forgotten as its desired state); its events keep them current.
    ///
    /// `agent_statuses` are the status checksums the agent reported (none from an agent of
    /// an earlier version): an object whose hub copy holds another status is asked for
    /// too, even when the specs agree. Otherwise a status change the hub missed (written
    /// on the spoke while the agent was down, or lost with a restart) would never come
    /// again. A hub copy holding a terminate the spoke has not taken up yet differs until
    /// it has (one more request per reconnect meanwhile).
    pub async fn resync_autonomous(
        &self,
        state: &AgentState,
        agent_state: Option<&Checksums>,
        agent_statuses: &Checksums,
    ) -> Vec<Event> {
        let ns = state.namespace();
        // Only the copies this agent wrote: hub-authored objects in its namespace are never
        // requested from it nor deleted because it lacks them.
        let mut objects = self.hub_objects(&ns);
        objects.retain(|_, o| written_by(o, &state.name));
        let hub = Self::agent_form_checksums(&state.name, &objects);
        let Some(agent_state) = agent_state else {
            tracing::info!(agent = %state.name, "resync (autonomous): the agent sent no resync state; its hub copies are kept");
            for obj in objects.values() {
                self.forward_operation(state, obj);
            }
            return Vec::new();
        };
        let mut plan = argocd_agent_sync::resync::plan(agent_state, &hub);
        let spec_requests = plan.send.len();
        let hub_statuses: Checksums = objects
            .iter()
            .filter(|(n, o)| agent_statuses.contains_key(*n) && !is_being_deleted(o))
            .map(|(n, o)| (n.clone(), object::status_checksum(o)))
            .collect();
        plan.send_stale_statuses(agent_statuses, &hub_statuses);
        tracing::info!(agent = %state.name, request = plan.send.len(),
            stale_status = plan.send.len() - spec_requests, delete = plan.delete.len(),
            "resync (autonomous): agent is the source");
        {
            let mut inner = state.inner();
            inner.desired.retain(|n, _| agent_state.contains_key(n));
            for (name, obj) in &objects {
                if agent_state.get(name) == hub.get(name) && !inner.desired.contains_key(name) {
                    inner.desired.insert(
                        name.clone(),
                        Arc::new(agent_form(&state.name, &for_wire(obj))),
                    );
                }
            }
        }
        for name in &plan.delete {
            let _ = self.delete_hub_copy(&ns, name).await;
        }
        // Hub operations not yet delivered (set while no session was up, or queued in a
        // principal that since restarted) go out now.
        for (name, obj) in &objects {
            if !plan.delete.contains(name) {
                self.forward_operation(state, obj);
            }
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
    /// Returns `false` when the API server had no such object.
    async fn delete_hub_copy(&self, ns: &Namespace, name: &str) -> bool {
        let ns = Some(ns.as_str());
        if let Err(e) = self.apps.remove_finalizers(ns, name).await
            && !e.is_not_found()
        {
            tracing::warn!(error = %chain(&e), "could not remove finalizers");
        }
        match self.apps.delete(ns, name).await {
            Ok(argocd_agent_kubernetes::DeleteOutcome::NotFound) => false,
            Ok(_) => {
                self.metrics
                    .hub_write(ResourceKind::Application, HubWrite::Deleted);
                true
            }
            Err(e) if e.is_not_found() => false,
            Err(e) => {
                self.metrics.hub_write_errors.inc();
                tracing::warn!(error = %chain(&e), "could not delete hub copy");
                true
            }
        }
    }

    /// Sends a hub-side `.operation` to the agent once, and a terminate request (the hub's
    /// `.status.operationState.phase` turning `Terminating`, what `argocd app terminate-op`
    /// writes) once, also after the operation itself was delivered and cleared on the hub.
    fn forward_operation(&self, state: &AgentState, obj: &DynamicObject) {
        let name = self.app_key(obj);
        let op = object::operation(obj).filter(|v| !v.is_null());
        let terminating = obj
            .data
            .pointer("/status/operationState/phase")
            .and_then(Value::as_str)
            == Some("Terminating");
        let (send_op, send_terminate) = {
            let mut inner = state.inner();
            let send_op = match op {
                Some(op) => {
                    let sum = value_checksum(Some(op));
                    inner.sent_operation.insert(name.clone(), sum.clone()) != Some(sum)
                }
                None => {
                    inner.sent_operation.remove(&name);
                    false
                }
            };
            let send_terminate = if terminating {
                inner.sent_terminate.insert(name.clone())
            } else {
                inner.sent_terminate.remove(&name);
                false
            };
            (send_op, send_terminate)
        };
        let resource = || obj_ref(obj).unwrap_or_else(|| app_ref(&state.namespace(), &name));
        if let (true, Some(op)) = (send_op, op) {
            let payload = Payload::Object(Arc::new(json!({ "operation": op })));
            self.push(
                state,
                Event::resource(&self.source, EventType::SetOperation, resource(), payload),
            );
        }
        if send_terminate {
            self.push(
                state,
                Event::resource(
                    &self.source,
                    EventType::TerminateOperation,
                    resource(),
                    Payload::None,
                ),
            );
        }
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
        let by_namespace = self.agent_for_namespace(&ns);
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
    fn route_by_destination(&self, ns: Namespace, change: Change) {
        let (obj, deleted) = match &change {
            Change::Applied(o) => (o.clone(), false),
            Change::Deleted(o) => (o.clone(), true),
            Change::Synced => return,
        };
        let key = (ns.to_string(), name_of(&obj));
        let target = if deleted {
            None
        } else {
            destination_of(&obj)
                .and_then(|d| AgentName::new(d).ok())
                .and_then(|d| self.agent(&d))
                .filter(|s| s.mode() == AgentMode::Managed)
        };
        let previous = {
            let mut placements = lock(&self.placements);
            match &target {
                Some(t) => placements.insert(key.clone(), t.name.clone()),
                None => placements.remove(&key),
            }
        };
        let app_key = self.app_key(&obj);
        if let Some(prev) = previous.filter(|p| target.as_ref().is_none_or(|t| &t.name != p))
            && let Some(prev_state) = self.agent(&prev)
        {
            tracing::info!(application = %app_key, from = %prev, to = ?target.as_ref().map(|t| t.name.to_string()),
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

    /// One worker per agent applies its hub changes in order, so a slow hub write for one
    /// agent never holds up another.
    fn spawn_worker(self: &Arc<Self>, state: Arc<AgentState>) {
        let hub = self.clone();
        let span = tracing::info_span!("hub-changes", agent = %state.name);
        self.tasks.spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = hub.shutdown.cancelled() => return,
                        _ = state.inbox.notify.notified() => {}
                    }
                    for ((kind, name), change, origin) in state.inbox.drain() {
                        let span = tracing::info_span!(parent: &origin, "principal.hub_change",
                            agent = %state.name, "object.kind" = kind.as_str(), "object.name" = %name);
                        drop(origin);
                        // Boxed: the worker of an idle agent only waits for its inbox,
                        // and a task is as large as its largest state.
                        match kind {
                            ResourceKind::AppProject => {
                                Box::pin(hub.on_autonomous_project_change(&state, &name, change))
                                    .instrument(span)
                                    .await
                            }
                            _ => Box::pin(hub.on_hub_change(&state, change)).instrument(span).await,
                        }
                    }
                    if state.inbox.take_config_dirty() {
                        hub.reconcile_config(&state);
                    }
                }
            }
            .instrument(span),
        );
    }

    /// Handles one change of a hub Application in the agent's namespace.
    pub async fn on_hub_change(&self, state: &AgentState, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        let ns = state.namespace();
        if !self.routes_by_destination(state)
            && obj.metadata.namespace.as_deref() != Some(ns.as_str())
        {
            return;
        }
        match state.mode() {
            AgentMode::Managed => self.on_managed_change(state, &ns, &obj, deleted),
            AgentMode::Autonomous => self.on_autonomous_change(state, &ns, &obj, deleted).await,
        }
    }

    /// Managed: hub spec changes and deletions go to the agent.
    fn on_managed_change(
        &self,
        state: &AgentState,
        ns: &Namespace,
        obj: &Arc<DynamicObject>,
        deleted: bool,
    ) {
        let name = self.app_key(obj);
        if deleted || is_being_deleted(obj) {
            {
                let mut inner = state.inner();
                inner.sent_spec.remove(&name);
                inner.sent_operation.remove(&name);
                inner.sent_terminate.remove(&name);
            }
            if let Some(r) = obj_ref(obj).or_else(|| self.key_ref(ns, &name)) {
                self.push_delete(state, r);
            }
            return;
        }
        let sum = self.cache.spec_checksum(obj);
        let previous = state.inner().sent_spec.insert(name, sum.clone());
        if previous != Some(sum) {
            self.push_spec(state, obj);
        }
        self.forward_operation(state, obj);
    }

    /// Autonomous: hub edits and deletions are reverted to what the agent sent.
    async fn on_autonomous_change(
        &self,
        state: &AgentState,
        ns: &Namespace,
        obj: &DynamicObject,
        deleted: bool,
    ) {
        let name = name_of(obj);
        let desired = state.inner().desired.get(&name).cloned();
        let Some(desired) = desired else { return };
        let resource = app_ref(ns, &name);
        if is_being_deleted(obj) && !deleted {
            // Hub deletion of an autonomous app: let it go, then recreate it from the
            // agent's copy when the deletion completes.
            let _ = self.apps.remove_finalizers(Some(ns.as_str()), &name).await;
            return;
        }
        let what = if deleted {
            "deletion"
        } else if spec_checksum(obj) != value_checksum(hub_form(&state.name, &desired).get("spec"))
        {
            "edit"
        } else {
            self.forward_operation(state, obj);
            return;
        };
        tracing::info!(%resource, "reverting hub {what} of autonomous application");
        if let Err(e) = self
            .upsert_from_agent(&resource, &state.name, &desired)
            .await
        {
            tracing::warn!(%resource, error = %chain(&e), "could not revert hub {what}");
        }
        if !deleted {
            self.forward_operation(state, obj);
        }
    }

    /// Applies an authorized command from the agent `state` (see [`crate::inbound`]).
    pub async fn apply(&self, state: &AgentState, command: Command) -> Result<Applied, ApplyError> {
        let kind = match &command {
            Command::WriteStatus { resource, .. }
            | Command::Upsert { resource, .. }
            | Command::Delete { resource }
            | Command::ResendCurrent { resource } => resource.kind,
        };
        if kind != ResourceKind::Application {
            return self.apply_config(state, command).await;
        }
        match command {
            Command::WriteStatus {
                resource,
                status,
                source_uid,
            } => {
                let Some(cur) = self
                    .cache
                    .get(Some(resource.namespace.as_str()), &resource.name)
                else {
                    return Err(ApplyError::Missing { resource });
                };
                // The status of a copy of an earlier hub object of this name (deleted and
                // created again since): the agent replaces that copy next, so the status
                // describes nothing on the hub any more.
                if let Some(uid) = source_uid
                    && cur.metadata.uid.as_deref().is_some_and(|u| u != uid)
                {
                    tracing::debug!(%resource, source_uid = %uid, "status of a replaced hub object ignored");
                    return Ok(Applied::Ack);
                }
                self.write_status(&resource, status).await?;
            }
            Command::Upsert { resource, object } => {
                // Recorded before the write, so the hub watch does not take our own write
                // for a hub edit to revert; restored if the write fails.
                let previous = state
                    .inner()
                    .desired
                    .insert(resource.name.clone(), object.clone());
                let result = self
                    .upsert_from_agent(&resource, &state.name, &object)
                    .await;
                if result.is_err() {
                    let mut inner = state.inner();
                    match previous {
                        Some(p) => inner.desired.insert(resource.name.clone(), p),
                        None => inner.desired.remove(&resource.name),
                    };
                }
                result?;
                // A hub operation set while this object was unknown here (after a restart,
                // before the agent's resync) goes out now: an unchanged upsert makes no
                // hub change that would forward it.
                if let Some(cur) = self
                    .cache
                    .get(Some(resource.namespace.as_str()), &resource.name)
                {
                    self.forward_operation(state, &cur);
                }
            }
            Command::Delete { resource } => {
                {
                    let mut inner = state.inner();
                    inner.desired.remove(&resource.name);
                    inner.sent_operation.remove(&resource.name);
                    inner.sent_terminate.remove(&resource.name);
                }
                if !self
                    .delete_hub_copy(&resource.namespace, &resource.name)
                    .await
                {
                    return Ok(Applied::NotFound);
                }
            }
            Command::ResendCurrent { resource } => {
                self.send_current(state, resource);
                return Ok(Applied::Silent);
            }
        }
        Ok(Applied::Ack)
    }

    /// An authorized command about a configuration object (authorization already refused
    /// every write but an autonomous agent's own projects).
    async fn apply_config(
        &self,
        state: &AgentState,
        command: Command,
    ) -> Result<Applied, ApplyError> {
        match command {
            Command::Upsert { resource, object } if resource.kind == ResourceKind::AppProject => {
                self.upsert_project_from_agent(state, &resource.name, &object)
                    .await?;
                Ok(Applied::Ack)
            }
            Command::Delete { resource } if resource.kind == ResourceKind::AppProject => {
                if self.delete_project_from_agent(state, &resource.name).await {
                    Ok(Applied::Ack)
                } else {
                    Ok(Applied::NotFound)
                }
            }
            Command::ResendCurrent { resource } => {
                self.send_current_config(state, resource);
                Ok(Applied::Silent)
            }
            Command::WriteStatus { resource, .. }
            | Command::Upsert { resource, .. }
            | Command::Delete { resource } => Err(ApplyError::Unsupported { resource }),
        }
    }

    /// Writes an object received from an autonomous agent into its hub namespace.
    async fn upsert_from_agent(
        &self,
        resource: &ResourceRef,
        agent: &AgentName,
        incoming: &Value,
    ) -> Result<(), ApplyError> {
        let mut copy =
            hub_copy_of_agent_app(agent, &resource.namespace, incoming).map_err(|source| {
                ApplyError::NotAnObject {
                    resource: resource.clone(),
                    source,
                }
            })?;
        // Status goes through the status subresource, after the object exists.
        let status = object::take_field(&mut copy, "status");
        // `.operation` on the hub copy is the hub's request to the spoke (`argocd app sync`
        // there), not the spoke's: the spoke's own would overwrite one not yet delivered.
        object::take_field(&mut copy, "operation");
        let outcome = self
            .apps
            .upsert_copy_known(
                &copy,
                &["spec"],
                self.cache
                    .known(Some(resource.namespace.as_str()), &resource.name),
            )
            .instrument(hub_write_span("upsert", resource))
            .await
            .inspect_err(|_| {
                self.metrics.hub_write_errors.inc();
            })?;
        self.count_upsert(ResourceKind::Application, outcome);
        match status.filter(|s| !s.is_null()) {
            Some(status) => self.write_status(resource, status).await?,
            // The spoke copy has no status (created again under this name, say): neither
            // has the hub copy, whatever an earlier object of this name reported.
            None => {
                let stale = self
                    .cache
                    .get(Some(resource.namespace.as_str()), &resource.name)
                    .and_then(|cur| object::status(&cur).cloned())
                    .is_some_and(|s| s.as_object().is_some_and(|m| !m.is_empty()));
                if stale {
                    self.write_status(resource, json!({})).await?;
                }
            }
        }
        Ok(())
    }

    /// Counts a hub write made by an upsert.
    pub(crate) fn count_upsert(&self, kind: ResourceKind, outcome: UpsertOutcome) {
        match outcome {
            UpsertOutcome::Created => self.metrics.hub_write(kind, HubWrite::Created),
            UpsertOutcome::Updated => self.metrics.hub_write(kind, HubWrite::Updated),
            UpsertOutcome::Unchanged => {}
        }
    }

    /// Keeps a terminate requested on the hub (`argocd app terminate-op`: operation phase
    /// `Terminating`) in the status the spoke reports, until the spoke has taken it up (its
    /// phase is `Terminating` too) or the operation ended there. Otherwise a status report
    /// written a moment after the request would erase it before it was forwarded (and a
    /// principal restart in between would lose it).
    fn keep_pending_terminate(hub: Option<&Value>, incoming: &mut Value) {
        let phase = |s: &Value| {
            s.pointer("/operationState/phase")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let Some(hub) = hub else { return };
        if phase(hub).as_deref() != Some("Terminating") {
            return;
        }
        let still_running = matches!(phase(incoming).as_deref(), None | Some("Running"));
        if let (true, Some(m), Some(op)) = (
            still_running,
            incoming.as_object_mut(),
            hub.get("operationState"),
        ) {
            m.insert("operationState".into(), op.clone());
        }
    }

    /// Removes the hub copy's `.operation` if it is still `delivered`, with a precondition
    /// on the resourceVersion it was read at (so an operation set meanwhile survives).
    async fn clear_delivered_operation(
        &self,
        ns: Option<&str>,
        name: &str,
        delivered: Option<&Value>,
    ) {
        let Some(delivered) = delivered else { return };
        for _ in 0..3 {
            let Some(cur) = self.cache.get(ns, name) else {
                return;
            };
            if object::operation(&cur) != Some(delivered) {
                return;
            }
            let rv = cur.metadata.resource_version.clone().unwrap_or_default();
            let patch = json!({"metadata": {"resourceVersion": rv}, "operation": null});
            match self.apps.patch_merge(ns, name, &patch).await {
                Ok(_) => return,
                Err(e) if e.is_not_found() => return,
                // The cache was behind, or something else changed the object: look again.
                Err(e) if e.is_conflict() => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::warn!(namespace = ns.unwrap_or_default(), name, error = %chain(&e), "could not clear operation");
                    return;
                }
            }
        }
    }

    /// Writes `.status` of a hub Application through the status subresource.
    async fn write_status(
        &self,
        resource: &ResourceRef,
        mut status: Value,
    ) -> Result<(), ApplyError> {
        let ns = Some(resource.namespace.as_str());
        let cur = self.cache.get(ns, &resource.name);
        if let Some(cur) = &cur {
            Self::keep_pending_terminate(object::status(cur), &mut status);
            if object::status(cur) == Some(&status) {
                return Ok(());
            }
        }
        self.apps
            .replace_status(ns, &resource.name, status)
            .instrument(hub_write_span("status", resource))
            .await
            .inspect_err(|_| {
                self.metrics.hub_write_errors.inc();
            })?;
        Ok(())
    }

    /// Called when the agent acknowledged an event of ours.
    pub async fn on_ack(&self, state: &AgentState, key: QueueKey, delivered: &Event) {
        let ns = Some(key.resource.namespace.as_str());
        let name = key.resource.name.as_str();
        let ty = delivered.ty;
        match key.lane {
            Lane::Operation if ty == EventType::SetOperation => {
                // Delivered: the hub copy's `.operation` has done its job (the hub runs no
                // application controller for agent namespaces); the agent reports progress
                // in `.status.operationState`. Only that operation is cleared: a newer one
                // set on the hub meanwhile is still to be delivered.
                let op = delivered.object().and_then(|o| o.get("operation")).cloned();
                self.clear_delivered_operation(ns, name, op.as_ref()).await;
            }
            Lane::Object if ty == EventType::Delete && state.mode() == AgentMode::Managed => {
                // The spoke deleted its copy: finish a pending hub deletion.
                if let Some(obj) = self.cache.get(ns, name)
                    && is_being_deleted(&obj)
                {
                    let _ = self.apps.remove_finalizers(ns, name).await;
                }
            }
            _ => {}
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

/// Every few seconds, sums the agents' queues into the queue-depth gauge and the resend
/// counter (queues live as long as the principal, so their resend totals only grow).
pub async fn sample_queues(hub: Arc<Hub>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    let mut counted = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let agents = hub.agents();
        let depth: usize = agents.iter().map(|a| a.queue.len()).sum();
        let resends: u64 = agents.iter().map(|a| a.queue.resends()).sum();
        hub.metrics
            .queue_depth
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
        hub.metrics.resends.inc_by(resends.saturating_sub(counted));
        counted = counted.max(resends);
    }
}

/// Runs one hub watch of `kind` until the stream ends or shutdown, routing its changes to
/// agents' workers (Applications by namespace or destination, configuration objects to the
/// agents they concern).
pub async fn run_hub_watch(
    hub: Arc<Hub>,
    kind: ResourceKind,
    changes: impl Stream<Item = Change> + Send + 'static,
    shutdown: CancellationToken,
) {
    futures::pin_mut!(changes);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            change = changes.next() => match change {
                Some(change) if kind == ResourceKind::Application => hub.route(change),
                Some(change) => hub.route_config(kind, change),
                None => break,
            },
        }
    }
    tracing::warn!(%kind, "hub watch ended");
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;

    fn change(name: &str, spec: i64) -> Change {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": "agent-a"}, "spec": {"v": spec}
        }))
        .unwrap();
        Change::Applied(Arc::new(obj))
    }

    fn spec_of(c: &Change) -> i64 {
        match c {
            Change::Applied(o) | Change::Deleted(o) => o.data["spec"]["v"].as_i64().unwrap(),
            Change::Synced => -1,
        }
    }

    #[test]
    fn a_pending_terminate_survives_the_spokes_status_until_taken_up() {
        let hub = json!({"sync": {"status": "Synced"},
                         "operationState": {"phase": "Terminating", "startedAt": "t0"}});
        // The spoke still runs the operation (or reports none yet): the request stays.
        for phase in [json!({"phase": "Running", "startedAt": "t0"}), Value::Null] {
            let mut incoming = json!({"sync": {"status": "OutOfSync"}});
            if !phase.is_null() {
                incoming["operationState"] = phase;
            }
            Hub::keep_pending_terminate(Some(&hub), &mut incoming);
            assert_eq!(incoming["operationState"]["phase"], "Terminating");
            assert_eq!(
                incoming["sync"]["status"], "OutOfSync",
                "the rest is the spoke's"
            );
        }
        // Taken up, or ended there: the spoke's state wins.
        for phase in ["Terminating", "Failed", "Succeeded"] {
            let mut incoming = json!({"operationState": {"phase": phase, "message": "m"}});
            Hub::keep_pending_terminate(Some(&hub), &mut incoming);
            assert_eq!(incoming["operationState"]["phase"], phase);
            assert_eq!(incoming["operationState"]["message"], "m");
        }
        // No terminate on the hub: nothing to keep.
        let mut incoming = json!({"operationState": {"phase": "Running"}});
        Hub::keep_pending_terminate(
            Some(&json!({"operationState": {"phase": "Running"}})),
            &mut incoming,
        );
        Hub::keep_pending_terminate(None, &mut incoming);
        assert_eq!(incoming["operationState"]["phase"], "Running");
    }

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
        let copy = hub_copy_of_agent_app(&agent, &ns, &incoming).unwrap();
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

    #[test]
    fn inbox_keeps_the_newest_change_per_object_in_first_seen_order() {
        let inbox = ChangeInbox::default();
        let key = |n: &str| (ResourceKind::Application, n.to_owned());
        inbox.push(key("a"), change("a", 1));
        inbox.push(key("b"), change("b", 1));
        inbox.push(key("a"), change("a", 2));
        let drained = inbox.drain();
        assert_eq!(
            drained
                .iter()
                .map(|(_, c, _)| spec_of(c))
                .collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert!(inbox.drain().is_empty());
    }
}
