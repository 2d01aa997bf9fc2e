//! Argo CD's configuration objects around the Application: AppProjects, repository and
//! repository-credential Secrets, and the GPG keys ConfigMap.
//!
//! Managed agents: the hub is the source of truth. For each managed agent the principal
//! works out the set of objects it must hold ([`ConfigObjects::desired_for`]: matching
//! projects as their agent copies, repositories of those projects, the GPG keys), and keeps
//! the agent's copies equal to that set: new and changed objects are sent, objects that
//! leave the set are deleted there (so a project change revokes repositories).
//!
//! Tenants (see [`crate::tenancy`]) narrow every set: a project, repository, repo-creds
//! Secret or GPG key a tenant claims goes to that tenant's agents only.
//!
//! Autonomous agents: their AppProjects flow up and land in the hub's Argo CD namespace as
//! `<agent>-<project>` ([`crate::projects::hub_copy`]); hub edits of those copies are
//! reverted. Repositories and GPG keys never flow to or from autonomous agents.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use argocd_agent_domain::resync::{self, Checksums, SourceUids};
use argocd_agent_domain::{AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef};
use argocd_agent_kubernetes::object::{self, content_checksum, is_being_deleted};
use argocd_agent_kubernetes::{AGENT_NAME_LABEL, Change, Kind, ObjectStore, ObjectView};
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::error::{ApplyError, chain};
use crate::inbound::OwnerRecord;
use crate::metrics::Metrics;
use crate::projects;
use crate::sessions::{AgentState, ConfigKey, Sessions};
use crate::tenancy::{self, Audience, TenantView};
use argocd_agent_domain::tenant::Claim;

/// Label selector of the Secrets the principal distributes.
pub const REPOSITORY_SELECTOR: &str = "argocd.argoproj.io/secret-type in (repository,repo-creds)";
/// The ConfigMap holding Argo CD's GPG public keys.
pub const GPG_KEYS_CONFIGMAP: &str = "argocd-gpg-keys-cm";
/// Annotation on the hub copy of an autonomous agent's project: the checksum of the spec the
/// agent sent, so resync after a principal restart compares like with like.
pub const SOURCE_CHECKSUM_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/source-checksum";
/// Annotation kubectl writes with the whole applied object; for Secrets that includes the
/// credentials in clear, so it never leaves the hub.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// The hub's configuration objects: watched caches of the Argo CD namespace.
pub struct ConfigObjects {
    /// Argo CD's namespace on the hub (where projects, repositories and GPG keys live).
    pub namespace: Namespace,
    /// Agents map to Applications by hub namespace (the default); `false` with
    /// destination-based mapping, where `sourceNamespaces` does not route projects.
    pub by_namespace: bool,
    /// The AppProjects in Argo CD's namespace, watched.
    pub projects: Arc<dyn ObjectView>,
    /// The repository Secrets in Argo CD's namespace ([`REPOSITORY_SELECTOR`]), watched.
    pub repositories: Arc<dyn ObjectView>,
    /// The ConfigMaps in Argo CD's namespace, watched ([`GPG_KEYS_CONFIGMAP`] among them).
    pub gpg_keys: Arc<dyn ObjectView>,
    /// Writes AppProjects (autonomous agents' hub copies).
    pub project_writer: Arc<dyn ObjectStore>,
    /// Wire forms by hub UID, valid for one resourceVersion: every managed agent
    /// re-evaluates its set on each change, and the conversion is the same for all of them.
    wire_cache: std::sync::Mutex<HashMap<String, (String, Wire)>>,
}

/// A hub object in wire form, with the project a repository Secret names and the claim
/// it is judged by when tenants are declared.
#[derive(Clone)]
struct Wire {
    value: Arc<Value>,
    project: Option<String>,
    claim: Claim,
}

/// Bound of the wire cache; cleared when full (deleted objects' entries go with it).
const MAX_WIRE_CACHE: usize = 4096;

