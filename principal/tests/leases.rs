//! The Lease protocol of principal replicas against the Kubernetes API test server: a
//! second replica gets an agent only after the first one's session has ended (handover on
//! request), and a replica that cannot renew its own Lease fences itself (not ready, refuses
//! sessions) until it can again.

use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::{AgentName, Namespace};
use argocd_agent_principal::ha::{self, HaConfig, LeaseBackend, Leases};
use argocd_agent_principal::metrics::Metrics;
use argocd_agent_principal::sessions::Sessions;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod common;
use common::setup;

/// The Leases of one replica.
fn replica(client: &kube::Client, name: &str, shutdown: &CancellationToken) -> Arc<Leases> {
    let tasks = TaskTracker::new();
    let sessions = Arc::new(Sessions::new(Default::default(), Default::default()));
    let mut cfg = HaConfig::new(name);
    cfg.replica_lease_duration = Duration::from_secs(1);
    cfg.agent_lease_duration = Duration::from_secs(30);
    cfg.rebalance = false;
    Leases::start(
        LeaseBackend::kube(client.clone(), client.clone(), "argocd", &sessions),
        "argocd",
        cfg,
        sessions,
        Metrics::new(),
        &tasks,
        shutdown.clone(),
    )
}

fn ns(n: &str) -> Namespace {
    Namespace::new(n).unwrap()
}

async fn lease(client: &kube::Client, agent: &str) -> Option<Lease> {
    Api::<Lease>::namespaced(client.clone(), "argocd")
        .get_opt(&format!("{}{agent}", ha::AGENT_LEASE_PREFIX))
        .await
        .unwrap()
}

async fn until<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn ready(leases: &Leases) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while leases.ready().is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "replica never ready"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_replica_gets_the_agent_only_after_the_first_session_ended() {
    let (_server, client) = setup().await;
    let stop = CancellationToken::new();
    let a = replica(&client, "principal-a", &stop);
    let b = replica(&client, "principal-b", &stop);
    ready(&a).await;
    ready(&b).await;
    let agent = AgentName::new("edge-1").unwrap();

    let guard_a = a.acquire(&agent, &ns("edge-1"), 1).await.unwrap();
    let l = lease(&client, "edge-1").await.unwrap();
    assert_eq!(
        l.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some(a.holder())
    );

    // B asks for it while A's session lives: B waits, and the Lease carries its request.
    let b2 = b.clone();
    let ag = agent.clone();
    let pending = tokio::spawn(async move { b2.acquire(&ag, &ns("edge-1"), 7).await });
    let b_holder = b.holder().to_string();
    until("B's takeover request on the Lease", || {
        let client = client.clone();
        let b_holder = b_holder.clone();
        async move {
            lease(&client, "edge-1").await.is_some_and(|l| {
                l.metadata
                    .annotations
                    .unwrap_or_default()
                    .get(ha::TAKEOVER_ANNOTATION)
                    == Some(&b_holder)
            })
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !pending.is_finished(),
        "B must not get the agent while A's session lives"
    );
    assert!(a.handover_pending(&agent, 1), "A knows it must hand over");

    // A's session ends: A writes B as holder, and B's session may start.
    drop(guard_a);
    let guard_b = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("B acquired after A's session ended")
        .unwrap()
        .unwrap();
    let l = lease(&client, "edge-1").await.unwrap();
    let spec = l.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some(b.holder()));
    assert_eq!(spec.lease_transitions, Some(1));
    assert!(
        !l.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(ha::TAKEOVER_ANNOTATION),
        "the request is cleared once handed over"
    );
    // B's session ends: the Lease is released (no holder).
    drop(guard_b);
    until("Lease released", || {
        let client = client.clone();
        async move {
            lease(&client, "edge-1")
                .await
                .is_some_and(|l| l.spec.unwrap().holder_identity.is_none())
        }
    })
    .await;
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_cannot_renew_fences_itself_until_it_can() {
    let (server, client) = setup().await;
    let stop = CancellationToken::new();
    let a = replica(&client, "principal-a", &stop);
    ready(&a).await;
    let agent = AgentName::new("edge-2").unwrap();
    let _guard = a.acquire(&agent, &ns("edge-2"), 1).await.unwrap();

    // The hub API fails every request for a while (longer than the 1 s replica Lease).
    server.fail_next(usize::MAX, 500);
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let not_ready = a.ready().unwrap_err();
    assert!(not_ready.to_string().contains("not renewed"), "{not_ready}");
    let refused = a
        .acquire(&AgentName::new("edge-3").unwrap(), &ns("edge-3"), 2)
        .await
        .err()
        .expect("a fenced replica refuses sessions");
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert!(
        refused.message().contains("cannot renew"),
        "{}",
        refused.message()
    );
    assert!(!a.alive(a.holder()), "fenced");

    // The hub API answers again: renewed, ready, sessions accepted.
    server.fail_next(0, 500);
    ready(&a).await;
    assert!(a.alive(a.holder()));
    a.acquire(&AgentName::new("edge-3").unwrap(), &ns("edge-3"), 3)
        .await
        .expect("accepting again once renewed");
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_census_lists_agents_other_live_replicas_serve_with_their_hub_namespace() {
    use argocd_agent_principal::tenant_limits::Census;
    let (_server, client) = setup().await;
    let stop = CancellationToken::new();
    let a = replica(&client, "principal-a", &stop);
    let b = replica(&client, "principal-b", &stop);
    ready(&a).await;
    ready(&b).await;
    let agent = AgentName::new("edge-1").unwrap();
    let guard = a.acquire(&agent, &ns("team-a-edge-1"), 1).await.unwrap();
    // B counts A's agent (with the namespace that tells its tenant); A does not count its
    // own sessions as elsewhere.
    until("B sees A's agent", || {
        let b = b.clone();
        async move {
            b.elsewhere()
                == vec![(
                    AgentName::new("edge-1").unwrap(),
                    "team-a-edge-1".to_string(),
                )]
        }
    })
    .await;
    assert!(a.elsewhere().is_empty(), "{:?}", a.elsewhere());
    // Released: nobody serves it any more.
    guard.release().await;
    until("the released agent is no longer counted", || {
        let b = b.clone();
        async move { b.elsewhere().is_empty() }
    })
    .await;
    stop.cancel();
}
