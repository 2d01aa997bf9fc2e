use std::time::Duration;

use super::*;
use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_identity::SpiffeId;

const RULES: &str = r#"
rules:
  - name: agents
    template: "spiffe://example.org/ns/{ns}/sa/{sa}"
    agent: "{sa}"
    namespace: "{sa}"
tenants:
  - name: team-a
    agents: ["spiffe://example.org/ns/team-a/sa/{sa}"]
    namespaces: ["a-*"]
    quotas:
      agents: 2
      eventsPerSecond: 1
      eventsBurst: 3
      proxyRequestsInFlight: 2
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{sa}"]
    namespaces: ["b-*"]
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
    rules: Arc<LiveRules>,
    tenancy: Arc<Tenancy>,
    metrics: Metrics,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    let rules =
        Arc::new(LiveRules::start(Some(path.clone()), vec![], Duration::from_millis(10)).unwrap());
    let metrics = Metrics::new();
    let tenancy = Tenancy::new(rules.clone(), metrics.clone());
    Fixture {
        _dir: dir,
        path,
        rules,
        tenancy,
        metrics,
    }
}

fn identity(f: &Fixture, team: &str, sa: &str) -> AgentIdentity {
    let id = SpiffeId::parse(&format!("spiffe://example.org/ns/{team}/sa/{sa}")).unwrap();
    f.rules.current().map(&id).unwrap()
}

fn tenant(name: &str) -> TenantName {
    TenantName::new(name).unwrap()
}

#[tokio::test]
async fn the_agents_quota_refuses_the_third_agent_and_frees_a_slot_on_disconnect() {
    let f = fixture();
    let a1 = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-1"))
        .unwrap();
    let _a2 = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-2"))
        .unwrap();
    // A reconnect of a connected agent overlaps its old session: never refused.
    let _a2_again = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-2"))
        .unwrap();
    let err = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-3"))
        .err()
        .expect("the third agent is over quotas.agents: 2");
    assert_eq!(err.quota(), "agents");
    assert!(err.to_string().contains("quotas.agents: 2"), "{err}");
    // Another tenant (no quota) and agents of no tenant are not affected.
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(
            f.tenancy
                .admit_agent(&identity(&f, "team-b", &format!("b-{i}")))
                .unwrap(),
        );
    }
    let _none = f
        .tenancy
        .admit_agent(&identity(&f, "platform", "edge-1"))
        .unwrap();
    drop(a1);
    let _a3 = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-3"))
        .unwrap();
    let text = argocd_agent_runtime::exposition::openmetrics_to_text(&f.metrics.encode()).unwrap();
    assert!(
        text.contains(
            "argocd_principal_tenant_quota_refused_total{tenant=\"team-a\",quota=\"agents\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains("argocd_principal_tenant_agents_connected{tenant=\"team-a\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("argocd_principal_tenant_agents_connected{tenant=\"team-b\"} 5"),
        "{text}"
    );
}

struct Elsewhere(Vec<(AgentName, String)>);

impl Census for Elsewhere {
    fn elsewhere(&self) -> Vec<(AgentName, String)> {
        self.0.clone()
    }
}

#[tokio::test]
async fn agents_on_other_replicas_count_by_their_namespace() {
    let f = fixture();
    f.tenancy.set_census(Arc::new(Elsewhere(vec![
        (AgentName::new("a-9").unwrap(), "a-9".into()),
        (AgentName::new("b-9").unwrap(), "b-9".into()),
    ])));
    let _a1 = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-1"))
        .unwrap();
    assert!(
        f.tenancy
            .admit_agent(&identity(&f, "team-a", "a-2"))
            .is_err()
    );
    // The agent served elsewhere moving here is not counted twice.
    let _a9 = f
        .tenancy
        .admit_agent(&identity(&f, "team-a", "a-9"))
        .unwrap();
    assert_eq!(f.tenancy.usage(&tenant("team-a")).agents_connected, 2);
}

#[tokio::test]
async fn the_event_bucket_is_shared_by_the_tenant_and_separate_from_others() {
    let f = fixture();
    let a = tenant("team-a");
    for _ in 0..3 {
        assert_eq!(f.tenancy.check_events(&a).0, Verdict::Allowed);
    }
    let (verdict, limit) = f.tenancy.check_events(&a);
    assert!(matches!(verdict, Verdict::Refused { .. }));
    assert_eq!(
        limit,
        Some(EventRate {
            rate: 1.0,
            burst: 3
        })
    );
    // team-b has no eventsPerSecond.
    let b = tenant("team-b");
    for _ in 0..1000 {
        assert_eq!(f.tenancy.check_events(&b).0, Verdict::Allowed);
    }
    assert_eq!(f.tenancy.usage(&a).refused.get("eventsPerSecond"), Some(&1));
}

#[tokio::test]
async fn proxy_requests_in_flight_are_bounded_per_tenant_and_given_back() {
    let f = fixture();
    let a = tenant("team-a");
    let p1 = f.tenancy.proxy_permit(Some(&a)).unwrap();
    let _p2 = f.tenancy.proxy_permit(Some(&a)).unwrap();
    let err = f.tenancy.proxy_permit(Some(&a)).err().unwrap();
    assert_eq!(err.quota(), "proxyRequestsInFlight");
    assert!(f.tenancy.proxy_permit(Some(&tenant("team-b"))).is_ok());
    assert!(f.tenancy.proxy_permit(None).unwrap().is_none());
    drop(p1);
    assert!(f.tenancy.proxy_permit(Some(&a)).is_ok());
}

#[tokio::test]
async fn quotas_follow_a_live_reload() {
    let f = fixture();
    let a = tenant("team-a");
    let _p1 = f.tenancy.proxy_permit(Some(&a)).unwrap();
    let _p2 = f.tenancy.proxy_permit(Some(&a)).unwrap();
    assert!(f.tenancy.proxy_permit(Some(&a)).is_err());
    std::fs::write(
        &f.path,
        RULES.replace("proxyRequestsInFlight: 2", "proxyRequestsInFlight: 3"),
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while f
        .tenancy
        .quotas(&a)
        .and_then(|q| q.proxy_requests_in_flight)
        != Some(3)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the reload was not seen"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(f.tenancy.proxy_permit(Some(&a)).is_ok());
}

#[test]
fn without_tenants_nothing_is_counted() {
    let t = Tenancy::disabled();
    let a = tenant("team-a");
    let held: Vec<_> = (0..100)
        .map(|_| t.proxy_permit(Some(&a)).unwrap())
        .collect();
    assert_eq!(held.len(), 100);
    assert!((0..1000).all(|_| t.check_events(&a).0 == Verdict::Allowed));
}