/// Wire form of a hub object for an agent: server-managed metadata, namespace and
/// kubectl's last-applied annotation removed, the hub UID recorded
/// (`argocd.argoproj.io/source-uid`).
fn wire(obj: &DynamicObject) -> Value {
    let mut stripped = object::stamped_for_transfer(obj);
    stripped.metadata.namespace = None;
    if let Some(a) = stripped.metadata.annotations.as_mut() {
        a.remove(LAST_APPLIED);
        if a.is_empty() {
            stripped.metadata.annotations = None;
        }
    }
    serde_json::to_value(&stripped).unwrap_or(Value::Null)
}

fn name_of(obj: &DynamicObject) -> String {
    obj.metadata.name.clone().unwrap_or_default()
}

fn agent_label(obj: &DynamicObject) -> Option<&str> {
    obj.metadata
        .labels
        .as_ref()?
        .get(AGENT_NAME_LABEL)
        .map(String::as_str)
}

/// Objects that take part in distribution: not being deleted, not labelled ignore-sync.
fn live(obj: &DynamicObject) -> bool {
    !is_being_deleted(obj) && !argocd_agent_kubernetes::is_sync_ignored(obj)
}

impl ConfigObjects {
    /// The configuration objects of Argo CD's hub namespace `namespace`, watched by the
    /// three caches.
    pub fn new(
        namespace: Namespace,
        by_namespace: bool,
        projects: Arc<dyn ObjectView>,
        repositories: Arc<dyn ObjectView>,
        gpg_keys: Arc<dyn ObjectView>,
        project_writer: Arc<dyn ObjectStore>,
    ) -> ConfigObjects {
        ConfigObjects {
            namespace,
            by_namespace,
            projects,
            repositories,
            gpg_keys,
            project_writer,
            wire_cache: Default::default(),
        }
    }

