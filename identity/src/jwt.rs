//! JWT-SVIDs for paths where a TLS-terminating ingress cannot forward the client certificate:
//! the agent sends `authorization: Bearer <JWT-SVID>` with the principal's SPIFFE ID as
//! audience; the principal validates it against the JWT bundles from its own Workload API.

// The spiffe crate verifies JWT signatures only through jsonwebtoken with aws-lc or RustCrypto, and this process keeps one crypto provider (ring), so signatures are verified here with ring.

use crate::text::{self, quoted};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use futures::StreamExt;
use ring::signature::{self, RsaPublicKeyComponents, UnparsedPublicKey};
use spiffe::{JwtBundleSet, JwtSvid, WorkloadApiClient};
use tokio::sync::watch;

use crate::id::{SpiffeId, TrustDomain};
use crate::source::SourceError;

/// How long `start`/`workload_api` wait for the first token or bundle.
const INITIAL_TIMEOUT: Duration = Duration::from_secs(15);
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// Clock skew tolerated between the token's issuer and the validator: a token whose `nbf`
/// (not before) or `iat` (issued at) lies more than this in the future is refused.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// JWT-SVID failures. Messages name the subject and the reason.
#[derive(Debug, thiserror::Error)]
pub enum JwtError {
    /// Not a well-formed JWT-SVID.
    #[error("malformed JWT-SVID: {0}")]
    Malformed(String),
    /// The `alg` is not one of ES256/384, RS256/384/512, PS256/384/512.
    #[error("JWT-SVID algorithm {q0} is not supported", q0 = quoted(.0))]
    UnsupportedAlgorithm(String),
    /// No JWT bundle for the subject's trust domain.
    #[error("JWT-SVID for {sub}: no JWT bundle for trust domain {trust_domain}", trust_domain = quoted(.trust_domain))]
    UnknownTrustDomain {
        /// The token's subject.
        sub: String,
        /// Its trust domain.
        trust_domain: String,
    },
    /// The `kid` is not in the bundle.
    #[error("JWT-SVID for {sub}: key {kid} is not in the bundle of {trust_domain}", kid = quoted(.kid), trust_domain = quoted(.trust_domain))]
    UnknownKey {
        /// The token's subject.
        sub: String,
        /// The key ID.
        kid: String,
        /// The trust domain.
        trust_domain: String,
    },
    /// The signature does not verify.
    #[error("JWT-SVID for {sub}: signature does not verify")]
    BadSignature {
        /// The token's subject.
        sub: String,
    },
    /// `exp` is not in the future.
    #[error("JWT-SVID for {sub} expired at {exp} (unix seconds)")]
    Expired {
        /// The token's subject.
        sub: String,
        /// The `exp` claim.
        exp: i64,
    },
    /// `nbf` or `iat` lies further in the future than [`CLOCK_SKEW`] allows.
    #[error("JWT-SVID for {sub} is not valid yet: {claim} is {at} (unix seconds), now is {now}")]
    NotYetValid {
        /// The token's subject.
        sub: String,
        /// The claim (`nbf` or `iat`).
        claim: &'static str,
        /// Its value.
        at: i64,
        /// The validator's clock.
        now: i64,
    },
    /// The audience is not in `aud`.
    #[error("JWT-SVID for {sub} is for audience {aud}, not {expected}", aud = text::quoted_list(.aud), expected = quoted(.expected))]
    WrongAudience {
        /// The token's subject.
        sub: String,
        /// The `aud` claim.
        aud: Vec<String>,
        /// The audience we are.
        expected: String,
    },
    /// A JWKS document could not be used.
    #[error("JWT bundle of {trust_domain}: {reason}", trust_domain = quoted(.trust_domain))]
    Bundle {
        /// The trust domain.
        trust_domain: String,
        /// Why.
        reason: String,
    },
    /// The Workload API could not be reached or answered with an error.
    #[error("Workload API {endpoint}: {reason}")]
    WorkloadApi {
        /// The endpoint.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// Endpoint resolution failed.
    #[error(transparent)]
    Source(#[from] SourceError),
}

#[derive(Clone, Debug)]
enum Key {
    Ec { p384: bool, point: Vec<u8> },
    Rsa { n: Vec<u8>, e: Vec<u8> },
}

/// JWT authorities (public keys by `kid`) per trust domain.
#[derive(Clone, Debug, Default)]
pub struct JwtBundles {
    domains: HashMap<TrustDomain, HashMap<String, Key>>,
}

/// A validated JWT-SVID.
#[derive(Clone, Debug)]
pub struct ValidatedJwt {
    /// The `sub` claim.
    pub spiffe_id: SpiffeId,
    /// The `exp` claim.
    pub expires_at: SystemTime,
    /// All claims.
    pub claims: serde_json::Map<String, serde_json::Value>,
}

/// A base64url part that does not decode. The message carries the cause, so it is no
/// `source`.
#[derive(Debug, thiserror::Error)]
#[error("{what} is not base64url: {cause}")]
struct Base64Error {
    /// Which part.
    what: &'static str,
    /// The decoder's complaint.
    cause: base64::DecodeError,
}

fn b64(s: &str, what: &'static str) -> Result<Vec<u8>, Base64Error> {
    URL_SAFE_NO_PAD
        .decode(s.trim_end_matches('='))
        .map_err(|cause| Base64Error { what, cause })
}

/// Why one key of a JWKS document is unusable.
#[derive(Debug, thiserror::Error)]
enum JwkError {
    /// A required string member is missing.
    #[error("JWK without string {}", quoted(.0))]
    Missing(&'static str),
    /// An EC curve other than P-256 and P-384.
    #[error("JWK {kid}: unsupported curve {}", quoted(.curve))]
    Curve { kid: String, curve: String },
    /// EC coordinates of the wrong size for the curve.
    #[error("JWK {kid}: coordinates have the wrong length")]
    CoordinateLength { kid: String },
    /// A key type other than EC and RSA.
    #[error("JWK {kid}: unsupported key type {}", quoted(.kty))]
    KeyType { kid: String, kty: String },
    /// A member that is not base64url.
    #[error(transparent)]
    Base64(#[from] Base64Error),
}

fn parse_jwk(jwk: &serde_json::Value) -> Result<(String, Key), JwkError> {
    let field = |name: &'static str| {
        jwk.get(name)
            .and_then(|v| v.as_str())
            .ok_or(JwkError::Missing(name))
    };
    let kid = field("kid")?.to_string();
    let key = match field("kty")? {
        "EC" => {
            let (p384, len) = match field("crv")? {
                "P-256" => (false, 32),
                "P-384" => (true, 48),
                other => {
                    return Err(JwkError::Curve {
                        kid,
                        curve: other.to_owned(),
                    });
                }
            };
            let x = b64(field("x")?, "x")?;
            let y = b64(field("y")?, "y")?;
            if x.len() != len || y.len() != len {
                return Err(JwkError::CoordinateLength { kid });
            }
            let mut point = vec![0x04];
            point.extend(x);
            point.extend(y);
            Key::Ec { p384, point }
        }
        "RSA" => Key::Rsa {
            n: b64(field("n")?, "n")?,
            e: b64(field("e")?, "e")?,
        },
        other => {
            return Err(JwkError::KeyType {
                kid,
                kty: other.to_owned(),
            });
        }
    };
    Ok((kid, key))
}

impl JwtBundles {
    /// Adds the keys of a JWKS document (`{"keys": [...]}`) for `trust_domain`.
    pub fn insert_jwks(&mut self, trust_domain: TrustDomain, jwks: &[u8]) -> Result<(), JwtError> {
        let err = |reason: String| JwtError::Bundle {
            trust_domain: trust_domain.as_str().to_string(),
            reason,
        };
        let doc: serde_json::Value =
            serde_json::from_slice(jwks).map_err(|e| err(format!("not JSON: {e}")))?;
        let keys = doc
            .get("keys")
            .and_then(|k| k.as_array())
            .ok_or_else(|| err("no \"keys\" array".into()))?;
        let mut parsed = HashMap::new();
        for jwk in keys {
            let (kid, key) = parse_jwk(jwk).map_err(|e| err(e.to_string()))?;
            parsed.insert(kid, key);
        }
        self.domains.entry(trust_domain).or_default().extend(parsed);
        Ok(())
    }

    /// Converts the `spiffe` crate's bundle set (as streamed by the Workload API).
    pub fn from_spiffe(set: &JwtBundleSet) -> Result<JwtBundles, JwtError> {
        let mut out = JwtBundles::default();
        for (td, bundle) in set.iter() {
            let our_td = TrustDomain::new(td.as_str()).map_err(|e| JwtError::Bundle {
                trust_domain: td.to_string(),
                reason: e.to_string(),
            })?;
            let keys = out.domains.entry(our_td).or_default();
            for authority in bundle.jwt_authorities() {
                let jwk: serde_json::Value =
                    serde_json::from_slice(authority.jwk_json()).map_err(|e| JwtError::Bundle {
                        trust_domain: td.to_string(),
                        reason: e.to_string(),
                    })?;
                match parse_jwk(&jwk) {
                    Ok((kid, key)) => {
                        keys.insert(kid, key);
                    }
                    // One unusable key must not make the whole trust domain unusable.
                    Err(e) => {
                        tracing::warn!(trust_domain = %td, error = %e, "skipping JWT authority")
                    }
                }
            }
        }
        Ok(out)
    }

    /// The trust domains with at least one key.
    pub fn trust_domains(&self) -> impl Iterator<Item = &TrustDomain> {
        self.domains.keys()
    }

    /// Validates `token` for `audience` (a SPIFFE ID) now; returns the subject.
    pub fn validate(&self, token: &str, audience: &SpiffeId) -> Result<SpiffeId, JwtError> {
        Ok(self
            .validate_claims(token, audience.as_str(), SystemTime::now())?
            .spiffe_id)
    }

    /// Validates `token`: signature against the bundle of the subject's trust domain by `kid`,
    /// `aud` contains `audience`, `exp` after `now`, `nbf` and `iat` (when present) not later
    /// than `now` plus [`CLOCK_SKEW`], `sub` a SPIFFE ID.
    pub fn validate_claims(
        &self,
        token: &str,
        audience: &str,
        now: SystemTime,
    ) -> Result<ValidatedJwt, JwtError> {
        // Structure, required claims and header fields are checked by the spiffe crate.
        let parsed =
            JwtSvid::parse_insecure(token).map_err(|e| JwtError::Malformed(e.to_string()))?;
        let Parts {
            header,
            claims,
            signature,
            signed_len,
        } = Parts::decode(token)?;
        // `sub` exactly as signed: the spiffe crate lowercases the trust domain of the ID it
        // returns, and an identity must never be normalised into another one.
        let sub = claims
            .get("sub")
            .and_then(|s| s.as_str())
            .ok_or_else(|| JwtError::Malformed("no sub".into()))?
            .to_string();
        let spiffe_id =
            SpiffeId::parse(&sub).map_err(|e| JwtError::Malformed(format!("sub: {e}")))?;
        let alg = header
            .get("alg")
            .and_then(|a| a.as_str())
            .ok_or_else(|| JwtError::Malformed("no alg".into()))?;
        let kid = parsed.key_id();
        let td = spiffe_id.trust_domain();
        let keys = self
            .domains
            .get(td)
            .ok_or_else(|| JwtError::UnknownTrustDomain {
                sub: sub.clone(),
                trust_domain: td.as_str().to_string(),
            })?;
        let key = keys.get(kid).ok_or_else(|| JwtError::UnknownKey {
            sub: sub.clone(),
            kid: kid.to_string(),
            trust_domain: td.as_str().to_string(),
        })?;
        let message = &token.as_bytes()[..signed_len];
        verify_signature(alg, key, message, &signature).map_err(|e| match e {
            SigError::Unsupported => JwtError::UnsupportedAlgorithm(alg.to_string()),
            SigError::Invalid => JwtError::BadSignature { sub: sub.clone() },
        })?;
        let exp = parsed.claims().exp();
        let now_secs = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        if now_secs >= exp {
            return Err(JwtError::Expired { sub, exp });
        }
        for claim in ["nbf", "iat"] {
            let Some(value) = claims.get(claim) else {
                continue;
            };
            // NumericDate: seconds, possibly fractional.
            let at = value
                .as_f64()
                .ok_or_else(|| JwtError::Malformed(format!("{claim} is not a number")))?
                .floor() as i64;
            if at > now_secs.saturating_add(CLOCK_SKEW.as_secs() as i64) {
                return Err(JwtError::NotYetValid {
                    sub,
                    claim,
                    at,
                    now: now_secs,
                });
            }
        }
        if !parsed.audience().iter().any(|a| a == audience) {
            return Err(JwtError::WrongAudience {
                sub,
                aud: parsed.audience().to_vec(),
                expected: audience.to_string(),
            });
        }
        Ok(ValidatedJwt {
            spiffe_id,
            expires_at: UNIX_EPOCH + Duration::from_secs(exp.max(0) as u64),
            claims,
        })
    }
}

/// A compact JWS taken apart: the decoded header and claims, the signature, and the length of
/// the signed `header.claims` prefix.
struct Parts {
    header: serde_json::Value,
    claims: serde_json::Map<String, serde_json::Value>,
    signature: Vec<u8>,
    signed_len: usize,
}

impl Parts {
    /// Splits `token` into its three dot-separated parts and decodes each.
    fn decode(token: &str) -> Result<Parts, JwtError> {
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(sig_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed(
                "expected three dot-separated parts".into(),
            ));
        };
        let header: serde_json::Value = serde_json::from_slice(
            &b64(header_b64, "header").map_err(|e| JwtError::Malformed(e.to_string()))?,
        )
        .map_err(|e| JwtError::Malformed(format!("header: {e}")))?;
        let claims: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(
            &b64(claims_b64, "claims").map_err(|e| JwtError::Malformed(e.to_string()))?,
        )
        .map_err(|e| JwtError::Malformed(format!("claims: {e}")))?;
        let signature =
            b64(sig_b64, "signature").map_err(|e| JwtError::Malformed(e.to_string()))?;
        Ok(Parts {
            header,
            claims,
            signature,
            signed_len: header_b64.len() + 1 + claims_b64.len(),
        })
    }
}

enum SigError {
    Unsupported,
    Invalid,
}

fn verify_signature(alg: &str, key: &Key, message: &[u8], sig: &[u8]) -> Result<(), SigError> {
    match (alg, key) {
        ("ES256", Key::Ec { p384: false, point }) => {
            UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                .verify(message, sig)
                .map_err(|_| SigError::Invalid)
        }
        ("ES384", Key::Ec { p384: true, point }) => {
            UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                .verify(message, sig)
                .map_err(|_| SigError::Invalid)
        }
        // Algorithm and key type disagree (e.g. ES256 with an RSA or P-384 key).
        ("ES256" | "ES384", _) => Err(SigError::Invalid),
        (_, Key::Rsa { n, e }) => {
            let params: &signature::RsaParameters = match alg {
                "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                "PS256" => &signature::RSA_PSS_2048_8192_SHA256,
                "PS384" => &signature::RSA_PSS_2048_8192_SHA384,
                "PS512" => &signature::RSA_PSS_2048_8192_SHA512,
                _ => return Err(SigError::Unsupported),
            };
            RsaPublicKeyComponents { n, e }
                .verify(params, message, sig)
                .map_err(|_| SigError::Invalid)
        }
        _ => Err(SigError::Unsupported),
    }
}

/// Aborts a background task when dropped.
struct TaskGuard(tokio::task::JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Clone, Debug)]
struct Token {
    token: String,
    expires_at: SystemTime,
}

/// Agent side: keeps a JWT-SVID for one audience, refreshed at half its lifetime.
#[derive(Clone)]
pub struct JwtSvidFetcher {
    rx: watch::Receiver<Option<Token>>,
    audience: SpiffeId,
    _task: Arc<TaskGuard>,
}

impl std::fmt::Debug for JwtSvidFetcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtSvidFetcher")
            .field("audience", &self.audience.as_str())
            .finish()
    }
}

