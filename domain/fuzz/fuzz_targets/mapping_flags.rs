//! Fuzz target: arbitrary text as mapping-rule flags (one flag per line). Must never panic; an
//! accepted rule set must map and explain a handful of SPIFFE IDs consistently
//! (`map` decides as `explain` does).
#![no_main]

use argocd_agent_identity::SpiffeId;

use argocd_agent_domain::RuleSet;
use libfuzzer_sys::fuzz_target;

const IDS: &[&str] = &[
    "spiffe://example.org/ns/edge/sa/agent-1",
    "spiffe://example.org/agent/edge-2",
    "spiffe://example.org/special",
    "spiffe://other.test/ns/platform/sa/ops",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let flags: Vec<String> = text.lines().map(str::to_owned).collect();
    if let Ok(rules) = RuleSet::from_flags(&flags) {
        for id in IDS {
            let id = SpiffeId::parse(id).expect("fixed IDs are valid");
            let mapped = rules.map(&id);
            let explained = rules.explain(&id);
            assert_eq!(
                mapped, explained.decision,
                "map and explain disagree for {id}"
            );
            let _ = explained.to_string();
            let _ = rules.authorize_admin(&id.clone().into());
        }
    }
});
