//! The resource proxy's keys: the HMAC key of the per-agent bearer tokens the cluster
//! secrets carry, and the CA that issues the proxy's serving certificate when no SVID with a
//! DNS SAN serves it. Both live in one hub Secret (`argocd-agent-resource-proxy` in the Argo
//! CD namespace), created by the first principal that needs it, so tokens and CA data in
//! cluster secrets stay valid across restarts and replicas.
//!
//! A token is `rp1.<payload>.<tag>`: the payload is base64url JSON `{"sub": <agent>,
//! "iat": <unix>, "exp": <unix>}` and the tag its HMAC-SHA256 (ring). A token names exactly
//! one agent and expires; nothing else is trusted from it. (Hand-written because a JWT
//! library would pull a second crypto provider for one HMAC.)

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use argocd_agent_domain::{AgentName, TenantName};
use argocd_agent_kubernetes::ObjectStore;
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::ObjectMeta;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType,
};
use ring::hmac;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::{Deserialize, Serialize};

/// Name of the hub Secret holding the keys.
pub const SECRET_NAME: &str = "argocd-agent-resource-proxy";
const TOKEN_PREFIX: &str = "rp1.";
const KEY_FIELD: &str = "token-key";
const CA_CERT_FIELD: &str = "ca.crt";
const CA_KEY_FIELD: &str = "ca.key";
/// Lifetime of the CA the principal makes.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Serving certificates are backdated this much against clock skew.
const BACKDATE: Duration = Duration::from_secs(300);

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not of the form `rp1.<payload>.<tag>`, not decodable, or naming no valid agent.
    #[error("not a resource proxy token")]
    Malformed,
    /// The tag is not the payload's HMAC under this principal's key.
    #[error("the token's signature does not verify")]
    BadSignature,
    /// Its `exp` has passed.
    #[error("the token expired")]
    Expired,
}

/// Failures making or loading the keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A key or certificate could not be made, or the stored data is missing or unusable
    /// (the message says which).
    #[error("resource proxy keys: {0}")]
    Invalid(String),
    /// Reading or creating the hub Secret [`SECRET_NAME`] failed.
    #[error("resource proxy keys: hub Secret {SECRET_NAME}: {0}")]
    Store(#[from] argocd_agent_kubernetes::Error),
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    iat: u64,
    exp: u64,
    /// The agent's tenant when the token was issued (tokens the admin API issues for a
    /// tenant's agent): refused once the agent belongs to another tenant or to none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ten: Option<String>,
}

/// Why a resource proxy request's credential is refused.
#[derive(Debug, thiserror::Error)]
pub enum CredentialRefused {
    /// No `authorization: Bearer <token>` header.
    #[error("a bearer token from the agent's cluster secret is required")]
    Missing,
    /// The token is malformed, forged or expired.
    #[error(transparent)]
    Token(#[from] TokenError),
}

/// The token of an `authorization: Bearer <token>` header (the scheme in any case, RFC 7235
/// section 2.1; one or more spaces after it).
pub(crate) fn bearer_token(headers: &http::HeaderMap) -> Option<&str> {
    bearer(headers.get(http::header::AUTHORIZATION)?.to_str().ok()?)
}

/// The token of an `authorization` header's value `Bearer <token>` (also the gRPC listener's
/// JWT-SVID).
pub(crate) fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    Some(token.trim()).filter(|t| !t.is_empty())
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The one agent it is valid for.
    pub agent: AgentName,
    /// The tenant it was issued under, if it names one.
    pub tenant: Option<TenantName>,
}

/// A minted token and when it expires.
#[derive(Debug, Clone)]
pub struct Token {
    /// The bearer token, `rp1.<payload>.<tag>`.
    pub value: String,
    /// Its `exp`: refused from this instant (whole seconds).
    pub expires: SystemTime,
}

/// The keys.
pub struct ProxyKeys {
    key: hmac::Key,
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn invalid(what: &str) -> impl Fn(rcgen::Error) -> KeyError + '_ {
    move |e| KeyError::Invalid(format!("{what}: {e}"))
}

