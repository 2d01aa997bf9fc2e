//! Principal replicas, all active, coordinated through the hub's `coordination.k8s.io/v1`
//! Leases (no replication protocol of our own).
//!
//! - Each replica renews its **replica Lease** `argocd-agent-replica-<replica>` every fifth
//!   of `--replica-lease-duration`. Its holder is `<replica>_<incarnation>`: a restarted
//!   replica is a new holder, so what its previous process held is free at once. Another
//!   replica judges it alive by having seen the Lease change within its duration (local
//!   observation, as client-go's leader election does, so clocks need not agree).
//! - Each live session holds its agent's **agent Lease** `argocd-agent-session-<agent>`,
//!   holder = the replica's holder identity. It is renewed at a random point between a third
//!   and two thirds of `--agent-lease-duration` (default 15 minutes), so 10,000 agents cost
//!   ~22 writes/s, not 10,000 per period: liveness comes from the replica Lease, the agent
//!   Lease only says who serves the agent.
//! - **One live session per agent.** A session that reaches a replica whose agent Lease is
//!   held by another live replica asks for it (annotation
//!   [`TAKEOVER_ANNOTATION`]); the holder closes its session and, once that session has
//!   ended, writes the requester as holder. Only then does the new session attach and
//!   resync: the newest session wins, as on one replica, and two never overlap. A holder
//!   whose replica Lease went stale (dead, partitioned) is taken over without asking.
//! - A replica that cannot renew its own Lease for a whole duration closes its sessions
//!   and refuses new ones (others will take its agents over); `/readyz` fails sooner.
//! - **Rebalancing**: a replica above its fair share (agents / live replicas, plus
//!   `--rebalance-slack`) two rounds in a row while another is below it closes a few
//!   sessions per round; the agents reconnect through the Service and land elsewhere.

use argocd_agent_identity::text;
use argocd_agent_identity::text::quoted;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use argocd_agent_domain::{AgentName, Namespace};
use argocd_agent_kubernetes::{Cache, Change, Kind, Mutation, Resources, Scope, UpdateOutcome};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::DynamicObject;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;

use crate::error::chain;
use crate::metrics::Metrics;
use crate::sessions::Sessions;

/// Label on every Lease the principal writes: `agent` or `replica`.
pub const LEASE_LABEL: &str = "argocd-agent.argoproj-labs.io/lease";
/// Annotation a replica sets on an agent Lease held by another live replica: its holder
/// identity, asking for the agent to be handed over.
pub const TAKEOVER_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/takeover-requested-by";
/// Annotation on an agent Lease: the agent's hub namespace (any replica can tell whose an
/// Application is, also for agents it never served).
pub const HUB_NAMESPACE_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/hub-namespace";
/// Annotation on a replica Lease: the replica's resource proxy URL (for other replicas).
pub const RESOURCE_PROXY_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/resource-proxy-url";
/// Annotation on a replica Lease: the replica's Redis proxy address (`host:port`, for other
/// replicas).
pub const REDIS_PROXY_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/redis-proxy-address";
/// Agent label on agent Leases (the same label the hub namespace carries).
pub const AGENT_LABEL: &str = argocd_agent_kubernetes::AGENT_NAME_LABEL;
/// Name prefix of agent Leases.
pub const AGENT_LEASE_PREFIX: &str = "argocd-agent-session-";
/// Name prefix of replica Leases.
pub const REPLICA_LEASE_PREFIX: &str = "argocd-agent-replica-";

/// Default of `--replica-lease-duration`.
pub const DEFAULT_REPLICA_LEASE: Duration = Duration::from_secs(10);
/// Default of `--agent-lease-duration`.
pub const DEFAULT_AGENT_LEASE: Duration = Duration::from_secs(15 * 60);
/// Default of `--lease-qps`.
pub const DEFAULT_LEASE_QPS: f32 = 500.0;
/// Default of `--lease-burst`.
pub const DEFAULT_LEASE_BURST: u32 = 1000;
/// Lease requests in flight at once (each one a connection to the hub API at most).
pub const LEASE_REQUESTS_IN_FLIGHT: usize = 16;
/// How often Leases held in our name without a session are looked for.
const ORPHAN_SWEEP: Duration = Duration::from_secs(10);
/// Agent Leases renewed per tick at most (a burst after a long stall is spread).
const RENEWS_PER_TICK: usize = 200;

/// How replicas share agents (`--ha`).
#[derive(Debug, Clone)]
pub struct HaConfig {
    /// This replica's name (`--replica-id`, default the pod name from `POD_NAME` or the
    /// host name); a DNS label.
    pub replica: String,
    /// Lifetime of the replica Lease (`--replica-lease-duration`, default 10 s, at least
    /// 1 s): renewed every fifth of it; a replica not seen renewing for this long is dead.
    pub replica_lease_duration: Duration,
    /// Lifetime of an agent Lease (`--agent-lease-duration`, default 15 min, not shorter
    /// than the replica Lease's): renewed between a third and two thirds of it.
    pub agent_lease_duration: Duration,
    /// Even the load out across live replicas.
    pub rebalance: bool,
    /// Agents a replica may hold above its fair share before shedding.
    pub rebalance_slack: usize,
    /// How often a replica compares its share (sheds at most `rebalance_batch` per round).
    pub rebalance_interval: Duration,
    /// Sessions shed per rebalance round at most (default 10).
    pub rebalance_batch: usize,
    /// Client-side limit of Lease requests per second (their own budget, apart from
    /// `--kube-qps`: a reconnect storm is one Lease write per agent).
    pub lease_qps: f32,
    /// Lease requests allowed at once above `lease_qps` (`--lease-burst`).
    pub lease_burst: u32,
}

impl HaConfig {
    /// Defaults for `replica`.
    pub fn new(replica: impl Into<String>) -> Self {
        HaConfig {
            replica: replica.into(),
            replica_lease_duration: DEFAULT_REPLICA_LEASE,
            agent_lease_duration: DEFAULT_AGENT_LEASE,
            rebalance: true,
            rebalance_slack: 1,
            rebalance_interval: Duration::from_secs(5),
            rebalance_batch: 10,
            lease_qps: DEFAULT_LEASE_QPS,
            lease_burst: DEFAULT_LEASE_BURST,
        }
    }

    /// Checks what the flags gave.
    pub fn validate(&self) -> Result<(), String> {
        let r = &self.replica;
        let dns_label = !r.is_empty()
            && r.len() <= 63
            && r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !r.starts_with('-')
            && !r.ends_with('-');
        if !dns_label {
            return Err(format!(
                "--replica-id {r}: must be a DNS label (lowercase letters, digits, '-', at most 63)",
                r = quoted(&r)
            ));
        }
        if self.replica_lease_duration < Duration::from_secs(1) {
            return Err("--replica-lease-duration must be at least 1s".into());
        }
        if self.agent_lease_duration < self.replica_lease_duration {
            return Err(
                "--agent-lease-duration must not be shorter than --replica-lease-duration".into(),
            );
        }
        Ok(())
    }
}

