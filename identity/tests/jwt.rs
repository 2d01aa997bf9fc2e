//! JWT-SVIDs: the agent fetches one for the principal's ID, the principal validates it against
//! the JWT bundles of its own Workload API.

mod support;

use std::time::{Duration, SystemTime};

use argocd_agent_identity::jwt::{
    JwtBundles, JwtError, JwtSvidFetcher, JwtValidator, bearer_token,
};
use argocd_agent_testkit::workload_api::DevCa;
use support::*;
use tonic::service::Interceptor as _;

#[tokio::test]
async fn agent_token_validates_at_principal_for_principal_audience() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let fetcher = JwtSvidFetcher::start(Some(endpoint(dir.path(), "agent")), id(PRINCIPAL))
        .await
        .expect("JWT-SVID fetched");
    let validator = JwtValidator::workload_api(Some(endpoint(dir.path(), "principal")))
        .await
        .expect("JWT bundles fetched");
    let token = fetcher.token().expect("token");
    let caller = validator.validate(&token, &id(PRINCIPAL)).expect("valid");
    assert_eq!(caller.as_str(), AGENT);

    // The interceptor sends it as a bearer token.
    let request = fetcher
        .interceptor()
        .call(tonic::Request::new(()))
        .expect("token available");
    assert_eq!(bearer_token(request.metadata()), Some(token.as_str()));
    dev.shutdown().await;
}

#[tokio::test]
async fn token_for_another_audience_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_server(dir.path()).await;
    let fetcher = JwtSvidFetcher::start(
        Some(endpoint(dir.path(), "agent")),
        id("spiffe://example.org/ns/other/sa/service"),
    )
    .await
    .unwrap();
    let validator = JwtValidator::workload_api(Some(endpoint(dir.path(), "principal")))
        .await
        .unwrap();
    let err = validator
        .validate(&fetcher.token().unwrap(), &id(PRINCIPAL))
        .unwrap_err();
    assert!(matches!(err, JwtError::WrongAudience { .. }), "{err}");
    dev.shutdown().await;
}

fn bundles(ca: &DevCa) -> JwtBundles {
    let mut b = JwtBundles::default();
    b.insert_jwks(ca.trust_domain().clone(), &ca.jwks())
        .unwrap();
    b
}

#[test]
fn expired_token_is_refused() {
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let now = SystemTime::now();
    let token = ca
        .issue_jwt_at(
            &id(AGENT),
            &[PRINCIPAL.to_string()],
            now - Duration::from_secs(600),
            now - Duration::from_secs(300),
        )
        .unwrap();
    let err = bundles(&ca).validate(&token, &id(PRINCIPAL)).unwrap_err();
    assert!(matches!(err, JwtError::Expired { .. }), "{err}");
}

#[test]
fn token_signed_by_unknown_key_or_tampered_is_refused() {
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let rogue = DevCa::ephemeral(td("example.org")).unwrap();
    let aud = [PRINCIPAL.to_string()];
    let good = ca
        .issue_jwt(&id(AGENT), &aud, Duration::from_secs(60))
        .unwrap();
    assert_eq!(
        bundles(&ca)
            .validate(&good, &id(PRINCIPAL))
            .unwrap()
            .as_str(),
        AGENT
    );

    let forged = rogue
        .issue_jwt(&id(AGENT), &aud, Duration::from_secs(60))
        .unwrap();
    let err = bundles(&ca).validate(&forged, &id(PRINCIPAL)).unwrap_err();
    assert!(matches!(err, JwtError::UnknownKey { .. }), "{err}");

    // Swap in claims for another subject but keep the original signature.
    let other = ca
        .issue_jwt(
            &id("spiffe://example.org/admin"),
            &aud,
            Duration::from_secs(60),
        )
        .unwrap();
    let parts: Vec<&str> = good.split('.').collect();
    let other_parts: Vec<&str> = other.split('.').collect();
    let tampered = format!("{}.{}.{}", parts[0], other_parts[1], parts[2]);
    let err = bundles(&ca)
        .validate(&tampered, &id(PRINCIPAL))
        .unwrap_err();
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err}");

    let foreign = DevCa::ephemeral(td("other.org")).unwrap();
    let token = foreign
        .issue_jwt(
            &id("spiffe://other.org/agent"),
            &aud,
            Duration::from_secs(60),
        )
        .unwrap();
    let err = bundles(&ca).validate(&token, &id(PRINCIPAL)).unwrap_err();
    assert!(matches!(err, JwtError::UnknownTrustDomain { .. }), "{err}");

    let err = bundles(&ca)
        .validate("not.a.jwt", &id(PRINCIPAL))
        .unwrap_err();
    assert!(matches!(err, JwtError::Malformed(_)), "{err}");
}