impl ProxyKeys {
    /// Fresh keys, and the Secret data that stores them.
    pub fn generate() -> Result<(ProxyKeys, BTreeMap<String, ByteString>), KeyError> {
        let mut secret = [0u8; 32];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
            .map_err(|_| KeyError::Invalid("no randomness".into()))?;
        let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(invalid("CA key"))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "argocd-agent resource proxy CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + CA_LIFETIME).into();
        let cert = params.self_signed(&ca_key).map_err(invalid("CA"))?;
        let data = BTreeMap::from([
            (KEY_FIELD.to_owned(), ByteString(secret.to_vec())),
            (
                CA_CERT_FIELD.to_owned(),
                ByteString(cert.pem().into_bytes()),
            ),
            (
                CA_KEY_FIELD.to_owned(),
                ByteString(ca_key.serialize_pem().into_bytes()),
            ),
        ]);
        Ok((Self::from_data(&data)?, data))
    }

    /// Keys from stored Secret data.
    pub fn from_data(data: &BTreeMap<String, ByteString>) -> Result<ProxyKeys, KeyError> {
        let field = |f: &str| {
            data.get(f)
                .map(|b| b.0.clone())
                .ok_or_else(|| KeyError::Invalid(format!("field {f} is missing")))
        };
        let secret = field(KEY_FIELD)?;
        if secret.len() < 32 {
            return Err(KeyError::Invalid(format!(
                "{KEY_FIELD} must hold at least 32 bytes"
            )));
        }
        let text = |f: &str| {
            String::from_utf8(field(f)?).map_err(|_| KeyError::Invalid(format!("{f} is not PEM")))
        };
        let ca_pem = text(CA_CERT_FIELD)?;
        let ca_key = KeyPair::from_pem(&text(CA_KEY_FIELD)?).map_err(invalid(CA_KEY_FIELD))?;
        let ca_der = CertificateDer::from_pem_slice(ca_pem.as_bytes())
            .map_err(|e| KeyError::Invalid(format!("{CA_CERT_FIELD}: {e}")))?;
        let ca = Issuer::from_ca_cert_der(&ca_der, ca_key).map_err(invalid(CA_CERT_FIELD))?;
        Ok(ProxyKeys {
            key: hmac::Key::new(hmac::HMAC_SHA256, &secret),
            ca,
            ca_pem,
        })
    }

