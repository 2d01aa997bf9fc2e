//! Mapping rules: YAML and flag syntax, evaluation order, deny reasons, explain output.

use argocd_agent_domain::AgentMode;
use argocd_agent_domain::mapping::{DenyReason, RuleError, RuleSet, StepOutcome};
use argocd_agent_domain::names::AllowedModes;
use argocd_agent_identity::SpiffeId;

fn id(s: &str) -> SpiffeId {
    SpiffeId::parse(s).unwrap()
}

fn flags(f: &[&str]) -> Vec<String> {
    f.iter().map(|s| s.to_string()).collect()
}

const EXAMPLE: &str = r#"
rules:
  - name: spire-k8s
    template: "spiffe://{trust_domain}/ns/{ns}/sa/{sa}"
    agent: "{sa}"
    namespace: "argocd-{sa}"
    trustDomains: ["example.org"]
    mode: both
  - name: legacy
    regex: "^spiffe://example.org/agent/([a-z0-9-]+)$"
  - name: pinned
    exact: "spiffe://example.org/special"
    agent: edge-1
    namespace: edge-1
    mode: autonomous
"#;

#[test]
fn a_rule_without_a_mode_grants_managed_only() {
    for rules in [
        RuleSet::from_yaml("rules:\n  - exact: spiffe://example.org/a\n    agent: a\n").unwrap(),
        RuleSet::from_flags(&flags(&["exact:spiffe://example.org/a=>a"])).unwrap(),
    ] {
        let got = rules.map(&id("spiffe://example.org/a")).unwrap();
        assert_eq!(got.allowed_modes, AllowedModes::Managed);
        assert!(got.check_mode(AgentMode::Managed).is_ok());
        let refused = got.check_mode(AgentMode::Autonomous).unwrap_err();
        assert!(
            refused
                .to_string()
                .contains("may not run in autonomous mode"),
            "{refused}"
        );
    }
    // Upstream's `mtls:uri:<regex>` keeps upstream's behaviour: the agent chooses.
    let upstream = RuleSet::from_flags(&flags(&["mtls:uri:spiffe://example.org/agent/([a-z]+)"]))
        .unwrap()
        .map(&id("spiffe://example.org/agent/edge"))
        .unwrap();
    assert_eq!(upstream.allowed_modes, AllowedModes::Both);
}

#[test]
fn spire_template_maps_service_account_to_agent_and_namespace() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let got = rules
        .map(&id("spiffe://example.org/ns/argocd/sa/edge-7"))
        .unwrap();
    assert_eq!(got.agent.as_str(), "edge-7");
    assert_eq!(got.namespace.as_str(), "argocd-edge-7");
    assert_eq!(got.allowed_modes, AllowedModes::Both);
    assert_eq!(got.rule, "spire-k8s");
    assert_eq!(
        got.client.spiffe_id().map(|i| i.as_str()),
        Some("spiffe://example.org/ns/argocd/sa/edge-7")
    );
}

#[test]
fn regex_rule_takes_agent_from_first_group_and_namespace_defaults_to_agent() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let got = rules.map(&id("spiffe://example.org/agent/edge-9")).unwrap();
    assert_eq!(got.agent.as_str(), "edge-9");
    assert_eq!(got.namespace.as_str(), "edge-9");
    assert_eq!(got.rule, "legacy");
}

#[test]
fn exact_rule_pins_one_id_and_its_mode() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let got = rules.map(&id("spiffe://example.org/special")).unwrap();
    assert_eq!(got.agent.as_str(), "edge-1");
    assert_eq!(got.allowed_modes, AllowedModes::Autonomous);
    assert!(got.check_mode(AgentMode::Autonomous).is_ok());
    let err = got.check_mode(AgentMode::Managed).unwrap_err();
    assert_eq!(err.reason.code(), "ModeNotAllowed");
    let msg = err.to_string();
    assert!(msg.contains("spiffe://example.org/special"), "{msg}");
    assert!(msg.contains("managed") && msg.contains("pinned"), "{msg}");
}

