//! Fuzz target: arbitrary bytes through the XFCC parser and every header-auth preset.
//! Must never panic; anything accepted must re-serialize to the same elements.
#![no_main]

use argocd_agent_mesh::xfcc::format_xfcc;
use argocd_agent_mesh::{HeaderAuth, parse_xfcc};
use http::{HeaderMap, HeaderValue};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(elements) = parse_xfcc(text) {
            let again = parse_xfcc(&format_xfcc(&elements)).expect("re-serialized XFCC parses");
            assert_eq!(again, elements);
        }
    }
    if let Ok(value) = HeaderValue::from_bytes(data) {
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-client-cert", value.clone());
        headers.insert("l5d-client-id", value);
        for auth in [HeaderAuth::Envoy, HeaderAuth::Istio, HeaderAuth::Linkerd] {
            let _ = auth.identity_from_headers(&headers);
        }
    }
});