    /// Reads the keys from the hub Secret, creating it when absent (a concurrent creator
    /// wins and its keys are read).
    pub async fn load_or_create(
        secrets: &dyn ObjectStore,
        namespace: &str,
    ) -> Result<Self, KeyError> {
        use argocd_agent_kubernetes::{Error, Kind, object};
        for _ in 0..3 {
            if let Some(found) = secrets.get(Some(namespace), SECRET_NAME).await? {
                let secret: Secret = object::typed(found, Kind::Secret)?;
                return Self::from_data(&secret.data.unwrap_or_default());
            }
            let (keys, data) = Self::generate()?;
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(SECRET_NAME.into()),
                    namespace: Some(namespace.into()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/part-of".into(),
                        "argocd-agent".into(),
                    )])),
                    ..ObjectMeta::default()
                },
                data: Some(data),
                ..Secret::default()
            };
            match secrets
                .create(&object::dynamic(&secret, Kind::Secret)?)
                .await
            {
                Ok(_) => {
                    tracing::info!(
                        namespace,
                        secret = SECRET_NAME,
                        "resource proxy keys created"
                    );
                    return Ok(keys);
                }
                Err(Error::AlreadyExists { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(KeyError::Invalid(
            "the Secret kept appearing and disappearing".into(),
        ))
    }

    /// The CA's certificate (PEM): what clients trust when the principal issues the serving
    /// certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A token for `agent`, valid for `ttl` from `now`.
    pub fn mint(&self, agent: &AgentName, ttl: Duration, now: SystemTime) -> Token {
        self.mint_for(agent, None, ttl, now)
    }

    /// A token for `agent` of `tenant`, valid for `ttl` from `now`: refused once the agent
    /// no longer belongs to `tenant`.
    pub fn mint_for(
        &self,
        agent: &AgentName,
        tenant: Option<&TenantName>,
        ttl: Duration,
        now: SystemTime,
    ) -> Token {
        let expires = now + ttl;
        let claims = Claims {
            sub: agent.to_string(),
            iat: unix(now),
            exp: unix(expires),
            ten: tenant.map(|t| t.to_string()),
        };
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap_or_default());
        let tag = hmac::sign(&self.key, payload.as_bytes());
        Token {
            value: format!(
                "{TOKEN_PREFIX}{payload}.{}",
                URL_SAFE_NO_PAD.encode(tag.as_ref())
            ),
            expires: UNIX_EPOCH + Duration::from_secs(claims.exp),
        }
    }

    /// The agent a token names, if it verifies and has not expired at `now`.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<AgentName, TokenError> {
        self.verify_claims(token, now).map(|v| v.agent)
    }

    /// Checks a request's credential at `now`: the bearer token of its `authorization`
    /// header, valid for one agent and unexpired. Returns the token's agent and tenant.
    pub fn authenticate(
        &self,
        headers: &http::HeaderMap,
        now: SystemTime,
    ) -> Result<Verified, CredentialRefused> {
        let token = bearer_token(headers).ok_or(CredentialRefused::Missing)?;
        Ok(self.verify_claims(token, now)?)
    }

    /// The agent and tenant a token names, if it verifies and has not expired at `now`.
    pub fn verify_claims(&self, token: &str, now: SystemTime) -> Result<Verified, TokenError> {
        let rest = token
            .strip_prefix(TOKEN_PREFIX)
            .ok_or(TokenError::Malformed)?;
        let (payload, tag) = rest.split_once('.').ok_or(TokenError::Malformed)?;
        let tag = URL_SAFE_NO_PAD
            .decode(tag)
            .map_err(|_| TokenError::Malformed)?;
        hmac::verify(&self.key, payload.as_bytes(), &tag).map_err(|_| TokenError::BadSignature)?;
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(payload)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(TokenError::Malformed)?;
        if unix(now) >= claims.exp {
            return Err(TokenError::Expired);
        }
        let tenant = match &claims.ten {
            Some(t) => Some(TenantName::new(t).map_err(|_| TokenError::Malformed)?),
            None => None,
        };
        Ok(Verified {
            agent: AgentName::new(&claims.sub).map_err(|_| TokenError::Malformed)?,
            tenant,
        })
    }

    /// A serving certificate for `hostnames` (DNS names or IP addresses), valid for
    /// `lifetime`, signed by the CA.
    pub fn issue_serving(
        &self,
        hostnames: &[String],
        lifetime: Duration,
    ) -> Result<Arc<CertifiedKey>, KeyError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(invalid("key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(
            DnType::CommonName,
            hostnames
                .first()
                .cloned()
                .unwrap_or_else(|| "argocd-agent-resource-proxy".into()),
        );
        params.subject_alt_names = hostnames
            .iter()
            .map(|h| match h.parse::<std::net::IpAddr>() {
                Ok(ip) => Ok(SanType::IpAddress(ip)),
                Err(_) => h
                    .clone()
                    .try_into()
                    .map(SanType::DnsName)
                    .map_err(invalid("DNS name")),
            })
            .collect::<Result<_, _>>()?;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let now = SystemTime::now();
        params.not_before = (now - BACKDATE).into();
        params.not_after = (now + lifetime).into();
        let cert = params
            .signed_by(&key, &self.ca)
            .map_err(invalid("serving certificate"))?;
        let chain = vec![cert.der().clone()];
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = rustls::crypto::ring::sign::any_supported_type(&der)
            .map_err(|e| KeyError::Invalid(format!("serving key: {e}")))?;
        Ok(Arc::new(CertifiedKey::new(chain, signing)))
    }
}