    /// The wire form of a hub object, converted once per resourceVersion.
    fn wire_of(&self, obj: &DynamicObject) -> Wire {
        let uid = obj.metadata.uid.clone().unwrap_or_default();
        let rv = obj.metadata.resource_version.clone().unwrap_or_default();
        let mut cache = self.wire_cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cached_rv, w)) = cache.get(&uid)
            && *cached_rv == rv
            && !uid.is_empty()
        {
            return w.clone();
        }
        let value = wire(obj);
        let w = Wire {
            project: projects::repository_project(&value),
            claim: tenancy::repository_claim(&value),
            value: Arc::new(value),
        };
        if cache.len() >= MAX_WIRE_CACHE {
            cache.clear();
        }
        cache.insert(uid, (rv, w.clone()));
        w
    }
    /// Whether every cache has listed once.
    pub fn is_synced(&self) -> bool {
        self.projects.is_synced() && self.repositories.is_synced() && self.gpg_keys.is_synced()
    }

    /// Waits until every cache has listed once.
    pub async fn wait_synced(&self) {
        self.projects.wait_synced().await;
        self.repositories.wait_synced().await;
        self.gpg_keys.wait_synced().await;
    }

    fn in_namespace(&self, cache: &Arc<dyn ObjectView>) -> Vec<Arc<DynamicObject>> {
        cache
            .list_namespace(self.namespace.as_str())
            .into_iter()
            .filter(|o| live(o))
            .collect()
    }

    /// Whether the hub project `p` goes to the managed agent of `to`: created on the hub
    /// (hub copies of autonomous agents' projects belong to those agents and go nowhere),
    /// matching the agent ([`projects::matches_agent`]), and the platform's or the agent's
    /// tenant's.
    fn project_goes_to(&self, p: &DynamicObject, value: &Value, to: &Audience<'_>) -> bool {
        agent_label(p).is_none()
            && to.may_see(Claim::Project, &name_of(p))
            && projects::matches_agent(value, to.agent, to.namespace, self.by_namespace)
    }

    /// What the managed agent of `to` must hold, as wire objects.
    pub fn desired_for(&self, to: &Audience<'_>) -> BTreeMap<ConfigKey, Arc<Value>> {
        let mut out = BTreeMap::new();
        let mut projects_sent = BTreeSet::new();
        for p in self.in_namespace(&self.projects) {
            let w = self.wire_of(&p).value;
            if self.project_goes_to(&p, &w, to) {
                let name = name_of(&p);
                projects_sent.insert(name.clone());
                out.insert(
                    (ResourceKind::AppProject, name),
                    Arc::new(projects::spoke_copy(&w, to.agent, self.by_namespace)),
                );
            }
        }
        for s in self.in_namespace(&self.repositories) {
            let w = self.wire_of(&s);
            let name = name_of(&s);
            if w.project.is_some_and(|p| projects_sent.contains(&p)) && to.may_see(w.claim, &name) {
                out.insert((ResourceKind::Repository, name), w.value);
            }
        }
        if let Some(cm) = self
            .gpg_keys
            .get(Some(self.namespace.as_str()), GPG_KEYS_CONFIGMAP)
            .filter(|o| live(o))
        {
            out.insert(
                (ResourceKind::GpgKeys, name_of(&cm)),
                tenancy::gpg_keys_for(&self.wire_of(&cm).value, to),
            );
        }
        out
    }

    /// Whether a change of the hub object `obj` (of `kind`) can change what the managed
    /// agent of `to` must hold, given what it holds now (`holds`: the keys sent to it). A project concerns the agents that hold it or that it matches now; a
    /// repository the agents that hold it or hold its project; the GPG keys every agent. So
    /// a change costs work in the agents it affects, not in every agent.
    pub fn concerns(
        &self,
        kind: ResourceKind,
        obj: &DynamicObject,
        to: &Audience<'_>,
        holds: impl Fn(&ConfigKey) -> bool,
    ) -> bool {
        let name = name_of(obj);
        match kind {
            ResourceKind::AppProject => {
                holds(&(ResourceKind::AppProject, name))
                    || (live(obj) && self.project_goes_to(obj, &self.wire_of(obj).value, to))
            }
            ResourceKind::Repository => {
                holds(&(ResourceKind::Repository, name))
                    || (live(obj)
                        && self
                            .wire_of(obj)
                            .project
                            .is_some_and(|p| holds(&(ResourceKind::AppProject, p))))
            }
            _ => true,
        }
    }

    /// Hub copies of the autonomous agent `agent`'s projects, by their name on the spoke.
    fn autonomous_projects(&self, agent: &AgentName) -> HashMap<String, Arc<DynamicObject>> {
        self.projects
            .list_namespace(self.namespace.as_str())
            .into_iter()
            .filter(|p| agent_label(p) == Some(agent.as_str()))
            .filter_map(|p| {
                let name = name_of(&p);
                let spoke = name.strip_prefix(agent.as_str())?.strip_prefix('-')?;
                Some((spoke.to_owned(), p.clone()))
            })
            .collect()
    }

    /// Whether the hub sends its project `name` to the managed agent of `to`: a live
    /// project created on the hub (not an autonomous agent's copy) that matches the agent
    /// (see [`projects::matches_agent`]) and that its tenant may see. Argo CD's built-in
    /// `default` goes to every managed agent (unless a tenant claims it), also before Argo CD
    /// has written it.
    pub fn sends_project(&self, to: &Audience<'_>, name: &str) -> bool {
        if name == projects::DEFAULT_PROJECT && to.may_see(Claim::Project, name) {
            return true;
        }
        self.projects
            .get(Some(self.namespace.as_str()), name)
            .filter(|p| live(p))
            .is_some_and(|p| self.project_goes_to(&p, &self.wire_of(&p).value, to))
    }

    /// The owner record of the hub object an agent's event about `resource` would write.
    /// For AppProjects that is the hub copy `<agent>-<name>` in Argo CD's namespace.
    pub fn project_owner(&self, agent: &AgentName, name: &str) -> OwnerRecord {
        match self.projects.get(
            Some(self.namespace.as_str()),
            &projects::hub_name(agent, name),
        ) {
            None => OwnerRecord::Absent,
            Some(p) => match agent_label(&p) {
                Some(l) => OwnerRecord::Label(l.to_owned()),
                None => OwnerRecord::Unlabelled,
            },
        }
    }
}