/// Signs a JWT-SVID with the RSA test key (test-only fixture generated with openssl; ring
/// cannot generate RSA keys).
fn rsa_token(alg: &str, sub: &str, aud: &str) -> (String, String) {
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
    use rustls_pki_types::PrivatePkcs8KeyDer;
    use rustls_pki_types::pem::PemObject as _;
    let der = PrivatePkcs8KeyDer::from_pem_file(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/rsa-2048.pk8.pem"
    ))
    .unwrap();
    let key = ring::rsa::KeyPair::from_pkcs8(der.secret_pkcs8_der()).unwrap();
    let public: ring::rsa::PublicKeyComponents<Vec<u8>> = key.public().into();
    let n = B64.encode(&public.n);
    let e = B64.encode(&public.e);
    let jwks = format!(r#"{{"keys":[{{"kty":"RSA","kid":"rsa-1","n":"{n}","e":"{e}"}}]}}"#);
    let header = B64.encode(format!(r#"{{"alg":"{alg}","kid":"rsa-1","typ":"JWT"}}"#));
    let exp = unix_now() + 300;
    let claims = B64.encode(format!(r#"{{"sub":"{sub}","aud":["{aud}"],"exp":{exp}}}"#));
    let input = format!("{header}.{claims}");
    let padding: &dyn ring::signature::RsaEncoding = match alg {
        "RS256" => &ring::signature::RSA_PKCS1_SHA256,
        "PS256" => &ring::signature::RSA_PSS_SHA256,
        "RS512" => &ring::signature::RSA_PKCS1_SHA512,
        other => panic!("no padding for {other}"),
    };
    let mut sig = vec![0; key.public().modulus_len()];
    key.sign(
        padding,
        &ring::rand::SystemRandom::new(),
        input.as_bytes(),
        &mut sig,
    )
    .unwrap();
    (format!("{input}.{}", B64.encode(sig)), jwks)
}

#[test]
fn rsa_signed_tokens_verify_with_ring_and_algorithm_confusion_is_refused() {
    for alg in ["RS256", "PS256", "RS512"] {
        let (token, jwks) = rsa_token(alg, AGENT, PRINCIPAL);
        let mut b = JwtBundles::default();
        b.insert_jwks(td("example.org"), jwks.as_bytes()).unwrap();
        assert_eq!(
            b.validate(&token, &id(PRINCIPAL)).expect(alg).as_str(),
            AGENT
        );
    }
    // An RS256 signature presented as PS256 does not verify.
    let (token, jwks) = rsa_token("RS256", AGENT, PRINCIPAL);
    let mut b = JwtBundles::default();
    b.insert_jwks(td("example.org"), jwks.as_bytes()).unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    use base64::Engine as _;
    let ps_header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(r#"{"alg":"PS256","kid":"rsa-1","typ":"JWT"}"#);
    let relabelled = format!("{ps_header}.{}.{}", parts[1], parts[2]);
    let err = b.validate(&relabelled, &id(PRINCIPAL)).unwrap_err();
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err}");

    // An EC token checked against an RSA key of the same kid is refused.
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let token = ca
        .issue_jwt(
            &id(AGENT),
            &[PRINCIPAL.to_string()],
            Duration::from_secs(60),
        )
        .unwrap();
    let mut b = JwtBundles::default();
    let rsa_jwk = format!(
        r#"{{"keys":[{{"kty":"RSA","kid":"{}","n":"sXch","e":"AQAB"}}]}}"#,
        ca.jwt_key_id()
    );
    b.insert_jwks(td("example.org"), rsa_jwk.as_bytes())
        .unwrap();
    let err = b.validate(&token, &id(PRINCIPAL)).unwrap_err();
    assert!(matches!(err, JwtError::BadSignature { .. }), "{err}");
}

#[tokio::test]
async fn fetcher_refreshes_token_before_it_expires() {
    let dir = tempfile::tempdir().unwrap();
    let dev = dev_builder(dir.path())
        .jwt_ttl(Duration::from_secs(2))
        .serve()
        .await
        .unwrap();
    let fetcher = JwtSvidFetcher::start(Some(endpoint(dir.path(), "agent")), id(PRINCIPAL))
        .await
        .unwrap();
    let first = fetcher.token().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let current = fetcher.token().expect("never without a valid token");
        if current != first {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "token never refreshed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    dev.shutdown().await;
}

#[test]
fn token_not_valid_yet_is_refused_beyond_the_clock_skew() {
    use argocd_agent_identity::jwt::CLOCK_SKEW;
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let now = unix_now();
    let skew = CLOCK_SKEW.as_secs() as i64;
    let token = |extra: serde_json::Value| {
        let mut claims = serde_json::json!({
            "sub": AGENT,
            "aud": [PRINCIPAL],
            "exp": now + 3600,
        });
        claims
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        ca.sign_jwt(&claims).unwrap()
    };
    let check = |extra| bundles(&ca).validate(&token(extra), &id(PRINCIPAL));

    // Within the tolerated skew, or in the past: accepted.
    for extra in [
        serde_json::json!({"nbf": now - 10, "iat": now - 10}),
        serde_json::json!({"nbf": now + skew / 2, "iat": now + skew / 2}),
        serde_json::json!({"nbf": (now - 5) as f64 + 0.5}),
    ] {
        let accepted = check(extra.clone()).unwrap_or_else(|e| panic!("{extra}: {e}"));
        assert_eq!(accepted.as_str(), AGENT);
    }
    // Not valid for another hour: refused, whichever claim says so.
    for (claim, extra) in [
        ("nbf", serde_json::json!({"nbf": now + 3000, "iat": now})),
        ("iat", serde_json::json!({"iat": now + 3000})),
    ] {
        let err = check(extra).unwrap_err();
        assert!(
            matches!(&err, JwtError::NotYetValid { claim: c, .. } if *c == claim),
            "{err}"
        );
    }
    let err = check(serde_json::json!({"nbf": "soon"})).unwrap_err();
    assert!(matches!(err, JwtError::Malformed(_)), "{err}");
}

/// Found by the `jwt_svid` fuzz target: the spiffe crate lowercases the trust domain of `sub`,
/// so a token for `spiffe://eXample.org/...` was accepted as `spiffe://example.org/...`.
/// A `sub` that is not a valid SPIFFE ID as written is malformed.
#[test]
fn subject_with_an_uppercase_trust_domain_is_refused_not_normalised() {
    let ca = DevCa::ephemeral(td("example.org")).unwrap();
    let token = ca
        .sign_jwt(&serde_json::json!({
            "sub": "spiffe://eXample.org/agent",
            "aud": [PRINCIPAL],
            "exp": unix_now() + 3600,
        }))
        .unwrap();
    let err = bundles(&ca).validate(&token, &id(PRINCIPAL)).unwrap_err();
    assert!(matches!(err, JwtError::Malformed(_)), "{err}");
}