impl JwtSvidFetcher {
    /// Fetches a JWT-SVID for `audience` from the Workload API at `endpoint` (or
    /// `SPIFFE_ENDPOINT_SOCKET`) and keeps it fresh. Waits up to 15 s for the first token.
    pub async fn start(
        endpoint: Option<String>,
        audience: SpiffeId,
    ) -> Result<JwtSvidFetcher, JwtError> {
        let endpoint = crate::source::resolve_endpoint(endpoint)?;
        let (tx, rx) = watch::channel(None);
        let last_error = Arc::new(Mutex::new(None::<String>));
        let task = tokio::spawn(refresh_loop(
            endpoint.clone(),
            audience.clone(),
            tx,
            last_error.clone(),
        ));
        let fetcher = JwtSvidFetcher {
            rx,
            audience,
            _task: Arc::new(TaskGuard(task)),
        };
        let mut rx = fetcher.rx.clone();
        match tokio::time::timeout(INITIAL_TIMEOUT, rx.wait_for(|t| t.is_some())).await {
            Ok(Ok(_)) => Ok(fetcher),
            _ => Err(JwtError::WorkloadApi {
                endpoint,
                reason: format!(
                    "no JWT-SVID within {INITIAL_TIMEOUT}: {}",
                    last_error
                        .lock()
                        .ok()
                        .and_then(|e| e.clone())
                        .unwrap_or_else(|| "no answer".into()),
                    INITIAL_TIMEOUT = text::duration(INITIAL_TIMEOUT)
                ),
            }),
        }
    }

