//! The command line of `argocd-agent` (principal and agent): the clap definitions and their
//! conversion to the principal's and the agent's configuration. The binary runs them;
//! `argocd-agentctl validate` parses the same flags offline.

use argocd_agent_identity::text::quoted;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_domain::AgentMode;
use argocd_agent_identity::source::SvidConfig;
use argocd_agent_identity::tls::TlsProfile;
use argocd_agent_identity::{SpiffeId, TrustDomain};
use argocd_agent_kubernetes::ClientOptions;
use argocd_agent_mesh::guard::HeaderListenerPolicy;
use clap::{Args, Parser, Subcommand};

mod error;
pub use error::{ArgError, DurationError, ListenError};

/// `argocd-agent`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "argocd-agent",
    version = crate::version::text(),
    about = "SPIFFE-native argocd-agent: principal and agent"
)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The two roles of the binary.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the principal (hub side).
    Principal(Box<PrincipalArgs>),
    /// Run the agent (spoke side).
    Agent(Box<AgentArgs>),
}

/// Where the Kubernetes API is, and how fast to call it.
#[derive(Debug, Args)]
pub struct KubeArgs {
    /// Path to a kubeconfig (default: KUBECONFIG, in-cluster, ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context in the kubeconfig.
    #[arg(long)]
    pub kube_context: Option<String>,
    /// Client-side rate limit towards the Kubernetes API (watches: ten times this, on a
    /// bucket of their own, as they list in pages a tenth of client-go's).
    #[arg(long, default_value_t = argocd_agent_kubernetes::DEFAULT_QPS)]
    pub kube_qps: f32,
    /// Requests above --kube-qps allowed at once.
    #[arg(long, default_value_t = argocd_agent_kubernetes::DEFAULT_BURST)]
    pub kube_burst: u32,
}

impl KubeArgs {
    fn options(&self) -> ClientOptions {
        ClientOptions {
            kubeconfig: self.kubeconfig.clone(),
            context: self.kube_context.clone(),
            qps: self.kube_qps,
            burst: self.kube_burst,
        }
    }
}

/// Where the workload's X.509-SVID comes from: the Workload API or PEM files.
#[derive(Debug, Args)]
pub struct SvidArgs {
    /// SPIFFE Workload API socket (default: SPIFFE_ENDPOINT_SOCKET). `--spire-agent-socket`
    /// is upstream's name for it (argocd-agent PR #1049).
    #[arg(
        long,
        env = "SPIFFE_ENDPOINT_SOCKET",
        visible_alias = "spire-agent-socket"
    )]
    pub spiffe_endpoint_socket: Option<String>,
    /// SVID certificate chain (PEM) instead of the Workload API.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// SVID private key (PEM).
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Trust bundle(s) (PEM), `[trust-domain=]path`, repeatable.
    #[arg(long = "root-ca")]
    pub root_ca: Vec<String>,
}

/// TLS versions and cipher suites of every listener and dialer of the process (upstream's
/// flags and spellings; docs/spiffe.md, "TLS versions").
#[derive(Debug, Args)]
pub struct TlsVersionArgs {
    /// Lowest TLS version spoken: `tls1.3` (default) or `tls1.2` (TLS 1.2 and 1.3).
    /// `tls1.1` and older are refused.
    #[arg(long)]
    pub tls_min_version: Option<String>,
    /// Highest TLS version spoken: `tls1.3` (default) or `tls1.2`.
    #[arg(long)]
    pub tls_max_version: Option<String>,
    /// Cipher suites (IANA names, comma-separated, e.g. `TLS_AES_128_GCM_SHA256`,
    /// `TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384`); a list naming only suites of one version
    /// leaves the other's alone. Default: all AEAD suites of the versions allowed.
    #[arg(long, value_delimiter = ',')]
    pub tls_ciphersuites: Vec<String>,
}

impl TlsVersionArgs {
    /// The profile these settings ask for.
    pub fn profile(
        &self,
    ) -> Result<argocd_agent_identity::tls::TlsProfile, argocd_agent_identity::tls::ProfileError>
    {
        argocd_agent_identity::tls::TlsProfile::from_settings(
            self.tls_min_version.as_deref(),
            self.tls_max_version.as_deref(),
            &self.tls_ciphersuites,
        )
    }
}

fn parse_bundles(list: &[String]) -> Result<Vec<(Option<TrustDomain>, PathBuf)>, ArgError> {
    list.iter()
        .map(|s| match s.split_once('=') {
            Some((td, path)) => Ok((
                Some(TrustDomain::new(td).map_err(ArgError::TrustDomain)?),
                PathBuf::from(path),
            )),
            None => Ok((None, PathBuf::from(s))),
        })
        .collect()
}

