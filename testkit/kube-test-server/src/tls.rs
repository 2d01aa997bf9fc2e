//! HTTPS, as a cluster serves it: a CA made at start (rcgen, ECDSA P-256) signs the serving
//! certificate for `127.0.0.1`/`localhost` and, when client certificates are required, one
//! client certificate per kubeconfig user. kubectl (client-go) sends bearer tokens only over
//! TLS, so TLS is what lets the server demand credentials from every client.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// A TLS handshake that takes longer than this is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshaken connections waiting for the HTTP server to take them.
const ACCEPT_QUEUE: usize = 128;

fn err(what: &str) -> impl Fn(rcgen::Error) -> std::io::Error + '_ {
    move |e| std::io::Error::other(format!("{what}: {e}"))
}

/// The server's CA and TLS configuration.
pub struct ServerTls {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    acceptor: TlsAcceptor,
    /// Whether the handshake demands a client certificate signed by the CA.
    pub require_client_cert: bool,
}

/// A PEM certificate and its PKCS#8 key, for a kubeconfig's `client-certificate-data`.
pub struct ClientCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl ServerTls {
    /// A new CA and serving certificate.
    pub fn new(require_client_cert: bool) -> std::io::Result<Self> {
        let ca_key = KeyPair::generate().map_err(err("generate CA key"))?;
        let mut ca = CertificateParams::default();
        ca.distinguished_name
            .push(DnType::CommonName, "kube-test-server-ca");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_cert = ca.self_signed(&ca_key).map_err(err("self-sign CA"))?;
        let ca_pem = ca_cert.pem();
        let ca_der = ca_cert.der().clone();
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate().map_err(err("generate serving key"))?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into().map_err(err("DNS SAN"))?),
            SanType::IpAddress([127, 0, 0, 1].into()),
            SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(err("sign serving certificate"))?;

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?;
        let builder = if require_client_cert {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(ca_der.clone()).map_err(std::io::Error::other)?;
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(std::io::Error::other)?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder
            .with_single_cert(
                vec![cert.der().clone(), ca_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
            )
            .map_err(std::io::Error::other)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            issuer,
            ca_pem,
            ca_der,
            acceptor: TlsAcceptor::from(Arc::new(config)),
            require_client_cert,
        })
    }

    /// The CA certificate (PEM), for `certificate-authority-data`.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate (DER), for clients configured in code.
    pub fn ca_der(&self) -> &[u8] {
        self.ca_der.as_ref()
    }

    /// A client certificate for `user` (subject CN = user, as the apiserver reads it).
    pub fn client_cert(&self, user: &str) -> std::io::Result<ClientCert> {
        let key = KeyPair::generate().map_err(err("generate client key"))?;
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, user);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(err("sign client certificate"))?;
        Ok(ClientCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Accepts TCP connections on `tcp` and hands their TLS streams to the HTTP server;
    /// handshakes run in their own tasks so a slow client cannot hold up others.
    pub fn listen(&self, tcp: TcpListener) -> std::io::Result<TlsListener> {
        let addr = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(ACCEPT_QUEUE);
        let acceptor = self.acceptor.clone();
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = tcp.accept() => match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            tracing::debug!(error = %e, "kube test server: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    // The HTTP server stopped and dropped the listener.
                    _ = tx.closed() => return,
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "kube test server: TLS handshake failed")
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "kube test server: TLS handshake timed out")
                        }
                    }
                });
            }
        });
        Ok(TlsListener { rx, addr })
    }
}

/// The TLS side of the listening socket, for `axum::serve`.
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    addr: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(x) => x,
            // The acceptor task is gone (it only ends once this listener is dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.addr)
    }
}