fn checksum(kind: ResourceKind, obj: &Value) -> String {
    content_checksum(Kind::from(kind), obj)
}

/// Routes the hub's configuration objects to the agents they concern, and writes the
/// projects autonomous agents send.
pub struct ConfigRouter {
    /// The hub's configuration objects.
    pub config: ConfigObjects,
    /// CloudEvents `source` of events we send.
    source: String,
    metrics: Metrics,
    sessions: Arc<Sessions>,
    /// The tenants in force (from the live mapping rules).
    pub tenants: TenantView,
    /// Hub configuration changes routed so far: a managed agent's resync that saw a change
    /// come in while it computed its set re-evaluates it (the routing may have looked at
    /// what it held before the resync recorded it).
    changes: std::sync::atomic::AtomicU64,
}

impl ConfigRouter {
    /// The router of `config`'s objects to the agents of `sessions`.
    pub fn new(
        config: ConfigObjects,
        source: String,
        metrics: Metrics,
        sessions: Arc<Sessions>,
        tenants: TenantView,
    ) -> ConfigRouter {
        ConfigRouter {
            config,
            source,
            metrics,
            sessions,
            tenants,
            changes: Default::default(),
        }
    }

    /// What the managed agent `state` must hold now, under the tenants in force.
    fn desired_of(&self, state: &AgentState) -> BTreeMap<ConfigKey, Arc<Value>> {
        let identity = state.identity();
        let rules = self.tenants.current();
        self.config.desired_for(&Audience {
            agent: &state.name,
            namespace: &identity.namespace,
            tenant: identity.tenant.as_ref(),
            tenants: rules.tenants(),
        })
    }

    /// Whether the hub sends its project `name` to the managed agent `state` (see
    /// [`ConfigObjects::sends_project`]).
    pub fn sends_project(&self, state: &AgentState, name: &str) -> bool {
        let identity = state.identity();
        let rules = self.tenants.current();
        self.config.sends_project(
            &Audience {
                agent: &state.name,
                namespace: &identity.namespace,
                tenant: identity.tenant.as_ref(),
                tenants: rules.tenants(),
            },
            name,
        )
    }

    /// Waits until every configuration object has been listed.
    pub async fn wait_synced(&self) {
        self.config.wait_synced().await;
    }

    /// What the hub records about the owner of the AppProject `name` an event of `agent`
    /// would write (its hub copy `<agent>-<name>`).
    pub fn project_owner(&self, agent: &AgentName, name: &str) -> OwnerRecord {
        self.config.project_owner(agent, name)
    }

    fn agent(&self, name: &AgentName) -> Option<Arc<AgentState>> {
        self.sessions.agent(name)
    }

    fn agents(&self) -> Vec<Arc<AgentState>> {
        self.sessions.agents()
    }

    fn push(&self, state: &AgentState, event: Event) {
        state.enqueue(event, &self.metrics);
    }

    fn config_event(&self, ns: &Namespace, key: &ConfigKey, obj: Option<&Arc<Value>>) -> Event {
        let resource = ResourceRef::new(key.0, ns.clone(), key.1.clone());
        match obj {
            Some(o) => Event::resource(
                &self.source,
                EventType::SpecUpdate,
                resource,
                Payload::Object(o.clone()),
            ),
            None => Event::resource(&self.source, EventType::Delete, resource, Payload::None),
        }
    }

    /// Managed agent: sends what changed in its set of configuration objects since the last
    /// call, and deletes what left the set.
    pub fn reconcile_config(&self, state: &AgentState) {
        if state.mode() != AgentMode::Managed || !state.is_connected() {
            return;
        }
        // The root of the trace of configuration objects (re)sent after a hub change.
        let span =
            tracing::info_span!(parent: None, "principal.reconcile_config", agent = %state.name);
        let _entered = span.enter();
        let ns = state.namespace();
        let desired = self.desired_of(state);
        tracing::debug!(agent = %state.name, objects = desired.len(), "configuration objects re-evaluated");
        let mut events = Vec::new();
        {
            let mut inner = state.inner();
            for (key, obj) in &desired {
                if inner.record_sent_config(key, checksum(key.0, obj)) {
                    events.push(self.config_event(&ns, key, Some(obj)));
                }
            }
            let gone = inner.forget_sent_config_except(|k| desired.contains_key(k));
            for key in gone {
                tracing::info!(agent = %state.name, kind = %key.0, name = %key.1,
                    "object no longer meant for this agent: deleting its copy");
                events.push(self.config_event(&ns, &key, None));
            }
        }
        for e in events {
            self.push(state, e);
        }
    }

