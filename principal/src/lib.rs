//! The principal (hub): accepts agent streams authenticated by SPIFFE identity, keeps one
//! session per agent, sends hub changes to managed agents, writes what agents report into
//! their hub namespaces, and refuses every event an agent's identity does not allow.
#![forbid(unsafe_code)]

pub mod hub;
pub mod metrics;
pub mod server;
pub mod session;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_identity::TrustDomain;
use argocd_agent_identity::mapping::LiveRules;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_kubernetes::{ClientOptions, Kind, Resources, Scope};
use argocd_agent_mesh::guard::{HeaderListenerPolicy, ListenAddr};
use argocd_agent_mesh::header::HeaderAuth;
use argocd_agent_proto::eventstream::event_stream_server::EventStreamServer;
use argocd_agent_proto::version::version_server::VersionServer;
use argocd_agent_sync::QueueLimits;
use tokio_util::sync::CancellationToken;

use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::server::{Authenticator, EventStreamService, VersionService};

pub use argocd_agent_identity::source::SvidConfig;

/// How agents authenticate.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    /// SVID mutual TLS on the listener.
    Mtls {
        svid: SvidConfig,
        trust_domains: Vec<TrustDomain>,
    },
    /// Identity forwarded by a mesh sidecar in a header, on a plaintext loopback listener.
    Header {
        auth: String,
        policy: HeaderListenerPolicy,
    },
    /// JWT-SVID bearer tokens (audience = `audience`, or the principal's own X.509-SVID ID),
    /// validated against the JWT bundles from the Workload API at `endpoint`. The listener is
    /// plaintext: TLS is terminated by the ingress in front of it.
    Jwt {
        endpoint: Option<String>,
        audience: Option<argocd_agent_identity::SpiffeId>,
    },
}

/// Principal configuration.
#[derive(Debug, Clone)]
pub struct PrincipalConfig {
    pub listen: SocketAddr,
    pub auth: AuthConfig,
    pub rules_file: Option<PathBuf>,
    pub rules: Vec<String>,
    pub rules_poll: Duration,
    pub kube: ClientOptions,
    /// Restricts which hub Applications are watched.
    pub label_selector: Option<String>,
    pub create_namespace: bool,
    pub namespace_labels: BTreeMap<String, String>,
    pub metrics_listen: Option<SocketAddr>,
    pub max_message_size: usize,
    pub queue: QueueLimits,
    /// A session silent for longer than this is closed (agents send heartbeats).
    pub idle_timeout: Duration,
}

impl Default for PrincipalConfig {
    fn default() -> Self {
        PrincipalConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 8443)),
            auth: AuthConfig::Mtls {
                svid: SvidConfig::WorkloadApi { endpoint: None },
                trust_domains: Vec::new(),
            },
            rules_file: None,
            rules: Vec::new(),
            rules_poll: Duration::from_secs(2),
            kube: ClientOptions::default(),
            label_selector: None,
            create_namespace: false,
            namespace_labels: BTreeMap::new(),
            metrics_listen: Some(SocketAddr::from(([0, 0, 0, 0], 8000))),
            max_message_size: 4 * 1024 * 1024,
            queue: QueueLimits::default(),
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// Why the principal could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum PrincipalError {
    #[error("kubernetes: {0}")]
    Kube(#[from] argocd_agent_kubernetes::Error),
    #[error("identity rules: {0}")]
    Rules(String),
    #[error("SVID source: {0}")]
    Svid(String),
    #[error("TLS: {0}")]
    Tls(String),
    #[error("listener {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("header authentication: {0}")]
    Header(String),
    #[error("gRPC server: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A started principal.
pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub hub: Arc<Hub>,
    done: tokio::task::JoinHandle<Result<(), PrincipalError>>,
}

impl Running {
    /// Waits until the server stops.
    pub async fn wait(self) -> Result<(), PrincipalError> {
        match self.done.await {
            Ok(r) => r,
            Err(e) => Err(PrincipalError::Tls(format!("server task failed: {e}"))),
        }
    }
}

async fn load_svid(svid: &SvidConfig) -> Result<SvidSource, PrincipalError> {
    svid.load(Duration::from_secs(30))
        .await
        .map_err(|e| PrincipalError::Svid(e.to_string()))
}