    /// The current token, unless it has expired.
    pub fn token(&self) -> Option<String> {
        self.rx
            .borrow()
            .as_ref()
            .filter(|t| t.expires_at > SystemTime::now())
            .map(|t| t.token.clone())
    }

    /// The audience tokens are fetched for.
    pub fn audience(&self) -> &SpiffeId {
        &self.audience
    }

    /// A tonic interceptor adding `authorization: Bearer <JWT-SVID>` to every request.
    pub fn interceptor(&self) -> JwtInterceptor {
        JwtInterceptor {
            fetcher: self.clone(),
        }
    }
}

async fn refresh_loop(
    endpoint: String,
    audience: SpiffeId,
    tx: watch::Sender<Option<Token>>,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let mut client: Option<WorkloadApiClient> = None;
    let mut backoff = MIN_BACKOFF;
    loop {
        let result = async {
            if client.is_none() {
                client = Some(
                    WorkloadApiClient::connect_to(&endpoint)
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            let c = client.as_ref().ok_or("no client")?;
            let token = c
                .fetch_jwt_token([audience.as_str()], None)
                .await
                .map_err(|e| e.to_string())?;
            let parsed = JwtSvid::parse_insecure(&token).map_err(|e| e.to_string())?;
            let exp = UNIX_EPOCH + Duration::from_secs(parsed.claims().exp().max(0) as u64);
            Ok::<_, String>(Token {
                token,
                expires_at: exp,
            })
        }
        .await;
        let wait = match result {
            Ok(token) => {
                let lifetime = token
                    .expires_at
                    .duration_since(SystemTime::now())
                    .unwrap_or_default();
                tracing::debug!(audience = audience.as_str(), lifetime = %text::duration(lifetime), "fetched JWT-SVID");
                tx.send_replace(Some(token));
                backoff = MIN_BACKOFF;
                (lifetime / 2).max(Duration::from_secs(1))
            }
            Err(e) => {
                tracing::warn!(endpoint = %endpoint, error = %e, "cannot fetch JWT-SVID; keeping the current one until it expires");
                if let Ok(mut slot) = last_error.lock() {
                    *slot = Some(e);
                }
                client = None;
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(wait).await;
    }
}

/// Adds the fetcher's current JWT-SVID as a bearer token; fails the call locally
/// (`Unauthenticated`) when there is none.
#[derive(Clone, Debug)]
pub struct JwtInterceptor {
    fetcher: JwtSvidFetcher,
}

impl tonic::service::Interceptor for JwtInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        let token = self.fetcher.token().ok_or_else(|| {
            tonic::Status::unauthenticated(format!(
                "no valid JWT-SVID for audience {}",
                self.fetcher.audience.as_str()
            ))
        })?;
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| tonic::Status::internal("JWT-SVID is not a valid header value"))?;
        request.metadata_mut().insert("authorization", value);
        Ok(request)
    }
}

/// The bearer token of a request's `authorization` header, if any.
pub fn bearer_token(metadata: &tonic::metadata::MetadataMap) -> Option<&str> {
    let value = metadata.get("authorization")?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Principal side: validates JWT-SVIDs against the JWT bundles streamed by the Workload API.
#[derive(Clone)]
pub struct JwtValidator {
    rx: watch::Receiver<Option<Arc<JwtBundles>>>,
    _task: Option<Arc<TaskGuard>>,
}

impl std::fmt::Debug for JwtValidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JwtValidator").finish()
    }
}

