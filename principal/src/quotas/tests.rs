use super::*;
use argocd_agent_domain::mapping::RuleSet;

const RULES: &str = r#"
rules:
  - name: spire
    template: "spiffe://example.org/ns/{ns}/sa/{sa}"
    agent: "{sa}"
    namespace: "{ns}-{sa}"
tenants:
  - name: team-a
    agents: ["spiffe://example.org/ns/team-a/sa/{sa}"]
    namespaces: ["team-a-*"]
    quotas:
      applications: 3
      applicationsPerAgent: 2
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{sa}"]
    namespaces: ["team-b-*"]
"#;

fn app(ns: &str, name: &str, created: &str) -> Arc<DynamicObject> {
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created}
        }))
        .unwrap(),
    )
}

fn tn(s: &str) -> TenantName {
    TenantName::new(s).unwrap()
}

fn ns(s: &str) -> Namespace {
    Namespace::new(s).unwrap()
}

#[test]
fn the_oldest_applications_are_within_and_ties_go_by_namespace_then_name() {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    let t = rules.tenants();
    let a = [
        app("team-a-one", "first", "2026-01-01T00:00:00Z"),
        // Same second as `a-second`: the name decides.
        app("team-a-one", "b-third", "2026-01-01T00:00:01Z"),
        app("team-a-one", "a-second", "2026-01-01T00:00:01Z"),
    ];
    let ns1 = ns("team-a-one");
    let verdict = |o: &DynamicObject| held_back(&a[..], t, Some(&tn("team-a")), &ns1, o);
    assert_eq!(verdict(&a[0]), None);
    assert_eq!(verdict(&a[2]), None, "a-second sorts before b-third");
    let over = verdict(&a[1]).expect("third in a namespace with applicationsPerAgent 2");
    assert_eq!(
        (over.kind, over.limit, over.count),
        (QuotaKind::PerAgent, 2, 3)
    );
    let message = over.condition_message(&AgentName::new("one").unwrap());
    assert!(
        message.contains("tenant \"team-a\" quotas.applicationsPerAgent is 2"),
        "{message}"
    );
    // The same evaluation in any order of the list (replicas agree).
    let mut reversed = a.to_vec();
    reversed.reverse();
    assert_eq!(
        held_back(&reversed[..], t, Some(&tn("team-a")), &ns1, &a[1]).map(|e| e.kind),
        Some(QuotaKind::PerAgent)
    );
}

#[test]
fn the_tenant_quota_counts_every_namespace_of_the_tenant_and_nothing_else() {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    let t = rules.tenants();
    let a = [
        app("team-a-one", "x", "2026-01-01T00:00:00Z"),
        app("team-a-two", "y", "2026-01-01T00:00:01Z"),
        // Another tenant's and the platform's Applications do not count.
        app("team-b-one", "z", "2026-01-01T00:00:00Z"),
        app("platform", "p", "2026-01-01T00:00:00Z"),
        app("team-a-three", "w", "2026-01-01T00:00:02Z"),
        app("team-a-three", "v", "2026-01-01T00:00:03Z"),
    ];
    let a_t = Some(tn("team-a"));
    let three = ns("team-a-three");
    let over = held_back(&a[..], t, a_t.as_ref(), &three, &a[5]).unwrap();
    assert_eq!(
        (over.kind, over.limit, over.count),
        (QuotaKind::Tenant, 3, 4)
    );
    assert_eq!(held_back(&a[..], t, a_t.as_ref(), &three, &a[4]), None);
    // Being deleted: not counted, so the newest is within again.
    let mut gone = (*a[0]).clone();
    gone.metadata.deletion_timestamp = a[0].metadata.creation_timestamp.clone();
    let mut b = a.to_vec();
    b[0] = Arc::new(gone);
    assert_eq!(held_back(&b[..], t, a_t.as_ref(), &three, &a[5]), None);
    // Tenant B has no quota; agents of no tenant neither.
    let team_b = tn("team-b");
    assert_eq!(
        held_back(&a[..], t, Some(&team_b), &ns("team-b-one"), &a[2]),
        None
    );
    assert_eq!(held_back(&a[..], t, None, &three, &a[5]), None);
}

#[test]
fn a_new_agent_application_at_the_quota_is_refused_naming_tenant_and_quota() {
    let rules = RuleSet::from_yaml(RULES).unwrap();
    let t = rules.tenants();
    let agent = AgentName::new("one").unwrap();
    let one = ns("team-a-one");
    let a = [app("team-a-one", "x", "2026-01-01T00:00:00Z")];
    let team_a = Some(tn("team-a"));
    assert!(check_new_application(&a[..], t, team_a.as_ref(), &one, &agent, "n", 0).is_ok());
    // A write the watch has not seen yet counts.
    let (e, r) =
        check_new_application(&a[..], t, team_a.as_ref(), &one, &agent, "n", 1).unwrap_err();
    assert_eq!(
        (e.kind, r.reason, r.metric),
        (
            QuotaKind::PerAgent,
            AGENT_APPLICATION_QUOTA,
            AGENT_APPLICATION_QUOTA
        )
    );
    assert!(r.message.contains("tenant \"team-a\""), "{}", r.message);
    assert!(
        r.message.contains("quotas.applicationsPerAgent (2)"),
        "{}",
        r.message
    );
    let three = [
        app("team-a-two", "x", "2026-01-01T00:00:00Z"),
        app("team-a-three", "y", "2026-01-01T00:00:00Z"),
        app("team-a-four", "z", "2026-01-01T00:00:00Z"),
    ];
    let (e, r) =
        check_new_application(&three[..], t, team_a.as_ref(), &one, &agent, "n", 0).unwrap_err();
    assert_eq!(
        (e.kind, r.reason),
        (QuotaKind::Tenant, TENANT_APPLICATION_QUOTA)
    );
    // Tenant B: no quota, nothing refused.
    let team_b = tn("team-b");
    let b_ns = ns("team-b-one");
    assert!(check_new_application(&three[..], t, Some(&team_b), &b_ns, &agent, "n", 99).is_ok());
}

#[test]
fn the_condition_is_added_once_replaced_and_removed_keeping_others() {
    let other = json!({"type": "SyncError", "message": "boom"});
    let status = json!({"sync": {"status": "Synced"}, "conditions": [other]});
    let with = with_condition(Some(&status), Some("over")).unwrap();
    let conds = with["conditions"].as_array().unwrap();
    assert_eq!(conds.len(), 2);
    assert_eq!(conds[1]["type"], QUOTA_CONDITION);
    assert_eq!(with["sync"]["status"], "Synced");
    // The same message again: nothing to write.
    assert_eq!(with_condition(Some(&with), Some("over")), None);
    let removed = with_condition(Some(&with), None).unwrap();
    assert_eq!(removed["conditions"], json!([other]));
    assert_eq!(with_condition(Some(&removed), None), None);
    let bare = with_condition(None, Some("over")).unwrap();
    assert_eq!(with_condition(Some(&bare), None).unwrap(), json!({}));
}

#[test]
fn held_back_applications_are_tracked_per_agent_and_tenant() {
    let held = HeldBack::default();
    let a = AgentName::new("one").unwrap();
    assert!(held.hold(&a, Some(&tn("team-a")), "x"));
    assert!(!held.hold(&a, Some(&tn("team-a")), "x"));
    assert!(held.is_held(&a, "x"));
    assert_eq!(held.count_of(&tn("team-a")), 1);
    assert_eq!(held.count_of(&tn("team-b")), 0);
    assert!(held.release(&a, "x"));
    assert!(!held.release(&a, "x"));
    assert!(held.is_empty());
}
