//! The hub: the core the sessions work with. It puts together the session registry, the
//! Applications ([`crate::apps`]) and the configuration objects ([`crate::config_objects`]), runs
//! one worker per agent that hands each hub change to the router it concerns, dispatches
//! agents' commands by kind (checked first against the agents' bounds: `admit`), and
//! re-evaluates every agent when the mapping rules reload ([`watch_reloads`]).

mod admit;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use argocd_agent_domain::ResourceRef;
use argocd_agent_domain::{AgentIdentity, AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_kubernetes::{AGENT_NAME_LABEL, Change, ObjectStore, ObjectView};
use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::apps::Applications;
use crate::bounds::{AgentBounds, Ledger};
use crate::config_objects::{ConfigObjects, ConfigRouter};
use crate::error::{ApplyError, chain};
use crate::inbound::{Command, OwnerRecord};
use crate::metrics::Metrics;
use crate::sessions::{AgentState, Sessions};

pub use crate::apps::{AppOwners, Applied, destination_of};
pub use crate::sessions::SessionInfo;

/// The core of the principal.
pub struct Hub {
    /// What the hub was given and keeps as it is: its source, sessions, metrics, mapping,
    /// bounds, hub namespaces and workers' tasks.
    pub shared: HubShared,
    /// Which agent serves each Application.
    pub owners: Arc<AppOwners>,
    /// The hub's Applications: routing, resync, writes.
    pub apps: Applications,
    /// AppProjects, repositories and GPG keys.
    pub config: ConfigRouter,
    /// Agents' writes not yet seen by the watch, counted in their bounds.
    pub(crate) ledger: Ledger,
}

/// What the hub keeps as it was given ([`Hub::shared`], from [`HubParts::shared`]).
pub struct HubShared {
    /// CloudEvents `source` of events we send (our SPIFFE ID when we have one).
    pub source: String,
    /// The agents and their sessions.
    pub sessions: Arc<Sessions>,
    /// The principal's metrics, shared by every session and worker.
    pub metrics: Metrics,
    /// Destination-based mapping: a managed agent's Applications are those whose
    /// `spec.destination.name` names it, in any hub namespace.
    pub by_destination: bool,
    /// Per-agent bounds, checked before any write (see [`crate::bounds`]).
    pub bounds: AgentBounds,
    /// Creates agents' hub namespaces (with `create_namespace`).
    pub namespaces: Arc<dyn ObjectStore>,
    /// Create an agent's hub namespace when it first connects.
    pub create_namespace: bool,
    /// The hub's namespaces (watched when `create_namespace` is set): a namespace known to
    /// exist costs no API call on connect.
    pub namespace_cache: Option<Arc<dyn ObjectView>>,
    /// Labels put on the namespaces created for agents.
    pub namespace_labels: BTreeMap<String, String>,
    /// Where the per-agent workers run; drained on shutdown.
    pub tasks: TaskTracker,
    /// Stops the per-agent workers.
    pub shutdown: CancellationToken,
}

/// Every few seconds, counts the Applications the watch cache keeps decoded and compact
/// into `argocd_principal_cached_objects{form}`.
pub async fn sample_cache_forms(
    cache: Arc<dyn ObjectView>,
    metrics: Metrics,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let (decoded, compact) = cache.forms();
        for (form, n) in [("decoded", decoded), ("compact", compact)] {
            metrics
                .cached_objects
                .get_or_create(&crate::metrics::FormLabels { form: form.into() })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// A served session's hold on its hub namespace's Applications ([`Hub::hold_shard`]),
/// released when dropped.
pub struct ShardHold {
    cache: Arc<dyn ObjectView>,
    namespace: String,
}

impl Drop for ShardHold {
    fn drop(&mut self) {
        self.cache.unhold(&self.namespace);
    }
}

/// Everything [`Hub::new`] needs: what it keeps, and what its routers are built from.
pub struct HubParts {
    /// What the hub keeps as it is.
    pub shared: HubShared,
    /// Writes the hub's Applications.
    pub apps: Arc<dyn ObjectStore>,
    /// The hub's Applications, watched.
    pub cache: Arc<dyn ObjectView>,
    /// AppProjects, repositories and GPG keys: their clients and caches.
    pub config: ConfigObjects,
    /// The tenants in force, from the live mapping rules (see [`crate::tenancy`]).
    pub tenants: crate::tenancy::TenantView,
}

impl Hub {
    /// A hub with no agents yet.
    pub fn new(parts: HubParts) -> Hub {
        let HubParts {
            shared,
            apps,
            cache,
            config,
            tenants,
        } = parts;
        // Before the watches are first polled: an agent-written object too large for the
        // bounds (written before they existed) is cached as a stub from the first list on.
        if shared.bounds.max_object_size > 0 {
            let max = shared.bounds.max_object_size;
            cache.stub_oversized(max, crate::bounds::agent_written);
            config
                .projects
                .stub_oversized(max, crate::bounds::agent_written);
        }
        let apps = Applications::new(
            shared.source.clone(),
            apps,
            cache,
            shared.metrics.clone(),
            shared.by_destination,
            shared.sessions.clone(),
            tenants.clone(),
        );
        let config = ConfigRouter::new(
            config,
            shared.source.clone(),
            shared.metrics.clone(),
            shared.sessions.clone(),
            tenants,
        );
        Hub {
            owners: apps.owners.clone(),
            shared,
            apps,
            config,
            ledger: Ledger::default(),
        }
    }

    /// Registers (or refreshes) an agent's session (see [`Sessions::attach`]) and starts
    /// the worker of an agent seen for the first time.
    pub fn attach(
        self: &Arc<Self>,
        identity: AgentIdentity,
        mode: AgentMode,
        session_id: u64,
        token: CancellationToken,
    ) -> Arc<AgentState> {
        let (state, created) = self
            .shared
            .sessions
            .attach(identity, mode, session_id, token);
        // The session's connect-time round comes first (`release_changes` after it).
        state.hold_changes(session_id);
        if created {
            self.spawn_worker(state.clone());
        }
        state
    }

    /// Keeps the Applications of hub namespace `ns` decoded in the watch cache while the
    /// returned hold lives: taken when a session is registered, before its resync, and
    /// dropped when it ends. With replicas (`--ha`) the cache keeps the other namespaces'
    /// Applications as their JSON ([`argocd_agent_kubernetes::Cache::shard`]): a replica
    /// takes the shard of each agent it serves. Without, it only counts.
    pub fn hold_shard(&self, ns: &Namespace) -> ShardHold {
        self.apps.cache.hold(ns.as_str());
        ShardHold {
            cache: self.apps.cache.clone(),
            namespace: ns.as_str().to_string(),
        }
    }

    /// What the hub records about the owner of the object an event of `agent` about
    /// `resource` would write: the Application in its hub namespace, or for AppProjects the
    /// hub copy `<agent>-<name>` in Argo CD's namespace. Other kinds are never written.
    pub fn owner_record(&self, agent: &AgentName, resource: &ResourceRef) -> OwnerRecord {
        match resource.kind {
            ResourceKind::Application => self.apps.owner_record(resource),
            ResourceKind::AppProject => self.config.project_owner(agent, &resource.name),
            ResourceKind::Repository | ResourceKind::GpgKeys => OwnerRecord::Absent,
        }
    }

    /// Creates the agent's hub namespace when configured to.
    pub async fn ensure_namespace(&self, ns: &Namespace, agent: &AgentName) {
        if !self.shared.create_namespace {
            return;
        }
        if let Some(cache) = &self.shared.namespace_cache
            && cache.is_synced()
            && cache.get(None, ns.as_str()).is_some()
        {
            return;
        }
        let mut labels = self.shared.namespace_labels.clone();
        labels.insert(AGENT_NAME_LABEL.into(), agent.to_string());
        match self
            .shared
            .namespaces
            .ensure_namespace(ns.as_str(), labels)
            .await
        {
            Ok(true) => tracing::info!(namespace = %ns, %agent, "created hub namespace for agent"),
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(namespace = %ns, %agent, error = %chain(&e), "could not create namespace")
            }
        }
    }

    /// One worker per agent applies its hub changes in order, so a slow hub write for one
    /// agent never holds up another.
    fn spawn_worker(self: &Arc<Self>, state: Arc<AgentState>) {
        let hub = self.clone();
        let span = tracing::info_span!("hub-changes", agent = %state.name);
        self.shared.tasks.spawn(
            async move {
                loop {
                    tokio::select! {
                        _ = hub.shared.shutdown.cancelled() => return,
                        _ = state.inbox.notify.notified() => {}
                    }
                    // A session's connect-time round has not run yet: the changes wait,
                    // coalesced, and are taken once it has (which notifies again).
                    if state.changes_held() {
                        continue;
                    }
                    for ((kind, name), change, origin) in state.inbox.drain() {
                        let span = tracing::info_span!(parent: &origin, "principal.hub_change",
                            agent = %state.name, "object.kind" = kind.as_str(), "object.name" = %name);
                        drop(origin);
                        // Boxed: the worker of an idle agent only waits for its inbox,
                        // and a task is as large as its largest state.
                        match kind {
                            ResourceKind::AppProject => {
                                Box::pin(hub.config.on_autonomous_project_change(&state, &name, change))
                                    .instrument(span)
                                    .await
                            }
                            _ => Box::pin(hub.on_app_change(&state, change)).instrument(span).await,
                        }
                    }
                    if state.inbox.take_config_dirty() {
                        hub.config.reconcile_config(&state);
                    }
                }
            }
            .instrument(span),
        );
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
        self.apps.apply(state, command).await
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
                self.config
                    .upsert_project_from_agent(state, &resource.name, &object)
                    .await?;
                Ok(Applied::Ack)
            }
            Command::Delete { resource } if resource.kind == ResourceKind::AppProject => {
                if self
                    .config
                    .delete_project_from_agent(state, &resource.name)
                    .await
                {
                    Ok(Applied::Ack)
                } else {
                    Ok(Applied::NotFound)
                }
            }
            Command::ResendCurrent { resource } => {
                self.config.send_current_config(state, resource);
                Ok(Applied::Silent)
            }
            Command::WriteStatus { resource, .. }
            | Command::Upsert { resource, .. }
            | Command::Delete { resource } => Err(ApplyError::Unsupported { resource }),
        }
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
                Some(change) if kind == ResourceKind::Application => hub.apps.route(change),
                Some(change) => hub.config.route_config(kind, change),
                None => break,
            },
        }
    }
    tracing::warn!(%kind, "hub watch ended");
}

/// On every reload of the rules, re-evaluates what each connected managed agent must hold
/// (objects whose owner changed are sent or deleted; see
/// [`crate::config_objects::ConfigRouter::reconcile_config`]) and which Applications are within
/// their quotas (see [`crate::quotas`]). Ends on shutdown or when the rules are dropped.
pub async fn watch_reloads(hub: Arc<Hub>, shutdown: tokio_util::sync::CancellationToken) {
    let mut rx = hub.config.tenants.subscribe();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = rx.changed() => if changed.is_err() { return },
        }
        rx.mark_unchanged();
        let tenants = rx.borrow().tenants().iter().count();
        let mut agents = 0usize;
        for state in hub.shared.sessions.agents() {
            if !state.is_connected() {
                continue;
            }
            agents += 1;
            state.mark_config_dirty();
        }
        hub.apps.quotas_reloaded();
        tracing::info!(
            tenants,
            agents,
            "mapping rules reloaded: configuration objects and Application quotas re-evaluated"
        );
    }
}