/// `argocd-agent principal`.
#[derive(Debug, Args)]
pub struct PrincipalArgs {
    /// Address the agent listener binds.
    #[arg(long, env = "ARGOCD_PRINCIPAL_LISTEN_HOST", default_value = "0.0.0.0")]
    pub listen_host: IpAddr,
    /// Port of the agent listener (gRPC).
    #[arg(long, env = "ARGOCD_PRINCIPAL_LISTEN_PORT", default_value_t = 8443)]
    pub listen_port: u16,
    /// `spiffe` (SVID mTLS, default), `mtls:uri:<regex>` (SVID mTLS plus an upstream-style
    /// mapping rule), `jwt-svid` (JWT-SVID bearer tokens behind a TLS-terminating ingress),
    /// or header auth behind a mesh: `header:istio`, `header:envoy`, `header:linkerd`,
    /// `header:<name>:<regex>`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AUTH", default_value = "spiffe")]
    pub auth: String,
    /// Upstream's SPIRE switch (argocd-agent PR #1049): `mtls` is `--auth spiffe`, `jwt` is
    /// `--auth jwt-svid`. Refused when it contradicts an explicit `--auth`.
    #[arg(long, value_parser = ["mtls", "jwt"])]
    pub spire_auth_method: Option<String>,
    /// With `--auth jwt-svid`: the audience tokens must carry (default: the principal's own
    /// X.509-SVID ID).
    #[arg(long, env = "ARGOCD_PRINCIPAL_JWT_AUDIENCE")]
    pub jwt_audience: Option<String>,
    /// Identity mapping rules file (YAML), reloaded live.
    #[arg(long, env = "ARGOCD_PRINCIPAL_IDENTITY_RULES")]
    pub identity_rules: Option<PathBuf>,
    /// Extra mapping rules (see docs/identity.md), evaluated after the file's.
    #[arg(long = "identity-rule")]
    pub identity_rule: Vec<String>,
    /// Accept client SVIDs only from these trust domains (default: any with a bundle).
    #[arg(long = "trust-domain")]
    pub trust_domain: Vec<String>,
    /// The principal's SVID.
    #[command(flatten)]
    pub svid: SvidArgs,
    /// TLS versions and cipher suites.
    #[command(flatten)]
    pub tls: TlsVersionArgs,
    /// The hub's Kubernetes API.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Only hub objects (Applications, AppProjects, repository Secrets, GPG keys, cluster
    /// Secrets, Leases) matching this label selector are synced; its `k=v` terms label
    /// every object the principal creates, so two principals with different selectors
    /// never touch each other's objects (docs/migration-guide.md).
    #[arg(long, env = "ARGOCD_PRINCIPAL_LABEL_SELECTOR")]
    pub label_selector: Option<String>,
    /// The agent hub namespaces this principal serves and watches Applications in: globs
    /// (`agents-*`) or `/regex/`, comma-separated or repeated (default: every namespace).
    /// Agents whose rule maps them to another namespace are refused at connect.
    #[arg(
        long,
        value_delimiter = ',',
        env = "ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES"
    )]
    pub allowed_namespaces: Vec<String>,
    /// Argo CD's namespace on the hub: where AppProjects, repository Secrets and
    /// `argocd-gpg-keys-cm` live.
    #[arg(long, env = "ARGOCD_PRINCIPAL_NAMESPACE", default_value = "argocd")]
    pub namespace: String,
    /// Managed agents' Applications are chosen by `spec.destination.name` (any hub
    /// namespace) instead of by the agent's hub namespace. Set it on the agents too.
    #[arg(long, env = "ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING")]
    pub destination_based_mapping: bool,
    /// Per-agent metric labels for at most this many agents; later agents share the label
    /// value `other`, so series stay bounded with thousands of agents.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_METRICS_MAX_AGENT_LABELS",
        default_value_t = 100
    )]
    pub metrics_max_agent_labels: usize,
    /// Create an agent's hub namespace on its first connect.
    #[arg(long, env = "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE")]
    pub namespace_create_enable: bool,
    /// Labels for created namespaces, `k=v`, repeatable or comma-separated.
    #[arg(long = "namespace-create-label", value_delimiter = ',')]
    pub namespace_create_label: Vec<String>,
    /// Trusted proxy addresses allowed to send identity headers (header auth).
    #[arg(long = "header-auth-trusted-proxy")]
    pub header_auth_trusted_proxy: Vec<IpAddr>,
    /// Allow header auth on a non-loopback listener (dangerous; warns at every start).
    #[arg(long)]
    pub insecure_header_auth_any_address: bool,
    /// Address of the `/metrics`, `/healthz` and `/readyz` listener (the pod IP in the
    /// manifests, loopback when only a local sidecar scrapes).
    /// Default: `$POD_IP`, else 127.0.0.1 (never all interfaces unless set).
    #[arg(long, env = "ARGOCD_PRINCIPAL_METRICS_HOST")]
    pub metrics_host: Option<IpAddr>,
    /// Port of the metrics and health listener; 0 turns it off.
    #[arg(long, env = "ARGOCD_PRINCIPAL_METRICS_PORT", default_value_t = 8000)]
    pub metrics_port: u16,
    /// Also serve `/healthz` and `/readyz` on this port (upstream's `--healthz-port`; 0: only
    /// on the metrics port). Binds `--metrics-host`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_HEALTH_CHECK_PORT", default_value_t = 0)]
    pub healthz_port: u16,
    /// Operator API (`argocd-agentctl agent ...`): loopback `host:port` or `unix:///path`;
    /// `off` turns it off. Plaintext and unauthenticated: local operators only (kubectl exec
    /// or port-forward); a non-loopback address is refused.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ADMIN_ADDRESS", default_value = argocd_agent_principal::config::DEFAULT_ADMIN_ADDRESS)]
    pub admin_address: String,
    /// Maximum gRPC message size in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_message_size: usize,
    /// Compress what the principal sends (gzip or zstd, the agent's first accepted). Off,
    /// only agents that compress their own stream get compressed answers. Compressed agents
    /// are accepted either way. `--enable-compression[=true|false]`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_COMPRESSION", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_value = "false",
        default_missing_value = "true", ignore_case = true, value_parser = boolean_values())]
    pub enable_compression: bool,
    /// Also take agents over an HTTP/1.1 WebSocket on the agent listener (same port; the
    /// SVID mutual TLS runs inside it): for proxies and load balancers without HTTP/2.
    /// Needs `--auth spiffe`. `--enable-websocket[=true|false]`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_value = "false",
        default_missing_value = "true", ignore_case = true, value_parser = boolean_values())]
    pub enable_websocket: bool,
    /// Close agent connections that send HTTP/2 PINGs more often than this (after two
    /// tolerated strikes; GOAWAY `ENHANCE_YOUR_CALM`, `too_many_pings`). 0: no minimum.
    #[arg(long, env = "ARGOCD_PRINCIPAL_KEEP_ALIVE_MIN_INTERVAL", default_value = "0", value_parser = parse_duration)]
    pub keepalive_min_interval: Duration,
    /// Close agent connections that have had no gRPC stream open for this long (GOAWAY
    /// `NO_ERROR`, `max_idle`; gRPC's `MaxConnectionIdle`). An agent keeps its event stream
    /// open, so this closes only connections left without one. 0: no limit.
    #[arg(long, env = "ARGOCD_PRINCIPAL_MAX_CONNECTION_IDLE", default_value = "5m", value_parser = parse_duration)]
    pub max_connection_idle: Duration,
    /// Agent listener connections open at once (more are closed at accept).
    #[arg(long, env = "ARGOCD_PRINCIPAL_MAX_CONNECTIONS", default_value_t = argocd_agent_listener::DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
    /// Agent listener connections open at once from one client address. Agents behind one
    /// NAT address, or a mesh sidecar or ingress in front of the listener, share one.
    #[arg(long, env = "ARGOCD_PRINCIPAL_MAX_CONNECTIONS_PER_CLIENT", default_value_t = argocd_agent_listener::DEFAULT_MAX_CONNECTIONS_PER_CLIENT)]
    pub max_connections_per_client: usize,
    /// TLS handshakes (plaintext: connections awaiting their HTTP/2 preface) in progress
    /// at once from one client address, of 256.
    #[arg(long, env = "ARGOCD_PRINCIPAL_MAX_HANDSHAKES_PER_CLIENT", default_value_t = argocd_agent_listener::DEFAULT_MAX_HANDSHAKES_PER_CLIENT)]
    pub max_handshakes_per_client: usize,
    /// How long a new agent connection may wait for one of the 256 TLS handshake slots
    /// before it is reset (counted as `Busy`); its agent dials again within 2 s and,
    /// behind a Service, lands on a replica with room instead of queueing behind the
    /// busiest one. Default: 3s with --ha; without --ha (one principal, nowhere else to
    /// go) connections wait in the kernel's backlog. 0: wait there with --ha too.
    #[arg(long, env = "ARGOCD_PRINCIPAL_MAX_HANDSHAKE_WAIT", value_parser = parse_duration)]
    pub max_handshake_wait: Option<Duration>,
    /// How long an agent may take to send its hello once its stream is open; a stream
    /// without one is closed (`DeadlineExceeded`, refusal reason `HelloTimeout`).
    #[arg(long, env = "ARGOCD_PRINCIPAL_HELLO_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub hello_timeout: Duration,
    /// The shortest interval between one agent's resync rounds: agents asking for periodic
    /// resync (`--resync-interval`) more often are refused (`ResyncTooSoon`), and are told
    /// this minimum when they connect so they ask less often. 0: no minimum (the agent's
    /// event rate limit still applies). Upstream's name (PR #1037).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESYNC_MIN_INTERVAL", default_value = "0s", value_parser = parse_duration)]
    pub resync_min_interval: Duration,
    /// A session whose agent sends nothing (agents send heartbeats), or takes no event the
    /// principal sends, for this long is closed.
    #[arg(long, env = "ARGOCD_PRINCIPAL_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// The Redis proxy.
    #[command(flatten)]
    pub redis: RedisProxyArgs,
    /// The resource proxy.
    #[command(flatten)]
    pub resource_proxy: ResourceProxyArgs,
    /// Active replicas.
    #[command(flatten)]
    pub ha: HaArgs,
    /// Maximum unacknowledged events per agent.
    #[arg(long, default_value_t = 256)]
    pub max_in_flight: usize,
    /// Inbound write events (create, spec-update, status-update, delete, request-update)
    /// accepted per second from one agent; events over it are refused with
    /// `TooManyRequests` before any hub write, and the agent resends them later. 0: no limit.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_EVENT_RATE", default_value_t = argocd_agent_principal::ratelimit::DEFAULT_EVENT_RATE)]
    pub agent_event_rate: f64,
    /// Events one agent may send at once above --agent-event-rate.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_EVENT_BURST", default_value_t = argocd_agent_principal::ratelimit::DEFAULT_EVENT_BURST)]
    pub agent_event_burst: u32,
    /// Largest object an agent may send (Application, AppProject, status update), in bytes:
    /// its JSON bytes plus 32 per JSON value (what decoding it costs); larger ones are
    /// refused (`ObjectTooLarge`), and agent-written hub objects larger than this are
    /// cached as stubs and never sent on. 0: no bound.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_MAX_OBJECT_SIZE", default_value_t = argocd_agent_principal::bounds::DEFAULT_MAX_OBJECT_SIZE)]
    pub agent_max_object_size: usize,
    /// Most Applications one agent may write on the hub (autonomous copies and app-of-apps
    /// children together; hub-authored ones do not count); a new one over it is refused
    /// (`TooManyApplications`). 0: no bound.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_MAX_APPLICATIONS", default_value_t = argocd_agent_principal::bounds::DEFAULT_MAX_APPLICATIONS)]
    pub agent_max_applications: usize,
    /// Most bytes (JSON bytes plus 32 per JSON value) of objects one agent may have written
    /// on the hub; a write over it is refused (`AgentBytesExceeded`). 0: no bound.
    #[arg(long, env = "ARGOCD_PRINCIPAL_AGENT_MAX_BYTES", default_value_t = argocd_agent_principal::bounds::DEFAULT_MAX_BYTES)]
    pub agent_max_bytes: u64,
    /// Log level filter (overridden by RUST_LOG).
    #[arg(long, env = "ARGOCD_PRINCIPAL_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: text or json.
    #[arg(long, env = "ARGOCD_PRINCIPAL_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// OpenTelemetry collector (OTLP/gRPC) to export traces to, e.g.
    /// `https://collector:4317` (default: OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing).
    #[arg(long, env = "ARGOCD_PRINCIPAL_OTLP_ADDRESS")]
    pub otlp_address: Option<String>,
    /// Talk to the collector in plaintext instead of TLS.
    #[arg(long, env = "ARGOCD_PRINCIPAL_OTLP_INSECURE")]
    pub otlp_insecure: bool,
}