#[test]
fn unmatched_id_is_denied_by_default() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let err = rules.map(&id("spiffe://example.org/other")).unwrap_err();
    assert_eq!(err.reason, DenyReason::NoRuleMatched { tried: 3 });
    assert_eq!(
        err.to_string(),
        "SPIFFE ID spiffe://example.org/other denied: no rule matched (3 tried)"
    );
    let explicit = RuleSet::from_yaml("rules: []\n").unwrap();
    assert!(explicit.is_empty());
    let empty = RuleSet::default();
    assert!(empty.is_empty());
    let msg = empty.map(&id("spiffe://td/x")).unwrap_err().to_string();
    assert!(msg.contains("no mapping rules are configured"), "{msg}");
}

#[test]
fn first_matching_rule_wins() {
    let rules = RuleSet::from_flags(&flags(&[
        "exact:spiffe://example.org/ns/a/sa/b=>special",
        "template:spiffe://{trust_domain}/ns/{ns}/sa/{sa}=>{sa}",
    ]))
    .unwrap();
    assert_eq!(
        rules
            .map(&id("spiffe://example.org/ns/a/sa/b"))
            .unwrap()
            .agent
            .as_str(),
        "special"
    );
    assert_eq!(
        rules
            .map(&id("spiffe://example.org/ns/a/sa/c"))
            .unwrap()
            .agent
            .as_str(),
        "c"
    );
}

#[test]
fn invalid_rendered_agent_denies_and_does_not_fall_through() {
    let rules = RuleSet::from_yaml(
        r#"
rules:
  - name: loose
    regex: "spiffe://example.org/agent/(.+)"
  - name: catch-all
    regex: "spiffe://example.org/.*"
    agent: fallback
"#,
    )
    .unwrap();
    let err = rules
        .map(&id("spiffe://example.org/agent/Foo_1"))
        .unwrap_err();
    match &err.reason {
        DenyReason::InvalidAgentName { rule, value, .. } => {
            assert_eq!(rule, "loose");
            assert_eq!(value, "Foo_1");
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains("spiffe://example.org/agent/Foo_1"), "{msg}");
    assert!(
        msg.contains("rule \"loose\" produced invalid agent name \"Foo_1\""),
        "{msg}"
    );
    // The catch-all still works for IDs the first rule does not match.
    assert_eq!(
        rules
            .map(&id("spiffe://example.org/x"))
            .unwrap()
            .agent
            .as_str(),
        "fallback"
    );
}

#[test]
fn invalid_rendered_namespace_denies_naming_the_rule() {
    // A 60-character service account renders a 67-character namespace.
    let sa = "a".repeat(60);
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let err = rules
        .map(&id(&format!("spiffe://example.org/ns/x/sa/{sa}")))
        .unwrap_err();
    assert_eq!(err.reason.code(), "InvalidNamespace");
    let msg = err.to_string();
    assert!(
        msg.contains("spire-k8s") && msg.contains(&format!("argocd-{sa}")),
        "{msg}"
    );
}

#[test]
fn uppercase_segment_in_template_denies_with_invalid_agent() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let err = rules
        .map(&id("spiffe://example.org/ns/argocd/sa/Edge7"))
        .unwrap_err();
    assert_eq!(err.reason.code(), "InvalidAgentName");
}

#[test]
fn trust_domain_mismatch_skips_rule_and_continues() {
    let rules = RuleSet::from_flags(&flags(&[
        "template:spiffe://{trust_domain}/ns/{ns}/sa/{sa}=>{sa},trustDomains=example.org",
        "template:spiffe://{trust_domain}/ns/{ns}/sa/{sa}=>{sa},namespace=other-{sa},name=other-td",
    ]))
    .unwrap();
    let got = rules.map(&id("spiffe://other.org/ns/a/sa/edge")).unwrap();
    assert_eq!(got.rule, "other-td");
    assert_eq!(got.namespace.as_str(), "other-edge");
    let ex = rules.explain(&id("spiffe://other.org/ns/a/sa/edge"));
    assert!(matches!(
        ex.steps[0].outcome,
        StepOutcome::TrustDomainNotAllowed { .. }
    ));
    let text = ex.to_string();
    assert!(
        text.contains("skipped: trust domain \"other.org\" is not in trustDomains [example.org]"),
        "{text}"
    );
}

