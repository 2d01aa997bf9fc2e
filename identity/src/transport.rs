//! tonic over our rustls configs. tonic's built-in TLS cannot take a custom rustls config, so
//! the server is fed a stream of already-handshaken TLS streams (`serve_with_incoming`) and
//! the client dials through a connector that does TLS itself (`connect_with_connector`).
//!
//! The accept side is the listener crate's bounded accept loop
//! ([`argocd_agent_listener::Bounded`]: caps, readiness, handshake and preface timeouts);
//! this module supplies its TLS handshake ([`SvidHandshake`]), which reads the client's
//! verified identity ([`VerifiedPeer`]) once per connection and carries it into every
//! request made on it, so handlers never parse certificates again.

use crate::text::{self, quoted};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use std::net::SocketAddr;

use argocd_agent_listener::{Bounded, H2Connection, Handshake, IncomingOptions, Refused};
use futures::Stream;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use crate::peer::{
    PeerError, VerifiedPeer, VerifiedStream, fingerprint, not_after_from_chain, peer_spiffe_id,
    spiffe_id_from_chain, verified_peer,
};

/// The TLS handshake of the SVID listeners, for the listener crate's accept loop: the
/// client must present an SVID the config's verifier accepts, whose SPIFFE ID and
/// fingerprint are then read once ([`VerifiedStream`]). Failures are logged with the
/// client's address and counted as `HandshakeFailed` or `NoUsableSvid`.
#[derive(Clone)]
pub struct SvidHandshake {
    acceptor: TlsAcceptor,
}