/// The Redis proxy in front of argocd-server (docs/redis-proxy.md).
#[derive(Debug, Args)]
pub struct RedisProxyArgs {
    /// Turn the Redis proxy off.
    #[arg(long, env = "ARGOCD_PRINCIPAL_DISABLE_REDIS_PROXY")]
    pub disable_redis_proxy: bool,
    /// Where argocd-server connects (`redis.server` in argocd-cmd-params-cm): `[host]:port`.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_PROXY_ADDRESS",
        default_value = ":6379"
    )]
    pub redis_proxy_address: String,
    /// The hub's Redis (`host:port`): every command that is not an agent's Application key.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS",
        default_value = "argocd-redis:6379"
    )]
    pub redis_server_address: String,
    /// The hub Redis's ACL user (Argo CD's `REDIS_USERNAME`, also read).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// The hub Redis's password: Argo CD's (the `auth` key of the `argocd-redis` Secret, which
    /// argocd-server reads as `REDIS_PASSWORD`, also read here). With a password, clients of
    /// the proxy must AUTH before anything, agents' keys included; prefer the environment.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// Connect to the hub Redis with TLS, trusting the CA certificates in this PEM file.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_SERVER_TLS_CA_PATH")]
    pub redis_server_tls_ca_path: Option<PathBuf>,
    /// Serve the proxy with TLS: PEM certificate chain (with `--redis-proxy-tls-key`).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_TLS_CERT_PATH")]
    pub redis_proxy_tls_cert_path: Option<PathBuf>,
    /// PEM private key of `--redis-proxy-tls-cert-path`.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_TLS_KEY_PATH")]
    pub redis_proxy_tls_key_path: Option<PathBuf>,
    /// Largest RESP frame accepted and largest value an agent may return, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub redis_proxy_max_value_size: usize,
    /// Commands of one client connection waiting for replies at once.
    #[arg(long, default_value_t = 128)]
    pub redis_proxy_max_in_flight: usize,
    /// Requests waiting for one agent's answers at once (more get an error).
    #[arg(long, default_value_t = 256)]
    pub redis_proxy_max_in_flight_per_agent: usize,
    /// How long an agent may take to answer.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub redis_proxy_request_timeout: Duration,
    /// Close client connections silent for this long (never while subscribed).
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub redis_proxy_idle_timeout: Duration,
    /// With `--ha`: the address (`host:port`) other replicas reach this replica's Redis proxy
    /// at, to forward keys of the agents it serves (published on its replica Lease);
    /// default `$POD_IP:<port>`, else the listen address.
    #[arg(long, env = "ARGOCD_PRINCIPAL_REDIS_PROXY_REPLICA_ADDRESS")]
    pub redis_proxy_replica_address: Option<String>,
    /// The hub Argo CD's Redis compression (`redis.compression`): `gzip` or `none`; the
    /// agents' cluster info is written in it.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE",
        default_value = "gzip"
    )]
    pub redis_compression_type: argocd_agent_redis::clusterinfo::Compression,
    /// Server URL of an agent's cluster in Argo CD (its cluster Secret's `server`);
    /// `{agent}` is replaced by the agent's name. Cluster info is written under it.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_CLUSTER_SERVER_URL_TEMPLATE",
        default_value = argocd_agent_principal::clusterinfo::DEFAULT_SERVER_TEMPLATE
    )]
    pub cluster_server_url_template: String,
}

/// The resource proxy argocd-server reaches agents' clusters through (docs/resource-proxy.md).
#[derive(Debug, Args)]
pub struct ResourceProxyArgs {
    /// Serve the resource proxy: the HTTPS endpoint argocd-server (and kubectl) uses as each
    /// agent's cluster, tunnelled through the agent's stream.
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY")]
    pub enable_resource_proxy: bool,
    /// Where the resource proxy listens: `[host]:port`.
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS",
        default_value = ":9090"
    )]
    pub resource_proxy_address: String,
    /// The URL clients reach the proxy at (cluster secrets hold `<url>/agents/<agent>`);
    /// default `https://<listen address>` (127.0.0.1 for an unspecified address).
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_URL")]
    pub resource_proxy_url: Option<String>,
    /// Client connections to the resource proxy at once (more are closed at accept).
    #[arg(
        long,
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_MAX_CONNECTIONS",
        default_value_t = 1024
    )]
    pub resource_proxy_max_connections: usize,
    /// Connections at once from one client address (a sixteenth of the default total: one
    /// address cannot fill the listener; raise it for an argocd-server reaching more
    /// agents' clusters at once).
    #[arg(long, default_value_t = 64)]
    pub resource_proxy_max_connections_per_client: usize,
    /// Bytes of request bodies buffered at once across all requests (at least
    /// `--resource-proxy-max-body`); a request finding no room within
    /// `--resource-proxy-body-wait` is answered 429.
    #[arg(long, default_value_t = argocd_agent_principal::resourceproxy::DEFAULT_MAX_BUFFERED_BODIES)]
    pub resource_proxy_max_buffered_bodies: usize,
    /// How long a request body waits for room among the buffered bodies (429 after).
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub resource_proxy_body_wait: Duration,
    /// A resource proxy connection with no request in progress for this long is closed.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub resource_proxy_idle_timeout: Duration,
    /// With `--ha`: this replica's own resource proxy URL, which other replicas forward
    /// requests for its agents to (published on its replica Lease; the serving certificate
    /// names its host); default `https://$POD_IP:<port>`, else the listen address.
    #[arg(long, env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_REPLICA_URL")]
    pub resource_proxy_replica_url: Option<String>,
    /// Extra names (DNS or IP) of the certificate the principal issues for the proxy; the
    /// URL's host is always one.
    #[arg(
        long,
        value_delimiter = ',',
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_HOSTNAMES"
    )]
    pub resource_proxy_hostnames: Vec<String>,
    /// `svid`: serve the principal's SVID (it must carry the URL's host as a DNS SAN);
    /// `issued`: a certificate from the principal's own CA; `auto`: the SVID when it names
    /// the host, else issued.
    #[arg(
        long,
        default_value = "auto",
        env = "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS"
    )]
    pub resource_proxy_tls: argocd_agent_principal::resourceproxy::tls::ServingMode,
    /// Lifetime of the per-agent tokens in cluster secrets (renewed at two thirds).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub resource_proxy_token_ttl: Duration,
    /// How long an agent may take to answer a request (504 after).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub resource_proxy_request_timeout: Duration,
    /// Largest request body (413 above).
    #[arg(long, default_value_t = 4 << 20)]
    pub resource_proxy_max_body: usize,
    /// How long a client may take to send a request body (408 after); bodies are read
    /// before a request takes one of its agent's slots.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub resource_proxy_body_timeout: Duration,
    /// How long a client may take to send a request's headers (the connection is closed
    /// after).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub resource_proxy_header_timeout: Duration,
    /// Requests, log streams and terminal sessions at once per agent (429 above).
    #[arg(long, default_value_t = 32)]
    pub resource_proxy_max_in_flight_per_agent: usize,
    /// Close a terminal session without traffic for this long.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub terminal_idle_timeout: Duration,
    /// Close a terminal session after this long in any case.
    #[arg(long, default_value = "4h", value_parser = parse_duration)]
    pub terminal_max_duration: Duration,
    /// Create each agent's Argo CD cluster secret when it first connects, and keep its
    /// token and CA data current (needs the resource proxy).
    #[arg(long, env = "ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION")]
    pub enable_self_cluster_registration: bool,
}

/// Several active principal replicas (docs/ha.md).
#[derive(Debug, Args)]
pub struct HaArgs {
    /// Run as one of several active replicas: every agent's session is recorded in a
    /// `coordination.k8s.io` Lease on the hub (see docs/ha.md), so an agent has one live
    /// session across all replicas and a dead replica's agents are taken over.
    #[arg(long, env = "ARGOCD_PRINCIPAL_HA")]
    pub ha: bool,
    /// This replica's name in Leases (default: `POD_NAME`, else the host name).
    #[arg(long, env = "ARGOCD_PRINCIPAL_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// A replica whose Lease is not renewed for this long is gone: its agents are taken
    /// over (renewed every fifth of it).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub replica_lease_duration: Duration,
    /// Duration of agent Leases (renewed at a random point between a third and two thirds
    /// of it: N agents cost about 2N/duration writes per second).
    #[arg(long, default_value = "15m", value_parser = parse_duration)]
    pub agent_lease_duration: Duration,
    /// Do not move agents to even out the replicas' load.
    #[arg(long)]
    pub no_rebalance: bool,
    /// Keep every Application decoded in the watch cache, not only the served agents'
    /// (more memory, as many times as there are replicas).
    #[arg(long)]
    pub no_shard_cache: bool,
    /// Agents a replica may hold above its fair share before it sheds some.
    #[arg(long, default_value_t = 1)]
    pub rebalance_slack: usize,
    /// How often a replica compares its share with the others'.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub rebalance_interval: Duration,
    /// Sessions a replica closes per rebalance round: this many, or a quarter of its
    /// excess over the fair share when that is more.
    #[arg(long, default_value_t = 10)]
    pub rebalance_batch: usize,
    /// Client-side limit of Lease requests per second, apart from --kube-qps (every
    /// session start is one Lease write: a reconnect storm of N agents is N writes).
    #[arg(long, default_value_t = argocd_agent_principal::ha::DEFAULT_LEASE_QPS)]
    pub lease_qps: f32,
    /// Burst of Lease requests above --lease-qps.
    #[arg(long, default_value_t = argocd_agent_principal::ha::DEFAULT_LEASE_BURST)]
    pub lease_burst: u32,
}

impl HaArgs {
    fn config(&self) -> Result<Option<argocd_agent_principal::ha::HaConfig>, ArgError> {
        if !self.ha {
            return Ok(None);
        }
        let replica = self
            .replica_id
            .clone()
            .unwrap_or_else(argocd_agent_principal::ha::default_replica_id);
        let mut c = argocd_agent_principal::ha::HaConfig::new(replica);
        c.replica_lease_duration = self.replica_lease_duration;
        c.agent_lease_duration = self.agent_lease_duration;
        c.rebalance = !self.no_rebalance;
        c.shard_cache = !self.no_shard_cache;
        c.rebalance_slack = self.rebalance_slack;
        c.rebalance_interval = self.rebalance_interval;
        c.rebalance_batch = self.rebalance_batch.max(1);
        c.lease_qps = self.lease_qps;
        c.lease_burst = self.lease_burst;
        c.validate()?;
        Ok(Some(c))
    }
}