#[test]
fn literal_text_in_template_must_match_exactly() {
    let rules = RuleSet::from_flags(&flags(&[
        "template:spiffe://example.org/agents/{name}=>{name}",
    ]))
    .unwrap();
    assert!(rules.map(&id("spiffe://example.org/agents/a")).is_ok());
    for other in [
        "spiffe://example.org/agentsx/a",
        "spiffe://example.org/Agents/a",
        "spiffe://example.com/agents/a",
        "spiffe://example.org/agents/a/b",
        "spiffe://example.org/agents",
        "spiffe://example.org/x/agents/a",
    ] {
        assert!(rules.map(&id(other)).is_err(), "{other}");
    }
}

#[test]
fn template_placeholder_matches_one_segment_only() {
    let rules = RuleSet::from_flags(&flags(&[
        "template:spiffe://{trust_domain}/ns/{ns}/sa/{sa}=>{sa}",
    ]))
    .unwrap();
    assert!(rules.map(&id("spiffe://td/ns/a/b/sa/c")).is_err());
    assert!(rules.map(&id("spiffe://td/ns/a/sa/c/d")).is_err());
}

#[test]
fn template_may_mix_literal_and_placeholder_in_a_segment() {
    let rules = RuleSet::from_flags(&flags(&[
        "template:spiffe://example.org/agent-{id}=>edge-{id},namespace=hub-{id}",
    ]))
    .unwrap();
    let got = rules.map(&id("spiffe://example.org/agent-42")).unwrap();
    assert_eq!(got.agent.as_str(), "edge-42");
    assert_eq!(got.namespace.as_str(), "hub-42");
}

#[test]
fn template_with_agent_placeholder_needs_no_agent_output() {
    let rules = RuleSet::from_flags(&flags(&[
        "template:spiffe://example.org/region/{region}/agent/{agent}",
    ]))
    .unwrap();
    let got = rules
        .map(&id("spiffe://example.org/region/eu/agent/edge-3"))
        .unwrap();
    assert_eq!(got.agent.as_str(), "edge-3");
}

#[test]
fn outputs_may_use_trust_domain_and_regex_groups() {
    let rules = RuleSet::from_yaml(
        r#"
rules:
  - regex: "spiffe://([a-z]+)\\.example\\.org/(?P<site>[a-z0-9]+)/agent"
    agent: "{site}-{1}"
    namespace: "{2}"
"#,
    )
    .unwrap();
    let got = rules
        .map(&id("spiffe://prod.example.org/ber1/agent"))
        .unwrap();
    assert_eq!(got.agent.as_str(), "ber1-prod");
    assert_eq!(got.namespace.as_str(), "ber1");
    assert_eq!(got.rule, "rule-1");
}

#[test]
fn upstream_mtls_uri_flag_is_anchored_over_the_whole_id() {
    let rules = RuleSet::from_flags(&flags(&[
        "mtls:uri:spiffe://example.org/agent/([a-z0-9-]+)",
    ]))
    .unwrap();
    let got = rules.map(&id("spiffe://example.org/agent/edge-2")).unwrap();
    assert_eq!(got.agent.as_str(), "edge-2");
    assert_eq!(got.namespace.as_str(), "edge-2");
    assert_eq!(got.rule, "flag-1");
    // Not a substring match: a prefix or suffix around the pattern does not match.
    assert!(
        rules
            .map(&id("spiffe://example.org/agent/edge-2/x"))
            .is_err()
    );
    assert!(
        rules
            .map(&id("spiffe://evil.org/spiffe/example.org/agent/a"))
            .is_err()
    );
}

