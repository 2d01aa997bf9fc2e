//! The spoke side of synchronisation: what the agent does with its local Applications in
//! each mode, and with the events the principal sends.
//!
//! Managed: the principal's copy is the source of truth for `.spec`. The agent applies what
//! it receives, remembers it (`desired`), reverts local edits and deletions, and reports
//! status changes. Autonomous: the local copy is the source of truth; every local change is
//! published; operations (sync, terminate) requested on the hub are applied locally.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_domain::resync::Checksums;
use argocd_agent_domain::{AgentMode, Namespace, ResourceKind};
use argocd_agent_domain::{Event, EventType, Payload, ResourceRef, SendQueue};
use argocd_agent_kubernetes::object::{self, is_being_deleted, spec_checksum, status_checksum};
use argocd_agent_kubernetes::{Change, DeleteOutcome, Known, ObjectStore, ObjectView};
use argocd_agent_proto::eventstream::ResyncState;
use kube::api::DynamicObject;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::config_objects::kinds::ConfigKinds;
use crate::error::SpokeError;
use crate::namespaces::{self, AllowedNamespaces, HubNameError};
use crate::policy::{self, Policies, RecreateAction, WritePlan};

mod deletes;
mod desired;
mod events;
mod ledger;
mod local;
mod plan;
mod resync;
mod session;
#[cfg(test)]
mod tests;

use plan::{Command, add_condition, hub_metadata, outside_allowed, plan};

pub use crate::managed::MANAGED_LABEL;
use crate::managed::{is_managed_copy, name_of, source_uid};
use deletes::Deletes;
use desired::Desired;
use ledger::SentLedger;
use session::{HelloState, SessionState};

use object::REFRESHED_ANNOTATION;

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
    pub apps: Arc<dyn ObjectStore>,
    /// The watched Applications (managed across namespaces: only the managed copies).
    pub cache: Arc<dyn ObjectView>,
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
    pub namespace_api: Option<Arc<dyn ObjectStore>>,
    /// The agent's metrics.
    pub metrics: crate::metrics::Metrics,
    /// This cluster's Redis, when the agent serves the principal's Redis proxy.
    pub redis: Option<Arc<crate::redis::SpokeRedis>>,
    /// The resource proxy, when the agent serves it.
    pub proxy: Option<Arc<crate::proxy::SpokeProxy>>,
    /// Where the agent's request handlers run (the agent's tracker, drained on shutdown).
    pub tasks: tokio_util::task::TaskTracker,
    /// The session with the principal: hub namespace, hello, late answers ([`session`]).
    session: SessionState,
    /// Managed: what the principal wants of each copy ([`desired`]).
    desired: Desired,
    /// What was last reported to the principal ([`ledger`]).
    sent: SentLedger,
    /// Managed: deletes waiting for their copy to be gone ([`deletes`]).
    deletes: Deletes,
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

impl crate::proxy::Host for Spoke {
    fn source(&self) -> &str {
        &self.source
    }

    fn tasks(&self) -> &tokio_util::task::TaskTracker {
        &self.tasks
    }

    fn proxy(&self) -> Option<Arc<crate::proxy::SpokeProxy>> {
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
        apps: Arc<dyn ObjectStore>,
        cache: Arc<dyn ObjectView>,
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
            session: SessionState::default(),
            desired: Desired::default(),
            sent: SentLedger::default(),
            deletes: Deletes::default(),
            children: Mutex::default(),
            guard: Arc::default(),
            guard_state: Mutex::default(),
        }
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
        self.sent.forget_status(key);
    }

    /// Sends `event` beside the queue on the current session (dropped, with a debug line,
    /// between sessions or when the channel is full: what it asks for comes again with
    /// the next resync).
    pub(crate) fn send_direct(&self, event: Event) {
        if self.session.send_late(event).is_err() {
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
        self.desired.seed(self.local(), |obj| wire(obj));
    }

    /// The hub namespace the principal assigned us (after the first welcome).
    pub fn hub_namespace(&self) -> Option<Namespace> {
        self.session.hub_namespace()
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