impl ResourceProxyArgs {
    /// The resource proxy's configuration, or none when it is off.
    pub fn config(
        &self,
    ) -> Result<Option<argocd_agent_principal::resourceproxy::ResourceProxyConfig>, ArgError> {
        if !self.enable_resource_proxy {
            if self.enable_self_cluster_registration {
                return Err(ArgError::SelfRegistrationNeedsProxy);
            }
            return Ok(None);
        }
        let listen =
            parse_listen(&self.resource_proxy_address).map_err(|cause| ArgError::Listen {
                flag: "--resource-proxy-address",
                cause,
            })?;
        let url = self.resource_proxy_url.clone().unwrap_or_default();
        if !url.is_empty() && !url.starts_with("https://") {
            return Err(ArgError::NotHttps {
                flag: "--resource-proxy-url",
                url,
            });
        }
        let replica_url = self.resource_proxy_replica_url.clone().unwrap_or_default();
        if !replica_url.is_empty() && !replica_url.starts_with("https://") {
            return Err(ArgError::NotHttps {
                flag: "--resource-proxy-replica-url",
                url: replica_url,
            });
        }
        let mut c = argocd_agent_principal::resourceproxy::ResourceProxyConfig::new(listen, url);
        c.replica_url = replica_url;
        c.hostnames = self.resource_proxy_hostnames.clone();
        c.tls = self.resource_proxy_tls;
        c.token_ttl = self.resource_proxy_token_ttl;
        c.request_timeout = self.resource_proxy_request_timeout;
        c.max_body = self.resource_proxy_max_body;
        c.max_in_flight_per_agent = self.resource_proxy_max_in_flight_per_agent.max(1);
        c.terminal_idle_timeout = self.terminal_idle_timeout;
        c.terminal_max_duration = self.terminal_max_duration;
        c.self_cluster_registration = self.enable_self_cluster_registration;
        c.limits.max_connections = self.resource_proxy_max_connections.max(1);
        c.limits.max_per_client = self.resource_proxy_max_connections_per_client.max(1);
        c.limits.idle_timeout = self.resource_proxy_idle_timeout;
        c.limits.header_timeout = self.resource_proxy_header_timeout;
        c.body_timeout = self.resource_proxy_body_timeout;
        c.max_buffered_bodies = self
            .resource_proxy_max_buffered_bodies
            .max(self.resource_proxy_max_body);
        c.body_wait = self.resource_proxy_body_wait;
        Ok(Some(c))
    }
}

impl RedisProxyArgs {
    /// The Redis proxy's configuration, or none when it is off.
    pub fn config(
        &self,
    ) -> Result<Option<argocd_agent_principal::redisproxy::RedisProxyConfig>, ArgError> {
        if self.disable_redis_proxy {
            return Ok(None);
        }
        let listen = parse_listen(&self.redis_proxy_address).map_err(|cause| ArgError::Listen {
            flag: "--redis-proxy-address",
            cause,
        })?;
        let tls = match (
            &self.redis_proxy_tls_cert_path,
            &self.redis_proxy_tls_key_path,
        ) {
            (Some(cert), Some(key)) => Some(
                argocd_agent_redis::client::server_tls(
                    cert,
                    key,
                    TlsProfile::process()
                        .server_builder()
                        .map_err(ArgError::TlsProfile)?,
                )
                .map_err(ArgError::RedisTls)?,
            ),
            (None, None) => None,
            _ => {
                return Err(ArgError::RedisProxyTlsPair);
            }
        };
        // Replicas serve the same certificate: each trusts exactly that one in the others.
        let replica_tls = match &self.redis_proxy_tls_cert_path {
            Some(cert) if tls.is_some() => Some(
                argocd_agent_principal::redisproxy::pinned_replica_tls(cert)?,
            ),
            _ => None,
        };
        let replica_address = self
            .redis_proxy_replica_address
            .as_deref()
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(str::to_owned);
        if let Some(a) = &replica_address
            && !a.contains(':')
        {
            return Err(ArgError::ReplicaAddress(a.clone()));
        }
        let upstream_tls = match &self.redis_server_tls_ca_path {
            Some(ca) => Some(
                argocd_agent_redis::RedisTls::from_ca_file(
                    ca,
                    host_of(&self.redis_server_address),
                    TlsProfile::process()
                        .client_builder()
                        .map_err(ArgError::TlsProfile)?,
                )
                .map_err(ArgError::RedisTls)?,
            ),
            None => None,
        };
        Ok(Some(argocd_agent_principal::redisproxy::RedisProxyConfig {
            listen,
            upstream: argocd_agent_redis::RedisEndpoint {
                addr: self.redis_server_address.clone(),
                tls: upstream_tls,
                username: self
                    .redis_username
                    .clone()
                    .or_else(|| non_empty_env("REDIS_USERNAME")),
                password: self
                    .redis_password
                    .clone()
                    .or_else(|| non_empty_env("REDIS_PASSWORD"))
                    .filter(|p| !p.is_empty()),
            },
            tls,
            max_value_size: self.redis_proxy_max_value_size,
            max_in_flight_per_connection: self.redis_proxy_max_in_flight,
            max_in_flight_per_agent: self.redis_proxy_max_in_flight_per_agent,
            request_timeout: self.redis_proxy_request_timeout,
            idle_timeout: self.redis_proxy_idle_timeout,
            compression: self.redis_compression_type,
            cluster_server_template: self.cluster_server_url_template.clone(),
            replica_address,
            replica_tls,
            ..Default::default()
        }))
    }
}

/// The agent's side of the principal's resource proxy (docs/resource-proxy-agent.md).
#[derive(Debug, Args)]
pub struct AgentResourceProxyArgs {
    /// Do not serve the principal's resource proxy (its requests are then answered 502).
    #[arg(long, env = "ARGOCD_AGENT_DISABLE_RESOURCE_PROXY")]
    pub disable_resource_proxy: bool,
    /// Largest response passed back to the proxy (502 above).
    #[arg(long, default_value_t = argocd_agent_agent::proxy::DEFAULT_MAX_BODY)]
    pub resource_proxy_max_body: usize,
    /// Proxied requests, and log and exec streams, at once (429 above).
    #[arg(long, default_value_t = argocd_agent_agent::proxy::DEFAULT_MAX_CONCURRENT)]
    pub resource_proxy_max_concurrent: usize,
    /// How long one proxied request may take on this cluster (504 after).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub resource_proxy_timeout: Duration,
    /// Pod Security Standards level for pods created or patched through the resource proxy:
    /// privileged (off), baseline or restricted.
    #[arg(
        long,
        env = "ARGOCD_AGENT_RESOURCE_PROXY_POD_SECURITY",
        default_value = "baseline",
        value_parser = |s: &str| s.parse::<argocd_agent_agent::proxy::pss::Level>()
    )]
    pub resource_proxy_pod_security: argocd_agent_agent::proxy::pss::Level,
}

/// The spoke guard: a policy on this cluster that the hub cannot change, enforced on
/// everything the principal sends (see docs/spoke-guard.md). Nothing set: no guard.
#[derive(Debug, Args)]
pub struct AgentGuardArgs {
    /// A YAML guard policy file, reread every `--guard-reload-interval`.
    #[arg(long, env = "ARGOCD_AGENT_GUARD_FILE")]
    pub guard_file: Option<std::path::PathBuf>,
    /// A ConfigMap in `--namespace` whose `guard.yaml` key holds a guard policy, reread every
    /// `--guard-reload-interval` (the hub can never write it).
    #[arg(long, env = "ARGOCD_AGENT_GUARD_CONFIGMAP")]
    pub guard_configmap: Option<String>,
    /// How often the guard file and ConfigMap are read again.
    #[arg(long, env = "ARGOCD_AGENT_GUARD_RELOAD_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub guard_reload_interval: Duration,
    /// Allowed source repositories (globs as Argo CD's `sourceRepos`, `!` denies),
    /// comma-separated or repeated.
    #[arg(long, value_delimiter = ',', env = "ARGOCD_AGENT_GUARD_ALLOWED_REPOS")]
    pub guard_allowed_repos: Vec<String>,
    /// Allowed destinations, comma-separated or repeated: `server=GLOB;name=GLOB;namespace=GLOB`
    /// (fields left out match anything), or just a namespace glob.
    #[arg(
        long,
        value_delimiter = ',',
        env = "ARGOCD_AGENT_GUARD_ALLOWED_DESTINATIONS"
    )]
    pub guard_allowed_destinations: Vec<String>,
    /// Allowed projects (globs, `!` denies), comma-separated or repeated.
    #[arg(
        long,
        value_delimiter = ',',
        env = "ARGOCD_AGENT_GUARD_ALLOWED_PROJECTS"
    )]
    pub guard_allowed_projects: Vec<String>,
    /// Whether cluster-scoped resources may be deployed (`=false` empties every project's
    /// clusterResourceWhitelist). `--guard-cluster-resources[=true|false]`.
    #[arg(long, env = "ARGOCD_AGENT_GUARD_CLUSTER_RESOURCES", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        ignore_case = true, value_parser = boolean_values())]
    pub guard_cluster_resources: Option<bool>,
    /// Refuse projects without `destinationServiceAccounts`.
    /// `--guard-require-service-account[=true|false]`.
    #[arg(long, env = "ARGOCD_AGENT_GUARD_REQUIRE_SERVICE_ACCOUNT", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_missing_value = "true",
        ignore_case = true, value_parser = boolean_values())]
    pub guard_require_service_account: Option<bool>,
    /// Never write repository Secrets from the hub (this cluster keeps its own).
    /// `--guard-local-repositories[=true|false]`.
    #[arg(long, env = "ARGOCD_AGENT_GUARD_LOCAL_REPOSITORIES", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_value = "false", default_missing_value = "true",
        ignore_case = true, value_parser = boolean_values())]
    pub guard_local_repositories: bool,
}