/// Starts the principal; it runs until `shutdown` is cancelled.
pub async fn start(
    config: PrincipalConfig,
    shutdown: CancellationToken,
) -> Result<Running, PrincipalError> {
    let rules = LiveRules::start(
        config.rules_file.clone(),
        config.rules.clone(),
        config.rules_poll,
    )
    .map_err(|e| PrincipalError::Rules(e.to_string()))?;
    if rules.current().is_empty() {
        tracing::warn!(
            "no identity mapping rules configured: every agent will be refused (deny by default)"
        );
    }
    let rules = Arc::new(rules);

    let client = argocd_agent_kubernetes::client(&config.kube).await?;
    let mut scope = Scope::all();
    if let Some(sel) = &config.label_selector {
        scope = scope.with_label_selector(sel.clone());
    }
    let (cache, changes) = argocd_agent_kubernetes::watch(client.clone(), Kind::Application, scope);

    let metrics = Metrics::new();
    let (auth, svid_source) = match &config.auth {
        AuthConfig::Mtls { svid, .. } => (Authenticator::Mtls, Some(load_svid(svid).await?)),
        AuthConfig::Header { auth, policy } => {
            let parsed =
                HeaderAuth::parse(auth).map_err(|e| PrincipalError::Header(e.to_string()))?;
            match argocd_agent_mesh::guard::check_listen_addr(
                &ListenAddr::Tcp(config.listen),
                policy,
            ) {
                Ok(Some(warning)) => {
                    tracing::warn!(%warning, "header authentication on a non-loopback listener")
                }
                Ok(None) => {}
                Err(e) => return Err(PrincipalError::Header(e.to_string())),
            }
            (
                Authenticator::Header {
                    auth: Arc::new(parsed),
                    policy: Arc::new(policy.clone()),
                },
                None,
            )
        }
        AuthConfig::Jwt { .. } => (Authenticator::Mtls, None),
    };
    let (auth, svid_source) = match &config.auth {
        AuthConfig::Jwt { endpoint, audience } => {
            let audience = match audience {
                Some(a) => a.clone(),
                None => {
                    let src = load_svid(&SvidConfig::WorkloadApi {
                        endpoint: endpoint.clone(),
                    })
                    .await?;
                    let id = src.current().map(|s| s.svid.spiffe_id().clone());
                    id.ok_or_else(|| {
                        PrincipalError::Svid("no X.509-SVID to take the JWT audience from".into())
                    })?
                }
            };
            let validator =
                argocd_agent_identity::jwt::JwtValidator::workload_api(endpoint.clone())
                    .await
                    .map_err(|e| PrincipalError::Svid(e.to_string()))?;
            tracing::info!(%audience, "accepting JWT-SVID bearer tokens");
            (
                Authenticator::Jwt {
                    validator: Arc::new(validator),
                    audience,
                },
                None,
            )
        }
        _ => (auth, svid_source),
    };
    let source_id = svid_source
        .as_ref()
        .and_then(|s| s.current())
        .map(|s| s.svid.spiffe_id().to_string())
        .unwrap_or_else(|| "argocd-agent-principal".into());

    let hub = Arc::new(Hub {
        source: source_id,
        apps: Resources::new(client.clone(), Kind::Application),
        namespaces: Resources::new(client.clone(), Kind::Namespace),
        cache,
        agents: Mutex::new(Default::default()),
        by_namespace: Mutex::new(Default::default()),
        metrics: metrics.clone(),
        queue_limits: config.queue.clone(),
        create_namespace: config.create_namespace,
        namespace_labels: config.namespace_labels.clone(),
    });
    tokio::spawn(hub::run_hub_watch(hub.clone(), changes));

    // Sessions whose identity no longer maps (rules changed) are closed.
    {
        let h1 = hub.clone();
        let h2 = hub.clone();
        rules.on_revoked(
            Arc::new(move || h1.connected_identities()),
            Arc::new(move |identity, why| {
                tracing::warn!(agent = %identity.agent, spiffe_id = %identity.spiffe_id, reason = %why,
                    "identity no longer maps: closing session");
                h2.disconnect(identity.agent.as_str());
            }),
        );
    }

    let metrics_addr = match config.metrics_listen {
        Some(addr) => Some(
            metrics::serve(addr, metrics.clone())
                .await
                .map_err(|source| PrincipalError::Listen { addr, source })?,
        ),
        None => None,
    };

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|source| PrincipalError::Listen {
            addr: config.listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| PrincipalError::Listen {
            addr: config.listen,
            source,
        })?;

    let svc = EventStreamService {
        hub: hub.clone(),
        rules: rules.clone(),
        auth: auth.clone(),
        idle_timeout: config.idle_timeout,
    };
    let events = EventStreamServer::new(svc)
        .max_decoding_message_size(config.max_message_size)
        .max_encoding_message_size(config.max_message_size);
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(events)
        .add_service(VersionServer::new(VersionService));

    tracing::info!(%addr, auth = ?config.auth, "principal listening");
    let done = match &config.auth {
        AuthConfig::Mtls { trust_domains, .. } => {
            let policy = if trust_domains.is_empty() {
                PeerPolicy::Any
            } else {
                PeerPolicy::TrustDomains(trust_domains.clone())
            };
            let source =
                svid_source.ok_or_else(|| PrincipalError::Svid("no SVID source".into()))?;
            let tls = argocd_agent_identity::tls::server_config(&source, policy)
                .map_err(|e| PrincipalError::Tls(e.to_string()))?;
            let incoming = argocd_agent_identity::transport::tls_incoming(listener, tls);
            tokio::spawn(async move {
                let _keep = source;
                router
                    .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                    .await
                    .map_err(PrincipalError::from)
            })
        }
        AuthConfig::Header { .. } | AuthConfig::Jwt { .. } => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            tokio::spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                    .await
                    .map_err(PrincipalError::from)
            })
        }
    };
    Ok(Running {
        addr,
        metrics_addr,
        hub,
        done,
    })
}
