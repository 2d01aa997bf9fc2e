//! The Leases of one replica: the shared state its replica-Lease, agent-Lease, takeover and
//! rebalance code changes, how it starts, and what a Lease object says.

use argocd_agent_identity::text;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_domain::AgentName;
use argocd_agent_kubernetes::{
    Change, CompactLease, Kind, ObjectStore, ObjectView, Resources, Scope,
};
use futures::StreamExt;
use futures::stream::BoxStream;
use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::DynamicObject;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::config::*;
use super::shares::*;
use crate::metrics::Metrics;
use crate::sessions::Sessions;

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
        LeaseView::of_lease(&CompactLease::read(obj))
    }

    /// Reads the Lease `lease` as the watch cache keeps it.
    pub fn of_lease(lease: &CompactLease) -> LeaseView {
        LeaseView {
            holder: holder_str(lease).map(str::to_owned),
            renewed: lease.renew_time(),
            duration: lease
                .duration_seconds()
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
            transitions: lease.transitions().unwrap_or(0),
            takeover: lease
                .annotation(TAKEOVER_ANNOTATION)
                .filter(|v| !v.is_empty())
                .map(str::to_owned),
            resource_version: lease.resource_version().and_then(|v| v.parse().ok()),
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

pub(super) fn rv(obj: &DynamicObject) -> Option<u64> {
    obj.metadata.resource_version.as_deref()?.parse().ok()
}

/// The replica part of a holder identity `<replica>_<incarnation>`.
pub fn replica_of(holder: &str) -> &str {
    holder.rsplit_once('_').map_or(holder, |(r, _)| r)
}

/// Writes `spec` fields into a Lease object.
pub(super) fn set_spec(obj: &mut DynamicObject, f: impl FnOnce(&mut LeaseSpec)) {
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

pub(super) fn set_annotation(obj: &mut DynamicObject, key: &str, value: Option<&str>) {
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

pub(super) fn now_micro() -> MicroTime {
    MicroTime(jiff::Timestamp::now())
}

pub(super) fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

/// An agent Lease this replica holds.
#[derive(Debug)]
pub(super) struct Held {
    pub(super) session: u64,
    /// resourceVersion of our last write (older watch events are not news).
    pub(super) rv: u64,
    pub(super) next_renew: Instant,
    /// A replica that asked for the agent: the holder written when the session ends.
    pub(super) handover_to: Option<String>,
}

/// Where a replica's Leases live: the store written to, the view read, and the changes that
/// keep the view (the API server and its watch; a `MemoryStore` in unit tests).
pub struct LeaseBackend {
    /// Writes agent Leases.
    pub api: Arc<dyn ObjectStore>,
    /// Writes this replica's own Lease: a client of its own, so that a storm of agent Lease
    /// writes (10,000 takeovers queue ~20 s behind the Lease budget) never delays the
    /// renewal that keeps the replica ready.
    pub replica_api: Arc<dyn ObjectStore>,
    /// The Leases of this principal's partition, as last seen.
    pub cache: Arc<dyn ObjectView>,
    /// The changes the view follows, which the replica reacts to.
    pub changes: BoxStream<'static, Change>,
}

impl LeaseBackend {
    /// The hub's Leases in `namespace` through `client`: only this principal's partition's
    /// (another principal's replicas on the same hub are neither peers nor holders here);
    /// the replica's own Lease through `replica_client`.
    pub fn kube(
        client: kube::Client,
        replica_client: kube::Client,
        namespace: &str,
        sessions: &Sessions,
    ) -> LeaseBackend {
        let selector = sessions
            .partition
            .selector_with(Some(LEASE_LABEL))
            .unwrap_or_else(|| LEASE_LABEL.to_string());
        let (cache, changes) = argocd_agent_kubernetes::watch(
            client.clone(),
            Kind::Lease,
            Scope::namespace(namespace.to_string()).with_label_selector(selector),
        );
        LeaseBackend {
            api: Arc::new(Resources::new(client, Kind::Lease)),
            replica_api: Arc::new(Resources::new(replica_client, Kind::Lease)),
            cache: Arc::new(cache),
            changes: Box::pin(changes),
        }
    }
}

/// The agent Leases and the replica Lease of one principal replica.
pub struct Leases {
    pub(super) cfg: HaConfig,
    /// Holder identity: `<replica>_<incarnation>`.
    pub(super) me: String,
    pub(super) namespace: String,
    /// The Leases on the hub (the API server; in memory in unit tests).
    pub(super) api: Arc<dyn ObjectStore>,
    /// The same, through the client only the replica Lease uses.
    pub(super) replica_api: Arc<dyn ObjectStore>,
    /// The watched Leases of this principal's partition.
    pub(super) cache: Arc<dyn ObjectView>,
    pub(super) changed: Notify,
    /// The sessions a lost or handed-over Lease closes.
    pub(super) sessions: Arc<Sessions>,
    pub(super) metrics: Metrics,
    pub(super) held: Mutex<HashMap<AgentName, Held>>,
    pub(super) acquiring: Mutex<HashSet<AgentName>>,
    pub(super) releasing: Mutex<HashSet<AgentName>>,
    pub(super) shares_cache: Mutex<Option<(Instant, Shares)>>,
    /// Hub namespace -> agent, from the agent Leases' annotation.
    pub(super) by_namespace: Mutex<HashMap<String, AgentName>>,
    /// Replica Lease name -> (resourceVersion, when we first saw it).
    pub(super) observed: Mutex<HashMap<String, (Option<u64>, Instant)>>,
    /// Last successful renewal of our replica Lease.
    pub(super) renewed: Mutex<Option<Instant>>,
    pub(super) fenced: AtomicBool,
    /// Shutting down: whether the replica Lease was cleared ([`Leases::retire`]); `None`
    /// until that write is answered.
    pub(super) retired: tokio::sync::watch::Sender<Option<bool>>,
    /// The principal's shutdown.
    pub(super) shutdown: CancellationToken,
    pub(super) resource_proxy_url: Mutex<Option<String>>,
    pub(super) redis_proxy_address: Mutex<Option<String>>,
    /// Where releases of dropped guards run (drained on shutdown).
    pub(super) tasks: TaskTracker,
    /// Agent Lease calls in flight ([`LEASE_REQUESTS_IN_FLIGHT`]). A session takes a slot
    /// before it builds its request: the client would queue the built request instead,
    /// and in a storm 10,000 sessions each held one (~5 KB with its futures) for the ~20 s
    /// the Lease budget takes to write them all.
    pub(super) calls: Semaphore,
}

pub(super) use argocd_agent_domain::sync::lock;

impl Leases {
    /// Starts following the Leases of `backend` ([`LeaseBackend::kube`] on the hub) and
    /// the renew and rebalance loops.
    pub fn start(
        backend: LeaseBackend,
        namespace: &str,
        cfg: HaConfig,
        sessions: Arc<Sessions>,
        metrics: Metrics,
        tasks: &TaskTracker,
        shutdown: CancellationToken,
    ) -> Arc<Leases> {
        let LeaseBackend {
            api,
            replica_api,
            cache,
            changes,
        } = backend;
        let incarnation = uuid::Uuid::new_v4().simple().to_string();
        let me = format!("{}_{}", cfg.replica, &incarnation[..8]);
        let leases = Arc::new(Leases {
            cfg,
            me,
            namespace: namespace.to_string(),
            api,
            replica_api,
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
            retired: tokio::sync::watch::Sender::new(None),
            shutdown: shutdown.clone(),
            resource_proxy_url: Mutex::new(None),
            redis_proxy_address: Mutex::new(None),
            tasks: tasks.clone(),
            calls: Semaphore::new(LEASE_REQUESTS_IN_FLIGHT),
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
        tasks.spawn(leases.clone().replica_loop(shutdown.clone()));
        tasks.spawn(leases.clone().agents_loop(shutdown.clone()));
        if leases.cfg.rebalance {
            tasks.spawn(leases.clone().rebalance_loop(shutdown.clone()));
        }
        leases
    }
}

/// The holder identity; `None` when empty (nobody holds the Lease).
pub(super) fn holder_str(lease: &CompactLease) -> Option<&str> {
    lease.holder_identity().filter(|h| !h.is_empty())
}

/// The agent an agent Lease is for.
pub(super) fn agent_of(lease: &CompactLease) -> Option<AgentName> {
    lease
        .label(AGENT_LABEL)
        .and_then(|a| AgentName::new(a).ok())
}

/// `agent` or `replica`.
pub(super) fn lease_label(lease: &CompactLease) -> Option<&str> {
    lease.label(LEASE_LABEL)
}

/// The agent Lease's name.
pub fn agent_lease_name(agent: &AgentName) -> String {
    format!("{AGENT_LEASE_PREFIX}{agent}")
}

/// A replica Lease's name.
pub fn replica_lease_name(replica: &str) -> String {
    format!("{REPLICA_LEASE_PREFIX}{replica}")
}