impl AgentGuardArgs {
    /// The guard's sources; a destination flag that does not parse is refused, naming it.
    pub fn sources(&self) -> Result<argocd_agent_agent::guard::GuardSources, ArgError> {
        use argocd_agent_agent::guard::{GuardSources, GuardSpec, RepositoryMode};
        let list = |v: &Vec<String>| {
            let v: Vec<String> = v
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            (!v.is_empty()).then_some(v)
        };
        let destinations = self
            .guard_allowed_destinations
            .iter()
            .filter(|d| !d.trim().is_empty())
            .map(|d| parse_destination(d.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let flags = GuardSpec {
            source_repos: list(&self.guard_allowed_repos),
            destinations: (!destinations.is_empty()).then_some(destinations),
            projects: list(&self.guard_allowed_projects),
            cluster_resources: self.guard_cluster_resources,
            require_destination_service_accounts: self.guard_require_service_account,
            destination_service_accounts: None,
            repositories: self
                .guard_local_repositories
                .then_some(RepositoryMode::LocalOnly),
        };
        if self.guard_configmap.as_deref() == Some(argocd_agent_agent::guard::GPG_KEYS_CONFIGMAP) {
            return Err(ArgError::GuardConfigMap);
        }
        // Checked before anything connects, so a broken policy stops the agent at once.
        if flags != GuardSpec::default() {
            argocd_agent_agent::guard::Guard::compile(&flags, "flags").map_err(ArgError::Guard)?;
        }
        if let Some(path) = &self.guard_file {
            let origin = format!("--guard-file {}", path.display());
            let text = match std::fs::read_to_string(path) {
                Ok(text) => text,
                Err(cause) => return Err(ArgError::GuardRead { origin, cause }),
            };
            argocd_agent_agent::guard::Guard::from_yaml(&text, &origin).map_err(ArgError::Guard)?;
        }
        Ok(GuardSources {
            file: self.guard_file.clone(),
            configmap: self
                .guard_configmap
                .clone()
                .filter(|c| !c.trim().is_empty()),
            flags,
            reload_interval: self.guard_reload_interval,
        })
    }
}

/// One `--guard-allowed-destinations` entry: `server=..;name=..;namespace=..`, or a
/// namespace glob alone.
fn parse_destination(s: &str) -> Result<argocd_agent_agent::guard::DestinationSpec, ArgError> {
    let mut d = argocd_agent_agent::guard::DestinationSpec::default();
    if !s.contains('=') {
        d.namespace = Some(s.to_owned());
        return Ok(d);
    }
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| ArgError::DestinationPart {
                value: s.to_owned(),
                part: part.to_owned(),
            })?;
        let slot = match k.trim() {
            "server" => &mut d.server,
            "name" => &mut d.name,
            "namespace" => &mut d.namespace,
            other => {
                return Err(ArgError::DestinationField {
                    value: s.to_owned(),
                    field: other.to_owned(),
                });
            }
        };
        *slot = Some(v.trim().to_owned());
    }
    Ok(d)
}

/// This cluster's Redis, which the agent reads for the principal's Redis proxy.
#[derive(Debug, Args)]
pub struct AgentRedisArgs {
    /// This cluster's Redis (`host:port`, Argo CD's `argocd-redis:6379`); without it the
    /// agent does not serve the principal's Redis proxy.
    #[arg(long, env = "ARGOCD_AGENT_REDIS_ADDRESS")]
    pub redis_addr: Option<String>,
    /// Redis ACL user name (with `--redis-password`).
    #[arg(long, env = "ARGOCD_AGENT_REDIS_USERNAME")]
    pub redis_username: Option<String>,
    /// Redis password (Argo CD's `redis-password`); prefer the environment variable.
    #[arg(long, env = "ARGOCD_AGENT_REDIS_PASSWORD", hide_env_values = true)]
    pub redis_password: Option<String>,
    /// Connect with TLS, trusting the CA certificates in this PEM file.
    #[arg(long, env = "ARGOCD_AGENT_REDIS_TLS_CA_PATH")]
    pub redis_tls_ca_path: Option<PathBuf>,
    /// Largest value read and sent to the principal, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub redis_max_value_size: usize,
    /// How often to report this cluster's cache counts (Applications; APIs and resources
    /// from the cluster's Redis) for the hub's cluster info.
    #[arg(long, env = "ARGOCD_AGENT_CACHE_REFRESH_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub cache_refresh_interval: Duration,
}

impl AgentRedisArgs {
    fn config(&self) -> Result<Option<argocd_agent_agent::redis::RedisConfig>, ArgError> {
        let Some(addr) = &self.redis_addr else {
            return Ok(None);
        };
        let tls = match &self.redis_tls_ca_path {
            Some(ca) => Some(
                argocd_agent_redis::RedisTls::from_ca_file(
                    ca,
                    host_of(addr),
                    TlsProfile::process()
                        .client_builder()
                        .map_err(ArgError::TlsProfile)?,
                )
                .map_err(ArgError::RedisTls)?,
            ),
            None => None,
        };
        Ok(Some(argocd_agent_agent::redis::RedisConfig {
            endpoint: argocd_agent_redis::RedisEndpoint {
                addr: addr.clone(),
                username: self.redis_username.clone(),
                password: self.redis_password.clone(),
                tls,
            },
            max_value_size: self.redis_max_value_size,
        }))
    }
}

/// `[host]:port` (empty host: every address) as a socket address.
/// `[host]:port`; without a host, [`default_host`] (`0.0.0.0:port` must be asked for).
fn parse_listen(s: &str) -> Result<SocketAddr, ListenError> {
    if let Some(port) = s.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|cause| ListenError::Port {
            addr: s.to_owned(),
            cause,
        })?;
        return Ok(SocketAddr::new(default_host(), port));
    }
    s.parse().map_err(|cause| ListenError::Addr {
        addr: s.to_owned(),
        cause,
    })
}

/// Where a listener binds when no host is given: the pod IP (`$POD_IP`, set from the
/// downward API in deploy/), else loopback; never every interface.
fn default_host() -> IpAddr {
    pod_ip_or_loopback(std::env::var("POD_IP").ok().as_deref())
}

fn pod_ip_or_loopback(pod_ip: Option<&str>) -> IpAddr {
    pod_ip
        .and_then(|ip| ip.trim().parse().ok())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]))
}

/// An environment variable that is set and not empty.
fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The host part of `host:port` (the name a TLS certificate must carry).
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':')
        .map_or(addr, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
}