/// The replica name when `--replica-id` is not given: `POD_NAME`, else the host name.
pub fn default_replica_id() -> String {
    let raw = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_else(|| "principal".into());
    let mut id: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    id = id.trim_matches('-').to_string();
    if id.is_empty() {
        "principal".into()
    } else {
        id
    }
}

/// What a Lease says, read from its `spec`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LeaseView {
    /// `holderIdentity` (`<replica>_<incarnation>`); `None` when empty: nobody holds it.
    pub holder: Option<String>,
    /// `renewTime`, by the writer's clock.
    pub renewed: Option<jiff::Timestamp>,
    /// `leaseDurationSeconds`.
    pub duration: Option<Duration>,
    /// `leaseTransitions`: how many times the holder changed (0 when unset).
    pub transitions: i32,
    /// The holder identity asking for the Lease ([`TAKEOVER_ANNOTATION`]), when set.
    pub takeover: Option<String>,
    /// `metadata.resourceVersion`, when it is a number.
    pub resource_version: Option<u64>,
}

impl LeaseView {
    /// Reads the Lease `obj` (missing or malformed fields read as unset).
    pub fn of(obj: &DynamicObject) -> LeaseView {
        let spec: LeaseSpec = obj
            .data
            .get("spec")
            .and_then(|s| serde_json::from_value(s.clone()).ok())
            .unwrap_or_default();
        LeaseView {
            holder: spec.holder_identity.filter(|h| !h.is_empty()),
            renewed: spec.renew_time.map(|t| t.0),
            duration: spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
            transitions: spec.lease_transitions.unwrap_or(0),
            takeover: obj
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TAKEOVER_ANNOTATION))
                .filter(|v| !v.is_empty())
                .cloned(),
            resource_version: rv(obj),
        }
    }

    /// Whether the Lease ran out by the wall clock (`now`), with `skew` of tolerance.
    pub fn expired(&self, now: jiff::Timestamp, skew: Duration) -> bool {
        match (self.renewed, self.duration) {
            (Some(renewed), Some(d)) => {
                let until = renewed
                    .checked_add(jiff::SignedDuration::try_from(d + skew).unwrap_or_default())
                    .unwrap_or(renewed);
                until < now
            }
            _ => true,
        }
    }
}

fn rv(obj: &DynamicObject) -> Option<u64> {
    obj.metadata.resource_version.as_deref()?.parse().ok()
}

/// The replica part of a holder identity `<replica>_<incarnation>`.
pub fn replica_of(holder: &str) -> &str {
    holder.rsplit_once('_').map_or(holder, |(r, _)| r)
}

/// Writes `spec` fields into a Lease object.
fn set_spec(obj: &mut DynamicObject, f: impl FnOnce(&mut LeaseSpec)) {
    let mut spec: LeaseSpec = obj
        .data
        .get("spec")
        .and_then(|s| serde_json::from_value(s.clone()).ok())
        .unwrap_or_default();
    f(&mut spec);
    if !obj.data.is_object() {
        obj.data = serde_json::json!({});
    }
    if let (Some(map), Ok(v)) = (obj.data.as_object_mut(), serde_json::to_value(spec)) {
        map.insert("spec".into(), v);
    }
}

fn set_annotation(obj: &mut DynamicObject, key: &str, value: Option<&str>) {
    let annotations = obj
        .metadata
        .annotations
        .get_or_insert_with(Default::default);
    match value {
        Some(v) => {
            annotations.insert(key.into(), v.into());
        }
        None => {
            annotations.remove(key);
        }
    }
}

fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// An agent Lease this replica holds.
#[derive(Debug)]
struct Held {
    session: u64,
    /// resourceVersion of our last write (older watch events are not news).
    rv: u64,
    next_renew: Instant,
    /// A replica that asked for the agent: the holder written when the session ends.
    handover_to: Option<String>,
}

/// The agent Leases and the replica Lease of one principal replica.
pub struct Leases {
    cfg: HaConfig,
    /// Holder identity: `<replica>_<incarnation>`.
    me: String,
    namespace: String,
    api: Resources,
    cache: Cache,
    changed: Notify,
    /// The sessions a lost or handed-over Lease closes.
    sessions: Arc<Sessions>,
    metrics: Metrics,
    held: Mutex<HashMap<AgentName, Held>>,
    acquiring: Mutex<HashSet<AgentName>>,
    releasing: Mutex<HashSet<AgentName>>,
    shares_cache: Mutex<Option<(Instant, Shares)>>,
    /// Hub namespace -> agent, from the agent Leases' annotation.
    by_namespace: Mutex<HashMap<String, AgentName>>,
    /// Replica Lease name -> (resourceVersion, when we first saw it).
    observed: Mutex<HashMap<String, (Option<u64>, Instant)>>,
    /// Last successful renewal of our replica Lease.
    renewed: Mutex<Option<Instant>>,
    fenced: AtomicBool,
    resource_proxy_url: Mutex<Option<String>>,
    redis_proxy_address: Mutex<Option<String>>,
    /// Where releases of dropped guards run (drained on shutdown).
    tasks: TaskTracker,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The agent Lease a session took: the session ends by [`LeaseGuard::release`], which
/// releases (or hands over) the Lease and waits for the write. A guard dropped without it
/// (a session task that panicked) releases on the Leases' task tracker.
pub struct LeaseGuard {
    leases: Arc<Leases>,
    agent: AgentName,
    session: u64,
    released: bool,
}

impl LeaseGuard {
    /// Releases (or hands over) the Lease now and waits for the API server's answer.
    pub async fn release(mut self) {
        self.released = true;
        self.leases.release(&self.agent, self.session).await;
    }
}

impl crate::hooks::SessionPass for LeaseGuard {
    fn release(self: Box<Self>) -> crate::hooks::BoxFuture<'static, ()> {
        Box::pin(LeaseGuard::release(*self))
    }
}

/// Replicas admit a session only with the agent's Lease: one session per agent across
/// replicas, handed over when the agent connects elsewhere.
impl crate::hooks::SessionGate for Arc<Leases> {
    fn enter<'a>(
        &'a self,
        agent: &'a AgentName,
        namespace: &'a Namespace,
        session: u64,
    ) -> crate::hooks::BoxFuture<'a, Result<Box<dyn crate::hooks::SessionPass>, Status>> {
        Box::pin(async move {
            let guard = self.acquire(agent, namespace, session).await?;
            Ok(Box::new(guard) as Box<dyn crate::hooks::SessionPass>)
        })
    }

    fn must_yield(&self, agent: &AgentName, session: u64) -> bool {
        self.handover_pending(agent, session)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let leases = self.leases.clone();
        let agent = self.agent.clone();
        let session = self.session;
        self.leases
            .tasks
            .spawn(async move { leases.release(&agent, session).await });
    }
}

