//! How the agent reaches the principal: SVID mutual TLS pinned to the principal's SPIFFE
//! ID (straight on TCP, or inside an HTTP/1.1 WebSocket with `--enable-websocket`),
//! plaintext to a local mesh sidecar, or a JWT-SVID bearer token through a
//! TLS-terminating ingress.

use argocd_agent_identity::text::quoted;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_identity::jwt::JwtSvidFetcher;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_identity::transport::ChannelOptions;

use crate::error::{AgentError, SessionError};
use argocd_agent_identity::source::SvidConfig;
use argocd_agent_identity::{SpiffeId, TrustDomain};

/// How the agent reaches the principal.
#[derive(Debug, Clone)]
pub enum Transport {
    /// SVID mutual TLS straight to the principal; the principal must present `principal_id`
    /// (or any ID of `principal_trust_domain` when no ID is pinned).
    Mtls {
        /// Where the agent's X.509-SVID comes from (Workload API or PEM files).
        svid: SvidConfig,
        /// The principal's SPIFFE ID the handshake must present (`--principal-spiffe-id`).
        principal_id: Option<SpiffeId>,
        /// Any principal of this trust domain, when no ID is pinned.
        principal_trust_domain: Option<TrustDomain>,
    },
    /// Plaintext HTTP/2 to the local mesh sidecar, which does mTLS (`--creds header:`).
    PlaintextToSidecar,
    /// A JWT-SVID (audience = the principal's SPIFFE ID) from the Workload API as a bearer
    /// token, for principals behind a TLS-terminating ingress. The connection to `server` is
    /// plaintext HTTP/2: run it through a local TLS-originating proxy or sidecar.
    JwtSvid {
        /// The Workload API endpoint (`None`: `SPIFFE_ENDPOINT_SOCKET`).
        endpoint: Option<String>,
        /// The token's audience: the principal's SPIFFE ID.
        audience: SpiffeId,
    },
}

/// gRPC message compression the agent asks for (`--enable-compression`,
/// `--compression-algorithm`). The agent always decodes both; the principal always decodes
/// both, and answers in the agent's first accepted encoding when it compresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    /// gzip: what upstream's agent sends, decoded by every gRPC implementation (default).
    #[default]
    Gzip,
    /// Zstandard: smaller and cheaper on CPU than gzip; needs a principal of this project
    /// (upstream's principal decodes gzip only).
    Zstd,
}

impl Compression {
    /// The tonic encoding.
    pub fn encoding(self) -> tonic::codec::CompressionEncoding {
        match self {
            Compression::Gzip => tonic::codec::CompressionEncoding::Gzip,
            Compression::Zstd => tonic::codec::CompressionEncoding::Zstd,
        }
    }

    /// The encodings the agent accepts, in order of preference (`grpc-accept-encoding`):
    /// `preferred` first (gzip when the agent does not compress), then the other.
    pub fn accepted(preferred: Option<Compression>) -> [Compression; 2] {
        match preferred.unwrap_or_default() {
            Compression::Gzip => [Compression::Gzip, Compression::Zstd],
            Compression::Zstd => [Compression::Zstd, Compression::Gzip],
        }
    }
}

/// A compression algorithm other than `gzip` or `zstd`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown compression algorithm {q0} (gzip or zstd)", q0 = quoted(.0))]
pub struct UnknownCompression(pub String);

impl std::str::FromStr for Compression {
    type Err = UnknownCompression;
    fn from_str(s: &str) -> Result<Self, UnknownCompression> {
        match s {
            "gzip" => Ok(Compression::Gzip),
            "zstd" => Ok(Compression::Zstd),
            _ => Err(UnknownCompression(s.to_owned())),
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
        })
    }
}

/// Sets a generated gRPC client's compression: sends in `$compression` when set, accepts
/// both encodings (`$compression` first) in every case.
#[macro_export]
macro_rules! compressed_client {
    ($client:expr, $compression:expr) => {{
        let compression: Option<$crate::dialer::Compression> = $compression;
        let [first, second] = $crate::dialer::Compression::accepted(compression);
        let client = $client
            .accept_compressed(first.encoding())
            .accept_compressed(second.encoding());
        match compression {
            Some(c) => client.send_compressed(c.encoding()),
            None => client,
        }
    }};
}

/// How long start-up waits for the agent's own SVID.
const SVID_TIMEOUT: Duration = Duration::from_secs(30);

/// A ready-to-dial transport, built once at start.
pub enum Dialer {
    /// SVID mutual TLS to the principal, pinned to its SPIFFE ID or trust domain.
    Mtls {
        /// The client TLS config: the SVID resolver and the principal's peer policy.
        config: Arc<rustls::ClientConfig>,
        /// Feeds every handshake's certificate: kept while the agent runs (`None`: the
        /// config holds a fixed SVID, as a simulated agent's does).
        source: Option<SvidSource>,
        /// The TLS runs inside an HTTP/1.1 WebSocket (`--enable-websocket`).
        websocket: bool,
    },
    /// Plaintext HTTP/2 to the local mesh sidecar, which does mTLS.
    Plain,
    /// A JWT-SVID bearer token on a plaintext HTTP/2 connection (through a TLS-originating
    /// proxy or sidecar).
    Jwt(JwtSvidFetcher),
}