    /// Managed agent connected: compares its copies (checksums by kind) with what it must
    /// hold, sends what is missing or different, deletes what it must not have.
    pub fn resync_config(
        &self,
        state: &AgentState,
        agent: &BTreeMap<ResourceKind, Checksums>,
        agent_uids: &BTreeMap<ResourceKind, SourceUids>,
    ) {
        let ns = state.namespace();
        let seen = self.changes.load(std::sync::atomic::Ordering::Acquire);
        let desired = self.desired_of(state);
        let mut sums: HashMap<ConfigKey, String> = HashMap::new();
        for (key, obj) in &desired {
            sums.insert(key.clone(), checksum(key.0, obj));
        }
        let mut events = Vec::new();
        for kind in [
            ResourceKind::AppProject,
            ResourceKind::Repository,
            ResourceKind::GpgKeys,
        ] {
            let hub: Checksums = sums
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .map(|((_, n), s)| (n.clone(), s.clone()))
                .collect();
            let empty = Checksums::new();
            let mut plan = resync::plan(&hub, agent.get(&kind).unwrap_or(&empty));
            let hub_uids: SourceUids = desired
                .iter()
                .filter(|((k, _), _)| *k == kind)
                .filter_map(|((_, n), o)| {
                    let uid = o
                        .pointer("/metadata/annotations")?
                        .get(object::SOURCE_UID_ANNOTATION)?
                        .as_str()?;
                    Some((n.clone(), uid.to_owned()))
                })
                .collect();
            let no_uids = SourceUids::new();
            for name in resync::stale_copies(&hub_uids, agent_uids.get(&kind).unwrap_or(&no_uids)) {
                if !plan.send.contains(&name) {
                    plan.send.push(name);
                }
            }
            tracing::info!(agent = %state.name, %kind, send = plan.send.len(), delete = plan.delete.len(),
                "resync (managed): hub is the source");
            for name in plan.send {
                let key = (kind, name);
                events.push(self.config_event(&ns, &key, desired.get(&key)));
            }
            for name in plan.delete {
                events.push(self.config_event(&ns, &(kind, name), None));
            }
        }
        state.inner().replace_sent_config(sums);
        if self.changes.load(std::sync::atomic::Ordering::Acquire) != seen {
            state.mark_config_dirty();
        }
        for e in events {
            self.push(state, e);
        }
    }

    /// A managed agent asked for one configuration object again: the current copy, or a
    /// delete when it is not (or no longer) meant for this agent.
    pub fn send_current_config(&self, state: &AgentState, resource: ResourceRef) {
        let ns = state.namespace();
        let desired = self.desired_of(state);
        let key = (resource.kind, resource.name.clone());
        let event = self.config_event(&ns, &key, desired.get(&key));
        self.push(state, event);
    }

