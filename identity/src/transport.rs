//! tonic over our rustls configs. tonic's built-in TLS cannot take a custom rustls config, so
//! the server is fed a stream of already-handshaken TLS streams (`serve_with_incoming`) and
//! the client dials through a connector that does TLS itself (`connect_with_connector`).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_stream::wrappers::ReceiverStream;

/// How long a TLS handshake may take before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Dialing failures.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    /// `host:port` could not become an `http://` URI.
    #[error("invalid principal address {addr:?}: {reason}")]
    InvalidAddress {
        /// The address given.
        addr: String,
        /// Why it is invalid.
        reason: String,
    },
    /// The TLS server name is not a DNS name or IP address.
    #[error("invalid TLS server name {0:?}")]
    InvalidServerName(String),
    /// TCP connect, TLS handshake or HTTP/2 setup failed.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The address dialed.
        addr: String,
        /// The failure.
        #[source]
        source: tonic::transport::Error,
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

/// Accepts TCP connections and runs each TLS handshake in its own task, yielding only
/// completed handshakes: a slow or failed handshake neither blocks others nor ends the
/// server (failures are logged). Feed the result to `Server::serve_with_incoming`.
pub fn tls_incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
) -> impl Stream<Item = Result<tokio_rustls::server::TlsStream<TcpStream>, io::Error>> + Send + 'static
{
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                _ = tx.closed() => return,
                accepted = listener.accept() => accepted,
            };
            let (tcp, remote) = match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    // E.g. out of file descriptors: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(tls)).await;
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(remote = %remote, error = %e, "TLS handshake failed")
                    }
                    Err(_) => {
                        tracing::warn!(remote = %remote, "TLS handshake timed out after {HANDSHAKE_TIMEOUT:?}")
                    }
                }
            });
        }
    });
    ReceiverStream::new(rx)
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

fn endpoint(
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
        .map_err(|source| TransportError::Connect {
            addr: addr.to_string(),
            source,
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
