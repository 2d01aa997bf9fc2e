use super::*;
use crate::mapping::{AdminScope, DenyReason, RuleSet};

const TWO_TEAMS: &str = r#"
rules:
  - name: spire
    template: "spiffe://example.org/ns/{ns}/sa/{sa}"
    agent: "{sa}"
    namespace: "{ns}-{sa}"
    mode: both
  - name: ops
    template: "spiffe://example.org/ops/{who}"
    role: admin
tenants:
  - name: team-a
    agents: ["spiffe://example.org/ns/team-a/sa/{sa}"]
    namespaces: ["team-a-*"]
    admins: ["spiffe://example.org/ops/alice"]
    projects: ["team-a-*"]
    repositories: ["team-a-*"]
    repoCreds: ["creds-a-*"]
    gpgKeys: ["AAAA*"]
    quotas:
      agents: 2
      applicationsPerAgent: 10
      eventsPerSecond: 5
  - name: team-b
    agents: ["spiffe://example.org/ns/team-b/sa/{sa}"]
    namespaces: ["team-b-*"]
    projects: ["team-b-*"]
"#;

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

fn load(yaml: &str) -> Result<RuleSet, String> {
    RuleSet::from_yaml(yaml).map_err(|e| e.to_string())
}

#[test]
fn agents_get_their_tenant_from_their_identity() {
    let rules = load(TWO_TEAMS).unwrap();
    let a = rules
        .map(&id("spiffe://example.org/ns/team-a/sa/edge-1"))
        .unwrap();
    assert_eq!(a.tenant.as_ref().map(TenantName::as_str), Some("team-a"));
    assert_eq!(a.namespace.as_str(), "team-a-edge-1");
    let b = rules
        .map(&id("spiffe://example.org/ns/team-b/sa/edge-2"))
        .unwrap();
    assert_eq!(b.tenant.as_ref().map(TenantName::as_str), Some("team-b"));
    let other = rules
        .map(&id("spiffe://example.org/ns/platform/sa/edge-3"))
        .unwrap();
    assert_eq!(other.tenant, None);
    assert_eq!(
        rules
            .tenants()
            .get(&TenantName::new("team-a").unwrap())
            .unwrap()
            .quotas
            .agents,
        Some(2)
    );
}

#[test]
fn nobody_enters_a_tenants_namespace_and_no_tenant_leaves_its_own() {
    // A rule that maps team-a's agent outside team-a's namespaces is refused...
    let yaml = TWO_TEAMS.replace("namespace: \"{ns}-{sa}\"", "namespace: \"shared-{sa}\"");
    let rules = load(&yaml).unwrap();
    let denied = rules
        .map(&id("spiffe://example.org/ns/team-a/sa/edge-1"))
        .unwrap_err();
    assert_eq!(denied.reason.code(), "TenantNamespace");
    assert!(
        denied
            .to_string()
            .contains("tenant \"team-a\" does not list hub namespace \"shared-edge-1\""),
        "{denied}"
    );
    // ...and an identity of no tenant that the rules map into team-b's namespaces too.
    let rules = load(TWO_TEAMS).unwrap();
    let sneaky = rules
        .map(&id("spiffe://example.org/ns/team-b-x/sa/y"))
        .unwrap_err();
    assert_eq!(sneaky.reason.code(), "NamespaceOfTenant");
    assert!(
        sneaky.to_string().contains("belongs to tenant \"team-b\""),
        "{sneaky}"
    );
    // `identity explain` shows the refusal against the rule that matched.
    let explained = rules
        .explain(&id("spiffe://example.org/ns/team-b-x/sa/y"))
        .to_string();
    assert!(
        explained.contains("belongs to tenant \"team-b\""),
        "{explained}"
    );
    // A header-captured agent name has no SPIFFE ID: never in a tenant's namespace.
    let header = crate::ClientIdentity::AgentName(crate::AgentName::new("team-a-x").unwrap());
    assert_eq!(
        rules.map_client(&header).unwrap_err().reason.code(),
        "NamespaceOfTenant"
    );
}