impl JwtValidator {
    /// Follows the JWT bundles of the Workload API at `endpoint` (or `SPIFFE_ENDPOINT_SOCKET`),
    /// reconnecting with backoff; waits up to 15 s for the first bundles.
    pub async fn workload_api(endpoint: Option<String>) -> Result<JwtValidator, JwtError> {
        let endpoint = crate::source::resolve_endpoint(endpoint)?;
        let (tx, rx) = watch::channel(None);
        let last_error = Arc::new(Mutex::new(None::<String>));
        let task = tokio::spawn(follow_bundles(endpoint.clone(), tx, last_error.clone()));
        let validator = JwtValidator {
            rx,
            _task: Some(Arc::new(TaskGuard(task))),
        };
        let mut rx = validator.rx.clone();
        match tokio::time::timeout(INITIAL_TIMEOUT, rx.wait_for(|b| b.is_some())).await {
            Ok(Ok(_)) => Ok(validator),
            _ => Err(JwtError::WorkloadApi {
                endpoint,
                reason: format!(
                    "no JWT bundles within {INITIAL_TIMEOUT}: {}",
                    last_error
                        .lock()
                        .ok()
                        .and_then(|e| e.clone())
                        .unwrap_or_else(|| "no answer".into()),
                    INITIAL_TIMEOUT = text::duration(INITIAL_TIMEOUT)
                ),
            }),
        }
    }