impl Dialer {
    /// The X.509-SVID source of an mTLS dialer.
    pub fn svid(&self) -> Option<&SvidSource> {
        match self {
            Dialer::Mtls { source, .. } => source.as_ref(),
            _ => None,
        }
    }

    /// An mTLS dialer over a ready client config (its certificate resolver supplies the
    /// SVID; its verifier pins the principal): what the load generator's simulated agents
    /// dial with.
    pub fn mtls(config: Arc<rustls::ClientConfig>) -> Dialer {
        Dialer::Mtls {
            config,
            source: None,
            websocket: false,
        }
    }

    /// The same dialer with its TLS carried in a WebSocket when `on`
    /// (`--enable-websocket`); refused for the plaintext transports, whose identity comes
    /// from the sidecar or the ingress in front of the principal.
    pub fn over_websocket(self, on: bool) -> Result<Dialer, AgentError> {
        match self {
            Dialer::Mtls { config, source, .. } => Ok(Dialer::Mtls {
                config,
                source,
                websocket: on,
            }),
            plain if !on => Ok(plain),
            _ => Err(AgentError::Config(
                "--enable-websocket carries SVID mutual TLS inside the WebSocket: it needs --creds spiffe".into(),
            )),
        }
    }

    /// Builds the dialer for `transport`; returns it with the CloudEvents `source` the
    /// agent's events carry (its SPIFFE ID when it has an X.509-SVID).
    pub async fn from_transport(transport: &Transport) -> Result<(Dialer, String), AgentError> {
        match transport {
            Transport::Mtls {
                svid,
                principal_id,
                principal_trust_domain,
            } => {
                let policy = match (principal_id, principal_trust_domain) {
                    (Some(id), _) => PeerPolicy::Exact(id.clone()),
                    (None, Some(td)) => PeerPolicy::TrustDomains(vec![td.clone()]),
                    (None, None) => {
                        return Err(AgentError::Config(
                            "refusing to connect without pinning the principal: set --principal-spiffe-id (or --principal-trust-domain)".into(),
                        ));
                    }
                };
                let source = svid.load(SVID_TIMEOUT).await.map_err(AgentError::Svid)?;
                let state = source
                    .wait_ready(SVID_TIMEOUT)
                    .await
                    .map_err(AgentError::Svid)?;
                let config = argocd_agent_identity::tls::client_config(&source, policy)
                    .map_err(AgentError::Tls)?;
                Ok((
                    Dialer::Mtls {
                        config,
                        source: Some(source),
                        websocket: false,
                    },
                    state.svid.spiffe_id().to_string(),
                ))
            }
            Transport::PlaintextToSidecar => Ok((Dialer::Plain, "argocd-agent-agent".into())),
            Transport::JwtSvid { endpoint, audience } => {
                let fetcher = JwtSvidFetcher::start(endpoint.clone(), audience.clone())
                    .await
                    .map_err(AgentError::Jwt)?;
                Ok((Dialer::Jwt(fetcher), "argocd-agent-agent".into()))
            }
        }
    }

    /// Opens an HTTP/2 channel to `server` (`host:port`).
    pub async fn connect(
        &self,
        server: &str,
        keepalive: Duration,
    ) -> Result<tonic::transport::Channel, SessionError> {
        match self {
            Dialer::Mtls {
                config, websocket, ..
            } => {
                // SNI only; the principal is authenticated by its SPIFFE ID.
                let host = server.rsplit_once(':').map_or(server, |(h, _)| h);
                let opts = ChannelOptions {
                    keepalive_interval: keepalive,
                    ..ChannelOptions::default()
                };
                if *websocket {
                    // WebSocket pings at the keepalive interval keep idle proxies from
                    // cutting the connection.
                    let ws = argocd_agent_identity::websocket::WsOptions {
                        ping_interval: keepalive,
                        ..Default::default()
                    };
                    return Ok(argocd_agent_identity::websocket::connect(
                        server,
                        config.clone(),
                        host,
                        opts,
                        ws,
                    )
                    .await?);
                }
                Ok(
                    argocd_agent_identity::transport::connect(server, config.clone(), host, opts)
                        .await?,
                )
            }
            Dialer::Plain | Dialer::Jwt(_) => Ok(tonic::transport::Endpoint::from_shared(
                format!("http://{server}"),
            )?
            .http2_keep_alive_interval(keepalive)
            .keep_alive_while_idle(true)
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await?),
        }
    }

    /// Adds the credentials this transport sends with the stream request.
    pub fn authorize<T>(&self, request: &mut tonic::Request<T>) -> Result<(), SessionError> {
        if let Dialer::Jwt(fetcher) = self {
            let token = fetcher.token().ok_or(SessionError::NoToken)?;
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| SessionError::BadToken)?;
            request.metadata_mut().insert("authorization", value);
        }
        Ok(())
    }
}