#[test]
fn tenant_operators_are_scoped_and_never_agents() {
    let rules = load(TWO_TEAMS).unwrap();
    let alice = id("spiffe://example.org/ops/alice");
    // The platform's admin rule also matches alice: the narrower grant wins.
    let grant = rules.authorize_admin(&alice.clone().into()).unwrap();
    assert_eq!(
        grant.scope,
        AdminScope::Tenant(TenantName::new("team-a").unwrap())
    );
    assert!(
        grant
            .scope
            .covers(Some(&TenantName::new("team-a").unwrap()))
    );
    assert!(
        !grant
            .scope
            .covers(Some(&TenantName::new("team-b").unwrap()))
    );
    assert!(!grant.scope.covers(None));
    let bob = rules
        .authorize_admin(&id("spiffe://example.org/ops/bob").into())
        .unwrap();
    assert_eq!(bob.scope, AdminScope::Platform);
    assert!(bob.scope.covers(None));
    // An operator identity the agent rules would map is still never an agent.
    let yaml = TWO_TEAMS.replace(
        "admins: [\"spiffe://example.org/ops/alice\"]",
        "admins: [\"spiffe://example.org/ns/ops-a/sa/{sa}\"]",
    );
    let rules = load(&yaml).unwrap();
    let denied = rules
        .map(&id("spiffe://example.org/ns/ops-a/sa/carol"))
        .unwrap_err();
    assert_eq!(denied.reason.code(), "TenantAdmin");
}

#[test]
fn objects_belong_to_their_tenant_or_to_the_platform() {
    let rules = load(TWO_TEAMS).unwrap();
    let t = rules.tenants();
    let a = TenantName::new("team-a").unwrap();
    let b = TenantName::new("team-b").unwrap();
    assert_eq!(t.owner(Claim::Project, "team-a-web"), Some(&a));
    assert_eq!(t.owner(Claim::Project, "team-b-web"), Some(&b));
    assert_eq!(t.owner(Claim::Project, "default"), None);
    assert!(t.visible_to(Claim::Project, "team-a-web", Some(&a)));
    assert!(!t.visible_to(Claim::Project, "team-a-web", Some(&b)));
    assert!(!t.visible_to(Claim::Project, "team-a-web", None));
    assert!(t.visible_to(Claim::Project, "default", Some(&b)));
    assert!(t.visible_to(Claim::Repository, "team-a-git", Some(&a)));
    assert!(!t.visible_to(Claim::Repository, "team-a-git", Some(&b)));
    assert!(!t.visible_to(Claim::RepoCreds, "creds-a-1", Some(&b)));
    assert!(!t.visible_to(Claim::GpgKey, "AAAA0001", Some(&b)));
    assert!(t.visible_to(Claim::GpgKey, "BBBB0001", Some(&b)));
}

#[test]
fn no_tenants_changes_nothing() {
    let yaml = TWO_TEAMS.split("tenants:").next().unwrap();
    let rules = load(yaml).unwrap();
    assert!(rules.tenants().is_empty());
    let m = rules
        .map(&id("spiffe://example.org/ns/team-b-x/sa/y"))
        .unwrap();
    assert_eq!(
        (m.namespace.as_str(), m.tenant.clone()),
        ("team-b-x-y", None)
    );
    assert_eq!(
        rules
            .authorize_admin(&id("spiffe://example.org/ops/alice").into())
            .unwrap()
            .scope,
        AdminScope::Platform
    );
    assert!(rules.tenants().visible_to(Claim::Project, "team-a-x", None));
}