    /// A validator with fixed bundles.
    pub fn from_bundles(bundles: JwtBundles) -> JwtValidator {
        let (_tx, rx) = watch::channel(Some(Arc::new(bundles)));
        JwtValidator { rx, _task: None }
    }

    /// Validates `token` for `audience` (our own SPIFFE ID); returns the caller's SPIFFE ID.
    pub fn validate(&self, token: &str, audience: &SpiffeId) -> Result<SpiffeId, JwtError> {
        let bundles = self.rx.borrow().clone().unwrap_or_default();
        bundles.validate(token, audience)
    }
}

async fn follow_bundles(
    endpoint: String,
    tx: watch::Sender<Option<Arc<JwtBundles>>>,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let record = |e: String| {
        tracing::warn!(endpoint = %endpoint, error = %e, "JWT bundle stream failed; keeping the last bundles");
        if let Ok(mut slot) = last_error.lock() {
            *slot = Some(e);
        }
    };
    let mut backoff = MIN_BACKOFF;
    loop {
        match WorkloadApiClient::connect_to(&endpoint).await {
            Ok(client) => match client.stream_jwt_bundles().await {
                Ok(mut stream) => {
                    while let Some(item) = stream.next().await {
                        match item.map_err(|e| e.to_string()).and_then(|set| {
                            JwtBundles::from_spiffe(&set).map_err(|e| e.to_string())
                        }) {
                            Ok(bundles) => {
                                tx.send_replace(Some(Arc::new(bundles)));
                                backoff = MIN_BACKOFF;
                            }
                            Err(e) => {
                                record(e);
                                break;
                            }
                        }
                    }
                }
                Err(e) => record(e.to_string()),
            },
            Err(e) => record(e.to_string()),
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