#[test]
fn flag_options_set_namespace_mode_trust_domains_and_name() {
    let rules = RuleSet::from_flags(&flags(&[
        "exact:spiffe://example.org/special=>edge-1,namespace=hub-edge-1,mode=managed,name=pin",
        "template:spiffe://{trust_domain}/a/{x}=>{x},mode=autonomous,trustDomains=a.org|b.org",
    ]))
    .unwrap();
    let got = rules.map(&id("spiffe://example.org/special")).unwrap();
    assert_eq!(
        (
            got.agent.as_str(),
            got.namespace.as_str(),
            got.allowed_modes,
            got.rule.as_str()
        ),
        ("edge-1", "hub-edge-1", AllowedModes::Managed, "pin")
    );
    assert_eq!(
        rules.map(&id("spiffe://b.org/a/y")).unwrap().allowed_modes,
        AllowedModes::Autonomous
    );
    assert!(rules.map(&id("spiffe://c.org/a/y")).is_err());
}

#[test]
fn file_rules_come_before_flag_rules_when_appended() {
    let file =
        RuleSet::from_yaml("rules:\n  - exact: spiffe://example.org/a\n    agent: from-file\n")
            .unwrap();
    let flag = RuleSet::from_flags(&flags(&["exact:spiffe://example.org/a=>from-flag"])).unwrap();
    let all = file.append(flag);
    assert_eq!(all.len(), 2);
    assert_eq!(
        all.map(&id("spiffe://example.org/a"))
            .unwrap()
            .agent
            .as_str(),
        "from-file"
    );
}

fn yaml_err(text: &str) -> String {
    match RuleSet::from_yaml(text) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("expected an error for:\n{text}"),
    }
}

#[test]
fn bad_yaml_rules_are_rejected_with_index_name_and_reason() {
    let cases = [
        ("rules:\n  - name: x\n", "needs one of"),
        (
            "rules:\n  - template: spiffe://td/{a}\n    regex: x\n",
            "more than one",
        ),
        ("rules:\n  - regex: \"spiffe://td/(\"\n", "does not compile"),
        ("rules:\n  - regex: \"spiffe://td/x\"\n", "capture group"),
        ("rules:\n  - exact: spiffe://td/x/\n", "must not end with"),
        ("rules:\n  - exact: spiffe://td/x\n", "needs `agent`"),
        (
            "rules:\n  - exact: spiffe://td/x\n    agent: Bad\n",
            "DNS-1123",
        ),
        (
            "rules:\n  - template: spiffe://td/{a}\n    agent: \"{b}\"\n",
            "uses {b}",
        ),
        (
            "rules:\n  - template: spiffe://td/{a}\n    agent: \"x_{a}\"\n",
            "can never be part",
        ),
        (
            "rules:\n  - template: spiffe://td/{a}/{a}\n    agent: \"{a}\"\n",
            "appears twice",
        ),
        (
            "rules:\n  - template: spiffe://td/{a}/\n    agent: \"{a}\"\n",
            "cannot match any valid SPIFFE ID",
        ),
        (
            "rules:\n  - template: spiffe://td-{x}/{a}\n    agent: \"{a}\"\n",
            "trust domain must be a literal",
        ),
        (
            "rules:\n  - template: \"spiffe://td/{a\"\n    agent: \"{a}\"\n",
            "unclosed",
        ),
        (
            "rules:\n  - template: spiffe://td/{a}\n    agent: \"{a}}\"\n",
            "unmatched '}'",
        ),
        (
            "rules:\n  - template: spiffe://td/{a-b}\n    agent: x\n",
            "must be a name of letters",
        ),
        (
            "rules:\n  - template: spiffe://td/x/{trust_domain}\n    agent: x\n",
            "may only stand for the trust domain",
        ),
        (
            "rules:\n  - template: http://td/{a}\n    agent: x\n",
            "must start with",
        ),
        (
            "rules:\n  - exact: spiffe://td/x\n    agent: a\n    mode: sometimes\n",
            "invalid agent mode",
        ),
        (
            "rules:\n  - exact: spiffe://td/x\n    agent: a\n    trustDomains: [Bad]\n",
            "lowercase",
        ),
        (
            "rules:\n  - exact: spiffe://td/x\n    agent: a\n    colour: red\n",
            "colour",
        ),
        ("", "write `rules: []`"),
        ("# just a comment\n\n", "write `rules: []`"),
        ("other: 1\n", "unknown field `other`"),
        (
            "rules:\n  - {name: a, exact: spiffe://td/x, agent: a}\n  - {name: a, exact: spiffe://td/y, agent: b}\n",
            "already used by rule 1",
        ),
    ];
    for (text, want) in cases {
        let msg = yaml_err(text);
        assert!(msg.contains(want), "for {text:?}: {msg}");
    }
    let msg = yaml_err(
        "rules:\n  - exact: spiffe://td/x\n    agent: a\n  - name: second\n    regex: x\n",
    );
    assert!(msg.starts_with("mapping rule 2 (\"second\"):"), "{msg}");
}

