//! Principal configuration: what the binary's flags fill in.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_identity::TrustDomain;
use argocd_agent_identity::source::SvidConfig;
use argocd_agent_kubernetes::ClientOptions;
use argocd_agent_mesh::guard::HeaderListenerPolicy;
use argocd_agent_sync::QueueLimits;

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
    /// Restricts which hub objects (of every kind) are watched.
    pub label_selector: Option<String>,
    /// Argo CD's namespace on the hub: where AppProjects, repository Secrets and the GPG
    /// keys ConfigMap live (`--namespace`, as upstream).
    pub argocd_namespace: String,
    /// Managed agents' Applications are chosen by `spec.destination.name` instead of by hub
    /// namespace (`--destination-based-mapping`).
    pub destination_based_mapping: bool,
    /// Agents that get their own label value in per-agent metrics; later ones share `other`.
    pub metrics_max_agent_labels: usize,
    pub create_namespace: bool,
    pub namespace_labels: BTreeMap<String, String>,
    pub metrics_listen: Option<SocketAddr>,
    /// An extra listener for `/healthz` and `/readyz` only (upstream's `--healthz-port`);
    /// both are always served on the metrics listener too.
    pub healthz_listen: Option<SocketAddr>,
    pub max_message_size: usize,
    pub queue: QueueLimits,
    /// A session silent for longer than this is closed (agents send heartbeats).
    pub idle_timeout: Duration,
    /// TLS handshakes in progress at once (a reconnect storm queues beyond this).
    pub max_concurrent_handshakes: usize,
    /// HTTP/2 streams one connection may open at once (an agent needs one or two).
    pub max_concurrent_streams: u32,
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
            argocd_namespace: "argocd".into(),
            destination_based_mapping: false,
            metrics_max_agent_labels: crate::metrics::DEFAULT_MAX_AGENT_LABELS,
            create_namespace: false,
            namespace_labels: BTreeMap::new(),
            metrics_listen: Some(SocketAddr::from(([0, 0, 0, 0], 8000))),
            healthz_listen: None,
            max_message_size: 4 * 1024 * 1024,
            queue: QueueLimits::default(),
            idle_timeout: Duration::from_secs(120),
            max_concurrent_handshakes:
                argocd_agent_identity::transport::DEFAULT_MAX_CONCURRENT_HANDSHAKES,
            max_concurrent_streams: 16,
        }
    }
}
