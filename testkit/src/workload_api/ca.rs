//! A development CA per trust domain (ECDSA P-256, rcgen) that issues X.509-SVIDs the way
//! SPIRE does, plus an ES256 key for JWT-SVIDs. Keys live as PEM files in a directory so a
//! restarted server keeps the same trust bundle.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};
use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair, KeyPair as _};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use super::DevServerError;
use argocd_agent_identity::id::{SpiffeId, TrustDomain};
use argocd_agent_identity::svid::{SvidError, X509Svid};

/// Lifetime of a freshly created dev CA certificate.
const CA_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Backdating of notBefore to tolerate small clock differences between processes.
const BACKDATE: Duration = Duration::from_secs(60);

/// A development certificate authority for one trust domain.
pub struct DevCa {
    trust_domain: TrustDomain,
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    jwt_key: EcdsaKeyPair,
    jwt_pkcs8: Vec<u8>,
    jwt_kid: String,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa")
            .field("trust_domain", &self.trust_domain.as_str())
            .field("jwt_kid", &self.jwt_kid)
            .finish()
    }
}

/// An X.509-SVID issued by a [`DevCa`]: chain is leaf + CA.
pub struct IssuedSvid {
    /// The SPIFFE ID in the leaf's URI SAN.
    pub spiffe_id: SpiffeId,
    /// Leaf first, then the CA certificate.
    pub chain: Vec<CertificateDer<'static>>,
    /// PKCS#8 DER private key of the leaf.
    pub key: PrivatePkcs8KeyDer<'static>,
    /// Leaf notAfter.
    pub not_after: SystemTime,
}

impl Clone for IssuedSvid {
    fn clone(&self) -> Self {
        Self {
            spiffe_id: self.spiffe_id.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            not_after: self.not_after,
        }
    }
}

impl std::fmt::Debug for IssuedSvid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedSvid")
            .field("spiffe_id", &self.spiffe_id.as_str())
            .field("not_after", &self.not_after)
            .finish()
    }
}

impl IssuedSvid {
    /// The chain as PEM (leaf first).
    pub fn chain_pem(&self) -> String {
        self.chain
            .iter()
            .map(|c| pem("CERTIFICATE", c.as_ref()))
            .collect()
    }

    /// The key as PKCS#8 PEM.
    pub fn key_pem(&self) -> String {
        pem("PRIVATE KEY", self.key.secret_pkcs8_der())
    }

    /// As the crate's SVID type (for [`argocd_agent_identity::source::SvidSource::fixed`]).
    pub fn to_x509_svid(&self) -> Result<X509Svid, SvidError> {
        X509Svid::new(
            self.chain.clone(),
            PrivateKeyDer::Pkcs8(self.key.clone_key()),
        )
    }
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

fn rcgen_err(what: &str) -> impl Fn(rcgen::Error) -> DevServerError + '_ {
    move |e| DevServerError::Ca(format!("{what}: {e}"))
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    time::OffsetDateTime::from(t)
}

