//! Principal configuration: what the binary's flags fill in.

use argocd_agent_identity::text::quoted;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_domain::QueueLimits;
use argocd_agent_kubernetes::ClientOptions;

use argocd_agent_identity::source::SvidConfig;

use crate::auth::AuthConfig;

/// Where the operator (admin) API listens: loopback TCP or a Unix socket. Plaintext and
/// unauthenticated: only local operators (`kubectl exec`, `kubectl port-forward`) reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdminAddress {
    /// A loopback TCP address (anything else is refused at start).
    Tcp(SocketAddr),
    /// A Unix socket path (`unix:///path`).
    Unix(PathBuf),
}

/// Why an `--admin-address` is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdminAddressError {
    /// `unix://` without a path.
    #[error("unix:// needs a socket path (unix:///run/admin.sock)")]
    NoSocketPath,
    /// Neither `host:port` nor `unix:///path`.
    #[error("{}: expected host:port or unix:///path ({reason})", quoted(.value))]
    NotAnAddress {
        /// The value given.
        value: String,
        /// Why it is no socket address.
        reason: std::net::AddrParseError,
    },
    /// A TCP address off loopback.
    #[error(
        "{0}: the admin API is plaintext and unauthenticated; it listens on loopback or a Unix socket only"
    )]
    NotLoopback(SocketAddr),
}

impl std::str::FromStr for AdminAddress {
    type Err = AdminAddressError;
    fn from_str(s: &str) -> Result<Self, AdminAddressError> {
        if let Some(path) = s.strip_prefix("unix://") {
            if path.is_empty() {
                return Err(AdminAddressError::NoSocketPath);
            }
            return Ok(AdminAddress::Unix(PathBuf::from(path)));
        }
        let addr: SocketAddr = s
            .parse()
            .map_err(|reason| AdminAddressError::NotAnAddress {
                value: s.to_owned(),
                reason,
            })?;
        if !addr.ip().is_loopback() {
            return Err(AdminAddressError::NotLoopback(addr));
        }
        Ok(AdminAddress::Tcp(addr))
    }
}

impl std::fmt::Display for AdminAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdminAddress::Tcp(a) => write!(f, "{a}"),
            AdminAddress::Unix(p) => write!(f, "unix://{}", p.display()),
        }
    }
}

/// The default admin address: `127.0.0.1:8001`.
pub const DEFAULT_ADMIN_ADDRESS: &str = "127.0.0.1:8001";

/// How long an agent connection may stay without a stream by default
/// (`--max-connection-idle`).
pub const DEFAULT_MAX_CONNECTION_IDLE: Duration = Duration::from_secs(300);