/// `argocd-agent agent`.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// `managed` or `autonomous`.
    #[arg(long, env = "ARGOCD_AGENT_MODE", default_value = "managed")]
    pub agent_mode: AgentMode,
    /// The principal's address (host name or IP).
    #[arg(long, env = "ARGOCD_AGENT_REMOTE_SERVER")]
    pub server_address: String,
    /// The principal's port.
    #[arg(long, env = "ARGOCD_AGENT_REMOTE_PORT", default_value_t = 8443)]
    pub server_port: u16,
    /// `spiffe` (SVID mTLS, default), `header:` (plaintext to the local mesh sidecar) or
    /// `jwt-svid` (JWT-SVID bearer token, for a principal behind a TLS-terminating ingress).
    #[arg(long, env = "ARGOCD_AGENT_CREDS", default_value = "spiffe")]
    pub creds: String,
    /// Upstream's SPIRE switch (argocd-agent PR #1049): `mtls` is `--creds spiffe`, `jwt` is
    /// `--creds jwt-svid`. Refused when it contradicts an explicit `--creds`.
    #[arg(long, value_parser = ["mtls", "jwt"])]
    pub spire_auth_method: Option<String>,
    /// The principal's SPIFFE ID; the agent refuses any other server.
    #[arg(long, env = "ARGOCD_AGENT_PRINCIPAL_SPIFFE_ID")]
    pub principal_spiffe_id: Option<String>,
    /// Accept any principal ID from this trust domain (when no ID is pinned).
    #[arg(long, env = "ARGOCD_AGENT_PRINCIPAL_TRUST_DOMAIN")]
    pub principal_trust_domain: Option<String>,
    /// Allow plaintext to a non-loopback sidecar address (dangerous).
    #[arg(long)]
    pub insecure_plaintext_any_address: bool,
    /// The agent's SVID.
    #[command(flatten)]
    pub svid: SvidArgs,
    /// TLS versions and cipher suites.
    #[command(flatten)]
    pub tls: TlsVersionArgs,
    /// This cluster's Kubernetes API.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Argo CD namespace on this cluster.
    #[arg(long, env = "ARGOCD_AGENT_NAMESPACE", default_value = "argocd")]
    pub namespace: String,
    /// Only Applications matching this label selector are synced (default: all).
    #[arg(long, env = "ARGOCD_AGENT_LABEL_SELECTOR")]
    pub label_selector: Option<String>,
    /// Managed mode: take over (`always`) or refuse (`never`) a local object of the same
    /// name the principal did not create. Per object: annotation
    /// `argocd.argoproj.io/adoption-policy` on the hub copy.
    #[arg(long, env = "ARGOCD_AGENT_ADOPTION_POLICY", default_value = "always")]
    pub adoption_policy: argocd_agent_agent::policy::AdoptionPolicy,
    /// Managed mode: when the hub object was recreated (new UID), `recreate` the local copy
    /// or `upsert` it in place. Per object: annotation
    /// `argocd.argoproj.io/source-uid-mismatch-policy`.
    #[arg(
        long,
        env = "ARGOCD_AGENT_SOURCE_UID_MISMATCH_POLICY",
        default_value = "recreate"
    )]
    pub source_uid_mismatch_policy: argocd_agent_agent::policy::MismatchPolicy,
    /// Managed mode: after recreating an Application deleted on the spoke, `ignore`,
    /// `clear-status` (drop the stale operation state) or `resync` (start a sync).
    #[arg(
        long,
        env = "ARGOCD_AGENT_ON_APPLICATION_RECREATE",
        default_value = "ignore"
    )]
    pub on_application_recreate: argocd_agent_agent::policy::RecreateAction,
    /// Managed mode, with the principal's flag of the same name: Applications keep their
    /// hub namespace on this cluster (allowed by `--namespace` or `--allowed-namespaces`;
    /// they must exist, or `--create-namespace`).
    #[arg(long, env = "ARGOCD_AGENT_DESTINATION_BASED_MAPPING")]
    pub destination_based_mapping: bool,
    /// Namespaces besides `--namespace` whose Applications the agent takes: globs
    /// (`team-*`) or `/regex/`, comma-separated or repeated. With destination-based
    /// mapping, the namespaces the principal may write copies into; in autonomous mode,
    /// the namespaces whose Applications are published (as `<namespace>.<name>`).
    #[arg(long, value_delimiter = ',', env = "ARGOCD_AGENT_ALLOWED_NAMESPACES")]
    pub allowed_namespaces: Vec<String>,
    /// With `--destination-based-mapping`: create a missing namespace before writing a copy
    /// into it.
    #[arg(long, env = "ARGOCD_AGENT_CREATE_NAMESPACE")]
    pub create_namespace: bool,
    /// Managed mode: take part in sync only with the Applications the principal wrote
    /// here; Applications an app-of-apps parent creates on this cluster stay local instead
    /// of appearing on the hub (upstream's name: there it silences Applications without a
    /// source UID, which this agent never reports anyway).
    #[arg(long, env = "ARGOCD_AGENT_IGNORE_UNMANAGED_APPS")]
    pub ignore_unmanaged_apps: bool,
    /// HTTP/2 PING interval on the connection to the principal (finds dead connections); also
    /// the heartbeat interval unless `--heartbeat-interval` is given. Keep it at or above the
    /// principal's `--keepalive-min-interval`.
    #[arg(long, env = "ARGOCD_AGENT_KEEP_ALIVE_PING_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub keep_alive_ping_interval: Duration,
    /// Heartbeat events on the stream (keep it alive through mesh and proxy idle timeouts,
    /// which HTTP/2 PINGs do not reset). Default: `--keep-alive-ping-interval`.
    #[arg(long, env = "ARGOCD_AGENT_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// While connected, ask the principal for a resync round this often, so an event lost
    /// on the way (a change the hub refused for good, say) is put right without a
    /// reconnect. Stretched to the principal's `--resync-min-interval` when that is longer.
    /// 0: resync only at connect. Upstream's name (PR #1037).
    #[arg(long, env = "ARGOCD_AGENT_RESYNC_INTERVAL", default_value = "0s", value_parser = parse_duration)]
    pub resync_interval: Duration,
    /// Compress what the agent sends to the principal (`--compression-algorithm`); the
    /// principal's compressed answers are accepted either way.
    /// `--enable-compression[=true|false]`.
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_COMPRESSION", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_value = "false",
        default_missing_value = "true", ignore_case = true, value_parser = boolean_values())]
    pub enable_compression: bool,
    /// Reach the principal through an HTTP/1.1 WebSocket (`ws://server-address:server-port/`),
    /// with the SVID mutual TLS inside it: for proxies and load balancers without HTTP/2.
    /// Needs `--creds spiffe` and a principal with `--enable-websocket`.
    /// `--enable-websocket[=true|false]`.
    #[arg(long, env = "ARGOCD_AGENT_ENABLE_WEBSOCKET", action = clap::ArgAction::Set,
        num_args = 0..=1, require_equals = true, default_value = "false",
        default_missing_value = "true", ignore_case = true, value_parser = boolean_values())]
    pub enable_websocket: bool,
    /// With `--enable-compression`: `gzip` (upstream's, any principal decodes it) or `zstd`
    /// (smaller and cheaper; a principal of this project). Also the encoding the agent asks
    /// the principal to answer in.
    #[arg(
        long,
        env = "ARGOCD_AGENT_COMPRESSION_ALGORITHM",
        default_value = "gzip"
    )]
    pub compression_algorithm: argocd_agent_agent::dialer::Compression,
    /// Address of the `/metrics`, `/healthz` and `/readyz` listener (the pod IP in the
    /// manifests, loopback when only a local sidecar scrapes).
    /// Default: `$POD_IP`, else 127.0.0.1 (never all interfaces unless set).
    #[arg(long, env = "ARGOCD_AGENT_METRICS_HOST")]
    pub metrics_host: Option<IpAddr>,
    /// Port of the metrics and health listener; 0 turns it off.
    #[arg(long, env = "ARGOCD_AGENT_METRICS_PORT", default_value_t = 8181)]
    pub metrics_port: u16,
    /// Also serve `/healthz` and `/readyz` on this port (upstream's `--healthz-port`; 0: only
    /// on the metrics port). Binds `--metrics-host`.
    #[arg(long, env = "ARGOCD_AGENT_HEALTH_CHECK_PORT", default_value_t = 0)]
    pub healthz_port: u16,
    /// Maximum gRPC message size in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024)]
    pub max_message_size: usize,
    /// This cluster's Redis.
    #[command(flatten)]
    pub redis: AgentRedisArgs,
    /// The agent's side of the resource proxy.
    #[command(flatten)]
    pub resource_proxy: AgentResourceProxyArgs,
    /// The spoke guard.
    #[command(flatten)]
    pub guard: AgentGuardArgs,
    /// Log level filter (overridden by RUST_LOG).
    #[arg(long, env = "ARGOCD_AGENT_LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log format: text or json.
    #[arg(long, env = "ARGOCD_AGENT_LOG_FORMAT", default_value = "text")]
    pub log_format: String,
    /// OpenTelemetry collector (OTLP/gRPC) to export traces to, e.g.
    /// `https://collector:4317` (default: OTEL_EXPORTER_OTLP_ENDPOINT; none: no tracing).
    #[arg(long, env = "ARGOCD_AGENT_OTLP_ADDRESS")]
    pub otlp_address: Option<String>,
    /// Talk to the collector in plaintext instead of TLS.
    #[arg(long, env = "ARGOCD_AGENT_OTLP_INSECURE")]
    pub otlp_insecure: bool,
}

/// A duration: a number of seconds (`30`), or numbers with units (`500ms`, `30s`, `5m`,
/// `1h`), several in a row as Go writes them (`1h20m10s`, upstream's flags).
pub(crate) fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Duration::from_secs(n));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .ok_or_else(|| DurationError::NoUnit(s.to_owned()))?;
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| DurationError::Number(s.to_owned()))?;
        let tail = &rest[digits..];
        let unit_len = tail
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(tail.len());
        let one = match &tail[..unit_len] {
            "ms" => Duration::from_millis(n),
            "s" => Duration::from_secs(n),
            "m" => Duration::from_secs(n.saturating_mul(60)),
            "h" => Duration::from_secs(n.saturating_mul(3600)),
            _ => {
                return Err(DurationError::Unit(s.to_owned()));
            }
        };
        total = total.saturating_add(one);
        rest = &tail[unit_len..];
    }
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    Ok(total)
}

fn svid_config(a: &SvidArgs) -> Result<SvidConfig, ArgError> {
    if a.tls_cert.is_none() && !a.root_ca.is_empty() {
        return Err(ArgError::RootCaWithoutFiles);
    }
    Ok(match (&a.tls_cert, &a.tls_key) {
        (Some(cert), Some(key)) => SvidConfig::Files {
            cert: cert.clone(),
            key: key.clone(),
            bundles: parse_bundles(&a.root_ca)?,
        },
        _ => SvidConfig::WorkloadApi {
            endpoint: Some(
                a.spiffe_endpoint_socket
                    .clone()
                    .ok_or(ArgError::NoSvidSource)?,
            ),
        },
    })
}

/// The values a boolean flag or variable takes (`true`/`false`, and the spellings Go's
/// `strconv.ParseBool` and clap's "boolish" parser take, any case); a wrong value is refused
/// with the list, not with "value was not a boolean".
pub fn boolean_values() -> impl clap::builder::TypedValueParser<Value = bool> {
    use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
    PossibleValuesParser::new([
        PossibleValue::new("true").aliases(["t", "y", "yes", "on", "1"]),
        PossibleValue::new("false").aliases(["f", "n", "no", "off", "0"]),
    ])
    .map(|v: String| {
        matches!(
            v.to_ascii_lowercase().as_str(),
            "true" | "t" | "y" | "yes" | "on" | "1"
        )
    })
}

/// `--spire-auth-method` against an `--auth`/`--creds` chosen to mean something else.
#[derive(Debug, thiserror::Error)]
#[error(
    "--spire-auth-method {method} means {flag} {means}, but {flag} {current} is given: keep one of them"
)]
struct SpireAuthConflict {
    method: String,
    flag: &'static str,
    means: &'static str,
    current: String,
}

