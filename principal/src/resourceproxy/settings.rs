//! The resource proxy's settings: what the binary's flags fill in, and the URLs they give.

use std::net::SocketAddr;
use std::time::Duration;

use argocd_agent_domain::AgentName;

use super::tls;

/// Default listen address (upstream's port).
pub const DEFAULT_ADDRESS: &str = "0.0.0.0:9090";
/// URL path prefix naming the agent.
pub const AGENT_PREFIX: &str = "/agents/";

/// Bytes of request bodies the proxy buffers at once by default: sixteen bodies of the
/// default 4 MiB maximum.
pub const DEFAULT_MAX_BUFFERED_BODIES: usize = 64 << 20;

/// Resource proxy settings.
#[derive(Debug, Clone)]
pub struct ResourceProxyConfig {
    /// Where the proxy listens (upstream's default: [`DEFAULT_ADDRESS`]).
    pub listen: SocketAddr,
    /// Base URL clients reach the proxy at (cluster secrets hold `<url>/agents/<agent>`).
    pub url: String,
    /// This replica's own URL, which other replicas forward to (published on its replica
    /// Lease); empty: `https://$POD_IP:<port>`, else the bound address.
    pub replica_url: String,
    /// Names of the issued serving certificate (DNS names or IPs); the URL's host is added.
    pub hostnames: Vec<String>,
    /// Which certificate the proxy serves (default [`tls::ServingMode::Auto`]).
    pub tls: tls::ServingMode,
    /// Lifetime of an issued serving certificate.
    pub cert_lifetime: Duration,
    /// Lifetime of the per-agent tokens in cluster secrets (renewed at two thirds).
    pub token_ttl: Duration,
    /// How long an agent has to answer a request (504 after).
    pub request_timeout: Duration,
    /// Largest request body accepted (413 above).
    pub max_body: usize,
    /// Requests, log streams and terminal sessions at once per agent (429 above).
    pub max_in_flight_per_agent: usize,
    /// A terminal session with no traffic either way for this long is closed.
    pub terminal_idle_timeout: Duration,
    /// A terminal session is closed after this long in any case.
    pub terminal_max_duration: Duration,
    /// How long a followed log waits for its agent to come back.
    pub log_resume_timeout: Duration,
    /// Create (and keep current) each agent's Argo CD cluster secret on connect.
    pub self_cluster_registration: bool,
    /// Connections, handshakes, header and idle timeouts of the listener.
    pub limits: argocd_agent_listener::Limits,
    /// How long a client may take to send a request body (408 after); the body is read
    /// before the request takes one of its agent's slots.
    pub body_timeout: Duration,
    /// Bytes of request bodies buffered at once across all requests
    /// (`--resource-proxy-max-buffered-bodies`, default 64 MiB); at least `max_body`.
    pub max_buffered_bodies: usize,
    /// How long a request waits for room among the buffered bodies before it is answered
    /// 429 (`--resource-proxy-body-wait`).
    pub body_wait: Duration,
}

impl ResourceProxyConfig {
    /// Defaults listening on `listen`, reachable at `url`.
    pub fn new(listen: SocketAddr, url: String) -> Self {
        ResourceProxyConfig {
            listen,
            url,
            replica_url: String::new(),
            hostnames: Vec::new(),
            tls: tls::ServingMode::Auto,
            cert_lifetime: Duration::from_secs(30 * 24 * 3600),
            token_ttl: Duration::from_secs(24 * 3600),
            request_timeout: Duration::from_secs(30),
            max_body: 4 << 20,
            max_in_flight_per_agent: 32,
            terminal_idle_timeout: Duration::from_secs(30 * 60),
            terminal_max_duration: Duration::from_secs(4 * 3600),
            log_resume_timeout: Duration::from_secs(60),
            self_cluster_registration: false,
            limits: argocd_agent_listener::Limits::default(),
            body_timeout: Duration::from_secs(30),
            max_buffered_bodies: DEFAULT_MAX_BUFFERED_BODIES,
            body_wait: Duration::from_secs(2),
        }
    }

    /// The URL's host (what the serving certificate must name).
    pub fn host(&self) -> String {
        url_host(&self.url)
    }

    /// The replica URL's host.
    pub fn replica_host(&self) -> String {
        url_host(&self.replica_url)
    }
}

/// A URL's host (without IPv6 brackets); `localhost` when it has none.
fn url_host(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .and_then(|u| u.host_str().map(|h| h.trim_matches(['[', ']']).to_owned()))
        .unwrap_or_else(|| "localhost".into())
}

impl ResourceProxyConfig {
    /// The cluster URL of `agent`.
    pub fn agent_url(&self, agent: &AgentName) -> String {
        format!(
            "{}{AGENT_PREFIX}{}",
            self.url.trim_end_matches('/'),
            agent.as_str()
        )
    }
}
