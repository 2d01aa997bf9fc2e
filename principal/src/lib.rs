//! The principal (hub): accepts agent streams authenticated by SPIFFE identity, keeps one
//! session per agent, sends hub changes to managed agents, writes what agents report into
//! their hub namespaces, and refuses every event an agent's identity does not allow.
//!
//! Walk of one event: [`auth`] identifies the caller ([`argocd_agent_domain::ClientIdentity`])
//! -> the mapping rules make it an [`argocd_agent_domain::AgentIdentity`] ([`server`]) ->
//! [`session`] runs hello, welcome and resync -> each inbound event is decided by
//! [`inbound::decide`] and applied by [`hub::Hub::apply`]; hub changes reach agents through
//! [`apps::Applications::route`] and one worker per agent.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Functions under 80 lines (the threshold is in clippy.toml); unit tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod admin;
mod agent_listener;
pub mod apps;
pub mod auth;
pub mod blocklist;
pub mod bounds;
pub mod clusterinfo;
pub mod clustersecret;
pub mod config;
pub mod config_objects;
pub mod error;
pub mod ha;
pub mod health;
pub mod hooks;
pub mod hub;
pub mod inbound;
pub mod metrics;
pub mod partition;
pub mod projects;
pub mod quotas;
pub mod ratelimit;
pub mod redisproxy;
pub mod refusals;
pub mod resourceproxy;
pub mod rounds;
pub mod server;
pub mod session;
pub mod sessions;
pub mod tenancy;
pub mod tenant_limits;
pub mod tunnel;
mod wiring;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::hub::Hub;
use crate::wiring::{Features, Wiring};

pub use argocd_agent_identity::source::SvidConfig;
pub use auth::AuthConfig;
pub use config::{AdminAddress, PrincipalConfig};
pub use error::{ApplyError, PrincipalError};

/// A started principal.
pub struct Running {
    /// Where the agents' gRPC listener is bound (the actual port when `:0` was asked for).
    pub addr: SocketAddr,
    /// Where `/metrics`, `/healthz` and `/readyz` are served (`None`: turned off).
    pub metrics_addr: Option<SocketAddr>,
    /// Where the operator API listens (`None`: turned off).
    pub admin_addr: Option<config::AdminAddress>,
    /// Where the Redis proxy listens (`None`: turned off).
    pub redis_proxy_addr: Option<SocketAddr>,
    /// Where the resource proxy listens (`None`: turned off).
    pub resource_proxy_addr: Option<SocketAddr>,
    /// The hub state every session reads and writes through.
    pub hub: Arc<Hub>,
    tasks: TaskTracker,
    done: tokio::task::JoinHandle<Result<(), PrincipalError>>,
}

impl Running {
    /// Waits until the server stops (after shutdown), then drains sessions and workers.
    pub async fn wait(self) -> Result<(), PrincipalError> {
        let served = self.done.await?;
        argocd_agent_runtime::tasks::drain(&self.tasks).await;
        served
    }
}

/// Starts the principal; it runs until `shutdown` is cancelled.
pub async fn start(
    config: PrincipalConfig,
    shutdown: CancellationToken,
) -> Result<Running, PrincipalError> {
    let w = Wiring::new(config, shutdown).await?;
    // The core: the sessions and the hub, fed by the hub's watches.
    let hub = w.core(w.watch_hub()?);
    // The optional features, each built on the core.
    let mut features = Features {
        leases: w.leases(&hub).await?,
        ..Features::default()
    };
    let (metrics_addr, ready, readiness) = w.serve_health(features.leases.clone()).await?;
    features.metrics = metrics_addr;
    features.admin = w.serve_admin(&hub).await?;
    let tunnels = Arc::new(tunnel::Tunnels::default());
    w.resource_proxy(&hub, &tunnels, &mut features).await?;
    w.cluster_info(&hub, &mut features);
    w.redis_proxy(&hub, &mut features).await?;
    // The agents' listener.
    let (listener, addr) = w.bind().await?;
    w.ready_when_synced(&hub, ready);
    let sessions = w.session_context(hub.clone(), &features);
    tracing::info!(%addr, auth = %w.config.auth, "principal listening");
    let tasks = w.tasks.clone();
    let done = agent_listener::serve(w, listener, sessions, tunnels, readiness)?;
    Ok(Running {
        addr,
        metrics_addr: features.metrics,
        admin_addr: features.admin,
        redis_proxy_addr: features.redis_proxy,
        resource_proxy_addr: features.resource_proxy.map(|(addr, _)| addr),
        hub,
        tasks,
        done,
    })
}