#[test]
fn bad_flags_are_rejected_with_the_flag_and_reason() {
    for (flag, want) in [
        ("mtls:CN=([^,]+)", "only the \"mtls:uri:<regex>\" form"),
        ("spiffe://td/x", "expected \"mtls:uri:<regex>\""),
        ("exact:spiffe://td/x=>a,colour=red", "unknown option"),
        ("exact:spiffe://td/x=>a,namespace", "key=value"),
        (
            "exact:spiffe://td/x=>a,mode=managed,mode=both",
            "given twice",
        ),
        ("exact:spiffe://td/x=>namespace=a", "agent template"),
        (
            "template:spiffe://td/{a}=>{a},trustDomains=ok|Bad",
            "lowercase",
        ),
        ("mtls:uri:spiffe://td/[", "does not compile"),
    ] {
        match RuleSet::from_flags(&flags(&[flag])) {
            Err(e @ RuleError::Flag { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(want), "{flag}: {msg}");
                assert!(msg.contains(&format!("{flag:?}")), "{flag}: {msg}");
            }
            other => panic!("{flag}: unexpected {other:?}"),
        }
    }
}

#[test]
fn explain_lists_every_rule_and_the_decision() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    let ex = rules.explain(&id("spiffe://example.org/agent/edge-9"));
    assert!(ex.is_allowed());
    let outcomes: Vec<_> = ex.steps.iter().map(|s| s.outcome.clone()).collect();
    assert_eq!(
        outcomes,
        [
            StepOutcome::NoMatch,
            StepOutcome::Matched,
            StepOutcome::NotEvaluated
        ]
    );
    let text = ex.to_string();
    for want in [
        "SPIFFE ID: spiffe://example.org/agent/edge-9",
        "1. spire-k8s (template spiffe://{trust_domain}/ns/{ns}/sa/{sa}): no match",
        "2. legacy (regex ^spiffe://example.org/agent/([a-z0-9-]+)$): MATCHED",
        "3. pinned (exact spiffe://example.org/special): not evaluated",
        "decision: ALLOWED",
        "agent:         edge-9",
        "namespace:     edge-9",
        "allowed modes: managed",
    ] {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }

    let denied = rules.explain(&id("spiffe://example.org/nothing"));
    assert!(!denied.is_allowed());
    let text = denied.to_string();
    assert!(
        text.contains("decision: DENIED: no rule matched (3 tried)"),
        "{text}"
    );
    assert_eq!(text.matches("no match").count(), 3, "{text}");
}

#[test]
fn explain_agrees_with_map() {
    let rules = RuleSet::from_yaml(EXAMPLE).unwrap();
    for s in [
        "spiffe://example.org/ns/argocd/sa/edge-7",
        "spiffe://other.org/ns/argocd/sa/edge-7",
        "spiffe://example.org/agent/X",
        "spiffe://example.org/special",
        "spiffe://example.org",
    ] {
        let i = id(s);
        assert_eq!(rules.explain(&i).decision, rules.map(&i), "{s}");
    }
}