#[test]
fn overlaps_are_refused_at_load_naming_tenant_and_field() {
    let cases = [
        // team-b's agents could be team-a's.
        (
            "spiffe://example.org/ns/team-b/sa/{sa}",
            "spiffe://example.org/ns/{ns}/sa/edge-1",
            "tenant \"team-b\" field agents[1]",
        ),
        // team-b's agent pattern matches team-a's operator.
        (
            "spiffe://example.org/ns/team-b/sa/{sa}",
            "spiffe://example.org/ops/{who}",
            "tenant \"team-b\" field agents[1]",
        ),
    ];
    for (from, to, want) in cases {
        let yaml = TWO_TEAMS.replace(
            &format!("agents: [\"{from}\"]"),
            &format!("agents: [\"{to}\"]"),
        );
        let err = load(&yaml).unwrap_err();
        assert!(err.contains(want) && err.contains("team-a"), "{err}");
    }
    for (field, theirs) in [("namespaces", "team-*"), ("projects", "*-web")] {
        let yaml = TWO_TEAMS.replace(
            &format!("{field}: [\"team-b-*\"]"),
            &format!("{field}: [\"{theirs}\"]"),
        );
        let err = load(&yaml).unwrap_err();
        assert!(
            err.contains(&format!("tenant \"team-b\" field {field}[1]")),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "tenant \"team-a\" claims with {field}[1] team-a-*"
            )),
            "{err}"
        );
    }
    // One tenant's agents and admins may not meet either.
    let yaml = TWO_TEAMS.replace(
        "admins: [\"spiffe://example.org/ops/alice\"]",
        "admins: [\"spiffe://example.org/ns/team-a/sa/ops\"]",
    );
    let err = load(&yaml).unwrap_err();
    assert!(
        err.contains("tenant \"team-a\" field admins[1]") && err.contains("never both"),
        "{err}"
    );
}

#[test]
fn mistakes_name_the_tenant_and_the_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "name: team-b\n",
            "name: Team_B\n",
            "tenant \"Team_B\" field name",
        ),
        (
            "name: team-b\n",
            "name: team-a\n",
            "already used by tenant team-a",
        ),
        (
            "    namespaces: [\"team-b-*\"]\n",
            "",
            "tenant \"team-b\" field namespaces: list at least one",
        ),
        (
            "    projects: [\"team-b-*\"]\n",
            "    projects: [\"{x,y}\"]\n",
            "field projects[1]",
        ),
        (
            "      agents: 2\n",
            "      agents: 0\n",
            "tenant \"team-a\" field quotas.agents: 0 would refuse everything",
        ),
        (
            "      eventsPerSecond: 5\n",
            "      eventsPerSecond: -1\n",
            "field quotas.eventsPerSecond",
        ),
        ("      agents: 2\n", "      agent: 2\n", "unknown field"),
        (
            "agents: [\"spiffe://example.org/ns/team-b/sa/{sa}\"]",
            "agents: [\"example.org/x\"]",
            "field agents[1]: \"example.org/x\" must start with",
        ),
    ];
    for (from, to, want) in cases {
        assert!(TWO_TEAMS.contains(from), "{from}");
        let err = load(&TWO_TEAMS.replacen(from, to, 1)).unwrap_err();
        assert!(err.contains(want), "{to:?}: {err}");
    }
}

#[test]
fn a_tenant_change_revokes_the_session() {
    let rules = load(TWO_TEAMS).unwrap();
    let session = rules
        .map(&id("spiffe://example.org/ns/team-a/sa/edge-1"))
        .unwrap();
    assert!(rules.recheck(&session).is_ok());
    // team-a stops listing the agent, and no other tenant claims it or its namespace.
    let moved = TWO_TEAMS
        .replace(
            "agents: [\"spiffe://example.org/ns/team-a/sa/{sa}\"]",
            "agents: [\"spiffe://example.org/ns/team-a/sa/other\"]",
        )
        .replace(
            "namespaces: [\"team-a-*\"]",
            "namespaces: [\"team-a-other\"]",
        );
    let denied = load(&moved).unwrap().recheck(&session).unwrap_err();
    assert!(
        matches!(denied.reason, DenyReason::TenantChanged { .. }),
        "{denied}"
    );
    assert!(
        denied.to_string().contains("now belongs to no tenant"),
        "{denied}"
    );
}
