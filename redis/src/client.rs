//! A small Redis connection: TCP or TLS (rustls with ring, as everywhere in this project),
//! optional AUTH, commands and frames. The agent reads its cluster's Redis with it; the
//! principal's proxy uses [`RedisEndpoint::connect_io`] for its hub Redis leg. (The
//! maintained Redis clients pull in a second TLS stack or crypto provider.)

use argocd_agent_domain::quoted;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::TcpStream;

use super::resp::{self, Frame, FrameReader, Protocol, RespError};

/// A byte stream to Redis (TCP or TLS over TCP).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync + 'static> Io for T {}

/// How long connecting (TCP and TLS) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why TLS cannot be set up from PEM files. Messages carry their cause (no `source`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFileError {
    /// A PEM file cannot be read or parsed.
    #[error("{}: {cause}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: rustls_pki_types::pem::Error,
    },
    /// rustls refuses a certificate or key of a file.
    #[error("{}: {cause}", path.display())]
    Tls {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: rustls::Error,
    },
    /// A CA file with no certificate.
    #[error("{}: no CA certificate", path.display())]
    NoCa {
        /// The file.
        path: PathBuf,
    },
    /// The server name is not a valid DNS name or IP address.
    #[error("{}: {cause}", quoted(.name))]
    ServerName {
        /// The name.
        name: String,
        /// Why.
        cause: rustls_pki_types::InvalidDnsNameError,
    },
}

/// TLS towards a Redis server.
#[derive(Clone)]
pub struct RedisTls {
    /// The client config: trusted roots, no client certificate.
    pub config: Arc<rustls::ClientConfig>,
    /// Name the server's certificate must match (also sent as SNI).
    pub server_name: ServerName<'static>,
}

impl std::fmt::Debug for RedisTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisTls({:?})", self.server_name)
    }
}

impl RedisTls {
    /// TLS that trusts the CA certificates in PEM file `ca` and expects `server_name`;
    /// `builder` brings the TLS versions and suites (the process's TLS profile, TLS 1.3
    /// only unless configured).
    pub fn from_ca_file(
        ca: &Path,
        server_name: &str,
        builder: rustls::ConfigBuilder<rustls::ClientConfig, rustls::WantsVerifier>,
    ) -> Result<RedisTls, TlsFileError> {
        let mut roots = rustls::RootCertStore::empty();
        let pem = |cause| TlsFileError::Pem {
            path: ca.to_owned(),
            cause,
        };
        let certs = rustls_pki_types::CertificateDer::pem_file_iter(ca).map_err(pem)?;
        for cert in certs {
            let cert = cert.map_err(pem)?;
            roots.add(cert).map_err(|cause| TlsFileError::Tls {
                path: ca.to_owned(),
                cause,
            })?;
        }
        if roots.is_empty() {
            return Err(TlsFileError::NoCa {
                path: ca.to_owned(),
            });
        }
        let config = builder.with_root_certificates(roots).with_no_client_auth();
        let server_name = ServerName::try_from(server_name.to_owned()).map_err(|cause| {
            TlsFileError::ServerName {
                name: server_name.to_owned(),
                cause,
            }
        })?;
        Ok(RedisTls {
            config: Arc::new(config),
            server_name,
        })
    }
}

/// Where a Redis server is and how to log in.
#[derive(Clone, Debug, Default)]
pub struct RedisEndpoint {
    /// `host:port`.
    pub addr: String,
    /// ACL user for AUTH; `None` authenticates with the password alone.
    pub username: Option<String>,
    /// AUTH password; `None` sends no AUTH.
    pub password: Option<String>,
    /// TLS over the TCP connection; `None` is plaintext.
    pub tls: Option<RedisTls>,
}

impl RedisEndpoint {
    /// Opens the byte stream (TCP, then TLS when configured); no command is sent.
    pub async fn connect_io(&self) -> std::io::Result<Box<dyn Io>> {
        let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&self.addr))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        tcp.set_nodelay(true)?;
        match &self.tls {
            None => Ok(Box::new(tcp)),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
                let stream = tokio::time::timeout(
                    CONNECT_TIMEOUT,
                    connector.connect(tls.server_name.clone(), tcp),
                )
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
                Ok(Box::new(stream))
            }
        }
    }

    /// Connects and logs in (AUTH when a password is set).
    pub async fn connect(&self, limit: usize) -> Result<RedisConn, RespError> {
        let io = self.connect_io().await?;
        let (r, w) = tokio::io::split(io);
        let mut conn = RedisConn {
            reader: FrameReader::new(r, limit),
            writer: w,
        };
        if let Some(password) = &self.password {
            let reply = match &self.username {
                Some(user) => {
                    conn.command(&[b"AUTH", user.as_bytes(), password.as_bytes()])
                        .await?
                }
                None => conn.command(&[b"AUTH", password.as_bytes()]).await?,
            };
            if reply.is_error() {
                let msg = reply.error_text();
                return Err(RespError::Refused(format!("AUTH: {msg}")));
            }
        }
        Ok(conn)
    }
}

/// A RESP2 connection to Redis.
pub struct RedisConn {
    reader: FrameReader<ReadHalf<Box<dyn Io>>>,
    writer: WriteHalf<Box<dyn Io>>,
}

impl RedisConn {
    /// Sends a command without waiting for the reply.
    pub async fn send(&mut self, args: &[&[u8]]) -> Result<(), RespError> {
        self.writer.write_all(&resp::command(args)).await?;
        self.writer.flush().await?;
        Ok(())
    }

    /// The next frame from the server (an error at end of stream).
    pub async fn next(&mut self) -> Result<Frame, RespError> {
        self.reader
            .next(Protocol::Resp2)
            .await?
            .ok_or_else(|| RespError::Io(std::io::ErrorKind::UnexpectedEof.into()))
    }

    /// Sends a command and reads its reply.
    pub async fn command(&mut self, args: &[&[u8]]) -> Result<Frame, RespError> {
        self.send(args).await?;
        self.next().await
    }
}

/// TLS for a Redis-speaking listener from a PEM certificate chain and key (read once at
/// start); `builder` brings the TLS versions and suites (the process's TLS profile).
pub fn server_tls(
    cert: &Path,
    key: &Path,
    builder: rustls::ConfigBuilder<rustls::ServerConfig, rustls::WantsVerifier>,
) -> Result<Arc<rustls::ServerConfig>, TlsFileError> {
    let pem = |path: &Path| {
        let path = path.to_owned();
        move |cause| TlsFileError::Pem { path, cause }
    };
    let chain = rustls_pki_types::CertificateDer::pem_file_iter(cert)
        .map_err(pem(cert))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem(cert))?;
    let key_der = rustls_pki_types::PrivateKeyDer::from_pem_file(key).map_err(pem(key))?;
    let config = builder
        .with_no_client_auth()
        .with_single_cert(chain, key_der)
        .map_err(|cause| TlsFileError::Tls {
            path: cert.to_owned(),
            cause,
        })?;
    Ok(Arc::new(config))
}