impl SvidHandshake {
    /// The handshake with `config` (a [`crate::tls::server_config`]).
    pub fn new(config: Arc<rustls::ServerConfig>) -> SvidHandshake {
        SvidHandshake {
            acceptor: TlsAcceptor::from(config),
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static> Handshake<IO> for SvidHandshake {
    type Output = VerifiedStream<IO>;
    const NAME: &'static str = "TLS handshake";

    fn handshake(
        &self,
        io: IO,
        remote: Option<SocketAddr>,
    ) -> impl Future<Output = Result<VerifiedStream<IO>, Refused>> + Send {
        let acceptor = self.acceptor.clone();
        async move {
            // TLS listeners are TCP ones: the client's address is known.
            let remote = remote.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
            let started = std::time::Instant::now();
            let tls = acceptor.accept(io).await.map_err(|e| {
                tracing::warn!(remote = %remote, error = %e, "TLS handshake failed");
                Refused::new("HandshakeFailed", e.to_string())
            })?;
            VerifiedStream::new(tls, remote, started.elapsed()).map_err(|e| {
                tracing::warn!(remote = %remote, error = %e, "TLS client without a usable SVID dropped");
                Refused::new("NoUsableSvid", e.to_string())
            })
        }
    }
}

/// Dialing failures.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `host:port` could not become an `http://` URI.
    #[error("invalid principal address {addr}: {reason}", addr = quoted(.addr))]
    InvalidAddress {
        /// The address given.
        addr: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The TLS server name is not a DNS name or IP address.
    #[error("invalid TLS server name {q0}", q0 = quoted(.0))]
    InvalidServerName(String),
    /// TCP connect, TLS handshake or HTTP/2 setup failed. The message carries the cause's
    /// whole chain, so it is no `source` (a chain would print it twice).
    #[error("cannot connect to {addr}: {}", text::error_chain(.cause))]
    Connect {
        /// The address dialed.
        addr: String,
        /// The failure.
        cause: tonic::transport::Error,
    },
}

/// HTTP/2 channel settings. Keepalive pings keep mesh and ingress idle timeouts from killing
/// quiet streams and detect dead peers.
#[derive(Clone, Debug)]
pub struct ChannelOptions {
    /// Interval between HTTP/2 PINGs.
    pub keepalive_interval: Duration,
    /// How long to wait for a PING acknowledgement before closing the connection.
    pub keepalive_timeout: Duration,
    /// TCP connect timeout.
    pub connect_timeout: Duration,
}

impl Default for ChannelOptions {
    fn default() -> Self {
        Self {
            keepalive_interval: Duration::from_secs(30),
            keepalive_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

/// Accepts TCP connections on `tasks` until `shutdown` and runs each TLS handshake in its
/// own task, yielding only completed handshakes whose client presented a verified SVID and
/// then sent the HTTP/2 client preface within [`argocd_agent_listener::PREFACE_TIMEOUT`]: a
/// slow or failed handshake neither blocks others nor ends the server (failures are logged
/// with the peer address). At most
/// [`argocd_agent_listener::DEFAULT_MAX_CONCURRENT_HANDSHAKES`] handshakes run at once.
/// Feed the result to `Server::serve_with_incoming`; handlers find the [`VerifiedPeer`] in
/// request extensions.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<H2Connection<VerifiedStream>, io::Error>> + Send + 'static {
    tls_incoming_with_options(
        listener,
        config,
        IncomingOptions::default(),
        tasks,
        shutdown,
    )
}

/// Reasons [`IncomingOptions::on_refused`] is called with on an SVID listener: those of the
/// listener crate's accept loop ([`argocd_agent_listener::REFUSED_REASONS`]: handshake
/// timeout or failure, no HTTP/2 client preface in time, the caps, not ready), and
/// `NoUsableSvid` (the handshake gave no usable SVID) or, with `--enable-websocket`,
/// `WebSocketRefused` (the WebSocket upgrade the TLS runs in failed).
pub const REFUSED_REASONS: [&str; 9] = [
    "HandshakeTimeout",
    "HandshakeFailed",
    "NoUsableSvid",
    "NoPreface",
    "WebSocketRefused",
    "TooManyConnections",
    "TooManyFromClient",
    "NotReady",
    "Busy",
];

/// [`tls_incoming`] with explicit limits.
pub fn tls_incoming_with_options(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    opts: IncomingOptions,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> impl Stream<Item = Result<H2Connection<VerifiedStream>, io::Error>> + Send + 'static {
    let name = listener_name(&listener);
    Bounded::new(listener, &opts, &name, SvidHandshake::new(config)).incoming(tasks, shutdown)
}

/// The agent listener's name in log lines.
pub(crate) fn listener_name(listener: &TcpListener) -> String {
    listener.local_addr().map_or_else(
        |_| "agent listener".to_owned(),
        |a| format!("agent listener {a}"),
    )
}

/// A tower connector that dials TCP to the URI's host and port and runs the TLS handshake
/// with `config`, for `Endpoint::connect_with_connector(_lazy)` (the endpoint URI is
/// `http://host:port`; TLS is done here).
#[derive(Clone)]
pub struct SvidConnector {
    tls: TlsConnector,
    server_name: ServerName<'static>,
}

/// Builds a [`SvidConnector`]. `server_name` is sent as SNI; the server is authenticated by its
/// SPIFFE ID (the config's policy), not by this name. Falls back to `localhost` if the name is
/// not a valid DNS name or IP address.
pub fn connector(config: Arc<rustls::ClientConfig>, server_name: String) -> SvidConnector {
    let server_name = ServerName::try_from(server_name.clone()).unwrap_or_else(|_| {
        tracing::warn!(name = %server_name, "TLS server name is not a DNS name or IP; sending \"localhost\"");
        ServerName::try_from("localhost").expect("localhost is a valid DNS name")
    });
    SvidConnector {
        tls: TlsConnector::from(config),
        server_name,
    }
}

impl tower::Service<http::Uri> for SvidConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, io::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let tls = self.tls.clone();
        let name = self.server_name.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}"))
                })?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            let port = uri.port_u16().unwrap_or(443);
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            let _ = tcp.set_nodelay(true);
            let stream = tls.connect(name, tcp).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

pub(crate) fn endpoint(
    addr: &str,
    opts: &ChannelOptions,
) -> Result<tonic::transport::Endpoint, TransportError> {
    let invalid = |reason: String| TransportError::InvalidAddress {
        addr: addr.to_string(),
        reason,
    };
    if addr.contains("://") {
        return Err(invalid("expected host:port without a scheme".into()));
    }
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| invalid(e.to_string()))?
            .connect_timeout(opts.connect_timeout)
            .http2_keep_alive_interval(opts.keepalive_interval)
            .keep_alive_timeout(opts.keepalive_timeout)
            .keep_alive_while_idle(true)
            .tcp_nodelay(true),
    )
}

