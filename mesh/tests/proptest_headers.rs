//! Property tests (proptest) of the mesh identity headers, the stable-toolchain counterpart of
//! the cargo-fuzz targets in `mesh/fuzz` (`xfcc`, `linkerd`): arbitrary header values never
//! panic; XFCC values and `l5d-client-id` values built from parts parse back to those parts and
//! give the expected SPIFFE ID.

use argocd_agent_domain::ClientIdentity;
use argocd_agent_mesh::xfcc::format_xfcc;
use argocd_agent_mesh::{HeaderAuth, LinkerdId, XfccElement, parse_xfcc};
use http::{HeaderMap, HeaderValue};
use proptest::prelude::*;

/// An XFCC value without control characters, including the characters that need quoting.
const XFCC_VALUE: &str = "[a-zA-Z0-9/:._%,;=\"\\\\ *é-]{0,24}";

/// The same without `é`: what a header value that must be ASCII text can carry.
const ASCII_XFCC_VALUE: &str = "[a-zA-Z0-9/:._%,;=\"\\\\ *-]{0,24}";

fn element_of(value: &'static str) -> impl Strategy<Value = XfccElement> {
    let opt = || prop::option::of(value);
    (
        (opt(), opt(), opt(), opt(), opt()),
        prop::collection::vec(value, 0..3),
        prop::collection::vec(value, 0..3),
    )
        .prop_map(|((by, hash, cert, chain, subject), uri, dns)| XfccElement {
            by,
            hash,
            cert,
            chain,
            subject,
            uri,
            dns,
        })
        // An element needs at least one pair.
        .prop_filter("empty element", |e| *e != XfccElement::default())
}

fn element() -> impl Strategy<Value = XfccElement> {
    element_of(XFCC_VALUE)
}

fn dns_label() -> impl Strategy<Value = String> {
    "[a-z0-9]([a-z0-9-]{0,14}[a-z0-9])?"
}

fn headers(name: &'static str, value: &[u8]) -> Option<HeaderMap> {
    let value = HeaderValue::from_bytes(value).ok()?;
    let mut headers = HeaderMap::new();
    headers.insert(name, value);
    Some(headers)
}

proptest! {
    #[test]
    fn arbitrary_header_values_never_panic(bytes in any::<Vec<u8>>()) {
        let text = String::from_utf8_lossy(&bytes);
        if let Ok(elements) = parse_xfcc(&text) {
            prop_assert_eq!(parse_xfcc(&format_xfcc(&elements)).unwrap(), elements);
        }
        if let Ok(id) = LinkerdId::parse(&text) {
            prop_assert_eq!(id.to_string(), text.as_ref());
        }
        for name in ["x-forwarded-client-cert", "l5d-client-id"] {
            if let Some(h) = headers(name, &bytes) {
                for auth in [HeaderAuth::Envoy, HeaderAuth::Istio, HeaderAuth::Linkerd] {
                    let _ = auth.identity_from_headers(&h);
                }
            }
        }
    }

    #[test]
    fn xfcc_built_from_parts_parses_to_those_parts(
        elements in prop::collection::vec(element(), 1..4),
    ) {
        let text = format_xfcc(&elements);
        prop_assert_eq!(parse_xfcc(&text).unwrap(), elements);
    }

    #[test]
    fn xfcc_identity_is_the_nearest_elements_uri(
        earlier in prop::collection::vec(element_of(ASCII_XFCC_VALUE), 0..3),
        ns in dns_label(),
        sa in dns_label(),
    ) {
        let id = format!("spiffe://example.org/ns/{ns}/sa/{sa}");
        let mut elements = earlier;
        elements.push(XfccElement {
            by: Some("spiffe://example.org/principal".into()),
            uri: vec![id.clone()],
            ..XfccElement::default()
        });
        let h = headers("x-forwarded-client-cert", format_xfcc(&elements).as_bytes()).unwrap();
        let got = HeaderAuth::Envoy.identity_from_headers(&h).unwrap();
        prop_assert_eq!(got.spiffe_id().map(|i| i.as_str().to_owned()), Some(id));
    }

    #[test]
    fn linkerd_ids_built_from_parts_parse_to_those_parts(
        sa in dns_label(),
        ns in dns_label(),
        cp in dns_label(),
        td in prop::collection::vec(dns_label(), 1..4),
    ) {
        let td = td.join(".");
        let value = format!("{sa}.{ns}.serviceaccount.identity.{cp}.{td}");
        let id = LinkerdId::parse(&value).unwrap();
        prop_assert_eq!(
            (&id.sa, &id.ns, &id.control_plane_ns, &id.trust_domain),
            (&sa, &ns, &cp, &td)
        );
        prop_assert_eq!(id.to_string(), value.clone());
        let spiffe = format!("spiffe://{td}/ns/{ns}/sa/{sa}");
        prop_assert_eq!(id.spiffe_uri(), spiffe.clone());
        prop_assert_eq!(LinkerdId::from_spiffe_uri(&spiffe, &cp), Some(id));
        let h = headers("l5d-client-id", value.as_bytes()).unwrap();
        let got = HeaderAuth::Linkerd.identity_from_headers(&h).unwrap();
        prop_assert!(matches!(&got, ClientIdentity::Spiffe(i) if i.as_str() == spiffe));
    }

    #[test]
    fn linkerd_ids_with_a_bad_label_are_refused(
        sa in dns_label(),
        bad in prop::sample::select(vec!["", "-a", "a-", "A", "a_b", "a b"]),
    ) {
        let value = format!("{sa}.{bad}.serviceaccount.identity.linkerd.cluster.local");
        prop_assert!(LinkerdId::parse(&value).is_err());
    }
}
