//! Principal replicas, all active, coordinated through the hub's `coordination.k8s.io/v1`
//! Leases (no replication protocol of our own).
//!
//! - Each replica renews its **replica Lease** `argocd-agent-replica-<replica>` every fifth
//!   of `--replica-lease-duration`. Its holder is `<replica>_<incarnation>`: a restarted
//!   replica is a new holder, so what its previous process held is free at once. Another
//!   replica judges it alive by having seen the Lease change within its duration (local
//!   observation, as client-go's leader election does, so clocks need not agree).
//! - Each live session holds its agent's **agent Lease** `argocd-agent-session-<agent>`,
//!   holder = the replica's holder identity. It is renewed at a random point between a third
//!   and two thirds of `--agent-lease-duration` (default 15 minutes), so 10,000 agents cost
//!   ~22 writes/s, not 10,000 per period: liveness comes from the replica Lease, the agent
//!   Lease only says who serves the agent.
//! - **One live session per agent.** A session that reaches a replica whose agent Lease is
//!   held by another live replica asks for it (annotation
//!   [`TAKEOVER_ANNOTATION`]); the holder closes its session and, once that session has
//!   ended, writes the requester as holder. Only then does the new session attach and
//!   resync: the newest session wins, as on one replica, and two never overlap. A holder
//!   whose replica Lease went stale (dead, partitioned) is taken over without asking.
//! - A replica that cannot renew its own Lease for a whole duration closes its sessions
//!   and refuses new ones (others will take its agents over); `/readyz` fails sooner.
//! - **Rebalancing**: a replica above its fair share (agents / live replicas, plus
//!   `--rebalance-slack`) two rounds in a row while another is below it closes a few
//!   sessions per round; the agents reconnect through the Service and land elsewhere.

mod agent;
mod config;
mod rebalance;
mod replica;
mod shares;
mod state;
mod takeover;

pub use agent::LeaseGuard;
pub use config::{
    AGENT_LABEL, AGENT_LEASE_PREFIX, DEFAULT_AGENT_LEASE, DEFAULT_LEASE_BURST, DEFAULT_LEASE_QPS,
    DEFAULT_MAX_HANDSHAKE_WAIT, DEFAULT_REPLICA_LEASE, HUB_NAMESPACE_ANNOTATION, HaConfig,
    HaConfigError, LEASE_LABEL, LEASE_REQUESTS_IN_FLIGHT, REDIS_PROXY_ANNOTATION,
    REPLICA_LEASE_BURST, REPLICA_LEASE_PREFIX, REPLICA_LEASE_QPS, RESOURCE_PROXY_ANNOTATION,
    TAKEOVER_ANNOTATION, default_replica_id,
};
pub use shares::Shares;
pub use state::{
    LeaseBackend, LeaseView, Leases, agent_lease_name, replica_lease_name, replica_of,
};

#[cfg(test)]
mod tests;