/// What a share computation found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shares {
    /// Live replicas' holder identities -> agents each holds.
    pub held: HashMap<String, usize>,
    /// Agents per live replica, rounded up (`usize::MAX` with no live replica).
    pub fair: usize,
}

impl Shares {
    /// Agents held per live replica; `fair` = ceil(total / live replicas).
    pub fn compute(live: &[String], agent_holders: impl Iterator<Item = String>) -> Shares {
        let mut held: HashMap<String, usize> = live.iter().map(|r| (r.clone(), 0)).collect();
        for h in agent_holders {
            if let Some(n) = held.get_mut(&h) {
                *n += 1;
            }
        }
        let total: usize = held.values().sum();
        let fair = if held.is_empty() {
            usize::MAX
        } else {
            total.div_ceil(held.len())
        };
        Shares { held, fair }
    }

    /// Whether a live replica other than `me` is below its fair share.
    pub fn someone_below(&self, me: &str) -> bool {
        self.held.iter().any(|(r, n)| r != me && *n < self.fair)
    }

    /// How many agents `me` should shed with `slack`: those above fair + slack, when
    /// someone else has room.
    pub fn excess(&self, me: &str, slack: usize) -> usize {
        let mine = self.held.get(me).copied().unwrap_or(0);
        if self.someone_below(me) {
            mine.saturating_sub(self.fair.saturating_add(slack))
        } else {
            0
        }
    }
}

