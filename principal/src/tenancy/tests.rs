use super::*;
use argocd_agent_domain::tenant::Tenants;
use serde_json::json;

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
    projects: ["a-*"]
    repositories: ["repo-a-*"]
    repoCreds: ["creds-a-*"]
    gpgKeys: ["AAAA*"]
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{sa}"]
    namespaces: ["team-b-*"]
    projects: ["b-*"]
"#;

fn rules() -> RuleSet {
    RuleSet::from_yaml(RULES).unwrap()
}

fn audience<'a>(
    agent: &'a AgentName,
    ns: &'a Namespace,
    tenant: Option<&'a TenantName>,
    tenants: &'a Tenants,
) -> Audience<'a> {
    Audience {
        agent,
        namespace: ns,
        tenant,
        tenants,
    }
}

#[test]
fn a_tenants_objects_reach_its_agents_only_and_the_platforms_reach_all() {
    let r = rules();
    let (agent, ns) = (AgentName::new("x").unwrap(), Namespace::new("x").unwrap());
    let a = TenantName::new("team-a").unwrap();
    let b = TenantName::new("team-b").unwrap();
    let of_a = audience(&agent, &ns, Some(&a), r.tenants());
    let of_b = audience(&agent, &ns, Some(&b), r.tenants());
    let of_none = audience(&agent, &ns, None, r.tenants());
    assert!(of_a.may_see(Claim::Project, "a-apps"));
    assert!(!of_b.may_see(Claim::Project, "a-apps"));
    assert!(!of_none.may_see(Claim::Project, "a-apps"));
    for who in [&of_a, &of_b, &of_none] {
        assert!(
            who.may_see(Claim::Project, "shared"),
            "platform objects reach all"
        );
    }
    assert!(of_a.may_see(Claim::RepoCreds, "creds-a-1"));
    assert!(!of_b.may_see(Claim::RepoCreds, "creds-a-1"));
    // Claims are per kind: a repository named like a repo-creds claim is the platform's.
    assert!(of_b.may_see(Claim::Repository, "creds-a-1"));
    assert!(!of_b.may_see(Claim::Repository, "repo-a-1"));
}

#[test]
fn repository_secrets_are_judged_by_their_type() {
    let creds = json!({"metadata": {"labels": {"argocd.argoproj.io/secret-type": "repo-creds"}}});
    let repo = json!({"metadata": {"labels": {"argocd.argoproj.io/secret-type": "repository"}}});
    assert_eq!(repository_claim(&creds), Claim::RepoCreds);
    assert_eq!(repository_claim(&repo), Claim::Repository);
    assert_eq!(repository_claim(&json!({})), Claim::Repository);
}

#[test]
fn gpg_keys_of_another_tenant_are_cut_from_the_copy() {
    let r = rules();
    let (agent, ns) = (AgentName::new("x").unwrap(), Namespace::new("x").unwrap());
    let a = TenantName::new("team-a").unwrap();
    let b = TenantName::new("team-b").unwrap();
    let cm = Arc::new(json!({"metadata": {"name": "argocd-gpg-keys-cm"},
        "data": {"AAAA1111": "key-a", "CCCC2222": "key-platform"},
        "binaryData": {"AAAA3333": "a2V5"}}));
    let for_b = gpg_keys_for(&cm, &audience(&agent, &ns, Some(&b), r.tenants()));
    assert_eq!(for_b["data"], json!({"CCCC2222": "key-platform"}));
    assert_eq!(for_b["binaryData"], json!({}));
    let for_a = gpg_keys_for(&cm, &audience(&agent, &ns, Some(&a), r.tenants()));
    assert!(Arc::ptr_eq(&for_a, &cm), "nothing hidden: the shared copy");
    // No tenant declared: every key to everyone, untouched.
    let none = RuleSet::default();
    let all = gpg_keys_for(&cm, &audience(&agent, &ns, None, none.tenants()));
    assert!(Arc::ptr_eq(&all, &cm));
}

#[test]
fn a_view_follows_reloads() {
    let (tx, rx) = watch::channel(Arc::new(RuleSet::default()));
    let view = TenantView::new(rx);
    assert!(view.current().tenants().is_empty());
    tx.send(Arc::new(rules())).unwrap();
    assert_eq!(view.current().tenants().iter().count(), 2);
    assert!(TenantView::none().current().tenants().is_empty());
}
