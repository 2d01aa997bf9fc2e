//! Fuzz target: JWT-SVID parsing and validation (`JwtBundles::validate_claims`) and JWKS
//! bundle parsing (`JwtBundles::insert_jwks`). Must never panic.
//!
//! The first byte picks a mode:
//! - 0: the rest is the token, as text;
//! - 1: the rest is the JWKS document given to `insert_jwks`;
//! - 2: the rest is the JSON header, with fixed ES256 claims, signed with the bundle's key;
//! - other: the rest is the JSON claims, with a fixed ES256 header, signed with the bundle's
//!   key, so the claim checks (`sub`, `aud`, `exp`, `nbf`, `iat`) are reached. An accepted
//!   token must carry the audience, not be expired, and name `sub` as its SPIFFE ID.
#![no_main]

use std::sync::OnceLock;
use std::time::{Duration, UNIX_EPOCH};

use argocd_agent_identity::TrustDomain;
use argocd_agent_identity::jwt::JwtBundles;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use libfuzzer_sys::fuzz_target;
use ring::rand::SystemRandom;
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair};

const AUDIENCE: &str = "spiffe://example.org/principal";
/// The validator's clock: 2026-11-23T00:00:00Z.
const NOW: u64 = 1_795_392_000;

struct Fixture {
    key: EcdsaKeyPair,
    rng: SystemRandom,
    bundles: JwtBundles,
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .unwrap();
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
        Fixture { key, rng, bundles }
    })
}

fn signed(f: &Fixture, header: &[u8], claims: &[u8]) -> String {
    let mut token = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(header),
        URL_SAFE_NO_PAD.encode(claims)
    );
    let sig = f.key.sign(&f.rng, token.as_bytes()).unwrap();
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(sig.as_ref()));
    token
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = fixture();
    let now = UNIX_EPOCH + Duration::from_secs(NOW);
    let token = match mode {
        0 => String::from_utf8_lossy(rest).into_owned(),
        1 => {
            let mut bundles = JwtBundles::default();
            let _ = bundles.insert_jwks(TrustDomain::new("example.org").unwrap(), rest);
            return;
        }
        2 => signed(
            f,
            rest,
            br#"{"sub":"spiffe://example.org/agent","aud":["spiffe://example.org/principal"],"exp":1895392000}"#,
        ),
        _ => signed(f, br#"{"alg":"ES256","kid":"k1","typ":"JWT"}"#, rest),
    };
    if let Ok(valid) = f.bundles.validate_claims(&token, AUDIENCE, now) {
        assert!(valid.expires_at > now, "an expired token was accepted");
        let sub = valid.claims.get("sub").and_then(|s| s.as_str());
        assert_eq!(sub, Some(valid.spiffe_id.as_str()));
        let aud = &valid.claims["aud"];
        assert!(
            aud == AUDIENCE
                || aud
                    .as_array()
                    .is_some_and(|a| a.iter().any(|x| x == AUDIENCE)),
            "accepted for the wrong audience: {aud}"
        );
    }
});