/// Principal configuration.
#[derive(Debug, Clone)]
pub struct PrincipalConfig {
    /// The agents' gRPC listener (default `0.0.0.0:8443`; port 0 picks a free one).
    pub listen: SocketAddr,
    /// How agents (and admin callers on the agent listener) authenticate (default: SVID
    /// mTLS from the Workload API).
    pub auth: AuthConfig,
    /// The identity mapping rules file (YAML), reloaded live.
    pub rules_file: Option<PathBuf>,
    /// Extra mapping rules, one per entry, evaluated after the file's. With neither rules
    /// nor a file every agent is refused.
    pub rules: Vec<String>,
    /// How often the rules file is read for changes (default 250 ms).
    pub rules_poll: Duration,
    /// How to reach the hub's Kubernetes API.
    pub kube: ClientOptions,
    /// Restricts which hub objects (of every kind) are watched; its equality terms label
    /// every object the principal creates (see [`crate::partition`]).
    pub label_selector: Option<String>,
    /// The agent hub namespaces this principal serves and watches Applications in
    /// (`--allowed-namespaces`: globs and `/regex/`; empty: every namespace). Agents whose
    /// rule maps them elsewhere are refused at connect.
    pub allowed_namespaces: Vec<String>,
    /// Argo CD's namespace on the hub: where AppProjects, repository Secrets and the GPG
    /// keys ConfigMap live (`--namespace`, as upstream).
    pub argocd_namespace: String,
    /// Managed agents' Applications are chosen by `spec.destination.name` instead of by hub
    /// namespace (`--destination-based-mapping`).
    pub destination_based_mapping: bool,
    /// Agents that get their own label value in per-agent metrics; later ones share `other`.
    pub metrics_max_agent_labels: usize,
    /// Create an agent's hub namespace when it first connects (default off).
    pub create_namespace: bool,
    /// Labels put on the namespaces created for agents.
    pub namespace_labels: BTreeMap<String, String>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (default `0.0.0.0:8000`;
    /// `None` turns the listener off).
    pub metrics_listen: Option<SocketAddr>,
    /// An extra listener for `/healthz` and `/readyz` only (upstream's `--healthz-port`);
    /// both are always served on the metrics listener too.
    pub healthz_listen: Option<SocketAddr>,
    /// The operator API's listener (`--admin-address`); `None` turns it off.
    pub admin_listen: Option<AdminAddress>,
    /// The largest gRPC message sent or received on the agent listener, in bytes (default
    /// 4 MiB).
    pub max_message_size: usize,
    /// Each agent's outbound queue: pending resource keys, unacknowledged events and the
    /// resend backoff.
    pub queue: QueueLimits,
    /// Each agent's inbound event rate limit (`--agent-event-rate`, `--agent-event-burst`).
    pub event_rate: crate::ratelimit::EventRate,
    /// Each agent's bounds on what it writes to the hub (`--agent-max-object-size`,
    /// `--agent-max-applications`, `--agent-max-bytes`).
    pub agent_bounds: crate::bounds::AgentBounds,
    /// A session silent for longer than this is closed (agents send heartbeats); so is one
    /// whose agent takes no outbound event for this long (an agent that never reads).
    pub idle_timeout: Duration,
    /// How long an agent may take to send its hello (`--hello-timeout`).
    pub hello_timeout: Duration,
    /// The shortest interval between one agent's resync rounds (`--resync-min-interval`):
    /// periodic requests within it are refused (`ResyncTooSoon`). Zero: no minimum.
    pub resync_min_interval: Duration,
    /// TLS handshakes in progress at once (a reconnect storm queues beyond this); on the
    /// plaintext listener, connections waiting for their HTTP/2 preface.
    pub max_concurrent_handshakes: usize,
    /// Of `max_concurrent_handshakes`, how many one client address may hold
    /// (`--max-handshakes-per-client`).
    pub max_handshakes_per_client: usize,
    /// How long a connection may wait for a TLS handshake slot before it is reset
    /// (`Busy`), so its agent dials again and lands on a replica with room
    /// (`--max-handshake-wait`; by default 1 s with `--ha`, otherwise `None`: it waits in
    /// the kernel's backlog).
    pub max_handshake_wait: Option<Duration>,
    /// Agent listener connections open at once (`--max-connections`).
    pub max_connections: usize,
    /// Of `max_connections`, how many one client address may hold
    /// (`--max-connections-per-client`).
    pub max_connections_per_client: usize,
    /// HTTP/2 streams one connection may open at once (an agent needs one or two).
    pub max_concurrent_streams: u32,
    /// Compress what the principal sends to agents that accept gzip or zstd
    /// (`--enable-compression`; the agent's first accepted encoding is used). Off, answers are
    /// compressed only to agents that compress their own stream, in their encoding. Compressed
    /// messages from agents are decoded either way.
    pub compression: bool,
    /// The shortest interval allowed between an agent's HTTP/2 PINGs
    /// (`--keepalive-min-interval`; zero: no minimum); see [`argocd_agent_listener::h2`].
    pub keepalive_min_interval: Duration,
    /// How long an agent connection may stay open with no gRPC stream open
    /// (`--max-connection-idle`, gRPC's `MaxConnectionIdle`; zero: no limit); see
    /// [`argocd_agent_listener::h2`].
    pub max_connection_idle: Duration,
    /// The principal's own HTTP/2 PINGs on agent connections (not a flag: the defaults are
    /// measured; see [`Keepalive`]).
    pub keepalive: Keepalive,
    /// Also take agents whose connection comes as an HTTP/1.1 WebSocket upgrade, with the
    /// same SVID mutual TLS inside it, on the agent listener (`--enable-websocket`; mTLS
    /// only); see [`argocd_agent_identity::websocket`].
    pub websocket: bool,
    /// The Redis proxy in front of argocd-server (`None`: off).
    pub redis_proxy: Option<crate::redisproxy::RedisProxyConfig>,
    /// The resource proxy argocd-server uses as each agent's cluster (`None`: off).
    pub resource_proxy: Option<crate::resourceproxy::ResourceProxyConfig>,
    /// Replicas coordinated through Leases (`--ha`; `None`: a single principal).
    pub ha: Option<crate::ha::HaConfig>,
}

/// The principal's HTTP/2 keepalive: it PINGs an agent connection from which nothing came
/// for `interval`, and closes it when the answer takes longer than `timeout`. What finds a
/// dead agent is the agent's side: its own PINGs and heartbeats every
/// `--keep-alive-ping-interval` (30 s by default), and the session's `--idle-timeout`. The
/// principal's PING is the backstop for a connection whose agent fell silent, so an agent
/// that heartbeats is never PINGed (`agent_listener`'s tests). At 30 s (the agents' own
/// interval) the PINGs raced the heartbeats and doubled an idle fleet's packets; at 60 s a
/// silent peer is still found within 70 s, before the idle timeout. Upstream's principal
/// sends none (gRPC-Go's server default is 2 h). See docs/benchmarks.md, "Idle CPU: the
/// principal's own PINGs".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keepalive {
    /// Silence before a PING (`None`: the principal sends none).
    pub interval: Option<Duration>,
    /// How long a PING may go unanswered before the connection is closed.
    pub timeout: Duration,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            interval: Some(Duration::from_secs(60)),
            timeout: Duration::from_secs(10),
        }
    }
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
            rules_poll: Duration::from_millis(250),
            kube: ClientOptions::default(),
            label_selector: None,
            allowed_namespaces: Vec::new(),
            argocd_namespace: "argocd".into(),
            destination_based_mapping: false,
            metrics_max_agent_labels: crate::metrics::DEFAULT_MAX_AGENT_LABELS,
            create_namespace: false,
            namespace_labels: BTreeMap::new(),
            metrics_listen: Some(SocketAddr::from(([0, 0, 0, 0], 8000))),
            healthz_listen: None,
            // Off for embedders; the binary's `--admin-address` defaults to DEFAULT_ADMIN_ADDRESS.
            admin_listen: None,
            max_message_size: 4 * 1024 * 1024,
            queue: QueueLimits::default(),
            event_rate: crate::ratelimit::EventRate::default(),
            agent_bounds: crate::bounds::AgentBounds::default(),
            idle_timeout: Duration::from_secs(120),
            hello_timeout: crate::session::DEFAULT_HELLO_TIMEOUT,
            resync_min_interval: Duration::ZERO,
            max_concurrent_handshakes: argocd_agent_listener::DEFAULT_MAX_CONCURRENT_HANDSHAKES,
            max_handshakes_per_client: argocd_agent_listener::DEFAULT_MAX_HANDSHAKES_PER_CLIENT,
            max_handshake_wait: None,
            max_connections: argocd_agent_listener::DEFAULT_MAX_CONNECTIONS,
            max_connections_per_client: argocd_agent_listener::DEFAULT_MAX_CONNECTIONS_PER_CLIENT,
            max_concurrent_streams: 16,
            compression: false,
            keepalive_min_interval: Duration::ZERO,
            max_connection_idle: DEFAULT_MAX_CONNECTION_IDLE,
            keepalive: Keepalive::default(),
            websocket: false,
            redis_proxy: None,
            resource_proxy: None,
            ha: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_address_is_loopback_or_unix_socket() {
        assert_eq!(
            DEFAULT_ADMIN_ADDRESS.parse::<AdminAddress>().unwrap(),
            AdminAddress::Tcp("127.0.0.1:8001".parse().unwrap())
        );
        assert_eq!(
            "[::1]:9".parse::<AdminAddress>().unwrap().to_string(),
            "[::1]:9"
        );
        assert_eq!(
            "unix:///run/a.sock".parse::<AdminAddress>().unwrap(),
            AdminAddress::Unix("/run/a.sock".into())
        );
        let err = "0.0.0.0:8001"
            .parse::<AdminAddress>()
            .unwrap_err()
            .to_string();
        assert!(err.contains("loopback"), "{err}");
        assert!("unix://".parse::<AdminAddress>().is_err());
        assert!("localhost".parse::<AdminAddress>().is_err());
    }
}