/// Dials `addr` (`host:port`) over TLS with `config` and returns a connected channel. With TLS
/// 1.3 a server that refuses our certificate is only noticed on the first RPC.
pub async fn connect(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    opts: ChannelOptions,
) -> Result<tonic::transport::Channel, TransportError> {
    endpoint(addr, &opts)?
        .connect_with_connector(connector(config, server_name.to_string()))
        .await
        .map_err(|cause| TransportError::Connect {
            addr: addr.to_string(),
            cause,
        })
}

/// Like [`connect`] but dials on first use (and redials after failures).
pub fn connect_lazy(
    addr: &str,
    config: Arc<rustls::ClientConfig>,
    server_name: &str,
    opts: ChannelOptions,
) -> Result<tonic::transport::Channel, TransportError> {
    Ok(endpoint(addr, &opts)?
        .connect_with_connector_lazy(connector(config, server_name.to_string())))
}

/// Whether a gRPC status only says the connection went away (the peer process exited, the
/// network or a proxy cut it) rather than that the peer refused something: logs then say
/// "connection lost" instead of blaming the peer.
pub fn is_connection_loss(status: &tonic::Status) -> bool {
    use std::error::Error as _;
    if !matches!(
        status.code(),
        tonic::Code::Unknown
            | tonic::Code::Unavailable
            | tonic::Code::Cancelled
            | tonic::Code::Internal
    ) {
        return false;
    }
    let mut text = status.message().to_ascii_lowercase();
    let mut cur = status.source();
    while let Some(e) = cur {
        text.push(' ');
        text.push_str(&e.to_string().to_ascii_lowercase());
        cur = e.source();
    }
    [
        "h2 protocol error",
        "connection reset",
        "broken pipe",
        "transport error",
        "connection closed",
        "error reading a body from connection",
        "stream no longer needed",
        "unexpected eof",
    ]
    .iter()
    .any(|needle| text.contains(needle))
}

impl TransportError {
    /// Whether the principal took nothing of the attempt: the dial was refused (no process
    /// listens at the address, or a Service with no ready endpoint rejects it), or the
    /// connection was reset before the channel was up, which is how a principal turns a
    /// connection away before TLS (not ready yet, or no handshake slot within
    /// `--max-handshake-wait`). Such an attempt cost the principal an accept at most,
    /// unlike a handshake that timed out (which ends with the client's own timeout).
    pub fn is_refused(&self) -> bool {
        match self {
            TransportError::Connect { cause, .. } => is_refused(cause),
            _ => false,
        }
    }
}

/// Whether `err` or one of its sources is the I/O error "connection refused" or
/// "connection reset" (see [`TransportError::is_refused`]).
pub fn is_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.downcast_ref::<io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused | io::ErrorKind::ConnectionReset
            )
        }) {
            return true;
        }
        cur = e.source();
    }
    false
}

#[cfg(test)]
mod connection_loss_tests {
    use super::is_connection_loss;
    use std::sync::Arc;

