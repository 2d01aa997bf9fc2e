//! The agent (spoke): dials the principal (never the reverse), pins its SPIFFE ID,
//! reconnects with exponential backoff and jitter, sends heartbeats, and keeps its local
//! Applications in step with the hub in managed or autonomous mode. While disconnected it
//! keeps working; changes are exchanged by resync on reconnect.
#![forbid(unsafe_code)]

pub mod spoke;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use argocd_agent_identity::names::AgentMode;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_identity::transport::ChannelOptions;
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kubernetes::{ClientOptions, Kind, Resources, Scope};
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_proto::eventstream::{self as pb, Hello};
use argocd_agent_sync::event::PROTOCOL_VERSION;
use argocd_agent_sync::{Event, EventType, Payload, QueueLimits, SendQueue};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::spoke::Spoke;

pub use argocd_agent_identity::source::SvidConfig;

/// How the agent reaches the principal.
#[derive(Debug, Clone)]
pub enum Transport {
    /// SVID mutual TLS straight to the principal; the principal must present `principal_id`
    /// (or any ID of `principal_trust_domain` when no ID is pinned).
    Mtls {
        svid: SvidConfig,
        principal_id: Option<SpiffeId>,
        principal_trust_domain: Option<TrustDomain>,
    },
    /// Plaintext HTTP/2 to the local mesh sidecar, which does mTLS (`--creds header:`).
    PlaintextToSidecar,
    /// A JWT-SVID (audience = the principal's SPIFFE ID) from the Workload API as a bearer
    /// token, for principals behind a TLS-terminating ingress. The connection to `server` is
    /// plaintext HTTP/2: run it through a local TLS-originating proxy or sidecar.
    JwtSvid {
        endpoint: Option<String>,
        audience: SpiffeId,
    },
}

/// Agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub mode: AgentMode,
    /// `host:port` of the principal (or of the local sidecar).
    pub server: String,
    pub transport: Transport,
    /// Argo CD namespace on this cluster.
    pub namespace: String,
    pub kube: ClientOptions,
    pub label_selector: Option<String>,
    pub heartbeat: Duration,
    pub keepalive: Duration,
    pub backoff_initial: Duration,
    pub backoff_max: Duration,
    pub max_message_size: usize,
    pub metrics_listen: Option<SocketAddr>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            mode: AgentMode::Managed,
            server: "localhost:8443".into(),
            transport: Transport::Mtls {
                svid: SvidConfig::WorkloadApi { endpoint: None },
                principal_id: None,
                principal_trust_domain: None,
            },
            namespace: "argocd".into(),
            kube: ClientOptions::default(),
            label_selector: None,
            heartbeat: Duration::from_secs(30),
            keepalive: Duration::from_secs(30),
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_message_size: 4 * 1024 * 1024,
            metrics_listen: Some(SocketAddr::from(([0, 0, 0, 0], 8181))),
        }
    }
}

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("kubernetes: {0}")]
    Kube(#[from] argocd_agent_kubernetes::Error),
    #[error("SVID source: {0}")]
    Svid(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("listener {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// One connection attempt's failure.
#[derive(Debug, thiserror::Error)]
enum SessionError {
    #[error("connect: {0}")]
    Connect(String),
    #[error("principal refused the stream: {0}")]
    Status(#[from] tonic::Status),
    #[error("protocol: {0}")]
    Protocol(String),
}

/// A running agent.
pub struct Running {
    pub connected: Arc<AtomicBool>,
    pub spoke: Arc<Spoke>,
    pub metrics_addr: Option<SocketAddr>,
    done: tokio::task::JoinHandle<()>,
}

impl Running {
    pub async fn wait(self) {
        let _ = self.done.await;
    }
}

enum Dialer {
    Mtls {
        config: Arc<rustls::ClientConfig>,
        _source: SvidSource,
    },
    Plain,
    Jwt(argocd_agent_identity::jwt::JwtSvidFetcher),
}

impl Dialer {
    async fn connect(
        &self,
        server: &str,
        keepalive: Duration,
    ) -> Result<tonic::transport::Channel, SessionError> {
        match self {
            Dialer::Mtls { config, .. } => {
                let host = server
                    .rsplit_once(':')
                    .map(|(h, _)| h)
                    .unwrap_or(server)
                    .to_owned();
                let opts = ChannelOptions {
                    keepalive_interval: keepalive,
                    ..ChannelOptions::default()
                };
                argocd_agent_identity::transport::connect(server, config.clone(), &host, opts)
                    .await
                    .map_err(|e| SessionError::Connect(e.to_string()))
            }
            Dialer::Plain | Dialer::Jwt(_) => {
                tonic::transport::Endpoint::from_shared(format!("http://{server}"))
                    .map_err(|e| SessionError::Connect(e.to_string()))?
                    .http2_keep_alive_interval(keepalive)
                    .keep_alive_while_idle(true)
                    .connect_timeout(Duration::from_secs(10))
                    .connect()
                    .await
                    .map_err(|e| SessionError::Connect(e.to_string()))
            }
        }
    }
}

/// Starts the agent; it runs until `shutdown` is cancelled.
pub async fn start(
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<Running, AgentError> {
    let (dialer, source_id) = match &config.transport {
        Transport::Mtls {
            svid,
            principal_id,
            principal_trust_domain,
        } => {
            let source = svid
                .load(Duration::from_secs(30))
                .await
                .map_err(|e| AgentError::Svid(e.to_string()))?;
            let state = source
                .wait_ready(Duration::from_secs(30))
                .await
                .map_err(|e| AgentError::Svid(e.to_string()))?;
            let policy = match (principal_id, principal_trust_domain) {
                (Some(id), _) => PeerPolicy::Exact(id.clone()),
                (None, Some(td)) => PeerPolicy::TrustDomains(vec![td.clone()]),
                (None, None) => {
                    return Err(AgentError::Config(
                        "refusing to connect without pinning the principal: set --principal-spiffe-id (or --principal-trust-domain)".into(),
                    ));
                }
            };
            let config = argocd_agent_identity::tls::client_config(&source, policy)
                .map_err(|e| AgentError::Svid(e.to_string()))?;
            (
                Dialer::Mtls {
                    config,
                    _source: source,
                },
                state.svid.spiffe_id().to_string(),
            )
        }
        Transport::PlaintextToSidecar => (Dialer::Plain, "argocd-agent-agent".to_string()),
        Transport::JwtSvid { endpoint, audience } => {
            let fetcher = argocd_agent_identity::jwt::JwtSvidFetcher::start(
                endpoint.clone(),
                audience.clone(),
            )
            .await
            .map_err(|e| AgentError::Svid(e.to_string()))?;
            (Dialer::Jwt(fetcher), "argocd-agent-agent".to_string())
        }
    };

    let client = argocd_agent_kubernetes::client(&config.kube).await?;
    let mut scope = Scope::namespace(config.namespace.clone());
    if let Some(sel) = &config.label_selector {
        scope = scope.with_label_selector(sel.clone());
    }
    let (cache, changes) = argocd_agent_kubernetes::watch(client.clone(), Kind::Application, scope);
    let spoke = Arc::new(Spoke::new(
        config.mode,
        config.namespace.clone(),
        source_id,
        Resources::new(client, Kind::Application),
        cache,
        SendQueue::new(QueueLimits::default()),
    ));
    {
        let spoke = spoke.clone();
        tokio::spawn(async move {
            futures::pin_mut!(changes);
            while let Some(change) = changes.next().await {
                spoke.on_local_change(change).await;
            }
        });
    }

    let connected = Arc::new(AtomicBool::new(false));
    let metrics_addr = match config.metrics_listen {
        Some(addr) => Some(
            serve_health(addr, connected.clone())
                .await
                .map_err(|source| AgentError::Listen { addr, source })?,
        ),
        None => None,
    };

    let done = {
        let spoke = spoke.clone();
        let connected = connected.clone();
        let span = tracing::info_span!("agent", mode = %config.mode, server = %config.server);
        tokio::spawn(
            async move {
                spoke.cache.wait_synced().await;
                spoke.seed_desired();
                let mut backoff = config.backoff_initial;
                loop {
                    let started = tokio::time::Instant::now();
                    let result = tokio::select! {
                        _ = shutdown.cancelled() => return,
                        r = session(&spoke, &dialer, &config, &connected) => r,
                    };
                    connected.store(false, Ordering::Relaxed);
                    match result {
                        Ok(()) => tracing::info!("stream closed by the principal; reconnecting"),
                        Err(e) => tracing::warn!(error = %e, "connection to principal failed"),
                    }
                    // A session that lasted a while resets the backoff: reconnects stay cheap.
                    if started.elapsed() > Duration::from_secs(30) {
                        backoff = config.backoff_initial;
                    }
                    let jitter = backoff.mul_f64(fastrand::f64() * 0.5);
                    let wait = backoff + jitter;
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                    backoff = (backoff * 2).min(config.backoff_max);
                }
            }
            .instrument(span),
        )
    };
    Ok(Running {
        connected,
        spoke,
        metrics_addr,
        done,
    })
}

async fn session(
    spoke: &Spoke,
    dialer: &Dialer,
    config: &AgentConfig,
    connected: &AtomicBool,
) -> Result<(), SessionError> {
    let channel = dialer.connect(&config.server, config.keepalive).await?;
    let mut client = EventStreamClient::new(channel)
        .max_decoding_message_size(config.max_message_size)
        .max_encoding_message_size(config.max_message_size);
    let (tx, rx) = mpsc::channel(64);
    let mode = match config.mode {
        AgentMode::Managed => pb::AgentMode::Managed,
        AgentMode::Autonomous => pb::AgentMode::Autonomous,
    };
    let hello = Event::new(
        &spoke.source,
        EventType::Hello,
        Payload::Hello(Hello {
            mode: mode as i32,
            version: env!("CARGO_PKG_VERSION").into(),
            protocol_version: PROTOCOL_VERSION,
            capabilities: vec!["resync.v1".into(), "operations.v1".into()],
            state: Some(argocd_agent_sync::resync::to_state(
                "Application",
                &spoke.checksums(),
            )),
        }),
    );
    let _ = tx.send(hello.to_cloud_event()).await;
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Dialer::Jwt(fetcher) = dialer {
        let token = fetcher
            .token()
            .ok_or_else(|| SessionError::Connect("no JWT-SVID yet".into()))?;
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| SessionError::Connect("JWT-SVID is not a valid header value".into()))?;
        request.metadata_mut().insert("authorization", value);
    }
    let mut inbound = client.subscribe(request).await?.into_inner();
    let first = inbound
        .message()
        .await?
        .ok_or_else(|| SessionError::Protocol("stream closed before welcome".into()))?;
    let welcome =
        Event::from_cloud_event(first).map_err(|e| SessionError::Protocol(e.to_string()))?;
    let Payload::Welcome(w) = welcome.payload else {
        return Err(SessionError::Protocol(format!(
            "expected welcome, got {}",
            welcome.ty
        )));
    };
    tracing::info!(agent = %w.agent_name, hub_namespace = %w.namespace, principal_version = %w.version, "connected to principal");
    *spoke
        .hub_namespace
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(w.namespace.clone());
    spoke.queue.requeue_in_flight();
    spoke.after_welcome();
    connected.store(true, Ordering::Relaxed);

    let mut heartbeat = tokio::time::interval(config.heartbeat);
    heartbeat.tick().await;
    loop {
        tokio::select! {
            event = spoke.queue.next() => {
                tx.send(event.to_cloud_event()).await.map_err(|_| SessionError::Protocol("stream closed".into()))?;
            }
            _ = heartbeat.tick() => {
                let ping = Event::new(&spoke.source, EventType::Ping, Payload::None);
                tx.send(ping.to_cloud_event()).await.map_err(|_| SessionError::Protocol("stream closed".into()))?;
            }
            msg = inbound.message() => {
                let Some(ce) = msg? else { return Ok(()) };
                let event = match Event::from_cloud_event(ce) {
                    Ok(e) => e,
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed event from principal ignored");
                        continue;
                    }
                };
                match event.ty {
                    EventType::Processed => {
                        if let Some(id) = &event.ack_id {
                            spoke.queue.ack(id);
                        }
                    }
                    EventType::Error => {
                        if let Payload::Error(d) = &event.payload {
                            tracing::warn!(reason = %d.reason, message = %d.message, event_id = %d.event_id, "principal refused an event");
                        }
                        // A refused event is not retried: the principal gave a final answer.
                        if let Some(id) = &event.ack_id {
                            spoke.queue.ack(id);
                        }
                    }
                    EventType::Pong | EventType::Ping => {}
                    _ => {
                        if let Some(reply) = spoke.on_principal_event(&event).await {
                            tx.send(reply.to_cloud_event()).await.map_err(|_| SessionError::Protocol("stream closed".into()))?;
                        }
                    }
                }
            }
        }
    }
}

/// Serves `/healthz` (503 while disconnected from the principal) and `/metrics`.
async fn serve_health(addr: SocketAddr, connected: Arc<AtomicBool>) -> std::io::Result<SocketAddr> {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let c2 = connected.clone();
    let app = axum::Router::new()
        .route(
            "/healthz",
            get(move || {
                let up = connected.load(Ordering::Relaxed);
                async move {
                    if up {
                        (http::StatusCode::OK, "ok")
                    } else {
                        (http::StatusCode::SERVICE_UNAVAILABLE, "not connected to principal")
                    }
                }
            }),
        )
        .route(
            "/metrics",
            get(move || {
                let up = c2.load(Ordering::Relaxed) as u8;
                async move {
                    format!("# TYPE argocd_agent_agent_connected gauge\nargocd_agent_agent_connected {up}\n# EOF\n")
                }
            }),
        );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(local)
}