impl Leases {
    /// Starts the Lease watch and the renew and rebalance loops.
    pub fn start(
        client: kube::Client,
        namespace: &str,
        cfg: HaConfig,
        sessions: Arc<Sessions>,
        metrics: Metrics,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Leases> {
        // Only this principal's partition's Leases: another principal's replicas on the
        // same hub are neither peers nor holders here.
        let selector = sessions
            .partition
            .selector_with(Some(LEASE_LABEL))
            .unwrap_or_else(|| LEASE_LABEL.to_string());
        let (cache, changes) = argocd_agent_kubernetes::watch(
            client.clone(),
            Kind::Lease,
            Scope::namespace(namespace.to_string()).with_label_selector(selector),
        );
        let incarnation = uuid::Uuid::new_v4().simple().to_string();
        let me = format!("{}_{}", cfg.replica, &incarnation[..8]);
        let leases = Arc::new(Leases {
            cfg,
            me,
            namespace: namespace.to_string(),
            api: Resources::new(client, Kind::Lease),
            cache,
            changed: Notify::new(),
            sessions,
            metrics,
            held: Mutex::new(HashMap::new()),
            acquiring: Mutex::new(HashSet::new()),
            releasing: Mutex::new(HashSet::new()),
            shares_cache: Mutex::new(None),
            by_namespace: Mutex::new(HashMap::new()),
            observed: Mutex::new(HashMap::new()),
            renewed: Mutex::new(None),
            fenced: AtomicBool::new(false),
            resource_proxy_url: Mutex::new(None),
            redis_proxy_address: Mutex::new(None),
            tasks: tasks.clone(),
        });
        tracing::info!(replica = %leases.cfg.replica, holder = %leases.me, namespace,
            replica_lease = %text::duration(leases.cfg.replica_lease_duration), agent_lease = %text::duration(leases.cfg.agent_lease_duration),
            "high availability: sessions coordinated through Leases");
        {
            let leases = leases.clone();
            let stop = shutdown.clone();
            tasks.spawn(async move {
                futures::pin_mut!(changes);
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        c = changes.next() => match c {
                            None => return,
                            Some(c) => leases.on_change(c),
                        },
                    }
                }
            });
        }
        tasks.spawn(leases.clone().renew_loop(shutdown.clone()));
        if leases.cfg.rebalance {
            tasks.spawn(leases.clone().rebalance_loop(shutdown.clone()));
        }
        leases
    }

    /// This replica's holder identity.
    pub fn holder(&self) -> &str {
        &self.me
    }

    /// Published on the replica Lease so other replicas can forward resource proxy calls.
    pub fn set_resource_proxy_url(&self, url: &str) {
        *lock(&self.resource_proxy_url) = Some(url.to_string());
    }

    /// Published on the replica Lease so other replicas can forward Redis proxy commands.
    pub fn set_redis_proxy_address(&self, addr: &str) {
        *lock(&self.redis_proxy_address) = Some(addr.to_string());
    }

    /// The Redis proxy address a live replica published, by holder identity.
    pub fn redis_proxy_address_of(&self, holder: &str) -> Option<String> {
        self.published_by(holder, REDIS_PROXY_ANNOTATION)
    }

    /// An annotation of `holder`'s replica Lease, while `holder` is its current holder.
    fn published_by(&self, holder: &str, annotation: &str) -> Option<String> {
        let lease = self.cache.get(
            Some(&self.namespace),
            &replica_lease_name(replica_of(holder)),
        )?;
        if holder_str(&lease) != Some(holder) {
            return None;
        }
        lease
            .metadata
            .annotations
            .as_ref()?
            .get(annotation)
            .cloned()
    }

    /// Readiness: the replica Lease was renewed recently.
    pub fn ready(&self) -> Result<(), String> {
        let limit = self.cfg.replica_lease_duration / 2;
        match *lock(&self.renewed) {
            Some(at) if at.elapsed() <= limit => Ok(()),
            Some(at) => Err(format!(
                "replica Lease not renewed for {:.1}s (limit {})",
                at.elapsed().as_secs_f64(),
                text::duration(limit)
            )),
            None => Err("replica Lease not written yet".into()),
        }
    }

    /// The holder identity serving `agent`, when a live replica holds its Lease.
    pub fn holder_of(&self, agent: &AgentName) -> Option<String> {
        let lease = self
            .cache
            .get(Some(&self.namespace), &agent_lease_name(agent))?;
        let view = LeaseView::of(&lease);
        let holder = view.holder.clone()?;
        (self.alive(&holder) && !view.expired(jiff::Timestamp::now(), Duration::from_secs(5)))
            .then_some(holder)
    }

    /// The agent whose hub namespace is `namespace`, as its Lease says (any agent that ever
    /// had a session on any replica).
    pub fn agent_for_namespace(&self, namespace: &str) -> Option<AgentName> {
        lock(&self.by_namespace).get(namespace).cloned()
    }

    /// The resource proxy URL a live replica published, by holder identity.
    pub fn resource_proxy_url_of(&self, holder: &str) -> Option<String> {
        self.published_by(holder, RESOURCE_PROXY_ANNOTATION)
    }

    /// Whether the replica with holder identity `holder` renewed its Lease within its
    /// duration, as observed here. Ourselves: whether we are not fenced.
    pub fn alive(&self, holder: &str) -> bool {
        if holder == self.me {
            return !self.fenced.load(Ordering::Acquire);
        }
        let name = replica_lease_name(replica_of(holder));
        let Some(lease) = self.cache.get(Some(&self.namespace), &name) else {
            return false;
        };
        let view = LeaseView::of(&lease);
        if view.holder.as_deref() != Some(holder) {
            return false; // restarted (a new incarnation) or released
        }
        let duration = view.duration.unwrap_or(self.cfg.replica_lease_duration);
        let observed = lock(&self.observed)
            .get(&name)
            .map(|(_, at)| *at)
            .unwrap_or_else(Instant::now);
        observed.elapsed() < duration
    }

    /// Live replicas' holder identities (ourselves included unless fenced).
    fn live_replicas(&self, leases: &[Arc<DynamicObject>]) -> Vec<String> {
        leases
            .iter()
            .filter(|l| lease_label(l) == Some("replica"))
            .filter_map(|l| holder_str(l))
            .filter(|h| self.alive(h))
            .map(str::to_owned)
            .collect()
    }

    /// Agents per live replica, from the agent Leases; computed at most once a second
    /// (a reconnect storm asks once per session), with our own count always current.
    pub fn shares(&self) -> Shares {
        let fresh = lock(&self.shares_cache)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < Duration::from_secs(1))
            .map(|(_, s)| s.clone());
        let mut shares: Shares = match fresh {
            Some(s) => s,
            None => {
                let leases = self.cache.list_namespace(&self.namespace);
                let live = self.live_replicas(&leases);
                let holders = leases
                    .iter()
                    .filter(|l| lease_label(l) == Some("agent"))
                    .filter_map(|l| holder_str(l).map(str::to_owned));
                let s = Shares::compute(&live, holders);
                *lock(&self.shares_cache) = Some((Instant::now(), s.clone()));
                s
            }
        };
        // Every replica counted from the same view (the Leases in the cache), ours too: a
        // fresh count of our own against stale counts of the others would make every
        // replica look above its share while agents are arriving.
        shares.held.entry(self.me.clone()).or_insert(0);
        let total: usize = shares.held.values().sum();
        shares.fair = total.div_ceil(shares.held.len().max(1));
        shares
    }

    /// Takes `agent`'s Lease for session `session`, waiting for a live holder to hand it
    /// over (at most a replica Lease duration and a bit). The guard releases it.
    pub async fn acquire(
        self: &Arc<Self>,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
    ) -> Result<LeaseGuard, Status> {
        if self.fenced.load(Ordering::Acquire) || lock(&self.renewed).is_none() {
            self.metrics.deferred("Fenced");
            return Err(Status::unavailable(format!(
                "principal replica {} cannot renew its Lease on the hub: reconnect to another replica",
                self.cfg.replica
            )));
        }
        lock(&self.acquiring).insert(agent.clone());
        let result = self.acquire_loop(agent, namespace, session).await;
        // Held before no longer acquiring: the orphan sweep must never see neither.
        if let Ok(rv) = &result {
            lock(&self.held).insert(
                agent.clone(),
                Held {
                    session,
                    rv: *rv,
                    next_renew: Instant::now() + self.renew_after(),
                    handover_to: None,
                },
            );
        }
        lock(&self.acquiring).remove(agent);
        result?;
        Ok(LeaseGuard {
            leases: self.clone(),
            agent: agent.clone(),
            session,
            released: false,
        })
    }

    /// Whether another replica asked for `agent` while `session` was starting here.
    pub fn handover_pending(&self, agent: &AgentName, session: u64) -> bool {
        lock(&self.held)
            .get(agent)
            .is_some_and(|h| h.session == session && h.handover_to.is_some())
    }

    /// When to renew an agent Lease next: a random point between a third and two thirds
    /// of its duration, so renewals spread evenly.
    fn renew_after(&self) -> Duration {
        let d = self.cfg.agent_lease_duration;
        d / 3 + d.mul_f64(fastrand::f64() / 3.0)
    }

    async fn acquire_loop(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
    ) -> Result<u64, Status> {
        let name = agent_lease_name(agent);
        let deadline = Instant::now()
            + self.cfg.replica_lease_duration
            + Duration::from_secs(2).max(self.cfg.replica_lease_duration / 2);
        let mut asked = false;
        // Set when a create found the Lease present though the watch cache has none: a
        // Lease of another partition (an agent moving here); read it from the API.
        let mut unseen = false;
        // A session of this agent that just ended here is still releasing the Lease: let
        // it finish, so its write does not clear the holder we are about to write.
        while lock(&self.releasing).contains(agent) && Instant::now() < deadline {
            let notified = self.changed.notified();
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
        loop {
            // Register for changes before reading, so a handover written after the read
            // wakes us.
            let notified = self.changed.notified();
            let Some(current) = self.read_agent_lease(&name, unseen).await? else {
                match self.create_agent_lease(agent, namespace, session).await? {
                    Some(rv) => return Ok(rv),
                    None => {
                        // Only a partitioned principal has Leases its cache cannot show.
                        unseen = !self.sessions.partition.labels().is_empty();
                        continue;
                    }
                }
            };
            let view = LeaseView::of(&current);
            let now = jiff::Timestamp::now();
            let holder = view.holder.clone();
            let free = match holder.as_deref() {
                None => true,
                Some(h) if h == self.me => true,
                Some(h) => !self.alive(h) || view.expired(now, Duration::ZERO),
            };
            if free {
                match self
                    .take_agent_lease(agent, namespace, &name, current, holder)
                    .await?
                {
                    Some(rv) => return Ok(rv),
                    None => continue,
                }
            }
            let holder = holder.unwrap_or_default();
            if Instant::now() >= deadline {
                self.metrics.deferred("HeldElsewhere");
                return Err(Status::unavailable(format!(
                    "agent {agent} is served by principal replica {}, which did not hand it over in time; retry",
                    replica_of(&holder)
                )));
            }
            if !asked || view.takeover.as_deref() != Some(self.me.as_str()) {
                if !self.ask_handover(agent, &name, current, &holder).await? {
                    continue;
                }
                asked = true;
            }
            // Wait for the holder's answer (or its replica Lease to go stale).
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(500));
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// The agent Lease `name`. The watch cache decides when it is complete: a first
    /// connect costs one create, a reconnect one update (a stale cache costs a conflict and
    /// a read).
    /// `absent_unsure`: a create found the Lease present, so a cache without it is read
    /// again from the API server (a Lease outside this partition's selector, or a cache
    /// that is behind).
    async fn read_agent_lease(
        &self,
        name: &str,
        absent_unsure: bool,
    ) -> Result<Option<DynamicObject>, Status> {
        let known = match self.cache.known(Some(&self.namespace), name) {
            argocd_agent_kubernetes::Known::Absent if absent_unsure => {
                argocd_agent_kubernetes::Known::Unknown
            }
            known => known,
        };
        Ok(match known {
            argocd_agent_kubernetes::Known::Present(c) => Some((*c).clone()),
            argocd_agent_kubernetes::Known::Absent => None,
            argocd_agent_kubernetes::Known::Unknown => self
                .api
                .get(Some(&self.namespace), name)
                .await
                .map_err(|e| self.lease_error("get", &e))?,
        })
    }

    /// Creates the agent's Lease held by us; `None`: another replica created it first
    /// (look again).
    async fn create_agent_lease(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
    ) -> Result<Option<u64>, Status> {
        match self
            .api
            .create(&self.new_agent_lease(agent, namespace))
            .await
        {
            Ok(created) => {
                self.metrics.lease_write("agent", "create", "ok");
                tracing::debug!(%agent, session, "agent Lease created");
                Ok(Some(rv(&created).unwrap_or(0)))
            }
            Err(e) if e.is_already_exists() => {
                self.metrics.lease_write("agent", "create", "conflict");
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(None)
            }
            Err(e) => Err(self.lease_error("create", &e)),
        }
    }

    /// Writes us as holder of a free agent Lease (`current`, held by `previous`); `None`:
    /// someone else moved first (decide again).
    async fn take_agent_lease(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        name: &str,
        current: DynamicObject,
        previous: Option<String>,
    ) -> Result<Option<u64>, Status> {
        let me = self.me.clone();
        let expected = previous.clone();
        let written = self
            .api
            .update_from(Some(&self.namespace), name, Some(current), |obj| {
                let v = LeaseView::of(obj);
                if v.holder != expected {
                    return Mutation::Abort; // someone else moved first: decide again
                }
                let changing = v.holder.as_deref() != Some(me.as_str());
                set_spec(obj, |s| {
                    if changing {
                        s.acquire_time = Some(now_micro());
                        if v.holder.is_some() {
                            s.lease_transitions = Some(v.transitions + 1);
                        }
                    }
                    s.holder_identity = Some(me.clone());
                    s.renew_time = Some(now_micro());
                    s.lease_duration_seconds = Some(secs(self.cfg.agent_lease_duration));
                });
                set_annotation(obj, TAKEOVER_ANNOTATION, None);
                set_annotation(obj, HUB_NAMESPACE_ANNOTATION, Some(namespace.as_str()));
                // Into this partition (a Lease another principal's partition held moves).
                self.sessions.partition.stamp(obj);
                Mutation::Changed
            })
            .await;
        match written {
            Ok(UpdateOutcome::Updated(obj)) => {
                self.metrics.lease_write("agent", "acquire", "ok");
                if let Some(p) = previous.filter(|p| *p != self.me) {
                    tracing::info!(%agent, previous = %p, "agent Lease taken over from a replica that is gone");
                }
                Ok(Some(rv(&obj).unwrap_or(0)))
            }
            Ok(_) => {
                self.metrics.lease_write("agent", "acquire", "conflict");
                Ok(None)
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.lease_error("acquire", &e)),
        }
    }

    /// Asks `holder` to hand the agent over (the takeover annotation); `false`: the Lease
    /// changed meanwhile (look again).
    async fn ask_handover(
        &self,
        agent: &AgentName,
        name: &str,
        current: DynamicObject,
        holder: &str,
    ) -> Result<bool, Status> {
        let me = self.me.clone();
        let expected = holder.to_owned();
        let asked_now = self
            .api
            .update_from(Some(&self.namespace), name, Some(current), |obj| {
                let v = LeaseView::of(obj);
                if v.holder.as_deref() != Some(expected.as_str()) {
                    return Mutation::Abort;
                }
                if v.takeover.as_deref() == Some(me.as_str()) {
                    return Mutation::Unchanged;
                }
                set_annotation(obj, TAKEOVER_ANNOTATION, Some(&me));
                Mutation::Changed
            })
            .await;
        match asked_now {
            Ok(UpdateOutcome::Updated(_)) => {
                self.metrics.lease_write("agent", "takeover-request", "ok");
                tracing::info!(%agent, holder = %holder,
                    "agent is held by another replica: asked it to hand the agent over");
                Ok(true)
            }
            Ok(UpdateOutcome::Unchanged(_)) => Ok(true),
            Ok(UpdateOutcome::Aborted(_)) => Ok(false),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(self.lease_error("takeover-request", &e)),
        }
    }

    fn lease_error(&self, op: &str, e: &argocd_agent_kubernetes::Error) -> Status {
        self.metrics.lease_write("agent", op, "error");
        tracing::warn!(op, error = %chain(e), "agent Lease write failed");
        Status::unavailable(format!(
            "principal replica {} could not {op} the agent's Lease on the hub: {}",
            self.cfg.replica,
            chain(e)
        ))
    }

    fn new_agent_lease(&self, agent: &AgentName, namespace: &Namespace) -> DynamicObject {
        let mut obj = DynamicObject::new(&agent_lease_name(agent), &Kind::Lease.api_resource())
            .within(&self.namespace);
        obj.metadata.labels = Some(
            [
                (LEASE_LABEL.to_string(), "agent".to_string()),
                (AGENT_LABEL.to_string(), agent.to_string()),
            ]
            .into(),
        );
        set_annotation(&mut obj, HUB_NAMESPACE_ANNOTATION, Some(namespace.as_str()));
        self.sessions.partition.stamp(&mut obj);
        set_spec(&mut obj, |s| {
            s.holder_identity = Some(self.me.clone());
            s.acquire_time = Some(now_micro());
            s.renew_time = Some(now_micro());
            s.lease_duration_seconds = Some(secs(self.cfg.agent_lease_duration));
            s.lease_transitions = Some(0);
        });
        obj
    }

    /// The session that took `agent`'s Lease ended: release it, or write the replica that
    /// asked for it as holder.
    async fn release(&self, agent: &AgentName, session: u64) {
        let handover_to = {
            let mut held = lock(&self.held);
            match held.get(agent) {
                Some(h) if h.session == session => held.remove(agent).and_then(|h| h.handover_to),
                _ => return, // a newer session of this agent (here) holds it now
            }
        };
        lock(&self.releasing).insert(agent.clone());
        self.write_release(agent, handover_to).await;
        lock(&self.releasing).remove(agent);
        self.changed.notify_waiters();
    }

    async fn write_release(&self, agent: &AgentName, handover_to: Option<String>) {
        let name = agent_lease_name(agent);
        let me = self.me.clone();
        let first = self
            .cache
            .get(Some(&self.namespace), &name)
            .map(|o| (*o).clone());
        let to = handover_to.clone();
        let result = self
            .api
            .update_from(Some(&self.namespace), &name, first, |obj| {
                let v = LeaseView::of(obj);
                if v.holder.as_deref() != Some(me.as_str()) {
                    return Mutation::Abort;
                }
                // A requester may have asked after the session ended: hand over to it.
                let to = to.clone().or(v.takeover.clone());
                set_spec(obj, |s| {
                    s.holder_identity = to.clone();
                    s.renew_time = Some(now_micro());
                    if to.is_some() {
                        s.acquire_time = Some(now_micro());
                        s.lease_transitions = Some(v.transitions + 1);
                    }
                });
                set_annotation(obj, TAKEOVER_ANNOTATION, None);
                Mutation::Changed
            })
            .await;
        let op = if handover_to.is_some() {
            "handover"
        } else {
            "release"
        };
        match result {
            Ok(UpdateOutcome::Updated(obj)) => {
                self.metrics.lease_write("agent", op, "ok");
                let to = LeaseView::of(&obj).holder;
                tracing::debug!(%agent, to = %text::or_dash(to), "agent Lease {op}d");
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                self.metrics.lease_write("agent", op, "error");
                tracing::warn!(%agent, error = %chain(&e), "could not {op} the agent Lease (it expires by itself)");
            }
        }
    }

    /// A Lease changed on the hub.
    fn on_change(&self, change: Change) {
        match &change {
            Change::Applied(obj) => match lease_label(obj) {
                Some("replica") => {
                    let name = obj.metadata.name.clone().unwrap_or_default();
                    let version = rv(obj);
                    let mut observed = lock(&self.observed);
                    let entry = observed.entry(name).or_insert((version, Instant::now()));
                    if entry.0 != version {
                        *entry = (version, Instant::now());
                    }
                }
                Some("agent") => {
                    if let (Some(ns), Some(agent)) = (
                        obj.metadata
                            .annotations
                            .as_ref()
                            .and_then(|a| a.get(HUB_NAMESPACE_ANNOTATION)),
                        agent_of(obj),
                    ) {
                        lock(&self.by_namespace).insert(ns.clone(), agent);
                    }
                    self.on_agent_lease(obj)
                }
                _ => {}
            },
            Change::Deleted(obj) => {
                if let Some(name) = obj.metadata.name.as_ref() {
                    lock(&self.observed).remove(name);
                }
            }
            Change::Synced => {}
        }
        self.changed.notify_waiters();
    }

    /// An agent Lease changed: hand our agent over when asked, or close our session when
    /// another replica took the Lease (it judged us gone).
    fn on_agent_lease(&self, obj: &DynamicObject) {
        let Some(agent) = obj
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(AGENT_LABEL))
            .and_then(|a| AgentName::new(a).ok())
        else {
            return;
        };
        let view = LeaseView::of(obj);
        let mut held = lock(&self.held);
        let Some(h) = held.get_mut(&agent) else {
            return;
        };
        if view.resource_version.is_some_and(|v| v <= h.rv) {
            return; // our own write, or older
        }
        match (view.holder.as_deref(), view.takeover.as_deref()) {
            (Some(holder), Some(requester))
                if holder == self.me && requester != self.me && h.handover_to.is_none() =>
            {
                h.handover_to = Some(requester.to_string());
                drop(held);
                self.metrics.deferred("HandedOver");
                tracing::info!(%agent, to = %requester,
                    "another replica asked for this agent (it reconnected there): closing our session and handing the agent over");
                let reason = format!(
                    "the agent opened a session on principal replica {}",
                    replica_of(requester)
                );
                // Without a session left here (it is ending), the guard hands over.
                self.sessions.close_session(&agent, Some(reason));
            }
            (Some(holder), Some(_)) if holder == self.me => {} // handover under way
            (holder, _) if holder != Some(self.me.as_str()) => {
                let holder = holder.unwrap_or("nobody").to_string();
                held.remove(&agent);
                drop(held);
                self.metrics.deferred("LeaseLost");
                tracing::warn!(%agent, holder = %holder,
                    "this replica lost the agent's Lease: closing its session here");
                self.sessions.close_session(
                    &agent,
                    Some(format!(
                        "principal replica {} no longer holds the agent's Lease",
                        self.cfg.replica
                    )),
                );
            }
            _ => {}
        }
    }

    /// Renews the replica Lease every fifth of its duration, agent Leases when due, and
    /// releases Leases held in our name that no session uses.
    async fn renew_loop(self: Arc<Self>, shutdown: CancellationToken) {
        self.cache.wait_synced().await;
        let replica_every = self.cfg.replica_lease_duration / 5;
        let mut tick = tokio::time::interval(replica_every.min(Duration::from_secs(1)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_replica_write: Option<Instant> = None;
        let mut last_sweep = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.retire().await;
                    return;
                }
                _ = tick.tick() => {}
            }
            if last_replica_write.is_none_or(|t| t.elapsed() >= replica_every) {
                last_replica_write = Some(Instant::now());
                self.renew_replica().await;
            }
            self.renew_agents().await;
            if last_sweep.elapsed() >= ORPHAN_SWEEP {
                last_sweep = Instant::now();
                self.release_orphans().await;
            }
        }
    }

    async fn renew_replica(&self) {
        let name = replica_lease_name(&self.cfg.replica);
        let me = self.me.clone();
        let url = lock(&self.resource_proxy_url).clone();
        let redis = lock(&self.redis_proxy_address).clone();
        let duration = secs(self.cfg.replica_lease_duration);
        let cached = self
            .cache
            .get(Some(&self.namespace), &name)
            .map(|o| (*o).clone());
        let result = if cached.is_none()
            && matches!(self.api.get(Some(&self.namespace), &name).await, Ok(None))
        {
            let mut obj =
                DynamicObject::new(&name, &Kind::Lease.api_resource()).within(&self.namespace);
            obj.metadata.labels = Some([(LEASE_LABEL.to_string(), "replica".to_string())].into());
            self.sessions.partition.stamp(&mut obj);
            if let Some(url) = &url {
                set_annotation(&mut obj, RESOURCE_PROXY_ANNOTATION, Some(url));
            }
            if let Some(redis) = &redis {
                set_annotation(&mut obj, REDIS_PROXY_ANNOTATION, Some(redis));
            }
            set_spec(&mut obj, |s| {
                s.holder_identity = Some(me.clone());
                s.acquire_time = Some(now_micro());
                s.renew_time = Some(now_micro());
                s.lease_duration_seconds = Some(duration);
                s.lease_transitions = Some(0);
            });
            self.api.create(&obj).await.map(|_| ())
        } else {
            self.api
                .update_from(Some(&self.namespace), &name, cached, |obj| {
                    let v = LeaseView::of(obj);
                    set_spec(obj, |s| {
                        if v.holder.as_deref() != Some(me.as_str()) {
                            s.acquire_time = Some(now_micro());
                            s.lease_transitions = Some(v.transitions + 1);
                        }
                        s.holder_identity = Some(me.clone());
                        s.renew_time = Some(now_micro());
                        s.lease_duration_seconds = Some(duration);
                    });
                    set_annotation(obj, RESOURCE_PROXY_ANNOTATION, url.as_deref());
                    set_annotation(obj, REDIS_PROXY_ANNOTATION, redis.as_deref());
                    self.sessions.partition.stamp(obj);
                    Mutation::Changed
                })
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => {
                self.metrics.lease_write("replica", "renew", "ok");
                *lock(&self.renewed) = Some(Instant::now());
                if self.fenced.swap(false, Ordering::AcqRel) {
                    tracing::info!("replica Lease renewed again: accepting agents");
                }
            }
            Err(e) => {
                self.metrics.lease_write("replica", "renew", "error");
                let since = lock(&self.renewed).map(|t| t.elapsed());
                tracing::warn!(error = %chain(&e), since_last = %text::or_dash(since.map(text::duration)), "could not renew the replica Lease");
                if since.is_some_and(|s| s >= self.cfg.replica_lease_duration)
                    && !self.fenced.swap(true, Ordering::AcqRel)
                {
                    self.fence();
                }
            }
        }
    }

    /// Our replica Lease is stale: other replicas take our agents over, so close every
    /// session here (they reconnect elsewhere) and refuse new ones until renewed.
    fn fence(&self) {
        let agents: Vec<AgentName> = lock(&self.held).drain().map(|(a, _)| a).collect();
        tracing::error!(
            sessions = agents.len(),
            "replica Lease stale for a whole duration: closing every session so other replicas serve the agents"
        );
        for agent in agents {
            self.metrics.deferred("Fenced");
            self.sessions.close_session(
                &agent,
                Some(format!(
                    "principal replica {} cannot renew its Lease on the hub",
                    self.cfg.replica
                )),
            );
        }
    }

    async fn renew_agents(&self) {
        let now = Instant::now();
        let due: Vec<(AgentName, u64)> = lock(&self.held)
            .iter()
            .filter(|(_, h)| h.next_renew <= now && h.handover_to.is_none())
            .take(RENEWS_PER_TICK)
            .map(|(a, h)| (a.clone(), h.session))
            .collect();
        for (agent, session) in due {
            let name = agent_lease_name(&agent);
            let me = self.me.clone();
            let first = self
                .cache
                .get(Some(&self.namespace), &name)
                .map(|o| (*o).clone());
            let result = self
                .api
                .update_from(Some(&self.namespace), &name, first, |obj| {
                    if LeaseView::of(obj).holder.as_deref() != Some(me.as_str()) {
                        return Mutation::Abort;
                    }
                    set_spec(obj, |s| s.renew_time = Some(now_micro()));
                    Mutation::Changed
                })
                .await;
            let mut held = lock(&self.held);
            let ours = held.get_mut(&agent).filter(|h| h.session == session);
            match (result, ours) {
                (Ok(UpdateOutcome::Updated(obj)), Some(h)) => {
                    self.metrics.lease_write("agent", "renew", "ok");
                    h.rv = rv(&obj).unwrap_or(h.rv);
                    h.next_renew = Instant::now() + self.renew_after();
                }
                (Ok(UpdateOutcome::Aborted(_)) | Err(_), Some(_))
                    if !self.lease_still_ours(&agent) =>
                {
                    held.remove(&agent);
                    drop(held);
                    self.metrics.deferred("LeaseLost");
                    tracing::warn!(%agent, "agent Lease held by another replica at renewal: closing the session here");
                    self.sessions.close_session(
                        &agent,
                        Some(format!(
                            "principal replica {} no longer holds the agent's Lease",
                            self.cfg.replica
                        )),
                    );
                }
                (Err(e), Some(h)) => {
                    self.metrics.lease_write("agent", "renew", "error");
                    tracing::warn!(%agent, error = %chain(&e), "could not renew the agent Lease; retrying");
                    h.next_renew = Instant::now() + Duration::from_secs(5);
                }
                _ => {}
            }
        }
    }

    fn lease_still_ours(&self, agent: &AgentName) -> bool {
        self.cache
            .get(Some(&self.namespace), &agent_lease_name(agent))
            .is_some_and(|l| LeaseView::of(&l).holder.as_deref() == Some(self.me.as_str()))
    }

    /// Leases naming us that no session here uses (a requester gave up before we handed
    /// over): release them so the agent is free.
    async fn release_orphans(&self) {
        let orphans: Vec<AgentName> = {
            let held = lock(&self.held);
            let acquiring = lock(&self.acquiring);
            let releasing = lock(&self.releasing);
            self.cache
                .list_namespace(&self.namespace)
                .iter()
                .filter(|l| lease_label(l) == Some("agent"))
                .filter(|l| holder_str(l) == Some(self.me.as_str()))
                .filter_map(|l| {
                    l.metadata
                        .labels
                        .as_ref()
                        .and_then(|m| m.get(AGENT_LABEL))
                        .and_then(|a| AgentName::new(a).ok())
                })
                .filter(|a| {
                    !held.contains_key(a) && !acquiring.contains(a) && !releasing.contains(a)
                })
                .collect()
        };
        for agent in orphans {
            tracing::info!(%agent, "releasing an agent Lease no session here uses");
            self.write_release(&agent, None).await;
        }
    }

    /// Compares our share with the others' and sheds a few sessions when above it.
    async fn rebalance_loop(self: Arc<Self>, shutdown: CancellationToken) {
        self.cache.wait_synced().await;
        // Shed only when above the share two rounds in a row: arrivals and the watch's lag
        // make single readings noisy.
        let mut above_before = false;
        loop {
            let jitter = self
                .cfg
                .rebalance_interval
                .mul_f64(0.75 + fastrand::f64() * 0.5);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(jitter) => {}
            }
            if self.ready().is_err() {
                continue;
            }
            let shares = self.shares();
            let excess = shares
                .excess(&self.me, self.cfg.rebalance_slack)
                .min(self.cfg.rebalance_batch);
            let above = excess > 0;
            if !(above && above_before) {
                above_before = above;
                continue;
            }
            above_before = false;
            let victims = newest_sessions(&lock(&self.held), excess);
            tracing::info!(
                held = shares.held.get(&self.me).copied().unwrap_or(0),
                fair = shares.fair,
                shedding = victims.len(),
                "above fair share while another replica has room: closing sessions so they reconnect elsewhere"
            );
            for agent in victims {
                self.metrics.deferred("Rebalance");
                self.sessions.close_session(
                    &agent,
                    Some(format!(
                        "principal replica {} is rebalancing agents across replicas; reconnect",
                        self.cfg.replica
                    )),
                );
            }
        }
    }

    /// Shutting down: release the replica Lease so others do not wait for it to expire
    /// (agent Leases are released by the sessions' guards as they end).
    async fn retire(&self) {
        let name = replica_lease_name(&self.cfg.replica);
        let me = self.me.clone();
        let first = self
            .cache
            .get(Some(&self.namespace), &name)
            .map(|o| (*o).clone());
        let _ = self
            .api
            .update_from(Some(&self.namespace), &name, first, |obj| {
                if LeaseView::of(obj).holder.as_deref() != Some(me.as_str()) {
                    return Mutation::Abort;
                }
                set_spec(obj, |s| s.holder_identity = None);
                Mutation::Changed
            })
            .await;
    }
}