/// Applies upstream's `--spire-auth-method` (argocd-agent PR #1049) to our `--auth` or
/// `--creds` value `current` (`spiffe` is our default, so anything else was chosen).
fn spire_auth_method(
    current: &str,
    spire: Option<&str>,
    flag: &'static str,
) -> Result<String, SpireAuthConflict> {
    let chosen = current != "spiffe";
    match spire {
        None => Ok(current.to_owned()),
        Some("mtls") if !chosen || current.starts_with("mtls:") => Ok(current.to_owned()),
        Some("jwt") if !chosen || current == "jwt-svid" => Ok("jwt-svid".to_owned()),
        Some(m) => Err(SpireAuthConflict {
            method: m.to_owned(),
            flag,
            means: if m == "jwt" { "jwt-svid" } else { "spiffe" },
            current: current.to_owned(),
        }),
    }
}

impl PrincipalArgs {
    /// The principal's configuration from these flags: every check the principal makes before it starts.
    pub fn config(&self) -> Result<argocd_agent_principal::PrincipalConfig, crate::BoxError> {
        let a = self;
        let mut rules = a.identity_rule.clone();
        let auth_flag = spire_auth_method(&self.auth, self.spire_auth_method.as_deref(), "--auth")?;
        let auth = if let Some(rest) = auth_flag.strip_prefix("mtls:") {
            // Upstream form: the mapping rule is given with --auth.
            rules.push(format!("mtls:{rest}"));
            "spiffe".to_string()
        } else {
            auth_flag.clone()
        };
        let trust_domains = a
            .trust_domain
            .iter()
            .map(|t| TrustDomain::new(t))
            .collect::<Result<Vec<_>, _>>()?;
        let auth = if auth == "spiffe" {
            argocd_agent_principal::AuthConfig::Mtls {
                svid: svid_config(&a.svid)?,
                trust_domains,
            }
        } else if auth == "jwt-svid" {
            argocd_agent_principal::AuthConfig::Jwt {
                endpoint: a.svid.spiffe_endpoint_socket.clone(),
                audience: a.jwt_audience.as_deref().map(SpiffeId::parse).transpose()?,
            }
        } else if auth.starts_with("header:") {
            argocd_agent_principal::AuthConfig::Header {
                auth,
                policy: HeaderListenerPolicy {
                    trusted_proxies: a.header_auth_trusted_proxy.clone(),
                    allow_non_loopback: a.insecure_header_auth_any_address,
                },
            }
        } else {
            return Err(format!(
                "unknown --auth {auth}: use spiffe, mtls:uri:<regex> or header:<preset>",
                auth = quoted(&auth)
            )
            .into());
        };
        let mut labels = BTreeMap::new();
        for l in &a.namespace_create_label {
            let (k, v) = l.split_once('=').ok_or_else(|| {
                format!("--namespace-create-label {l}: expected k=v", l = quoted(&l))
            })?;
            labels.insert(k.to_owned(), v.to_owned());
        }
        if a.enable_websocket && !matches!(auth, argocd_agent_principal::AuthConfig::Mtls { .. }) {
            return Err("--enable-websocket carries SVID mutual TLS inside the WebSocket: it needs --auth spiffe".into());
        }
        let config = argocd_agent_principal::PrincipalConfig {
            listen: SocketAddr::new(a.listen_host, a.listen_port),
            auth,
            rules_file: a.identity_rules.clone(),
            rules,
            kube: a.kube.options(),
            label_selector: a.label_selector.clone(),
            allowed_namespaces: a.allowed_namespaces.clone(),
            argocd_namespace: a.namespace.clone(),
            destination_based_mapping: a.destination_based_mapping,
            metrics_max_agent_labels: a.metrics_max_agent_labels,
            create_namespace: a.namespace_create_enable,
            namespace_labels: labels,
            metrics_listen: (a.metrics_port != 0).then(|| {
                SocketAddr::new(a.metrics_host.unwrap_or_else(default_host), a.metrics_port)
            }),
            healthz_listen: (a.healthz_port != 0).then(|| {
                SocketAddr::new(a.metrics_host.unwrap_or_else(default_host), a.healthz_port)
            }),
            admin_listen: match a.admin_address.as_str() {
                "off" | "" => None,
                addr => Some(addr.parse().map_err(
                    |e: argocd_agent_principal::config::AdminAddressError| {
                        format!("--admin-address: {e}")
                    },
                )?),
            },
            max_message_size: a.max_message_size,
            compression: a.enable_compression,
            keepalive_min_interval: a.keepalive_min_interval,
            max_connection_idle: a.max_connection_idle,
            websocket: a.enable_websocket,
            hello_timeout: a.hello_timeout,
            resync_min_interval: a.resync_min_interval,
            idle_timeout: a.idle_timeout,
            max_connections: a.max_connections.max(1),
            max_connections_per_client: a.max_connections_per_client.max(1),
            max_handshakes_per_client: a.max_handshakes_per_client.max(1),
            max_handshake_wait: match a.max_handshake_wait {
                Some(d) if d.is_zero() => None,
                Some(d) => Some(d),
                None if a.ha.ha => Some(argocd_agent_principal::ha::DEFAULT_MAX_HANDSHAKE_WAIT),
                None => None,
            },
            queue: argocd_agent_domain::QueueLimits {
                max_in_flight: a.max_in_flight,
                ..Default::default()
            },
            event_rate: {
                if !(a.agent_event_rate >= 0.0 && a.agent_event_rate.is_finite()) {
                    return Err(format!(
                        "--agent-event-rate: {} is not a rate (events per second, 0: no limit)",
                        a.agent_event_rate
                    )
                    .into());
                }
                argocd_agent_principal::ratelimit::EventRate {
                    rate: a.agent_event_rate,
                    burst: a.agent_event_burst,
                }
            },
            agent_bounds: argocd_agent_principal::bounds::AgentBounds {
                max_object_size: a.agent_max_object_size,
                max_applications: a.agent_max_applications,
                max_bytes: a.agent_max_bytes,
            },
            redis_proxy: a.redis.config()?,
            resource_proxy: a.resource_proxy.config()?,
            ha: a.ha.config()?,
            ..Default::default()
        };
        Ok(config)
    }
}

impl AgentArgs {
    /// The agent's configuration from these flags: every check the agent makes before it starts.
    pub fn config(&self) -> Result<argocd_agent_agent::AgentConfig, crate::BoxError> {
        // The guard first: a broken policy stops the agent before anything connects.
        let guard = self.guard.sources()?;
        let a = self;
        let server = format!("{}:{}", a.server_address, a.server_port);
        let creds = spire_auth_method(&a.creds, a.spire_auth_method.as_deref(), "--creds")?;
        let transport = if creds.starts_with("header") {
            if !argocd_agent_mesh::guard::is_loopback_host(&a.server_address)
                && !a.insecure_plaintext_any_address
            {
                return Err(format!(
                    "--creds header: sends plaintext; {} is not a loopback address of a local sidecar (pass --insecure-plaintext-any-address to override)",
                    a.server_address
                )
                .into());
            }
            argocd_agent_agent::Transport::PlaintextToSidecar
        } else if creds == "jwt-svid" {
            let audience = a
                .principal_spiffe_id
                .as_deref()
                .ok_or("--creds jwt-svid needs --principal-spiffe-id (the token's audience)")?;
            argocd_agent_agent::Transport::JwtSvid {
                endpoint: a.svid.spiffe_endpoint_socket.clone(),
                audience: SpiffeId::parse(audience)?,
            }
        } else if creds == "spiffe" || creds == "mtls" {
            if a.principal_spiffe_id.is_none() && a.principal_trust_domain.is_none() {
                return Err("refusing to connect without pinning the principal: set --principal-spiffe-id (or --principal-trust-domain)".into());
            }
            argocd_agent_agent::Transport::Mtls {
                svid: svid_config(&a.svid)?,
                principal_id: a
                    .principal_spiffe_id
                    .as_deref()
                    .map(SpiffeId::parse)
                    .transpose()?,
                principal_trust_domain: a
                    .principal_trust_domain
                    .as_deref()
                    .map(TrustDomain::new)
                    .transpose()?,
            }
        } else {
            return Err(format!(
                "unknown --creds {}: use spiffe or header:",
                quoted(&a.creds)
            )
            .into());
        };
        if a.enable_websocket && !matches!(transport, argocd_agent_agent::Transport::Mtls { .. }) {
            return Err("--enable-websocket carries SVID mutual TLS inside the WebSocket: it needs --creds spiffe".into());
        }
        let config = argocd_agent_agent::AgentConfig {
            mode: a.agent_mode,
            server,
            transport,
            namespace: a.namespace.clone(),
            kube: a.kube.options(),
            label_selector: a.label_selector.clone(),
            heartbeat: match a.heartbeat_interval.unwrap_or(a.keep_alive_ping_interval) {
                d if d.is_zero() => return Err("--heartbeat-interval must be above 0".into()),
                d => d,
            },
            resync_interval: a.resync_interval,
            keepalive: match a.keep_alive_ping_interval {
                d if d.is_zero() => {
                    return Err("--keep-alive-ping-interval must be above 0".into());
                }
                d => d,
            },
            compression: a.enable_compression.then_some(a.compression_algorithm),
            websocket: a.enable_websocket,
            max_message_size: a.max_message_size,
            metrics_listen: (a.metrics_port != 0).then(|| {
                SocketAddr::new(a.metrics_host.unwrap_or_else(default_host), a.metrics_port)
            }),
            healthz_listen: (a.healthz_port != 0).then(|| {
                SocketAddr::new(a.metrics_host.unwrap_or_else(default_host), a.healthz_port)
            }),
            policies: argocd_agent_agent::policy::Policies {
                adoption: a.adoption_policy,
                mismatch: a.source_uid_mismatch_policy,
                on_recreate: a.on_application_recreate,
            },
            destination_based_mapping: a.destination_based_mapping,
            ignore_unmanaged_apps: a.ignore_unmanaged_apps,
            allowed_namespaces: a.allowed_namespaces.clone(),
            create_namespace: a.create_namespace,
            redis: a.redis.config()?,
            resource_proxy: !a.resource_proxy.disable_resource_proxy,
            resource_proxy_max_body: a.resource_proxy.resource_proxy_max_body,
            resource_proxy_max_concurrent: a.resource_proxy.resource_proxy_max_concurrent.max(1),
            resource_proxy_timeout: a.resource_proxy.resource_proxy_timeout,
            resource_proxy_pod_security: a.resource_proxy.resource_proxy_pod_security,
            guard,
            cache_refresh_interval: match a.redis.cache_refresh_interval {
                d if d.is_zero() => return Err("--cache-refresh-interval must be above 0".into()),
                d => d,
            },
            ..Default::default()
        };
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_and_keepalive_flags() {
        let agent = |args: &[&str]| {
            let mut argv = vec!["argocd-agent", "agent", "--server-address", "p"];
            argv.extend_from_slice(args);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Agent(a)) => Ok(a),
                Ok(_) => unreachable!("parsed as the agent"),
                Err(e) => Err(e.to_string()),
            }
        };
        let a = agent(&[]).unwrap();
        assert!(!a.enable_compression);
        assert_eq!(
            a.compression_algorithm,
            argocd_agent_agent::dialer::Compression::Gzip
        );
        assert_eq!(a.heartbeat_interval, None);
        for on in [
            &["--enable-compression"][..],
            &["--enable-compression=true"],
        ] {
            assert!(agent(on).unwrap().enable_compression, "{on:?}");
        }
        assert!(
            !agent(&["--enable-compression=false"])
                .unwrap()
                .enable_compression
        );
        let a = agent(&["--enable-compression", "--compression-algorithm", "zstd"]).unwrap();
        assert_eq!(
            a.compression_algorithm,
            argocd_agent_agent::dialer::Compression::Zstd
        );
        let err = agent(&["--compression-algorithm", "brotli"]).unwrap_err();
        assert!(err.contains("gzip or zstd"), "{err}");
        let a = agent(&[
            "--keep-alive-ping-interval",
            "50s",
            "--heartbeat-interval",
            "10s",
        ])
        .unwrap();
        assert_eq!(a.keep_alive_ping_interval, Duration::from_secs(50));
        assert_eq!(a.heartbeat_interval, Some(Duration::from_secs(10)));