    /// A hub configuration object changed: every connected managed agent re-evaluates its
    /// set (in its own worker); an autonomous agent's project copy goes to that agent.
    pub fn route_config(&self, kind: ResourceKind, change: Change) {
        let obj = match &change {
            Change::Applied(o) | Change::Deleted(o) => o.clone(),
            Change::Synced => return,
        };
        if obj.metadata.namespace.as_deref() != Some(self.config.namespace.as_str()) {
            return;
        }
        tracing::debug!(%kind, name = %name_of(&obj), "hub configuration object changed");
        if kind == ResourceKind::AppProject
            && let Some(owner) = agent_label(&obj).and_then(|l| AgentName::new(l).ok())
        {
            if let Some(state) = self.agent(&owner)
                && state.mode() == AgentMode::Autonomous
            {
                state.push_change(kind, name_of(&obj), change);
            }
            return;
        }
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let mut affected = 0usize;
        let rules = self.tenants.current();
        for state in self.agents() {
            if state.mode() != AgentMode::Managed || !state.is_connected() {
                continue;
            }
            let concerned = {
                let inner = state.inner();
                let to = Audience {
                    agent: &state.name,
                    namespace: &inner.identity().namespace,
                    tenant: inner.identity().tenant.as_ref(),
                    tenants: rules.tenants(),
                };
                self.config
                    .concerns(kind, &obj, &to, |k| inner.has_sent_config(k))
            };
            if concerned {
                affected += 1;
                state.mark_config_dirty();
            }
        }
        self.metrics.config_fanout.observe(affected as f64);
    }

    /// Whether the project `hub_name`, gone from the watch, still exists in Argo CD's
    /// namespace without this principal's partition labels: relabelled for another
    /// principal, whose object it now is. Without partition labels, never.
    async fn moved_to_another_partition(&self, hub_name: &str) -> bool {
        let partition = &self.sessions.partition;
        if partition.labels().is_empty() {
            return false;
        }
        match self
            .config
            .project_writer
            .get(Some(self.config.namespace.as_str()), hub_name)
            .await
        {
            Ok(Some(obj)) => !partition.owns(obj.metadata.labels.as_ref()),
            _ => false,
        }
    }

