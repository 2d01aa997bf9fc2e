//! How optional features take part in sessions without the core naming them. The core
//! ([`crate::session`]) calls these traits; the features implement them: replicas' agent
//! Leases are a [`SessionGate`] ([`crate::ha`]), agents' cluster info in the hub Redis and
//! their Argo CD cluster secrets are [`SessionObserver`]s ([`crate::clusterinfo`],
//! [`crate::clustersecret`]). `wiring.rs` plugs them in.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use argocd_agent_domain::{AgentName, Namespace};
use argocd_agent_proto::eventstream::ClusterCacheInfo;
use tokio_util::task::TaskTracker;
use tonic::Status;

/// A boxed, sendable future (the traits here are used as trait objects).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Admits a session before it registers, and may ask it to yield right after.
pub trait SessionGate: Send + Sync {
    /// Before the session of `agent` (hub namespace `namespace`, id `session`) registers:
    /// a pass held for the session's life, or the refusal the agent is sent.
    fn enter<'a>(
        &'a self,
        agent: &'a AgentName,
        namespace: &'a Namespace,
        session: u64,
    ) -> BoxFuture<'a, Result<Box<dyn SessionPass>, Status>>;

    /// After registering: whether the session must end at once (the agent was asked for
    /// elsewhere between [`SessionGate::enter`] and registration).
    fn must_yield(&self, agent: &AgentName, session: u64) -> bool;
}

/// What a session holds from its gate, released once the session is detached.
pub trait SessionPass: Send {
    /// Releases the pass; the session's end waits for it. A pass dropped without this (a
    /// session task that failed) must release itself in the background.
    fn release(self: Box<Self>) -> BoxFuture<'static, ()>;
}

/// Told when an agent's session starts and ends, and of the agent's cluster cache counts.
/// Work that takes time is spawned on `tasks` (drained at shutdown).
pub trait SessionObserver: Send + Sync {
    /// A session of `agent` was registered.
    fn connected(self: Arc<Self>, agent: &AgentName, tasks: &TaskTracker) {
        let _ = (agent, tasks);
    }

    /// The last session of `agent` ended (no newer session took over).
    fn disconnected(self: Arc<Self>, agent: &AgentName, tasks: &TaskTracker) {
        let _ = (agent, tasks);
    }

    /// `agent` reported its cluster cache counts.
    fn cache_info(
        self: Arc<Self>,
        agent: &AgentName,
        counts: &ClusterCacheInfo,
        tasks: &TaskTracker,
    ) {
        let _ = (agent, counts, tasks);
    }
}