/// The holder identity, read without decoding the whole spec (scans of every Lease).
/// The agents whose live session another replica serves, with their hub namespace (the
/// tenants' `agents` quotas count them), from the agent Leases in the cache.
impl crate::tenant_limits::Census for Leases {
    fn elsewhere(&self) -> Vec<(AgentName, String)> {
        let now = jiff::Timestamp::now();
        self.cache
            .list_namespace(&self.namespace)
            .iter()
            .filter(|l| lease_label(l) == Some("agent"))
            .filter_map(|l| {
                let view = LeaseView::of(l);
                let holder = view.holder.as_deref()?;
                if holder == self.me
                    || !self.alive(holder)
                    || view.expired(now, Duration::from_secs(5))
                {
                    return None;
                }
                let ns = l
                    .metadata
                    .annotations
                    .as_ref()?
                    .get(HUB_NAMESPACE_ANNOTATION)?
                    .clone();
                Some((agent_of(l)?, ns))
            })
            .collect()
    }
}

fn holder_str(obj: &DynamicObject) -> Option<&str> {
    obj.data
        .get("spec")?
        .get("holderIdentity")?
        .as_str()
        .filter(|h| !h.is_empty())
}

fn agent_of(obj: &DynamicObject) -> Option<AgentName> {
    obj.metadata
        .labels
        .as_ref()?
        .get(AGENT_LABEL)
        .and_then(|a| AgentName::new(a).ok())
}