        let principal = |args: &[&str]| {
            let mut argv = vec!["argocd-agent", "principal"];
            argv.extend_from_slice(args);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Principal(p)) => p,
                other => panic!("{other:?}"),
            }
        };
        let p = principal(&[]);
        assert!(!p.enable_compression);
        assert_eq!(p.keepalive_min_interval, Duration::ZERO);
        let p = principal(&["--enable-compression", "--keepalive-min-interval", "20s"]);
        assert!(p.enable_compression);
        assert_eq!(p.keepalive_min_interval, Duration::from_secs(20));
    }

    #[test]
    fn a_handshake_slot_is_waited_for_3s_with_ha_and_in_the_backlog_without() {
        let wait = |args: &[&str]| {
            let mut argv = vec!["argocd-agent", "principal"];
            argv.extend(["--spiffe-endpoint-socket", "unix:///spire.sock"]);
            argv.extend_from_slice(args);
            match Cli::try_parse_from(argv).map(|c| c.command) {
                Ok(Command::Principal(p)) => p.config().unwrap().max_handshake_wait,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(wait(&[]), None, "one principal: nowhere else to go");
        assert_eq!(wait(&["--ha"]), Some(Duration::from_secs(3)));
        assert_eq!(wait(&["--ha", "--max-handshake-wait", "0"]), None);
        assert_eq!(
            wait(&["--max-handshake-wait", "500ms"]),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn upstreams_spire_flag_names_are_aliases() {
        let parse = |argv: &[&str]| Cli::try_parse_from(argv).map(|c| c.command).unwrap();
        let agent = |args: &[&str]| {
            let mut argv = vec!["argocd-agent", "agent", "--server-address", "p"];
            argv.extend(["--spire-agent-socket", "unix:///spire.sock"]);
            argv.extend(["--principal-spiffe-id", "spiffe://hub/p"]);
            argv.extend_from_slice(args);
            match parse(&argv) {
                Command::Agent(a) => a,
                other => panic!("{other:?}"),
            }
        };
        let a = agent(&[]);
        assert_eq!(
            a.svid.spiffe_endpoint_socket.as_deref(),
            Some("unix:///spire.sock")
        );
        assert!(matches!(
            a.config().unwrap().transport,
            argocd_agent_agent::Transport::Mtls { .. }
        ));
        let jwt = agent(&["--spire-auth-method", "jwt"])
            .config()
            .unwrap()
            .transport;
        assert!(
            matches!(&jwt, argocd_agent_agent::Transport::JwtSvid { endpoint: Some(e), .. } if e == "unix:///spire.sock"),
            "{jwt:?}"
        );
        let mtls = agent(&["--spire-auth-method", "mtls"])
            .config()
            .unwrap()
            .transport;
        assert!(matches!(mtls, argocd_agent_agent::Transport::Mtls { .. }));
        let err = agent(&["--spire-auth-method", "mtls", "--creds", "jwt-svid"])
            .config()
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "--spire-auth-method mtls means --creds spiffe, but --creds jwt-svid is given: keep one of them"
        );
        let principal = |args: &[&str]| {
            let mut argv = vec![
                "argocd-agent",
                "principal",
                "--spire-agent-socket",
                "unix:///s",
            ];
            argv.extend_from_slice(args);
            match parse(&argv) {
                Command::Principal(p) => p,
                other => panic!("{other:?}"),
            }
        };
        let p = principal(&["--spire-auth-method", "jwt"]).config().unwrap();
        assert!(
            matches!(p.auth, argocd_agent_principal::AuthConfig::Jwt { .. }),
            "{:?}",
            p.auth
        );
        let p = principal(&["--spire-auth-method", "mtls"])
            .config()
            .unwrap();
        assert!(matches!(
            p.auth,
            argocd_agent_principal::AuthConfig::Mtls { .. }
        ));
        let err = principal(&["--spire-auth-method", "jwt", "--auth", "header:istio"])
            .config()
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("means --auth jwt-svid, but --auth header:istio is given"),
            "{err}"
        );
        assert!(
            Cli::try_parse_from([
                "argocd-agent",
                "agent",
                "--server-address",
                "p",
                "--spire-auth-method",
                "x509"
            ])
            .is_err()
        );
    }

    #[test]
    fn websocket_flags_need_mutual_tls() {
        let parse = |argv: &[&str]| Cli::try_parse_from(argv).map(|c| c.command).unwrap();
        let agent = |args: &[&str]| {
            let mut argv = vec!["argocd-agent", "agent", "--server-address", "p"];
            argv.extend(["--spiffe-endpoint-socket", "unix:///spire.sock"]);
            argv.extend_from_slice(args);
            match parse(&argv) {
                Command::Agent(a) => a,
                other => panic!("{other:?}"),
            }
        };
        assert!(!agent(&[]).enable_websocket);
        let a = agent(&[
            "--enable-websocket",
            "--principal-spiffe-id",
            "spiffe://hub/p",
        ]);
        assert!(a.enable_websocket);
        assert!(a.config().unwrap().websocket);
        let err = agent(&[
            "--enable-websocket=true",
            "--creds",
            "header",
            "--insecure-plaintext-any-address",
        ])
        .config()
        .unwrap_err()
        .to_string();
        assert!(err.contains("needs --creds spiffe"), "{err}");
        let principal = |args: &[&str]| {
            let mut argv = vec!["argocd-agent", "principal"];
            argv.extend(["--spiffe-endpoint-socket", "unix:///spire.sock"]);
            argv.extend_from_slice(args);
            match parse(&argv) {
                Command::Principal(p) => p,
                other => panic!("{other:?}"),
            }
        };
        assert!(!principal(&[]).enable_websocket);
        assert!(
            principal(&["--enable-websocket"])
                .config()
                .unwrap()
                .websocket
        );
        let err = principal(&["--enable-websocket", "--auth", "header:istio"])
            .config()
            .unwrap_err()
            .to_string();
        assert!(err.contains("needs --auth spiffe"), "{err}");
    }

    #[test]
    fn listeners_without_a_host_bind_the_pod_ip_or_loopback_never_every_interface() {
        let loopback = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(pod_ip_or_loopback(None), loopback);
        assert_eq!(pod_ip_or_loopback(Some("")), loopback);
        assert_eq!(pod_ip_or_loopback(Some("not-an-ip")), loopback);
        assert_eq!(
            pod_ip_or_loopback(Some("10.244.1.7")),
            "10.244.1.7".parse::<IpAddr>().unwrap()
        );
        let any = parse_listen(":6379").unwrap();
        assert!(!any.ip().is_unspecified(), "{any}");
        assert_eq!(
            parse_listen("0.0.0.0:6379").unwrap().ip(),
            IpAddr::from([0, 0, 0, 0]),
            "every interface when asked for"
        );
    }
}