/// The YAML examples in docs/identity.md are real: they parse and map as the doc says.
#[test]
fn documented_yaml_examples_parse_and_map_as_described() {
    let doc = include_str!("../../docs/identity.md");
    let blocks: Vec<&str> = doc
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(
        blocks.len(),
        2,
        "expected two YAML examples in docs/identity.md"
    );
    let first = RuleSet::from_yaml(blocks[0]).unwrap();
    let got = first
        .map(&id("spiffe://example.org/ns/argocd/sa/edge-7"))
        .unwrap();
    assert_eq!(
        (got.agent.as_str(), got.namespace.as_str()),
        ("edge-7", "argocd-edge-7")
    );

    let second = RuleSet::from_yaml(blocks[1]).unwrap();
    let cases = [
        (
            "spiffe://example.org/ns/edge-7/sa/argocd-agent",
            "edge-7",
            "edge-7",
        ),
        (
            "spiffe://berlin.example.org/ns/argocd/sa/agent",
            "berlin",
            "berlin",
        ),
        (
            "spiffe://example.org/ns/edge/sa/store-1",
            "store-1",
            "edge-store-1",
        ),
    ];
    for (s, agent, ns) in cases {
        let got = second.map(&id(s)).unwrap();
        assert_eq!(
            (got.agent.as_str(), got.namespace.as_str()),
            (agent, ns),
            "{s}"
        );
    }
    assert_eq!(
        second
            .map(&id("spiffe://example.org/ns/edge/sa/store-1"))
            .unwrap()
            .allowed_modes,
        AllowedModes::Managed
    );
}

#[test]
fn header_agent_name_maps_to_itself_and_survives_any_rules_change() {
    use argocd_agent_domain::{AgentName, ClientIdentity};
    let client = ClientIdentity::AgentName(AgentName::new("edge-9").unwrap());
    let none = RuleSet::from_flags(&[]).unwrap();
    let got = none.map_client(&client).unwrap();
    assert_eq!(got.agent.as_str(), "edge-9");
    assert_eq!(got.namespace.as_str(), "edge-9");
    assert_eq!(got.allowed_modes, AllowedModes::Both);
    assert_eq!(got.client, client);
    // No SPIFFE rule applies to a header name, so a rules change never revokes it.
    let other = RuleSet::from_yaml(EXAMPLE).unwrap();
    assert!(other.recheck(&got).is_ok());
    // A SPIFFE ID goes through the rules as `map` does.
    let spiffe = ClientIdentity::Spiffe(id("spiffe://example.org/nobody"));
    let denied = none.map_client(&spiffe).unwrap_err();
    assert_eq!(denied.client, spiffe);
}

const WITH_ADMIN: &str = r#"
rules:
  - name: operators
    template: "spiffe://example.org/ns/platform/sa/{sa}"
    role: admin
  - name: agents
    template: "spiffe://example.org/ns/{ns}/sa/{sa}"
    agent: "{sa}"
"#;

#[test]
fn an_admin_rule_grants_the_admin_api_and_never_an_agent_session() {
    let rules = RuleSet::from_yaml(WITH_ADMIN).unwrap();
    assert!(rules.has_admin_rules());
    let operator = id("spiffe://example.org/ns/platform/sa/alice");
    assert_eq!(
        rules
            .authorize_admin(&operator.clone().into())
            .unwrap()
            .rule,
        "operators"
    );
    let denied = rules.map(&operator).unwrap_err();
    assert_eq!(
        denied.reason,
        DenyReason::AdminRole {
            rule: "operators".into()
        }
    );
    assert!(denied.to_string().contains("never connect as an agent"));
}

#[test]
fn an_agent_identity_is_refused_by_the_admin_api() {
    let rules = RuleSet::from_yaml(WITH_ADMIN).unwrap();
    let agent = id("spiffe://example.org/ns/argocd/sa/edge-1");
    assert_eq!(rules.map(&agent).unwrap().agent.as_str(), "edge-1");
    let denied = rules.authorize_admin(&agent.into()).unwrap_err();
    assert_eq!(
        denied.reason,
        DenyReason::NotAdmin {
            rule: Some("agents".into())
        }
    );
    let stranger = id("spiffe://other.org/x");
    assert_eq!(
        rules.authorize_admin(&stranger.into()).unwrap_err().reason,
        DenyReason::NoRuleMatched { tried: 2 }
    );
    // An agent name captured from a header is never an operator.
    let header = argocd_agent_domain::ClientIdentity::AgentName(
        argocd_agent_domain::AgentName::new("edge-1").unwrap(),
    );
    assert_eq!(
        rules.authorize_admin(&header).unwrap_err().reason,
        DenyReason::NotAdmin { rule: None }
    );
}