    /// A port nobody listens on refuses the dial, and the error says so; a dial that
    /// reached a listener (which then closed before TLS) is no refusal.
    #[tokio::test]
    async fn a_dial_nothing_accepts_is_refused() {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let config = Arc::new(config);
        let opts = || super::ChannelOptions {
            connect_timeout: std::time::Duration::from_secs(5),
            ..Default::default()
        };
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = closed.local_addr().unwrap().to_string();
        drop(closed);
        let err = super::connect(&addr, config.clone(), "localhost", opts())
            .await
            .unwrap_err();
        assert!(err.is_refused(), "{err}");
        // Accepted, then closed (an end of stream mid-handshake): the TCP connection was
        // made and the server gave up on it, no refusal.
        let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = open.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut c, _)) = open.accept().await {
                tokio::spawn(async move {
                    let mut hello = [0u8; 5];
                    let _ = c.read_exact(&mut hello).await;
                    let _ = c.shutdown().await;
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                });
            }
        });
        let err = super::connect(&addr, config.clone(), "localhost", opts())
            .await
            .unwrap_err();
        assert!(!err.is_refused(), "{err}");
        // Accepted, then reset before TLS: how a principal turns a connection away (not
        // ready, or no handshake slot in time): told as a refusal.
        let resetting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = resetting.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((c, _)) = resetting.accept().await {
                tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                let _ = c.set_zero_linger();
                drop(c);
            }
        });
        let err = super::connect(&addr, config, "localhost", opts())
            .await
            .unwrap_err();
        assert!(err.is_refused(), "{err}");
    }

    #[test]
    fn transport_failures_are_connection_loss_and_refusals_are_not() {
        assert!(is_connection_loss(&tonic::Status::unknown(
            "h2 protocol error: error reading a body from connection"
        )));
        assert!(is_connection_loss(&tonic::Status::unavailable(
            "transport error"
        )));
        assert!(!is_connection_loss(&tonic::Status::permission_denied(
            "h2 protocol error"
        )));
        assert!(!is_connection_loss(&tonic::Status::unavailable(
            "principal shutting down"
        )));
    }
}

#[cfg(test)]
mod peer_tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
    use rustls_pki_types::CertificateDer;

    fn cert(uris: &[&str], ca: bool) -> CertificateDer<'static> {
        let mut params = CertificateParams::default();
        params.subject_alt_names = uris
            .iter()
            .map(|u| SanType::URI(u.to_string().try_into().unwrap()))
            .collect();
        params.is_ca = if ca {
            IsCa::Ca(BasicConstraints::Unconstrained)
        } else {
            IsCa::ExplicitNoCa
        };
        let key = KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    #[test]
    fn single_spiffe_uri_san_is_the_peer_id() {
        let id = spiffe_id_from_chain(&[cert(&["spiffe://example.org/agent"], false)]).unwrap();
        assert_eq!(id.as_str(), "spiffe://example.org/agent");
    }

    #[test]
    fn not_after_is_read_from_the_leaf() {
        // rcgen's default validity ends on 4096-01-01T00:00:00Z.
        let t = not_after_from_chain(&[cert(&["spiffe://example.org/agent"], false)]).unwrap();
        let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 67_090_118_400);
        assert_eq!(not_after_from_chain(&[]), None);
        assert_eq!(
            not_after_from_chain(&[CertificateDer::from(vec![1, 2, 3])]),
            None
        );
    }

    #[test]
    fn leaf_with_zero_or_two_uri_sans_is_refused() {
        assert_eq!(
            spiffe_id_from_chain(&[cert(&[], false)]),
            Err(PeerError::UriSanCount(0))
        );
        assert_eq!(
            spiffe_id_from_chain(&[cert(
                &["spiffe://example.org/a", "spiffe://example.org/b"],
                false
            )]),
            Err(PeerError::UriSanCount(2))
        );
    }

    #[test]
    fn non_spiffe_uri_and_ca_leaf_are_refused() {
        assert!(matches!(
            spiffe_id_from_chain(&[cert(&["https://example.org/agent"], false)]),
            Err(PeerError::NotSpiffe { .. })
        ));
        assert_eq!(
            spiffe_id_from_chain(&[cert(&["spiffe://example.org/agent"], true)]),
            Err(PeerError::LeafIsCa("spiffe://example.org/agent".into()))
        );
        assert_eq!(spiffe_id_from_chain(&[]), Err(PeerError::NoCertificate));
        assert!(matches!(
            spiffe_id_from_chain(&[CertificateDer::from(vec![1, 2, 3])]),
            Err(PeerError::Unparsable(_))
        ));
    }

    #[test]
    fn request_without_tls_info_has_no_peer_id() {
        let request = tonic::Request::new(());
        assert_eq!(peer_spiffe_id(&request), Err(PeerError::NoCertificate));
    }
}
