use std::collections::HashMap;
use std::time::Duration;

use argocd_agent_domain::AgentName;
use argocd_agent_kubernetes::Error as KubeError;
use argocd_agent_kubernetes::Kind;
use argocd_agent_kubernetes::memory::MemoryStore;
use kube::api::DynamicObject;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::time::Instant;

use super::rebalance::{newest_sessions, steady};
use super::state::{Held, now_micro, set_annotation, set_spec};
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

/// Reads as the store does; every write waits forever. Counts the creates begun.
struct Stalled(MemoryStore, Arc<AtomicUsize>);
#[async_trait::async_trait]
impl argocd_agent_kubernetes::ObjectStore for Stalled {
    fn kind(&self) -> Kind {
        self.0.kind()
    }
    async fn get(&self, ns: Option<&str>, name: &str) -> Result<Option<DynamicObject>, KubeError> {
        self.0.get(ns, name).await
    }
    async fn list(
        &self,
        ns: Option<&str>,
        scope: &argocd_agent_kubernetes::Scope,
    ) -> Result<Vec<DynamicObject>, KubeError> {
        self.0.list(ns, scope).await
    }
    async fn create(&self, _: &DynamicObject) -> Result<DynamicObject, KubeError> {
        self.1.fetch_add(1, Ordering::SeqCst);
        std::future::pending().await
    }
    async fn replace(&self, _: &DynamicObject) -> Result<DynamicObject, KubeError> {
        std::future::pending().await
    }
    async fn replace_status(
        &self,
        _: Option<&str>,
        _: &str,
        _: serde_json::Value,
    ) -> Result<DynamicObject, KubeError> {
        std::future::pending().await
    }
    async fn patch_merge(
        &self,
        _: Option<&str>,
        _: &str,
        _: &serde_json::Value,
    ) -> Result<DynamicObject, KubeError> {
        std::future::pending().await
    }
    async fn patch_status_merge(
        &self,
        _: Option<&str>,
        _: &str,
        _: &serde_json::Value,
    ) -> Result<DynamicObject, KubeError> {
        std::future::pending().await
    }
    async fn delete(
        &self,
        _: Option<&str>,
        _: &str,
    ) -> Result<argocd_agent_kubernetes::DeleteOutcome, KubeError> {
        std::future::pending().await
    }
}

