//! Property-style robustness test for the XFCC parser (a stand-in for `cargo fuzz`, which
//! `mesh/fuzz` also provides): thousands of generated and mutated inputs, fixed seed.
//! - no input makes `parse_xfcc` or `identity_from_headers` panic;
//! - `parse_xfcc(format_xfcc(x)) == x` for generated elements;
//! - anything accepted re-serializes to something that parses to the same elements.

use argocd_agent_mesh::xfcc::{MAX_XFCC_BYTES, format_xfcc};
use argocd_agent_mesh::{HeaderAuth, XfccElement, parse_xfcc};
use http::{HeaderMap, HeaderValue};

const ALPHABET: &[char] = &[
    'a', 'Z', '0', '/', ':', '.', '-', '_', ' ', '%', ',', ';', '=', '"', '\\', 'é', '*',
];

fn value(rng: &mut fastrand::Rng) -> String {
    let len = rng.usize(0..24);
    (0..len)
        .map(|_| ALPHABET[rng.usize(..ALPHABET.len())])
        .collect()
}

fn opt(rng: &mut fastrand::Rng) -> Option<String> {
    rng.bool().then(|| value(rng))
}

fn element(rng: &mut fastrand::Rng) -> XfccElement {
    loop {
        let el = XfccElement {
            by: opt(rng),
            hash: opt(rng),
            cert: opt(rng),
            chain: opt(rng),
            subject: opt(rng),
            uri: (0..rng.usize(0..3)).map(|_| value(rng)).collect(),
            dns: (0..rng.usize(0..3)).map(|_| value(rng)).collect(),
        };
        // An element needs at least one pair.
        if el != XfccElement::default() {
            return el;
        }
    }
}

fn check_identity_does_not_panic(bytes: &[u8]) {
    let Ok(v) = HeaderValue::from_bytes(bytes) else {
        return;
    };
    let mut headers = HeaderMap::new();
    headers.insert("x-forwarded-client-cert", v.clone());
    headers.insert("l5d-client-id", v);
    for auth in [HeaderAuth::Envoy, HeaderAuth::Istio, HeaderAuth::Linkerd] {
        let _ = auth.identity_from_headers(&headers);
    }
}

#[test]
fn xfcc_round_trips_generated_elements() {
    let mut rng = fastrand::Rng::with_seed(0x5eed_f00d);
    for _ in 0..5_000 {
        let els: Vec<XfccElement> = (0..rng.usize(1..4)).map(|_| element(&mut rng)).collect();
        let text = format_xfcc(&els);
        let back = parse_xfcc(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert_eq!(back, els, "{text:?}");
    }
}

#[test]
fn xfcc_survives_mutated_inputs() {
    let mut rng = fastrand::Rng::with_seed(42);
    let mut accepted = 0;
    for _ in 0..20_000 {
        let els: Vec<XfccElement> = (0..rng.usize(1..3)).map(|_| element(&mut rng)).collect();
        let mut bytes = format_xfcc(&els).into_bytes();
        for _ in 0..rng.usize(1..5) {
            match rng.u8(..4) {
                0 if !bytes.is_empty() => {
                    let i = rng.usize(..bytes.len());
                    bytes[i] = rng.u8(..);
                }
                1 if !bytes.is_empty() => {
                    bytes.remove(rng.usize(..bytes.len()));
                }
                2 => {
                    let i = rng.usize(..=bytes.len());
                    let b = *rng.choice(b",;=\"\\ \x00\x7f".iter()).unwrap_or(&b',');
                    bytes.insert(i, b);
                }
                _ => {
                    let i = rng.usize(..=bytes.len());
                    bytes.truncate(i);
                }
            }
        }
        check_identity_does_not_panic(&bytes);
        let Ok(text) = std::str::from_utf8(&bytes) else {
            continue;
        };
        if let Ok(parsed) = parse_xfcc(text) {
            accepted += 1;
            let again = parse_xfcc(&format_xfcc(&parsed)).expect("re-serialized value parses");
            assert_eq!(again, parsed, "{text:?}");
        }
    }
    // The mutations must leave both accepted and refused inputs, or this tests nothing.
    assert!(accepted > 1_000 && accepted < 19_000, "accepted {accepted}");
}

#[test]
fn xfcc_survives_random_bytes_and_huge_inputs() {
    let mut rng = fastrand::Rng::with_seed(7);
    for _ in 0..5_000 {
        let bytes: Vec<u8> = (0..rng.usize(0..64)).map(|_| rng.u8(..)).collect();
        check_identity_does_not_panic(&bytes);
        if let Ok(s) = std::str::from_utf8(&bytes) {
            let _ = parse_xfcc(s);
        }
    }
    let huge = "URI=a,".repeat(MAX_XFCC_BYTES);
    assert!(parse_xfcc(&huge).is_err());
    check_identity_does_not_panic(huge.as_bytes());
}
