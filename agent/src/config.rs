//! The agent's configuration: what the command line sets, with upstream's defaults.

use std::net::SocketAddr;
use std::time::Duration;

use argocd_agent_domain::AgentMode;
use argocd_agent_identity::source::SvidConfig;
use argocd_agent_kubernetes::ClientOptions;

use crate::dialer::{self, Transport};
use crate::{policy, proxy, redis};

/// Agent configuration.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Managed (the hub owns Applications) or autonomous (this cluster does).
    pub mode: AgentMode,
    /// `host:port` of the principal (or of the local sidecar).
    pub server: String,
    /// How the agent reaches and proves itself to the principal.
    pub transport: Transport,
    /// Argo CD namespace on this cluster.
    pub namespace: String,
    /// How to reach this cluster's Kubernetes API (kubeconfig, context, QPS).
    pub kube: ClientOptions,
    /// Only Applications matching this label selector are synced (`--label-selector`).
    pub label_selector: Option<String>,
    /// How often the agent sends a heartbeat on an idle stream (default 30 s).
    pub heartbeat: Duration,
    /// Periodic resync (`--resync-interval`): while connected, ask the principal for a
    /// resync round this often (stretched to the principal's minimum), so an event lost on
    /// the way is put right without a reconnect. Zero: only at connect.
    pub resync_interval: Duration,
    /// HTTP/2 keepalive ping interval on the connection (default 30 s).
    pub keepalive: Duration,
    /// Compress what the agent sends in this encoding (`--enable-compression`; `None`: sent
    /// uncompressed). Compressed answers of the principal are decoded either way.
    pub compression: Option<dialer::Compression>,
    /// First reconnect wait (default 500 ms); see [`crate::redial::Backoff`].
    pub backoff_initial: Duration,
    /// Longest reconnect wait (default 30 s).
    pub backoff_max: Duration,
    /// Largest gRPC message the agent sends or accepts, in bytes (default 4 MiB).
    pub max_message_size: usize,
    /// `/metrics`, `/healthz` and `/readyz` (default `0.0.0.0:8181`; `None`: off).
    pub metrics_listen: Option<SocketAddr>,
    /// An extra listener for `/healthz` and `/readyz` only (upstream's `--healthz-port`).
    pub healthz_listen: Option<SocketAddr>,
    /// Adoption, source-UID mismatch and recreate policies (managed mode).
    pub policies: policy::Policies,
    /// Destination-based mapping (managed mode): Applications keep their hub namespace on
    /// this cluster (`--destination-based-mapping`, as on the principal).
    pub destination_based_mapping: bool,
    /// Managed mode: Applications an app-of-apps parent creates here are not published to
    /// the hub (`--ignore-unmanaged-apps`).
    pub ignore_unmanaged_apps: bool,
    /// Namespaces besides `namespace` whose Applications the agent takes
    /// (`--allowed-namespaces`: globs and `/regex/`, see [`crate::namespaces`]): with
    /// destination-based mapping, those the principal may write copies into; in autonomous
    /// mode, those whose Applications are published (as `<namespace>.<name>`).
    pub allowed_namespaces: Vec<String>,
    /// Destination-based mapping: create a missing namespace before writing a copy into it
    /// (`--create-namespace`).
    pub create_namespace: bool,
    /// This cluster's Redis, to answer the principal's Redis proxy (`--redis-addr`; `None`:
    /// the agent does not announce the capability).
    pub redis: Option<redis::RedisConfig>,
    /// How often the agent reports its cluster's cache counts (`--cache-refresh-interval`).
    pub cache_refresh_interval: Duration,
    /// Serve the principal's resource proxy (requests, logs, exec; capability
    /// `resource-proxy.v1`).
    pub resource_proxy: bool,
    /// Largest Kubernetes API response body the resource proxy passes on (larger: 502).
    pub resource_proxy_max_body: usize,
    /// Resource proxy requests served at once (and, separately, log and exec streams);
    /// more are answered 429.
    pub resource_proxy_max_concurrent: usize,
    /// How long one resource proxy request may take (504 after).
    pub resource_proxy_timeout: Duration,
    /// The Pod Security Standards level pods created or patched through the resource proxy
    /// are held to (`--resource-proxy-pod-security`, default `baseline`).
    pub resource_proxy_pod_security: proxy::pss::Level,
    /// Reach the principal through an HTTP/1.1 WebSocket, with the SVID mutual TLS inside it
    /// (`--enable-websocket`; mTLS only): for proxies and load balancers without HTTP/2.
    pub websocket: bool,
    /// The spoke guard's sources (`--guard-file`, `--guard-configmap`, `--guard-*` rules;
    /// none: no guard), see [`crate::guard`].
    pub guard: crate::guard::GuardSources,
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
            resync_interval: Duration::ZERO,
            keepalive: Duration::from_secs(30),
            compression: None,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            max_message_size: 4 * 1024 * 1024,
            metrics_listen: Some(SocketAddr::from(([0, 0, 0, 0], 8181))),
            healthz_listen: None,
            policies: policy::Policies::default(),
            destination_based_mapping: false,
            ignore_unmanaged_apps: false,
            allowed_namespaces: Vec::new(),
            create_namespace: false,
            redis: None,
            cache_refresh_interval: Duration::from_secs(10),
            resource_proxy: true,
            resource_proxy_max_body: proxy::DEFAULT_MAX_BODY,
            resource_proxy_max_concurrent: proxy::DEFAULT_MAX_CONCURRENT,
            resource_proxy_timeout: proxy::DEFAULT_TIMEOUT,
            resource_proxy_pod_security: proxy::pss::Level::default(),
            websocket: false,
            guard: crate::guard::GuardSources {
                reload_interval: Duration::from_secs(5),
                ..Default::default()
            },
        }
    }
}