/// A replica whose agent Lease writes never answer (its own Lease is written as usual),
/// started and ready; with the count of creates begun and the token that stops it.
async fn stalled_replica(
    cfg: HaConfig,
) -> (
    Arc<Leases>,
    Arc<AtomicUsize>,
    tokio_util::sync::CancellationToken,
) {
    let store = MemoryStore::new(Kind::Lease);
    let creates = Arc::new(AtomicUsize::new(0));
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (cache, changes) = store.watch(argocd_agent_kubernetes::Scope::namespace("argocd"));
    let backend = LeaseBackend {
        api: Arc::new(Stalled(store.clone(), creates.clone())),
        replica_api: Arc::new(store.clone()),
        cache: Arc::new(cache),
        changes,
    };
    let leases = Leases::start(
        backend,
        "argocd",
        cfg,
        Arc::new(crate::sessions::Sessions::new(
            Default::default(),
            Default::default(),
        )),
        crate::metrics::Metrics::new(),
        &tokio_util::task::TaskTracker::new(),
        shutdown.clone(),
    );
    eventually("the replica renewed its Lease", || leases.ready().is_ok()).await;
    (leases, creates, shutdown)
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
fn a_round_sheds_the_batch_or_a_quarter_of_a_large_excess() {
    let live = ids(&["a_1", "b_1", "c_1"]);
    // After every replica restarted, a took 7,000 of 10,000 agents.
    let mut holders = vec!["a_1".to_string(); 7000];
    holders.extend(vec!["b_1".to_string(); 1500]);
    holders.extend(vec!["c_1".to_string(); 1500]);
    let s = Shares::compute(&live, holders.into_iter());
    assert_eq!(s.fair, 3334);
    assert_eq!(s.excess("a_1", 1), 3665);
    assert_eq!(s.shed("a_1", 1, 10), 916, "a quarter of the excess");
    assert_eq!(s.shed("a_1", 1, 2000), 2000, "the batch when larger");
    assert_eq!(s.shed("a_1", 1, 5000), 3665, "never more than the excess");
    assert_eq!(s.shed("b_1", 1, 10), 0, "below its share: nothing");
    // A small excess sheds it whole, within the batch.
    let s = Shares::compute(&live, ids(&["a_1", "a_1", "a_1", "a_1", "b_1"]).into_iter());
    assert_eq!(s.shed("a_1", 0, 10), 2);
}

#[test]
fn rebalancing_waits_for_a_steady_fleet() {
    assert!(
        !steady(None, 10_000),
        "the first round has nothing to compare"
    );
    // A storm: the agents held across replicas climb round after round.
    assert!(!steady(Some(2_000), 6_500));
    assert!(!steady(Some(9_700), 10_000));
    // Settled: within 1 % (at least 10 agents) of the last round.
    assert!(steady(Some(9_950), 10_000));
    assert!(steady(Some(10_000), 9_900));
    assert!(steady(Some(600), 609), "small fleets: 10 agents of slack");
    assert!(!steady(Some(600), 611));
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

/// Until `check` holds, polled for up to 10 s.
async fn eventually(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !check() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Replica `name` on the in-memory Lease `store` (no API server), until `shutdown`.
fn memory_replica(
    store: &MemoryStore,
    name: &str,
    sessions: Arc<crate::sessions::Sessions>,
    metrics: crate::metrics::Metrics,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Arc<Leases> {
    let (cache, changes) = store.watch(argocd_agent_kubernetes::Scope::namespace("argocd"));
    let backend = LeaseBackend {
        api: Arc::new(store.clone()),
        replica_api: Arc::new(store.clone()),
        cache: Arc::new(cache),
        changes,
    };
    Leases::start(
        backend,
        "argocd",
        HaConfig::new(name),
        sessions,
        metrics,
        tasks,
        shutdown.clone(),
    )
}

/// A [`memory_replica`] with sessions and metrics of its own.
fn memory_replica_alone(
    store: &MemoryStore,
    name: &str,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: &tokio_util::sync::CancellationToken,
) -> Arc<Leases> {
    let sessions = Arc::new(crate::sessions::Sessions::new(
        Default::default(),
        Default::default(),
    ));
    memory_replica(
        store,
        name,
        sessions,
        crate::metrics::Metrics::new(),
        tasks,
        shutdown,
    )
}

/// Once both replicas are ready, `agent-1`'s Lease taken by `a` for session 1, as `b`
/// sees it.
async fn held_by_the_first(
    a: &Arc<Leases>,
    b: &Leases,
) -> (AgentName, argocd_agent_domain::Namespace, super::LeaseGuard) {
    eventually("both replicas renewed their Lease", || {
        a.ready().is_ok() && b.ready().is_ok()
    })
    .await;
    let agent = AgentName::new("agent-1").unwrap();
    let namespace = argocd_agent_domain::Namespace::new("agent-1").unwrap();
    let guard = a.acquire(&agent, &namespace, 1).await.expect("acquire");
    eventually("the other replica sees the holder", || {
        b.holder_of(&agent).as_deref() == Some(a.holder())
    })
    .await;
    (agent, namespace, guard)
}

/// Two replicas on one in-memory Lease store (no API server): an agent's Lease taken on one
/// is seen held there by the other, and is free again once its guard is released.
#[tokio::test]
async fn an_agent_lease_taken_on_one_replica_is_seen_by_the_other_until_released() {
    use argocd_agent_kubernetes::memory::MemoryStore;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    let store = MemoryStore::new(Kind::Lease);
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let replica = |name: &str| memory_replica_alone(&store, name, &tasks, &shutdown);
    let (a, b) = (replica("principal-0"), replica("principal-1"));
    let (agent, _, guard) = held_by_the_first(&a, &b).await;
    eventually(
        "the other replica maps the hub namespace to the agent",
        || b.agent_for_namespace("agent-1") == Some(agent.clone()),
    )
    .await;
    guard.release().await;
    eventually("the Lease is free", || b.holder_of(&agent).is_none()).await;
    shutdown.cancel();
}

/// On SIGTERM a replica clears its replica Lease and writes no release of its agents'
/// Leases: the other replicas take each over as from a replica that is gone, at once.
#[tokio::test]
async fn a_replica_shutting_down_leaves_its_agents_leases_to_the_others() {
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    let store = MemoryStore::new(Kind::Lease);
    let tasks = TaskTracker::new();
    let replica = |name: &str, shutdown: &CancellationToken| {
        memory_replica_alone(&store, name, &tasks, shutdown)
    };
    let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
    let (a, b) = (
        replica("principal-0", &stop_a),
        replica("principal-1", &stop_b),
    );
    let (agent, namespace, guard) = held_by_the_first(&a, &b).await;
    let held_by_a = a.holder().to_string();
    stop_a.cancel();
    eventually("the replica Lease cleared", || {
        *a.retired.borrow() == Some(true) && !b.alive(&held_by_a)
    })
    .await;
    // The session ends: no release is written, the Lease still names the retired holder.
    guard.release().await;
    let stored = || async {
        use argocd_agent_kubernetes::ObjectStore;
        let lease = store
            .get(Some("argocd"), &agent_lease_name(&agent))
            .await
            .unwrap()
            .expect("the agent Lease");
        LeaseView::of(&lease).holder
    };
    assert_eq!(stored().await.as_deref(), Some(held_by_a.as_str()));
    // The other replica takes it over without waiting for the Lease to expire.
    let started = Instant::now();
    let taken = tokio::time::timeout(Duration::from_secs(2), b.acquire(&agent, &namespace, 2))
        .await
        .expect("taken over at once")
        .expect("acquire");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(stored().await.as_deref(), Some(b.holder()));
    drop(taken);
    stop_b.cancel();
}

/// A replica keeps nothing queued for an agent another replica serves: what was queued
/// while the agent was away is dropped once the other replica holds its Lease, nothing
/// more is queued for it, and its next session here queues again.
#[tokio::test]
async fn a_replica_drops_the_queue_of_an_agent_another_replica_serves() {
    use argocd_agent_domain::event::{Event, EventType, Payload, ResourceKind, ResourceRef};
    use argocd_agent_domain::{AgentIdentity, AgentMode, AllowedModes, ClientIdentity, Namespace};
    use argocd_agent_kubernetes::memory::MemoryStore;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    let store = MemoryStore::new(Kind::Lease);
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let metrics = crate::metrics::Metrics::new();
    let replica = |name: &str, sessions: Arc<crate::sessions::Sessions>| {
        memory_replica(&store, name, sessions, metrics.clone(), &tasks, &shutdown)
    };
    let sessions_a = Arc::new(crate::sessions::Sessions::new(
        Default::default(),
        Default::default(),
    ));
    let sessions_b = Arc::new(crate::sessions::Sessions::new(
        Default::default(),
        Default::default(),
    ));
    let (a, b) = (
        replica("principal-0", sessions_a.clone()),
        replica("principal-1", sessions_b),
    );
    eventually("both replicas renewed their Lease", || {
        a.ready().is_ok() && b.ready().is_ok()
    })
    .await;
    let agent = AgentName::new("agent-1").unwrap();
    let namespace = Namespace::new("agent-1").unwrap();
    let identity = AgentIdentity {
        client: ClientIdentity::AgentName(agent.clone()),
        agent: agent.clone(),
        namespace: namespace.clone(),
        allowed_modes: AllowedModes::Both,
        rule: "agents".into(),
        tenant: None,
    };
    let event = |name: &str| {
        Event::resource(
            "test",
            EventType::SpecUpdate,
            ResourceRef::new(ResourceKind::Application, namespace.clone(), name),
            Payload::Object(Arc::new(serde_json::json!({}))),
        )
    };
    // A session on replica a ends; a hub change is queued for the agent's return.
    let (state, _) = sessions_a.attach(
        identity.clone(),
        AgentMode::Managed,
        1,
        CancellationToken::new(),
    );
    sessions_a.detach(&state, 1);
    state.enqueue(event("app-1"), &metrics);
    assert_eq!(state.queue.len(), 1);
    // The agent reconnects to replica b, which takes its Lease.
    let guard = b.acquire(&agent, &namespace, 7).await.expect("acquire");
    eventually("replica a drops the queue", || state.queue.is_empty()).await;
    state.enqueue(event("app-2"), &metrics);
    assert!(
        state.queue.is_empty(),
        "nothing is queued while b serves it"
    );
    // The agent comes back to replica a: its session queues again.
    guard.release().await;
    let (again, _) = sessions_a.attach(identity, AgentMode::Managed, 2, CancellationToken::new());
    assert!(Arc::ptr_eq(&again, &state));
    again.enqueue(event("app-3"), &metrics);
    assert_eq!(again.queue.len(), 1);
    shutdown.cancel();
}

/// Agent Lease writes that never answer (a storm queued behind the Lease budget, here
/// stalled for good) do not delay the replica Lease's renewal: the replica stays ready,
/// so its listener keeps accepting the agents that make the storm.
#[tokio::test]
async fn stalled_agent_lease_writes_do_not_make_the_replica_unready() {
    use argocd_agent_domain::Namespace;

    let mut cfg = HaConfig::new("principal-0");
    // Ready while the replica Lease is younger than half of this: 500 ms.
    cfg.replica_lease_duration = Duration::from_secs(1);
    let (leases, _, shutdown) = stalled_replica(cfg).await;
    // An agent's first session: its Lease create never answers.
    let stuck = {
        let leases = leases.clone();
        tokio::spawn(async move {
            let agent = AgentName::new("agent-1").unwrap();
            let ns = Namespace::new("agent-1").unwrap();
            leases.acquire(&agent, &ns, 1).await.map(|_| ())
        })
    };
    // Four Lease durations later the replica is still ready, renewed all along.
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(leases.ready().is_ok(), "{:?}", leases.ready());
    }
    assert!(
        !stuck.is_finished(),
        "the agent's Lease write is still waiting"
    );
    stuck.abort();
    shutdown.cancel();
}

/// A holder whose replica Lease is no longer renewed (a `kill -9`) is not asked for a
/// handover: the session writes nothing while it waits, and takes the Lease once the holder
/// is judged gone. A holder that renews is asked.
#[tokio::test(start_paused = true)]
async fn a_holder_that_stopped_renewing_is_not_asked_for_a_handover() {
    use argocd_agent_domain::Namespace;
    use argocd_agent_kubernetes::ObjectStore;
    use argocd_agent_kubernetes::memory::MemoryStore;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    let store = MemoryStore::new(Kind::Lease);
    let (tasks, shutdown) = (TaskTracker::new(), CancellationToken::new());
    let leases = memory_replica_alone(&store, "principal-1", &tasks, &shutdown);
    eventually("the replica renewed its Lease", || leases.ready().is_ok()).await;
    // Replica principal-9 (another incarnation holds each agent's Lease): its replica
    // Lease, written now.
    let other = "principal-9_a1b2c3d4";
    let replica_lease = |renewed: bool| {
        let mut obj = DynamicObject::new(
            &replica_lease_name("principal-9"),
            &Kind::Lease.api_resource(),
        )
        .within("argocd");
        obj.metadata.labels = Some([(LEASE_LABEL.to_string(), "replica".to_string())].into());
        set_spec(&mut obj, |s| {
            s.holder_identity = Some(other.to_string());
            s.renew_time = Some(now_micro());
            s.lease_duration_seconds = Some(10);
            s.lease_transitions = Some(i32::from(renewed));
        });
        obj
    };
    let put = {
        let store = store.clone();
        move |obj: DynamicObject| {
            let store = store.clone();
            async move {
                match store
                    .get(Some("argocd"), obj.metadata.name.as_deref().unwrap())
                    .await
                    .unwrap()
                {
                    Some(cur) => {
                        let mut obj = obj;
                        obj.metadata.resource_version = cur.metadata.resource_version;
                        store.replace(&obj).await.unwrap();
                    }
                    None => {
                        store.create(&obj).await.unwrap();
                    }
                }
            }
        }
    };
    put(replica_lease(false)).await;
    let held_by_other = |agent: &AgentName| {
        let mut obj = leases.new_agent_lease(agent, &Namespace::new(agent.as_str()).unwrap());
        set_spec(&mut obj, |s| s.holder_identity = Some(other.to_string()));
        obj
    };
    let asked = |agent: &AgentName| {
        let store = store.clone();
        let name = agent_lease_name(agent);
        async move {
            store
                .get(Some("argocd"), &name)
                .await
                .unwrap()
                .and_then(|o| o.metadata.annotations)
                .is_some_and(|a| a.contains_key(TAKEOVER_ANNOTATION))
        }
    };

    // A session of `agent` taking its Lease here, in the background.
    let acquiring = |agent: &AgentName, session: u64| {
        let (leases, agent) = (leases.clone(), agent.clone());
        tokio::spawn(async move {
            let namespace = Namespace::new(agent.as_str()).unwrap();
            leases.acquire(&agent, &namespace, session).await
        })
    };
    // principal-9 renews every 2 s: a session here asks it for its agent.
    let live = AgentName::new("agent-live").unwrap();
    put(held_by_other(&live)).await;
    eventually("the replica sees the other's Leases", || {
        leases.holder_of(&live).as_deref() == Some(other)
    })
    .await;
    let renewing = {
        let put = put.clone();
        let lease = replica_lease(true);
        tokio::spawn(async move {
            loop {
                put(lease.clone()).await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };
    let waiting = acquiring(&live, 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        asked(&live).await,
        "a live holder is asked to hand its agent over"
    );
    waiting.abort();
    renewing.abort();

    // principal-9 stops renewing (killed): a session that starts 4 s later asks nothing,
    // and takes the Lease once the replica Lease's 10 s are over.
    let dead = AgentName::new("agent-dead").unwrap();
    put(held_by_other(&dead)).await;
    eventually("the replica sees the Lease", || {
        leases.holder_of(&dead).as_deref() == Some(other)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let started = Instant::now();
    let taking = acquiring(&dead, 2);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !asked(&dead).await,
        "a silent holder was asked to hand its agent over"
    );
    let guard = taking
        .await
        .unwrap()
        .expect("taken once the holder is judged gone");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(leases.holder_of(&dead).as_deref(), Some(leases.holder()));
    drop(guard);
    shutdown.cancel();
}

/// In a storm, sessions waiting for the Lease budget hold no request: at most
/// [`LEASE_REQUESTS_IN_FLIGHT`] agent Lease calls are begun at once, the rest wait for a
/// slot before building theirs (the client would otherwise queue every session's request,
/// ~5 KB each with its futures, for as long as the budget takes to write them all).
#[tokio::test]
async fn sessions_waiting_for_the_lease_budget_hold_no_request() {
    use argocd_agent_domain::Namespace;

    let (leases, creates, shutdown) = stalled_replica(HaConfig::new("principal-0")).await;
    // Three times as many first sessions as calls may be in flight; no create answers.
    let waiting: Vec<_> = (0..3 * LEASE_REQUESTS_IN_FLIGHT)
        .map(|i| {
            let leases = leases.clone();
            tokio::spawn(async move {
                let agent = AgentName::new(&format!("agent-{i}")).unwrap();
                let ns = Namespace::new(&format!("agent-{i}")).unwrap();
                leases.acquire(&agent, &ns, i as u64).await.map(|_| ())
            })
        })
        .collect();
    eventually("the first sessions began their creates", || {
        creates.load(Ordering::SeqCst) == LEASE_REQUESTS_IN_FLIGHT
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        creates.load(Ordering::SeqCst),
        LEASE_REQUESTS_IN_FLIGHT,
        "sessions beyond the bound began a request while the ones before are unanswered"
    );
    for w in &waiting {
        assert!(!w.is_finished());
    }
    for w in waiting {
        w.abort();
    }
    shutdown.cancel();
}