    /// Autonomous agent: its project `name` (agent form) as the hub copy should be.
    fn autonomous_project_copy(
        &self,
        state: &AgentState,
        incoming: &Value,
    ) -> Result<DynamicObject, ApplyError> {
        let ns = state.namespace();
        let mut hub = projects::hub_copy(incoming, &state.name, &ns);
        let sum = checksum(ResourceKind::AppProject, incoming);
        if let Some(meta) = hub.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("status");
            let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
            if let Some(a) = annotations.as_object_mut() {
                a.insert(SOURCE_CHECKSUM_ANNOTATION.into(), json!(sum));
                a.remove(LAST_APPLIED);
            }
        }
        let resource = ResourceRef::new(
            ResourceKind::AppProject,
            ns,
            projects::hub_name(&state.name, &name_of_value(incoming)),
        );
        let mut copy = object::received_copy(
            &hub,
            self.config.namespace.as_str(),
            (AGENT_NAME_LABEL, state.name.as_str()),
        )
        .map_err(|source| ApplyError::NotAnObject { resource, source })?;
        // The agent's finalizers and owners belong to its cluster.
        object::drop_foreign_bindings(&mut copy);
        // Labelled for this principal's partition, so its watch sees the copy.
        self.sessions.partition.stamp(&mut copy);
        Ok(copy)
    }

    /// Writes an autonomous agent's project into the hub's Argo CD namespace.
    pub async fn upsert_project_from_agent(
        &self,
        state: &AgentState,
        name: &str,
        incoming: &Arc<Value>,
    ) -> Result<(), ApplyError> {
        let copy = self.autonomous_project_copy(state, incoming)?;
        // Recorded first, so our own write is not taken for a hub edit to revert.
        let previous = state.inner().record_agent_project(name, incoming.clone());
        let result = self
            .config
            .project_writer
            .upsert_copy(&copy, &["spec"])
            .await;
        if let Err(e) = result {
            self.metrics.hub_write_errors.inc();
            state.inner().restore_agent_project(name, previous);
            return Err(e.into());
        }
        Ok(())
    }

    /// Deletes the hub copy of an autonomous agent's project. Returns `false` when the API
    /// server had no such object.
    pub async fn delete_project_from_agent(&self, state: &AgentState, name: &str) -> bool {
        state.inner().forget_agent_project(name);
        let hub_name = projects::hub_name(&state.name, name);
        let ns = Some(self.config.namespace.as_str());
        let _ = self
            .config
            .project_writer
            .remove_finalizers(ns, &hub_name)
            .await;
        let result = self.config.project_writer.delete(ns, &hub_name).await;
        if matches!(
            result,
            Ok(argocd_agent_kubernetes::DeleteOutcome::Deleted
                | argocd_agent_kubernetes::DeleteOutcome::Pending)
        ) {
            self.metrics
                .hub_write(ResourceKind::AppProject, crate::metrics::HubWrite::Deleted);
        }
        match result {
            Ok(argocd_agent_kubernetes::DeleteOutcome::NotFound) => false,
            Err(e) if e.is_not_found() => false,
            Err(e) => {
                self.metrics.hub_write_errors.inc();
                tracing::warn!(project = %hub_name, error = %chain(&e), "could not delete hub project");
                true
            }
            Ok(_) => true,
        }
    }

    /// Autonomous agent connected: asks for its projects that are missing or different on
    /// the hub, deletes hub copies of projects it no longer has.
    pub async fn resync_autonomous_projects(
        &self,
        state: &AgentState,
        agent: Option<&Checksums>,
    ) -> Vec<Event> {
        // No resync state (an agent of the previous protocol version): what it holds is
        // unknown, so its hub copies are kept.
        let Some(agent) = agent else {
            return Vec::new();
        };
        let copies = self.config.autonomous_projects(&state.name);
        let hub: Checksums = copies
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| {
                let sum = o
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SOURCE_CHECKSUM_ANNOTATION))
                    .cloned()
                    .unwrap_or_default();
                (n.clone(), sum)
            })
            .collect();
        let mut plan = resync::plan(agent, &hub);
        {
            let mut inner = state.inner();
            inner.retain_agent_projects(|n| agent.contains_key(n));
            // Hub edits are reverted to the agent's own object, which the principal only
            // has once the agent sent it (not after a principal restart): ask for those too.
            for name in agent.keys() {
                if !inner.has_agent_project(name) && !plan.send.contains(name) {
                    plan.send.push(name.clone());
                }
            }
        }
        tracing::info!(agent = %state.name, request = plan.send.len(), delete = plan.delete.len(),
            "resync (autonomous projects): agent is the source");
        for name in &plan.delete {
            let _ = self.delete_project_from_agent(state, name).await;
        }
        let ns = state.namespace();
        plan.send
            .into_iter()
            .map(|name| {
                Event::resource(
                    &self.source,
                    EventType::RequestUpdate,
                    ResourceRef::new(ResourceKind::AppProject, ns.clone(), name),
                    Payload::None,
                )
            })
            .collect()
    }

    /// A hub copy of an autonomous agent's project changed: reverts edits and deletions to
    /// what the agent sent.
    pub async fn on_autonomous_project_change(
        &self,
        state: &AgentState,
        hub_name: &str,
        change: Change,
    ) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        let Some(name) = hub_name
            .strip_prefix(state.name.as_str())
            .and_then(|r| r.strip_prefix('-'))
        else {
            return;
        };
        let desired = state.inner().agent_project(name);
        let Some(desired) = desired else { return };
        if is_being_deleted(&obj) && !deleted {
            let _ = self
                .config
                .project_writer
                .remove_finalizers(Some(self.config.namespace.as_str()), hub_name)
                .await;
            return;
        }
        if deleted && self.moved_to_another_partition(hub_name).await {
            tracing::info!(project = %hub_name, "hub copy now belongs to another principal's partition: not restored");
            state.inner().forget_agent_project(name);
            return;
        }
        let want = match self.autonomous_project_copy(state, &desired) {
            Ok(c) => c,
            Err(_) => return,
        };
        if !deleted && object::spec(&obj) == object::spec(&want) {
            return;
        }
        let what = if deleted { "deletion" } else { "edit" };
        tracing::info!(project = %hub_name, "reverting hub {what} of autonomous agent's project");
        if let Err(e) = self
            .config
            .project_writer
            .upsert_copy(&want, &["spec"])
            .await
        {
            self.metrics.hub_write_errors.inc();
            tracing::warn!(project = %hub_name, error = %chain(&e), "could not revert hub {what}");
        }
    }
}

fn name_of_value(v: &Value) -> String {
    v.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}