#[test]
fn first_match_decides_between_admin_and_agent_rules() {
    // An agent rule above the admin rule wins for IDs both match: no admin access.
    let rules = RuleSet::from_flags(&flags(&[
        "template:spiffe://example.org/ns/{ns}/sa/{sa}=>{sa}",
        "admin:spiffe://example.org/ns/platform/sa/alice",
    ]))
    .unwrap();
    let alice = id("spiffe://example.org/ns/platform/sa/alice");
    assert!(rules.authorize_admin(&alice.clone().into()).is_err());
    assert_eq!(rules.map(&alice).unwrap().agent.as_str(), "alice");
}

#[test]
fn admin_rules_as_flags_and_their_mistakes() {
    let rules = RuleSet::from_flags(&flags(&[
        "admin:spiffe://example.org/ops/bob,name=bob",
        "template:spiffe://example.org/ops/{who}=>,role=admin,trustDomains=example.org",
    ]))
    .unwrap();
    assert_eq!(
        rules
            .authorize_admin(&id("spiffe://example.org/ops/bob").into())
            .unwrap()
            .rule,
        "bob"
    );
    assert_eq!(
        rules
            .authorize_admin(&id("spiffe://example.org/ops/carol").into())
            .unwrap()
            .rule,
        "flag-2"
    );
    assert!(
        !RuleSet::from_flags(&flags(&["exact:spiffe://example.org/a=>edge-1"]))
            .unwrap()
            .has_admin_rules()
    );
    let err = RuleSet::from_yaml(
        "rules:\n  - exact: spiffe://example.org/a\n    agent: edge-1\n    role: admin\n",
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("remove `agent`"), "{err}");
    let err = RuleSet::from_yaml("rules:\n  - exact: spiffe://example.org/a\n    role: root\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("not one of: agent, admin"), "{err}");
    let err = RuleSet::from_flags(&flags(&["admin:spiffe://example.org/a,mode=managed"]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("remove `mode`"), "{err}");
}

#[test]
fn explain_names_the_admin_rule() {
    let rules = RuleSet::from_yaml(WITH_ADMIN).unwrap();
    let text = rules
        .explain(&id("spiffe://example.org/ns/platform/sa/alice"))
        .to_string();
    assert!(text.contains("gives the admin role"), "{text}");
    assert!(matches!(
        rules
            .explain(&id("spiffe://example.org/ns/platform/sa/alice"))
            .steps[0]
            .outcome,
        StepOutcome::Denied(DenyReason::AdminRole { .. })
    ));
}

#[test]
fn a_thousand_template_rules_keep_first_match_order_and_explain_every_rule() {
    let mut yaml = String::from("rules:\n");
    for i in 0..1000 {
        yaml.push_str(&format!(
            "  - name: r{i}\n    template: \"spiffe://example.org/site-{i}/{{sa}}\"\n    agent: \"s{i}-{{sa}}\"\n"
        ));
    }
    // A later rule that also matches site-999 IDs must not win over r999.
    yaml.push_str("  - name: catch-all\n    regex: \"spiffe://example.org/site-[0-9]+/(.+)\"\n");
    let rules = RuleSet::from_yaml(&yaml).unwrap();
    let got = rules
        .map(&id("spiffe://example.org/site-999/edge"))
        .unwrap();
    assert_eq!(
        (got.rule.as_str(), got.agent.as_str()),
        ("r999", "s999-edge")
    );
    let got = rules.map(&id("spiffe://example.org/site-5/edge")).unwrap();
    assert_eq!(got.rule, "r5");
    assert_eq!(
        rules
            .map(&id("spiffe://example.org/other/edge"))
            .unwrap_err()
            .reason,
        DenyReason::NoRuleMatched { tried: 1001 }
    );
    let explained = rules.explain(&id("spiffe://example.org/site-3/edge"));
    assert_eq!(explained.steps.len(), 1001);
    assert_eq!(explained.steps[3].outcome, StepOutcome::Matched);
    assert_eq!(explained.steps[2].outcome, StepOutcome::NoMatch);
    assert_eq!(explained.steps[1000].outcome, StepOutcome::NotEvaluated);
}
