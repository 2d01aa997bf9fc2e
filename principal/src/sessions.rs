//! Agents and their sessions: the state of each agent that ever connected (kept across its
//! sessions: queue, inbox of hub changes, what was sent, its request link), looked up by
//! name or hub namespace; a new session replaces the previous one, and any session can be
//! closed (revocation, blocklist, replicas).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use argocd_agent_domain::{AgentIdentity, AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_domain::{QueueLimits, SendQueue, SharedRtt};
use argocd_agent_kubernetes::Change;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::blocklist::{Blocklist, CONFIGMAP, LiveBlocklist};
use crate::metrics::Metrics;

mod inner;

pub(crate) use inner::AgentInner;
pub use inner::{ConfigKey, SessionInfo};

pub(crate) type InboxKey = (ResourceKind, String);
/// A hub change and the span that routed it.
type Routed = (Change, tracing::Span);

/// Hub changes waiting for one agent's worker, coalesced by kind and object name: only the
/// newest change of an object matters (every handler acts on the object's current state),
/// so the inbox never holds more entries than the agent has objects. A change of the hub's
/// configuration objects is one flag: the worker re-evaluates the agent's whole set.
#[derive(Default)]
pub(crate) struct ChangeInbox {
    /// With each change, the span that routed it (the parent of its handling).
    pending: Mutex<(VecDeque<InboxKey>, HashMap<InboxKey, Routed>)>,
    config_dirty: AtomicBool,
    pub(crate) notify: Notify,
}

impl ChangeInbox {
    pub(crate) fn push(&self, key: InboxKey, change: Change) {
        let origin = tracing::Span::current();
        let mut guard = lock(&self.pending);
        let (order, latest) = &mut *guard;
        if latest.insert(key.clone(), (change, origin)).is_none() {
            order.push_back(key);
        }
        drop(guard);
        self.notify.notify_one();
    }

    pub(crate) fn drain(&self) -> Vec<(InboxKey, Change, tracing::Span)> {
        let mut guard = lock(&self.pending);
        let (order, latest) = &mut *guard;
        order
            .drain(..)
            .filter_map(|k| latest.remove(&k).map(|(c, origin)| (k, c, origin)))
            .collect()
    }

    pub(crate) fn mark_config_dirty(&self) {
        self.config_dirty.store(true, Ordering::Release);
        self.notify.notify_one();
    }

    pub(crate) fn take_config_dirty(&self) -> bool {
        self.config_dirty.swap(false, Ordering::AcqRel)
    }
}

/// State of one agent, kept across its sessions.
pub struct AgentState {
    /// The agent's name (fixed: a new name is a new agent).
    pub name: AgentName,
    /// Events to the agent.
    pub queue: SendQueue,
    inner: Mutex<AgentInner>,
    pub(crate) inbox: ChangeInbox,
    /// Last event received from the agent, Unix milliseconds (0: none yet).
    last_event_ms: AtomicI64,
    /// Requests to the current session (none while disconnected).
    link: Mutex<Option<Arc<argocd_agent_domain::rpc::AgentLink>>>,
    /// The agent's inbound event rate limit: per agent, not per session, so reconnecting
    /// does not refill it.
    limiter: Mutex<crate::ratelimit::EventLimiter>,
    /// Another replica serves the agent (`--ha`): nothing is queued for it here until its
    /// next session here, which starts with a resync ([`AgentState::served_elsewhere`]).
    elsewhere: AtomicBool,
    /// The session whose connect-time resync round has not run yet (0: none): its worker
    /// leaves hub changes in the inbox until then ([`AgentState::hold_changes`]).
    changes_held_for: AtomicU64,
}