fn lease_label(obj: &DynamicObject) -> Option<&str> {
    obj.metadata
        .labels
        .as_ref()?
        .get(LEASE_LABEL)
        .map(String::as_str)
}

/// The agent Lease's name.
pub fn agent_lease_name(agent: &AgentName) -> String {
    format!("{AGENT_LEASE_PREFIX}{agent}")
}

/// A replica Lease's name.
pub fn replica_lease_name(replica: &str) -> String {
    format!("{REPLICA_LEASE_PREFIX}{replica}")
}

/// The agents of the `n` newest sessions not being handed over: whom rebalancing sheds. An
/// arrival is what put the replica above its share, and long-lived sessions stay
/// undisturbed (so the same agent is not shed round after round).
fn newest_sessions(held: &HashMap<AgentName, Held>, n: usize) -> Vec<AgentName> {
    let mut candidates: Vec<(u64, &AgentName)> = held
        .iter()
        .filter(|(_, h)| h.handover_to.is_none())
        .map(|(a, h)| (h.session, a))
        .collect();
    candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
    candidates
        .into_iter()
        .take(n)
        .map(|(_, a)| a.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rebalancing_sheds_the_newest_sessions_and_never_one_being_handed_over() {
        let held = |session: u64, handover: bool| Held {
            session,
            rv: 0,
            next_renew: Instant::now(),
            handover_to: handover.then(|| "principal-1".to_string()),
        };
        let agent = |a: &str| AgentName::new(a).unwrap();
        let map: HashMap<AgentName, Held> = [
            (agent("old"), held(3, false)),
            (agent("newest"), held(40, true)),
            (agent("new"), held(17, false)),
            (agent("middle"), held(9, false)),
        ]
        .into_iter()
        .collect();
        assert_eq!(newest_sessions(&map, 2), [agent("new"), agent("middle")]);
        assert_eq!(
            newest_sessions(&map, 10),
            [agent("new"), agent("middle"), agent("old")]
        );
        assert!(newest_sessions(&map, 0).is_empty());
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn fair_share_and_excess() {
        let live = ids(&["a_1", "b_1", "c_1"]);
        // After a failover: a and b hold three each, c (restarted) none.
        let holders = ids(&["a_1", "a_1", "a_1", "b_1", "b_1", "b_1", "dead_0"]);
        let s = Shares::compute(&live, holders.into_iter());
        assert_eq!(
            s.fair, 2,
            "six agents on three live replicas (the dead one's lease ignored)"
        );
        assert_eq!(s.excess("a_1", 0), 1);
        assert_eq!(s.excess("a_1", 1), 0, "slack tolerates one above");
        assert_eq!(s.excess("c_1", 0), 0);
        assert!(s.someone_below("a_1"));
        // Balanced: nobody sheds.
        let s = Shares::compute(
            &live,
            ids(&["a_1", "a_1", "b_1", "b_1", "c_1", "c_1"]).into_iter(),
        );
        assert_eq!(s.excess("a_1", 0), 0);
        assert!(!s.someone_below("a_1"));
        // Everyone above: nobody has room, nobody sheds.
        let s = Shares::compute(
            &ids(&["a_1", "b_1"]),
            ids(&["a_1", "a_1", "a_1", "b_1", "b_1", "b_1"]).into_iter(),
        );
        assert_eq!(s.excess("a_1", 0), 0);
    }

    #[test]
    fn replica_of_holder_identity() {
        assert_eq!(replica_of("principal-0_1a2b3c4d"), "principal-0");
        assert_eq!(replica_of("plain"), "plain");
    }

    #[test]
    fn lease_spec_round_trip() {
        let mut obj = DynamicObject::new("x", &Kind::Lease.api_resource()).within("argocd");
        set_spec(&mut obj, |s| {
            s.holder_identity = Some("r_1".into());
            s.renew_time = Some(now_micro());
            s.lease_duration_seconds = Some(10);
            s.lease_transitions = Some(3);
        });
        set_annotation(&mut obj, TAKEOVER_ANNOTATION, Some("s_2"));
        obj.metadata.resource_version = Some("42".into());
        let v = LeaseView::of(&obj);
        assert_eq!(v.holder.as_deref(), Some("r_1"));
        assert_eq!(v.duration, Some(Duration::from_secs(10)));
        assert_eq!(v.transitions, 3);
        assert_eq!(v.takeover.as_deref(), Some("s_2"));
        assert_eq!(v.resource_version, Some(42));
        let now = jiff::Timestamp::now();
        assert!(!v.expired(now, Duration::ZERO));
        let later = now
            .checked_add(jiff::SignedDuration::from_secs(11))
            .unwrap();
        assert!(v.expired(later, Duration::ZERO));
        assert!(!v.expired(later, Duration::from_secs(5)), "skew tolerated");
        // A released lease has no holder and is free.
        set_spec(&mut obj, |s| s.holder_identity = None);
        assert_eq!(LeaseView::of(&obj).holder, None);
    }

    #[test]
    fn config_validation() {
        assert!(HaConfig::new("principal-0").validate().is_ok());
        assert!(HaConfig::new("Principal_0").validate().is_err());
        assert!(HaConfig::new("").validate().is_err());
        let mut c = HaConfig::new("p");
        c.agent_lease_duration = Duration::from_secs(1);
        assert!(c.validate().is_err());
        assert!(!default_replica_id().is_empty());
    }
}