fn random_serial() -> SerialNumber {
    // Positive 16-byte serial (top bit cleared) as RFC 5280 asks.
    let mut bytes: Vec<u8> = (0..16).map(|_| fastrand::u8(..)).collect();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

impl DevCa {
    /// An in-memory CA (tests).
    pub fn ephemeral(trust_domain: TrustDomain) -> Result<DevCa, DevServerError> {
        let ca_key =
            KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(rcgen_err("generate CA key"))?;
        let jwt_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rcgen_err("generate JWT key"))?;
        let cert = Self::self_sign(&trust_domain, &ca_key)?;
        Self::assemble(trust_domain, ca_key, cert, &jwt_key.serialize_der())
    }

    /// Loads the CA of `trust_domain` from `dir/<trust-domain>/`, creating it if missing.
    pub fn load_or_create(dir: &Path, trust_domain: TrustDomain) -> Result<DevCa, DevServerError> {
        let td_dir = dir.join(trust_domain.as_str());
        let key_path = td_dir.join("ca.key.pem");
        let cert_path = td_dir.join("ca.crt.pem");
        let jwt_path = td_dir.join("jwt.key.pem");
        let io = |p: &PathBuf| {
            let p = p.display().to_string();
            move |e: std::io::Error| DevServerError::Io {
                path: p.clone(),
                reason: e.to_string(),
            }
        };
        if key_path.exists() && cert_path.exists() && jwt_path.exists() {
            let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
            let ca_key = KeyPair::from_pem(&key_pem)
                .map_err(|e| DevServerError::Ca(format!("{}: {e}", key_path.display())))?;
            let cert = CertificateDer::from_pem_file(&cert_path)
                .map_err(|e| DevServerError::Ca(format!("{}: {e}", cert_path.display())))?;
            let jwt_der = PrivatePkcs8KeyDer::from_pem_file(&jwt_path)
                .map_err(|e| DevServerError::Ca(format!("{}: {e}", jwt_path.display())))?;
            return Self::assemble(trust_domain, ca_key, cert, jwt_der.secret_pkcs8_der());
        }
        std::fs::create_dir_all(&td_dir).map_err(io(&td_dir))?;
        let ca = Self::ephemeral(trust_domain)?;
        write_private(&key_path, &ca.issuer.key().serialize_pem()).map_err(io(&key_path))?;
        std::fs::write(&cert_path, pem("CERTIFICATE", ca.cert.as_ref())).map_err(io(&cert_path))?;
        write_private(&jwt_path, &ca.jwt_key_pem()).map_err(io(&jwt_path))?;
        tracing::info!(trust_domain = ca.trust_domain.as_str(), dir = %td_dir.display(), "created development CA");
        Ok(ca)
    }

    fn self_sign(
        trust_domain: &TrustDomain,
        key: &KeyPair,
    ) -> Result<CertificateDer<'static>, DevServerError> {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(
            DnType::CommonName,
            format!("{} dev CA", trust_domain.as_str()),
        );
        params
            .distinguished_name
            .push(DnType::OrganizationName, "argocd-agent development");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        // SPIFFE CA certificates carry the trust domain's ID as URI SAN.
        let td_uri = format!("spiffe://{}", trust_domain.as_str());
        params.subject_alt_names = vec![SanType::URI(
            td_uri.try_into().map_err(rcgen_err("CA URI SAN"))?,
        )];
        let now = SystemTime::now();
        params.not_before = offset(now - BACKDATE);
        params.not_after = offset(now + CA_LIFETIME);
        params.serial_number = Some(random_serial());
        let cert = params.self_signed(key).map_err(rcgen_err("self-sign CA"))?;
        Ok(cert.der().clone())
    }

    fn assemble(
        trust_domain: TrustDomain,
        ca_key: KeyPair,
        cert: CertificateDer<'static>,
        jwt_pkcs8: &[u8],
    ) -> Result<DevCa, DevServerError> {
        let issuer =
            Issuer::from_ca_cert_der(&cert, ca_key).map_err(rcgen_err("CA certificate"))?;
        let rng = ring::rand::SystemRandom::new();
        let jwt_key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, jwt_pkcs8, &rng)
            .map_err(|e| DevServerError::Ca(format!("JWT signing key: {e}")))?;
        let digest = ring::digest::digest(&ring::digest::SHA256, jwt_key.public_key().as_ref());
        let jwt_kid = URL_SAFE_NO_PAD.encode(&digest.as_ref()[..16]);
        Ok(DevCa {
            trust_domain,
            issuer,
            cert,
            jwt_key,
            jwt_pkcs8: jwt_pkcs8.to_vec(),
            jwt_kid,
        })
    }

    fn jwt_key_pem(&self) -> String {
        pem("PRIVATE KEY", &self.jwt_pkcs8)
    }

    /// The trust domain this CA issues for.
    pub fn trust_domain(&self) -> &TrustDomain {
        &self.trust_domain
    }

    /// The CA certificate (the trust bundle of this trust domain).
    pub fn certificate(&self) -> &CertificateDer<'static> {
        &self.cert
    }

    /// The CA certificate as PEM.
    pub fn certificate_pem(&self) -> String {
        pem("CERTIFICATE", self.cert.as_ref())
    }

    /// Issues an X.509-SVID for `id` valid from now (backdated a minute) for `ttl`.
    pub fn issue_x509(&self, id: &SpiffeId, ttl: Duration) -> Result<IssuedSvid, DevServerError> {
        let now = SystemTime::now();
        self.issue_x509_valid(id, now - BACKDATE, now + ttl)
    }

    /// Issues an X.509-SVID with an explicit validity window (e.g. an already expired one).
    /// The ID does not have to belong to this CA's trust domain (to test refusals).
    pub fn issue_x509_valid(
        &self,
        id: &SpiffeId,
        not_before: SystemTime,
        not_after: SystemTime,
    ) -> Result<IssuedSvid, DevServerError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(rcgen_err("generate SVID key"))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::OrganizationName, "argocd-agent development");
        // Leaf rules strict verifiers enforce: one URI SAN, CA:false, digitalSignature only.
        params.subject_alt_names = vec![SanType::URI(
            id.as_str()
                .to_string()
                .try_into()
                .map_err(rcgen_err("SVID URI SAN"))?,
        )];
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        params.not_before = offset(not_before);
        params.not_after = offset(not_after);
        params.serial_number = Some(random_serial());
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(rcgen_err("sign SVID"))?;
        // X.509 times have second precision.
        let not_after_secs = not_after
            .duration_since(UNIX_EPOCH)
            .map(|d| UNIX_EPOCH + Duration::from_secs(d.as_secs()))
            .unwrap_or(UNIX_EPOCH);
        Ok(IssuedSvid {
            spiffe_id: id.clone(),
            chain: vec![cert.der().clone(), self.cert.clone()],
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
            not_after: not_after_secs,
        })
    }

    /// The JWT authority key ID.
    pub fn jwt_key_id(&self) -> &str {
        &self.jwt_kid
    }

    /// This trust domain's JWT bundle as a JWKS document.
    pub fn jwks(&self) -> Vec<u8> {
        let point = self.jwt_key.public_key().as_ref();
        // Uncompressed SEC1 point: 0x04 || x (32 bytes) || y (32 bytes).
        let (x, y) = point[1..].split_at(32);
        serde_json::to_vec(&serde_json::json!({
            "keys": [{
                "kty": "EC",
                "crv": "P-256",
                "x": URL_SAFE_NO_PAD.encode(x),
                "y": URL_SAFE_NO_PAD.encode(y),
                "kid": self.jwt_kid,
                "use": "jwt-svid",
            }]
        }))
        .unwrap_or_default()
    }

    /// Issues an ES256 JWT-SVID for `id` and `audience`, valid for `ttl`.
    pub fn issue_jwt(
        &self,
        id: &SpiffeId,
        audience: &[String],
        ttl: Duration,
    ) -> Result<String, DevServerError> {
        let now = SystemTime::now();
        self.issue_jwt_at(id, audience, now, now + ttl)
    }

    /// Issues a JWT-SVID with explicit `iat` and `exp` (e.g. an expired one).
    pub fn issue_jwt_at(
        &self,
        id: &SpiffeId,
        audience: &[String],
        issued_at: SystemTime,
        expires_at: SystemTime,
    ) -> Result<String, DevServerError> {
        let secs = |t: SystemTime| {
            t.duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0)
        };
        self.sign_jwt(&serde_json::json!({
            "sub": id.as_str(),
            "aud": audience,
            "exp": secs(expires_at),
            "iat": secs(issued_at),
        }))
    }

    /// Signs arbitrary `claims` as an ES256 JWT with this trust domain's JWT key (for tests of
    /// claims the issuing helpers do not set, such as `nbf`).
    pub fn sign_jwt(&self, claims: &serde_json::Value) -> Result<String, DevServerError> {
        let header = serde_json::json!({"alg": "ES256", "kid": self.jwt_kid, "typ": "JWT"});
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let rng = ring::rand::SystemRandom::new();
        let sig = self
            .jwt_key
            .sign(&rng, signing_input.as_bytes())
            .map_err(|e| DevServerError::Ca(format!("sign JWT-SVID: {e}")))?;
        Ok(format!(
            "{signing_input}.{}",
            URL_SAFE_NO_PAD.encode(sig.as_ref())
        ))
    }
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(contents.as_bytes())
}