impl AgentState {
    /// Session `session` is starting: hub changes wait in the inbox (coalesced) until its
    /// connect-time round has run ([`AgentState::release_changes`]). Otherwise a change
    /// taken between the registration and the round is queued once by the worker and
    /// again by the round (which goes by the agent's hello, not by what this session has
    /// queued already): the agent gets the object twice.
    pub(crate) fn hold_changes(&self, session: u64) {
        self.changes_held_for.store(session, Ordering::Release);
    }
    /// Session `session`'s connect-time round has run (or the session ended before it):
    /// the worker takes the changes that waited. A newer session's hold stays.
    pub(crate) fn release_changes(&self, session: u64) {
        if self
            .changes_held_for
            .compare_exchange(session, 0, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.inbox.notify.notify_one();
        }
    }
    /// Whether the worker leaves hub changes in the inbox for now.
    pub(crate) fn changes_held(&self) -> bool {
        self.changes_held_for.load(Ordering::Acquire) != 0
    }
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
    /// Queues an event for the agent. Span `principal.enqueue`: a child of the span the
    /// event was created in; the queued event carries its context, so the eventual send
    /// (maybe much later, maybe resent) joins the same trace.
    pub(crate) fn enqueue(&self, mut event: argocd_agent_domain::Event, metrics: &Metrics) {
        if self.elsewhere.load(Ordering::Acquire) {
            metrics.queue_released.inc();
            return;
        }
        let span =
            argocd_agent_domain::event_span!("principal.enqueue", &event, agent = %self.name);
        event.stamp_trace(&span);
        let _entered = span.enter();
        let (ty, kind) = (event.ty.verb(), event.resource.as_ref().map(|r| r.kind));
        if let Err(e) = self.queue.push(event) {
            metrics.discarded(self.name.as_str(), ty, kind);
            tracing::warn!(agent = %self.name, error = %e, "event dropped");
        }
    }
    /// Another replica serves the agent now (`--ha`): unless a session is open here, its
    /// queue is dropped and nothing is queued for it until its next session here (which
    /// starts with a resync round, as after a restart). Without this, a replica keeps
    /// queueing every hub change for each agent that ever left it, never to be sent.
    /// Returns how many queued events were dropped (`None`: a session is open here).
    pub(crate) fn served_elsewhere(&self) -> Option<usize> {
        let inner = self.inner();
        if inner.is_connected() {
            return None;
        }
        // Set under the agent's lock, as `attach` clears it: a session beginning now
        // either sees the flag cleared after this, or this sees its session.
        self.elsewhere.store(true, Ordering::Release);
        drop(inner);
        Some(self.queue.clear())
    }
    /// Takes one token of the agent's inbound event rate limit.
    pub fn check_rate(&self) -> crate::ratelimit::Verdict {
        lock(&self.limiter).check(std::time::Instant::now())
    }
    /// The agent's hub namespace.
    pub fn namespace(&self) -> Namespace {
        self.inner().identity().namespace.clone()
    }
    /// Why the principal closed the session, if it said (taken once).
    pub(crate) fn take_close_reason(&self) -> Option<String> {
        self.inner().take_close_reason()
    }
    /// The identity of its latest session.
    pub fn identity(&self) -> AgentIdentity {
        self.inner().identity().clone()
    }
    /// The mode of its latest session.
    pub fn mode(&self) -> AgentMode {
        self.inner().mode()
    }
    /// The request link of the current session, if connected.
    pub fn link(&self) -> Option<Arc<argocd_agent_domain::rpc::AgentLink>> {
        lock(&self.link).clone()
    }
    /// Installs the request link of a new session (failing the previous one's requests).
    pub fn set_link(&self, link: Arc<argocd_agent_domain::rpc::AgentLink>) {
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
        self.inner().is_connected()
    }
    /// Records what the operator API shows about session `session_id`, if it is current.
    /// Its TLS handshake's round trip, when measured, is where the agent's queue starts its
    /// resend timeout from ([`SendQueue::handshake_round_trip`]).
    pub fn set_session_info(&self, session_id: u64, info: SessionInfo) {
        if let Some(round_trip) = info.handshake {
            self.queue.handshake_round_trip(round_trip);
        }
        self.inner().set_session_info(session_id, info);
    }
    /// What is known about the current (or last) session.
    pub fn session_info(&self) -> SessionInfo {
        self.inner().session_info().clone()
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

pub(crate) use argocd_agent_domain::sync::lock;

/// Agents by name and by hub namespace, changed together under one lock.
#[derive(Default)]
struct Registry {
    agents: HashMap<AgentName, Arc<AgentState>>,
    by_namespace: HashMap<Namespace, AgentName>,
}

/// The registry of agents and their sessions.
pub struct Sessions {
    registry: Mutex<Registry>,
    /// Limits of each agent's queue.
    pub queue_limits: QueueLimits,
    /// The acknowledgement round trip over every agent's queue, which an agent's queue
    /// starts from until it has measured its own.
    pub rtt: Arc<SharedRtt>,
    /// Each agent's inbound event rate limit.
    pub event_rate: crate::ratelimit::EventRate,
    /// Identities that may not connect (the `argocd-agent-blocklist` ConfigMap).
    pub blocklist: LiveBlocklist,
    /// The hub namespaces and labels this principal serves (agents outside are refused).
    pub partition: Arc<crate::partition::Partition>,
    /// The tenants' quotas (agents connected, events per second, proxy requests in flight).
    pub tenancy: Arc<crate::tenant_limits::Tenancy>,
}

impl Sessions {
    /// A registry with no agents yet.
    pub fn new(queue_limits: QueueLimits, event_rate: crate::ratelimit::EventRate) -> Sessions {
        Sessions {
            registry: Mutex::new(Registry::default()),
            queue_limits,
            rtt: SharedRtt::new(),
            event_rate,
            blocklist: LiveBlocklist::default(),
            partition: Arc::new(crate::partition::Partition::whole_hub()),
            tenancy: crate::tenant_limits::Tenancy::disabled(),
        }
    }

    /// The registry of a principal enforcing `tenancy`'s quotas.
    pub fn with_tenancy(mut self, tenancy: Arc<crate::tenant_limits::Tenancy>) -> Sessions {
        self.tenancy = tenancy;
        self
    }

    /// The registry of a principal serving `partition`.
    pub fn with_partition(mut self, partition: Arc<crate::partition::Partition>) -> Sessions {
        self.partition = partition;
        self
    }

    /// The state of agent `name`, if it ever connected.
    pub fn agent(&self, name: &AgentName) -> Option<Arc<AgentState>> {
        lock(&self.registry).agents.get(name).cloned()
    }

    /// Every agent that ever connected.
    pub fn agents(&self) -> Vec<Arc<AgentState>> {
        lock(&self.registry).agents.values().cloned().collect()
    }

    /// The agent that owns hub namespace `ns`, if any.
    pub fn agent_for_namespace(&self, ns: &Namespace) -> Option<Arc<AgentState>> {
        let registry = lock(&self.registry);
        let name = registry.by_namespace.get(ns)?;
        registry.agents.get(name).cloned()
    }

    /// Registers (or refreshes) an agent and returns its state, and whether the agent is new.
    /// A new session replaces the old one: the old session's token is cancelled.
    pub fn attach(
        &self,
        identity: AgentIdentity,
        mode: AgentMode,
        session_id: u64,
        token: CancellationToken,
    ) -> (Arc<AgentState>, bool) {
        let name = identity.agent.clone();
        let ns = identity.namespace.clone();
        let mut registry = lock(&self.registry);
        let mut created = false;
        let state = match registry.agents.get(&name) {
            Some(s) => s.clone(),
            None => {
                let state = Arc::new(AgentState {
                    name: name.clone(),
                    queue: SendQueue::sharing(self.queue_limits.clone(), self.rtt.clone()),
                    inner: Mutex::new(AgentInner::new(identity.clone(), mode)),
                    inbox: ChangeInbox::default(),
                    last_event_ms: AtomicI64::new(0),
                    link: Mutex::new(None),
                    limiter: Mutex::new(crate::ratelimit::EventLimiter::new(
                        self.event_rate,
                        std::time::Instant::now(),
                    )),
                    elsewhere: AtomicBool::new(false),
                    changes_held_for: AtomicU64::new(0),
                });
                registry.agents.insert(name.clone(), state.clone());
                created = true;
                state
            }
        };
        let replaced = {
            let mut inner = state.inner();
            state.elsewhere.store(false, Ordering::Release);
            inner.begin_session(identity, mode, session_id, token)
        };
        // The rules may now map this agent to another namespace: forget the old route.
        if let Some(old_ns) = &replaced.moved_from {
            registry.by_namespace.remove(old_ns);
        }
        let old_session = replaced.session;
        registry.by_namespace.insert(ns, name.clone());
        drop(registry);
        if let Some((_, old)) = old_session {
            tracing::info!(agent = %name, "new session replaces the previous one");
            old.cancel();
        }
        (state, created)
    }

    /// Forgets the session if it is still the current one; hub changes are no longer held
    /// for it (it may end before its connect-time round).
    pub fn detach(&self, state: &AgentState, session_id: u64) {
        state.inner().end_session(session_id);
        state.release_changes(session_id);
    }

    /// Live sessions' identities (for revocation checks).
    pub fn connected_identities(&self) -> Vec<AgentIdentity> {
        lock(&self.registry)
            .agents
            .values()
            .filter_map(|a| {
                let inner = a.inner();
                inner.is_connected().then(|| inner.identity().clone())
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
            let token = state.inner().close_session(reason);
            if let Some(token) = token {
                token.cancel();
                return true;
            }
        }
        false
    }
}

/// Every few seconds, sums the agents' queues into the queue-depth gauge and the resend
/// counter (queues live as long as the principal, so their resend totals only grow).
pub async fn sample_queues(sessions: Arc<Sessions>, metrics: Metrics, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    let mut counted = 0u64;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let agents = sessions.agents();
        let depth: usize = agents.iter().map(|a| a.queue.len()).sum();
        let resends: u64 = agents.iter().map(|a| a.queue.resends()).sum();
        metrics
            .queue_depth
            .set(i64::try_from(depth).unwrap_or(i64::MAX));
        metrics.resends.inc_by(resends.saturating_sub(counted));
        counted = counted.max(resends);
        metrics
            .ack_timeout
            .set(sessions.rtt.timeout().map_or(0.0, |t| t.as_secs_f64()));
    }
}

/// Keeps the blocklist ([`crate::blocklist`]) current from its ConfigMap and closes the
/// sessions it denies.
pub(crate) async fn enforce_blocklist(
    sessions: Arc<Sessions>,
    metrics: Metrics,
    configmaps: Arc<dyn argocd_agent_kubernetes::ObjectView>,
    namespace: String,
    changed: Arc<Notify>,
    shutdown: CancellationToken,
) {
    configmaps.wait_synced().await;
    loop {
        let cm = configmaps.get(Some(&namespace), CONFIGMAP);
        let list = Blocklist::from_configmap(cm.as_deref());
        if sessions.blocklist.set(list) {
            tracing::info!(configmap = CONFIGMAP, "blocklist updated");
            let list = sessions.blocklist.current();
            for state in sessions.agents().into_iter().filter(|s| s.is_connected()) {
                let identity = state.identity();
                let fingerprint = state.session_info().fingerprint;
                if let Some(why) = list.denies(&identity.client, fingerprint.as_deref())
                    && sessions.disconnect(&state.name)
                {
                    metrics.auth_failed("Blocked");
                    tracing::warn!(agent = %state.name, client = %identity.client, reason = %why,
                        "session closed: identity blocked");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changed.notified() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::DynamicObject;
    use serde_json::json;

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
