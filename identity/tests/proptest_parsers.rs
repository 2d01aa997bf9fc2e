//! Property tests of the identity crate's parsers (the stable-toolchain counterpart of the
//! cargo-fuzz targets in `identity/fuzz`): SPIFFE IDs and JWT-SVIDs. Arbitrary input never panics; structured input gives the expected result.

use std::time::{Duration, UNIX_EPOCH};

use argocd_agent_identity::jwt::{JwtBundles, JwtError};
use argocd_agent_identity::{SpiffeId, TrustDomain};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use proptest::prelude::*;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

/// A valid trust domain: DNS-like labels of lowercase letters, digits, `-` and `_`.
fn trust_domain() -> impl Strategy<Value = String> {
    "[a-z0-9][a-z0-9_-]{0,8}(\\.[a-z0-9][a-z0-9-]{0,6}){0,3}"
}

/// A valid path segment (never `.` or `..`).
fn segment() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-][A-Za-z0-9._-]{0,12}"
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics_the_parsers(s in any::<String>()) {
        if let Ok(id) = SpiffeId::parse(&s) {
            prop_assert_eq!(id.as_str(), s.as_str());
            prop_assert_eq!(SpiffeId::parse(id.as_str()).unwrap(), id);
        }
        let _ = TrustDomain::new(&s);
        let _ = JwtBundles::default().validate_claims(&s, "spiffe://example.org/p", UNIX_EPOCH);
    }

    #[test]
    fn spiffe_id_like_text_never_panics(s in "spiffe://[a-zA-Z0-9.%:@/_-]{0,40}") {
        let _ = SpiffeId::parse(&s);
        let _ = TrustDomain::new(&s);
    }

    #[test]
    fn ids_built_from_valid_parts_round_trip(
        td in trust_domain(),
        segs in prop::collection::vec(segment(), 0..6),
    ) {
        let path: String = segs.iter().map(|s| format!("/{s}")).collect();
        let text = format!("spiffe://{td}{path}");
        let id = SpiffeId::parse(&text).unwrap();
        prop_assert_eq!(id.as_str(), text.as_str());
        prop_assert_eq!(id.trust_domain().as_str(), td.as_str());
        prop_assert_eq!(id.path(), path.as_str());
        prop_assert_eq!(id.segments().collect::<Vec<_>>(), segs.iter().map(String::as_str).collect::<Vec<_>>());
        let td = TrustDomain::new(&td).unwrap();
        prop_assert_eq!(SpiffeId::new(td, &path).unwrap(), id);
    }

    #[test]
    fn ids_with_a_bad_segment_are_refused(
        td in trust_domain(),
        bad in prop::sample::select(vec!["", ".", "..", "a b", "a%20", "a?b", "a#b", "é"]),
    ) {
        let text = format!("spiffe://{td}/ok/{bad}");
        prop_assert!(SpiffeId::parse(&text).is_err(), "accepted {}", text);
    }
}

struct Signer {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    bundles: JwtBundles,
}

fn signer() -> Signer {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let key =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let point = key.public_key().as_ref();
    let jwks = serde_json::json!({"keys": [{
        "kty": "EC", "crv": "P-256", "kid": "k1",
        "x": URL_SAFE_NO_PAD.encode(&point[1..33]),
        "y": URL_SAFE_NO_PAD.encode(&point[33..65]),
    }]});
    let mut bundles = JwtBundles::default();
    bundles
        .insert_jwks(
            TrustDomain::new("example.org").unwrap(),
            jwks.to_string().as_bytes(),
        )
        .unwrap();
    Signer { key, rng, bundles }
}

impl Signer {
    fn token(&self, claims: &serde_json::Value) -> String {
        let header = serde_json::json!({"alg": "ES256", "kid": "k1", "typ": "JWT"});
        let mut token = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let sig = self.key.sign(&self.rng, token.as_bytes()).unwrap();
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
        token
    }
}

const NOW: u64 = 1_795_392_000;
const AUDIENCE: &str = "spiffe://example.org/principal";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn signed_jwt_svids_are_judged_by_their_claims(
        segs in prop::collection::vec(segment(), 1..4),
        exp_offset in -10_000i64..10_000,
        nbf_offset in prop::option::of(-1_000i64..1_000),
        right_audience in any::<bool>(),
        tamper in any::<bool>(),
    ) {
        let signer = signer();
        let sub = format!("spiffe://example.org/{}", segs.join("/"));
        let aud = if right_audience { AUDIENCE } else { "spiffe://example.org/other" };
        let exp = NOW as i64 + exp_offset;
        let mut claims = serde_json::json!({"sub": sub, "aud": [aud], "exp": exp});
        if let Some(nbf) = nbf_offset {
            claims["nbf"] = (NOW as i64 + nbf).into();
        }
        let mut token = signer.token(&claims);
        if tamper {
            // Another valid signature's worth of bytes: the signature no longer verifies.
            let cut = token.rfind('.').unwrap();
            token.truncate(cut + 1);
            token.push_str(&URL_SAFE_NO_PAD.encode([7u8; 64]));
        }
        let now = UNIX_EPOCH + Duration::from_secs(NOW);
        let result = signer.bundles.validate_claims(&token, AUDIENCE, now);
        let not_yet = nbf_offset.is_some_and(|n| n > 60);
        match result {
            Ok(valid) => {
                prop_assert!(!tamper && exp_offset > 0 && right_audience && !not_yet);
                prop_assert_eq!(valid.spiffe_id.as_str(), sub.as_str());
            }
            Err(JwtError::BadSignature { .. }) => prop_assert!(tamper),
            Err(JwtError::Expired { .. }) => prop_assert!(!tamper && exp_offset <= 0),
            Err(JwtError::NotYetValid { .. }) => prop_assert!(!tamper && exp_offset > 0 && not_yet),
            Err(JwtError::WrongAudience { .. }) => {
                prop_assert!(!tamper && exp_offset > 0 && !not_yet && !right_audience)
            }
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error: {e}"))),
        }
    }

    #[test]
    fn arbitrary_jwks_documents_never_panic(doc in any::<Vec<u8>>(), kty in "(EC|RSA|oct)", crv in "(P-256|P-384|P-521)", x in "[A-Za-z0-9_-]{0,70}") {
        let mut bundles = JwtBundles::default();
        let td = TrustDomain::new("example.org").unwrap();
        let _ = bundles.insert_jwks(td.clone(), &doc);
        let jwk = serde_json::json!({"keys": [{"kty": kty, "crv": crv, "kid": "k", "x": x, "y": x, "n": x, "e": "AQAB"}]});
        let _ = bundles.insert_jwks(td, jwk.to_string().as_bytes());
    }
}
