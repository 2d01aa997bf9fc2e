//! Fuzz target: arbitrary text through SPIFFE ID and trust-domain parsing.
//! Must never panic; an accepted ID must re-parse to itself, agree with its parts
//! (`SpiffeId::new(trust_domain, path)`), and be accepted by the `spiffe` crate too
//! (for trust domains up to 255 bytes).
#![no_main]

use argocd_agent_identity::{SpiffeId, TrustDomain};

use argocd_agent_domain::{AgentName, Namespace};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = SpiffeId::parse(text) {
        assert_eq!(id.as_str(), text);
        let again = SpiffeId::parse(id.as_str()).expect("an accepted SPIFFE ID re-parses");
        assert_eq!(again, id);
        let rebuilt = SpiffeId::new(id.trust_domain().clone(), id.path())
            .expect("trust domain + path of an accepted ID rebuild it");
        assert_eq!(rebuilt, id);
        assert!(id.is_member_of(id.trust_domain()));
        let joined: String = id.segments().map(|s| format!("/{s}")).collect();
        assert_eq!(joined, id.path());
        // The spiffe crate also caps trust domains at 255 bytes (a DNS name's length); ours
        // does not (recorded in docs/reliability.md), so only shorter ones are compared.
        if id.trust_domain().as_str().len() <= 255 {
            let theirs = spiffe::SpiffeId::new(text);
            assert!(theirs.is_ok(), "spiffe crate refuses {text:?}: {theirs:?}");
        }
    }
    if let Ok(td) = TrustDomain::new(text) {
        let again = TrustDomain::new(td.as_str()).expect("an accepted trust domain re-parses");
        assert_eq!(again, td);
        let id = td.id();
        assert_eq!(SpiffeId::parse(id.as_str()).expect("td id parses"), id);
    }
    // Agent names and hub namespaces (DNS-1123 labels) are what mapping rules render.
    if let Ok(name) = AgentName::new(text) {
        assert_eq!(name.as_str(), text);
        assert!(!text.is_empty() && text.len() <= 63);
    }
    if let Ok(ns) = Namespace::new(text) {
        assert_eq!(ns.as_str(), text);
    }
});