/// The first certificate of a chain as PEM.
pub fn pem(der: &CertificateDer<'_>) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tenant_tests {
    use super::*;

    #[test]
    fn a_tenant_token_carries_its_tenant_and_a_plain_one_none() {
        let (keys, _) = ProxyKeys::generate().unwrap();
        let now = SystemTime::now();
        let agent = AgentName::new("edge-1").unwrap();
        let team = TenantName::new("team-a").unwrap();
        let t = keys.mint_for(&agent, Some(&team), Duration::from_secs(60), now);
        let v = keys.verify_claims(&t.value, now).unwrap();
        assert_eq!((v.agent, v.tenant), (agent.clone(), Some(team)));
        let plain = keys.mint(&agent, Duration::from_secs(60), now);
        assert_eq!(keys.verify_claims(&plain.value, now).unwrap().tenant, None);
        // The tenant is signed: changing it breaks the tag.
        let (payload, tag) = t.value["rp1.".len()..].split_once('.').unwrap();
        let mut claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
        claims["ten"] = "team-b".into();
        let forged = format!(
            "rp1.{}.{tag}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap())
        );
        assert_eq!(
            keys.verify_claims(&forged, now),
            Err(TokenError::BadSignature)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_token_needs_the_bearer_scheme() {
        let mut h = http::HeaderMap::new();
        assert_eq!(bearer_token(&h), None);
        h.insert(http::header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(bearer_token(&h), None);
        h.insert(http::header::AUTHORIZATION, "Bearer  tok ".parse().unwrap());
        assert_eq!(bearer_token(&h), Some("tok"));
        // RFC 7235: the scheme is case-insensitive.
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            h.insert(
                http::header::AUTHORIZATION,
                format!("{scheme} tok").parse().unwrap(),
            );
            assert_eq!(bearer_token(&h), Some("tok"), "{scheme}");
        }
        for bad in ["Bearer", "Bearer ", "Bearertok", "Bearer\ttok"] {
            h.insert(http::header::AUTHORIZATION, bad.parse().unwrap());
            assert_eq!(bearer_token(&h), None, "{bad:?}");
        }
    }

    fn agent(n: &str) -> AgentName {
        AgentName::new(n).unwrap()
    }

    #[test]
    fn a_token_names_its_agent_until_it_expires() {
        let (keys, _) = ProxyKeys::generate().unwrap();
        let now = SystemTime::now();
        let t = keys.mint(&agent("agent-a"), Duration::from_secs(60), now);
        assert!(t.value.starts_with("rp1."));
        assert_eq!(keys.verify(&t.value, now), Ok(agent("agent-a")));
        assert_eq!(
            keys.verify(&t.value, now + Duration::from_secs(61)),
            Err(TokenError::Expired)
        );
    }

    #[test]
    fn a_forged_or_foreign_token_is_refused() {
        let (keys, _) = ProxyKeys::generate().unwrap();
        let (other, _) = ProxyKeys::generate().unwrap();
        let now = SystemTime::now();
        let t = other.mint(&agent("agent-a"), Duration::from_secs(60), now);
        assert_eq!(keys.verify(&t.value, now), Err(TokenError::BadSignature));
        // Swapping the payload for another agent's breaks the signature.
        let mine = keys.mint(&agent("agent-a"), Duration::from_secs(60), now);
        let theirs = keys.mint(&agent("agent-b"), Duration::from_secs(60), now);
        let (_, tag) = mine.value.rsplit_once('.').unwrap();
        let (head, _) = theirs.value.rsplit_once('.').unwrap();
        assert_eq!(
            keys.verify(&format!("{head}.{tag}"), now),
            Err(TokenError::BadSignature)
        );
        for bad in ["", "rp1.", "rp1.x", "Bearer x", "rp1.a.b.c"] {
            assert!(keys.verify(bad, now).is_err(), "{bad}");
        }
    }

    #[test]
    fn stored_keys_verify_tokens_minted_before() {
        let (keys, data) = ProxyKeys::generate().unwrap();
        let now = SystemTime::now();
        let t = keys.mint(&agent("a"), Duration::from_secs(60), now);
        let again = ProxyKeys::from_data(&data).unwrap();
        assert_eq!(again.verify(&t.value, now), Ok(agent("a")));
        assert_eq!(again.ca_pem(), keys.ca_pem());
        let mut short = data.clone();
        short.insert(KEY_FIELD.into(), ByteString(vec![1; 8]));
        assert!(ProxyKeys::from_data(&short).is_err());
    }

    #[test]
    fn the_serving_certificate_names_the_hosts() {
        let (keys, _) = ProxyKeys::generate().unwrap();
        let ck = keys
            .issue_serving(
                &["proxy.argocd.svc".into(), "127.0.0.1".into()],
                Duration::from_secs(3600),
            )
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(ck.cert[0].as_ref()).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        let names = format!("{:?}", san.value.general_names);
        assert!(names.contains("proxy.argocd.svc"), "{names}");
        assert!(
            names.contains("127.0.0.1") || names.contains("[127, 0, 0, 1]"),
            "{names}"
        );
    }
}
