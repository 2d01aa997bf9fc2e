//! Fuzz target: Linkerd `l5d-client-id` values (`LinkerdId::parse`) and the reverse mapping
//! from SPIFFE IDs (`LinkerdId::from_spiffe_uri`). Must never panic; an accepted value must
//! print back to itself, re-parse to the same identity, and give a SPIFFE ID that maps back.
#![no_main]

use argocd_agent_mesh::LinkerdId;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(id) = LinkerdId::parse(text) {
        assert_eq!(id.to_string(), text);
        assert_eq!(LinkerdId::parse(&id.to_string()).expect("re-parses"), id);
        if let Ok(spiffe) = id.to_spiffe_id() {
            let back = LinkerdId::from_spiffe_uri(spiffe.as_str(), &id.control_plane_ns)
                .expect("a Linkerd SPIFFE ID maps back");
            assert_eq!(back, id);
        }
    }
    if let Some(id) = LinkerdId::from_spiffe_uri(text, "linkerd") {
        assert_eq!(id.spiffe_uri(), text);
    }
});
