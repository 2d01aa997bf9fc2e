//! Property tests of the mapping rules' parsers (YAML and flags) and agent names: arbitrary
//! input never panics; template rules map the SPIFFE IDs they describe.

use argocd_agent_domain::{AgentName, RuleSet};
use argocd_agent_identity::SpiffeId;
use proptest::prelude::*;

/// A valid trust domain: DNS-like labels of lowercase letters, digits, `-` and `_`.
fn trust_domain() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9_-]{0,8}(\\.[a-z0-9][a-z0-9-]{0,6}){0,3}"
}

/// A DNS-1123 label (agent names, namespaces, service accounts).
fn dns_label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,20}[a-z0-9])?"
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_the_rule_parsers(s in any::<String>()) {
        let _ = AgentName::new(&s);
        let _ = RuleSet::from_yaml(&s);
        let _ = RuleSet::from_flags(std::slice::from_ref(&s));
    }

    #[test]
    fn template_rules_map_service_accounts(
        td in trust_domain(),
        ns in dns_label(),
        sa in dns_label(),
        from_yaml in any::<bool>(),
    ) {
        let rules = if from_yaml {
            RuleSet::from_yaml(
                "rules:\n  - template: \"spiffe://{trust_domain}/ns/{ns}/sa/{sa}\"\n    agent: \"{sa}\"\n    namespace: \"argocd-{sa}\"\n",
            )
        } else {
            RuleSet::from_flags(&[
                "template:spiffe://{trust_domain}/ns/{ns}/sa/{sa}=>{sa},namespace=argocd-{sa}".into(),
            ])
        }
        .unwrap();
        let id = SpiffeId::parse(&format!("spiffe://{td}/ns/{ns}/sa/{sa}")).unwrap();
        let mapped = rules.map(&id).unwrap();
        prop_assert_eq!(mapped.agent.as_str(), sa.as_str());
        let namespace = format!("argocd-{sa}");
        prop_assert_eq!(mapped.namespace.as_str(), namespace.as_str());
        prop_assert_eq!(rules.explain(&id).decision, Ok(mapped));
        // One segment more is no match.
        let longer = SpiffeId::parse(&format!("spiffe://{td}/ns/{ns}/sa/{sa}/x")).unwrap();
        prop_assert!(rules.map(&longer).is_err());
    }
}
