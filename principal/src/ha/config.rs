//! The high-availability settings and the names, labels and annotations of the Leases.

use argocd_agent_identity::text::quoted;
use std::time::Duration;

/// Label on every Lease the principal writes: `agent` or `replica`.
pub const LEASE_LABEL: &str = "argocd-agent.argoproj-labs.io/lease";
/// Annotation a replica sets on an agent Lease held by another live replica: its holder
/// identity, asking for the agent to be handed over.
pub const TAKEOVER_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/takeover-requested-by";
/// Annotation on an agent Lease: the agent's hub namespace (any replica can tell whose an
/// Application is, also for agents it never served).
pub const HUB_NAMESPACE_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/hub-namespace";
/// Annotation on a replica Lease: the replica's resource proxy URL (for other replicas).
pub const RESOURCE_PROXY_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/resource-proxy-url";
/// Annotation on a replica Lease: the replica's Redis proxy address (`host:port`, for other
/// replicas).
pub const REDIS_PROXY_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/redis-proxy-address";
/// Agent label on agent Leases (the same label the hub namespace carries).
pub const AGENT_LABEL: &str = argocd_agent_kubernetes::AGENT_NAME_LABEL;
/// Name prefix of agent Leases.
pub const AGENT_LEASE_PREFIX: &str = "argocd-agent-session-";
/// Name prefix of replica Leases.
pub const REPLICA_LEASE_PREFIX: &str = "argocd-agent-replica-";

/// Default of `--replica-lease-duration`.
pub const DEFAULT_REPLICA_LEASE: Duration = Duration::from_secs(10);
/// Default of `--agent-lease-duration`.
pub const DEFAULT_AGENT_LEASE: Duration = Duration::from_secs(15 * 60);
/// Default of `--lease-qps`.
pub const DEFAULT_LEASE_QPS: f32 = 500.0;
/// Default of `--lease-burst`.
pub const DEFAULT_LEASE_BURST: u32 = 1000;
/// Default of `--max-handshake-wait` with `--ha`: how long a new agent connection waits
/// for a TLS handshake slot before it is reset, so that in a reconnect storm it dials
/// again and lands on a replica with room (the first replica to be ready otherwise holds
/// the whole returning fleet in its backlog while the others sit idle). Measured against
/// 1 s in docs/benchmarks.md: as good after a `kill -9` of every replica, and a first
/// connect of the whole fleet (every replica equally busy) does not pay for the redials.
pub const DEFAULT_MAX_HANDSHAKE_WAIT: Duration = Duration::from_secs(3);
/// Lease requests in flight at once (each one a connection to the hub API at most).
pub const LEASE_REQUESTS_IN_FLIGHT: usize = 16;

/// Requests per second of the replica Lease's own client (one in flight): a renewal every
/// fifth of `--replica-lease-duration`, a create, and the release at shutdown.
pub const REPLICA_LEASE_QPS: f32 = 5.0;
/// Burst of the replica Lease's own client.
pub const REPLICA_LEASE_BURST: u32 = 5;
/// How often Leases held in our name without a session are looked for.
pub(super) const ORPHAN_SWEEP: Duration = Duration::from_secs(10);
/// Agent Leases renewed per tick at most (a burst after a long stall is spread).
pub(super) const RENEWS_PER_TICK: usize = 200;

/// How replicas share agents (`--ha`).
#[derive(Debug, Clone)]
pub struct HaConfig {
    /// This replica's name (`--replica-id`, default the pod name from `POD_NAME` or the
    /// host name); a DNS label.
    pub replica: String,
    /// Lifetime of the replica Lease (`--replica-lease-duration`, default 10 s, at least
    /// 1 s): renewed every fifth of it; a replica not seen renewing for this long is dead.
    pub replica_lease_duration: Duration,
    /// Lifetime of an agent Lease (`--agent-lease-duration`, default 15 min, not shorter
    /// than the replica Lease's): renewed between a third and two thirds of it.
    pub agent_lease_duration: Duration,
    /// Even the load out across live replicas.
    pub rebalance: bool,
    /// Keep decoded only the Applications of the agents this replica serves, the others
    /// as their JSON (default on; `--no-shard-cache` turns it off; see docs/ha.md).
    pub shard_cache: bool,
    /// Agents a replica may hold above its fair share before shedding.
    pub rebalance_slack: usize,
    /// How often a replica compares its share (sheds at most `rebalance_batch` per round).
    pub rebalance_interval: Duration,
    /// Sessions shed per rebalance round at most (default 10).
    pub rebalance_batch: usize,
    /// Client-side limit of Lease requests per second (their own budget, apart from
    /// `--kube-qps`: a reconnect storm is one Lease write per agent).
    pub lease_qps: f32,
    /// Lease requests allowed at once above `lease_qps` (`--lease-burst`).
    pub lease_burst: u32,
}

impl HaConfig {
    /// Defaults for `replica`.
    pub fn new(replica: impl Into<String>) -> Self {
        HaConfig {
            replica: replica.into(),
            replica_lease_duration: DEFAULT_REPLICA_LEASE,
            agent_lease_duration: DEFAULT_AGENT_LEASE,
            rebalance: true,
            shard_cache: true,
            rebalance_slack: 1,
            rebalance_interval: Duration::from_secs(5),
            rebalance_batch: 10,
            lease_qps: DEFAULT_LEASE_QPS,
            lease_burst: DEFAULT_LEASE_BURST,
        }
    }

    /// Checks what the flags gave.
    pub fn validate(&self) -> Result<(), HaConfigError> {
        let r = &self.replica;
        let dns_label = !r.is_empty()
            && r.len() <= 63
            && r.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !r.starts_with('-')
            && !r.ends_with('-');
        if !dns_label {
            return Err(HaConfigError::ReplicaId(r.clone()));
        }
        if self.replica_lease_duration < Duration::from_secs(1) {
            return Err(HaConfigError::ReplicaLeaseTooShort);
        }
        if self.agent_lease_duration < self.replica_lease_duration {
            return Err(HaConfigError::AgentLeaseShorterThanReplicaLease);
        }
        Ok(())
    }
}

/// The replica name when `--replica-id` is not given: `POD_NAME`, else the host name.
pub fn default_replica_id() -> String {
    let raw = std::env::var("POD_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .unwrap_or_else(|| "principal".into());
    let mut id: String = raw
        .trim()
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .take(63)
        .collect();
    id = id.trim_matches('-').to_string();
    if id.is_empty() {
        "principal".into()
    } else {
        id
    }
}

/// Why the HA flags do not make a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HaConfigError {
    /// `--replica-id` is no DNS label.
    #[error(
        "--replica-id {}: must be a DNS label (lowercase letters, digits, '-', at most 63)",
        quoted(.0)
    )]
    ReplicaId(String),
    /// `--replica-lease-duration` is under a second.
    #[error("--replica-lease-duration must be at least 1s")]
    ReplicaLeaseTooShort,
    /// `--agent-lease-duration` is shorter than `--replica-lease-duration`.
    #[error("--agent-lease-duration must not be shorter than --replica-lease-duration")]
    AgentLeaseShorterThanReplicaLease,
}
