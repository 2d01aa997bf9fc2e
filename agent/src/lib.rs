//! The agent (spoke): dials the principal (never the reverse), pins its SPIFFE ID,
//! reconnects with exponential backoff and jitter, sends heartbeats, and keeps its local
//! Applications in step with the hub in managed or autonomous mode. While disconnected it
//! keeps working; changes are exchanged by resync on reconnect.
//!
//! Modules: [`dialer`] (how to reach the principal), [`connection`] (one stream: hello,
//! welcome, events), [`spoke`] (what each event and local change means), [`health`]
//! (`/healthz`, `/readyz`, `/metrics`).
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Functions under 80 lines (the threshold is in clippy.toml); unit tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod children;
mod config;
pub mod config_objects;
pub mod connection;
pub mod dialer;
pub mod error;
pub mod guard;
mod guarded;
pub mod health;
mod managed;
pub mod metrics;
pub mod namespaces;
pub mod policy;
pub mod proxy;
pub mod redial;
pub mod redis;
pub mod spoke;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use argocd_agent_domain::{AgentMode, Namespace, ResourceKind};
use argocd_agent_domain::{QueueLimits, SendQueue};
use argocd_agent_kubernetes::{Cache, Change, Kind, Resources, Scope};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::dialer::Dialer;
use crate::health::HealthState;
use crate::spoke::Spoke;

pub use argocd_agent_identity::source::SvidConfig;
pub use config::AgentConfig;
pub use dialer::Transport;
pub use error::{AgentError, SessionError, SpokeError};

/// A running agent.
pub struct Running {
    /// Whether a session with the principal is up now.
    pub connected: Arc<AtomicBool>,
    /// The local side: caches, desired state and writes on this cluster.
    pub spoke: Arc<Spoke>,
    /// Where `/metrics` listens (`None`: turned off).
    pub metrics_addr: Option<SocketAddr>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Running {
    /// Waits for shutdown, then for the agent's tasks to drain.
    pub async fn wait(self) {
        self.shutdown.cancelled().await;
        argocd_agent_runtime::tasks::drain(&self.tasks).await;
    }
}

/// Starts the agent; it runs until `shutdown` is cancelled.
pub async fn start(
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<Running, AgentError> {
    let namespace = Namespace::new(&config.namespace)
        .map_err(|e| AgentError::Config(format!("--namespace: {e}")))?;
    let allowed = allowed_namespaces(&config)?;
    let (dialer, source_id) = Dialer::from_transport(&config.transport).await?;
    let dialer = dialer.over_websocket(config.websocket)?;
    let tasks = TaskTracker::new();
    let (client, watch_client) = argocd_agent_kubernetes::clients(&config.kube).await?;
    let configmaps = Resources::new(client.clone(), Kind::ConfigMap);
    let mut watches = SpokeWatches::start(&client, &watch_client, &config);
    let mut spoke = build_spoke(
        &config,
        namespace,
        source_id,
        client,
        &mut watches,
        &dialer,
        &tasks,
    );
    spoke.allowed = allowed;
    spoke.create_namespace = config.create_namespace;
    spoke.guard = guard::LiveGuard::start(
        &config.guard,
        configmaps,
        &config.namespace,
        spoke.metrics.clone(),
        &tasks,
        shutdown.clone(),
    )
    .await
    .map_err(|e| AgentError::Config(format!("spoke guard: {e}")))?;
    let spoke = Arc::new(spoke);
    follow_local_changes(&spoke, watches, &tasks, &shutdown);
    follow_guard_changes(&spoke, &tasks, &shutdown);
    let connected = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = watch::channel(false);
    let health_state = HealthState {
        connected: connected.clone(),
        ready: ready_rx,
        svid: dialer.svid().cloned(),
        metrics: spoke.metrics.clone(),
    };
    let metrics_addr = serve_health(&config, health_state, &tasks, &shutdown).await?;
    let span = tracing::info_span!("agent", mode = %config.mode, server = %config.server);
    tasks.spawn(
        reconnect_loop(
            spoke.clone(),
            dialer,
            config,
            connected.clone(),
            ready_tx,
            shutdown.clone(),
        )
        .instrument(span),
    );
    Ok(Running {
        connected,
        spoke,
        metrics_addr,
        tasks,
        shutdown,
    })
}

/// `--allowed-namespaces` and `--create-namespace`, checked: patterns must compile, and
/// `--create-namespace` needs destination-based mapping (as upstream).
fn allowed_namespaces(config: &AgentConfig) -> Result<namespaces::AllowedNamespaces, AgentError> {
    if config.create_namespace && !config.destination_based_mapping {
        return Err(AgentError::Config(
            "--create-namespace needs --destination-based-mapping (it creates the namespaces of the principal's copies)".into(),
        ));
    }
    let allowed = namespaces::AllowedNamespaces::new(&config.namespace, &config.allowed_namespaces)
        .map_err(|e| AgentError::Config(format!("--allowed-namespaces: {e}")))?;
    if allowed.has_patterns()
        && config.mode == AgentMode::Managed
        && !config.destination_based_mapping
    {
        tracing::warn!(
            "--allowed-namespaces has no effect on a managed agent without --destination-based-mapping: its applications are all in --namespace"
        );
    }
    Ok(allowed)
}

/// The spoke's watches: its Applications, and the configuration kinds of its mode.
struct SpokeWatches {
    apps: Cache,
    changes: BoxStream<'static, Change>,
    config_kinds: Vec<config_objects::ConfigKind>,
    config_changes: Vec<(ResourceKind, BoxStream<'static, Change>)>,
}

impl SpokeWatches {
    /// The spoke's watches on `watch_client` (its own QPS budget,
    /// [`argocd_agent_kubernetes::clients`]); writes on `client`.
    fn start(
        client: &kube::Client,
        watch_client: &kube::Client,
        config: &AgentConfig,
    ) -> SpokeWatches {
        let mut scope = Scope::namespace(config.namespace.clone());
        if let Some(sel) = &config.label_selector {
            scope = scope.with_label_selector(sel.clone());
        }
        let across_namespaces =
            config.destination_based_mapping && config.mode == AgentMode::Managed;
        // Autonomous with --allowed-namespaces: every namespace is watched (patterns are no
        // API selector); the spoke keeps the allowed ones.
        let any_namespace = config.mode == AgentMode::Autonomous
            && config
                .allowed_namespaces
                .iter()
                .any(|p| !p.trim().is_empty());
        let app_scope = if across_namespaces {
            // Managed copies in every namespace: those the principal wrote.
            let selector = [Some(spoke::MANAGED_LABEL), config.label_selector.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(",");
            Scope::all().with_label_selector(selector)
        } else if any_namespace {
            match &config.label_selector {
                Some(sel) => Scope::all().with_label_selector(sel.clone()),
                None => Scope::all(),
            }
        } else {
            scope.clone()
        };
        let (apps, changes) =
            argocd_agent_kubernetes::watch(watch_client.clone(), Kind::Application, app_scope);
        let mut config_kinds = Vec::new();
        let mut config_changes = Vec::new();
        for &kind in config_objects::kinds_for(config.mode) {
            let mut kind_scope = scope.clone();
            if kind == ResourceKind::Repository {
                let selector = [
                    Some(config_objects::REPOSITORY_SELECTOR),
                    config.label_selector.as_deref(),
                ]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(",");
                kind_scope = kind_scope.with_label_selector(selector);
            }
            let (kind_cache, kind_stream) =
                argocd_agent_kubernetes::watch(watch_client.clone(), Kind::from(kind), kind_scope);
            config_kinds.push(config_objects::ConfigKind {
                kind,
                resources: Arc::new(Resources::new(client.clone(), Kind::from(kind))),
                cache: Arc::new(kind_cache),
            });
            config_changes.push((kind, kind_stream.boxed()));
        }
        SpokeWatches {
            apps,
            changes: changes.boxed(),
            config_kinds,
            config_changes,
        }
    }
}

/// The spoke: the agent's mode, namespace, caches and writers, its Redis and resource proxy.
fn build_spoke(
    config: &AgentConfig,
    namespace: Namespace,
    source_id: String,
    client: kube::Client,
    watches: &mut SpokeWatches,
    dialer: &Dialer,
    tasks: &TaskTracker,
) -> Spoke {
    let proxy_client = client.clone();
    let namespace_api = Resources::new(client.clone(), Kind::Namespace);
    let mut spoke = Spoke::new(
        config.mode,
        namespace,
        source_id,
        std::sync::Arc::new(Resources::new(client, Kind::Application)),
        std::sync::Arc::new(watches.apps.clone()),
        SendQueue::new(QueueLimits::default()),
        config_objects::ConfigKinds::new(std::mem::take(&mut watches.config_kinds)),
    );
    spoke.policies = config.policies;
    spoke.namespace_api = Some(std::sync::Arc::new(namespace_api));
    spoke.by_destination = config.destination_based_mapping;
    spoke.ignore_unmanaged_apps = config.ignore_unmanaged_apps;
    spoke.redis = config
        .redis
        .clone()
        .map(|r| redis::SpokeRedis::new(r, tasks.clone()));
    spoke.tasks = tasks.clone();
    if config.resource_proxy {
        let limits = proxy::ProxyConfig {
            max_body: config.resource_proxy_max_body,
            max_concurrent: config.resource_proxy_max_concurrent,
            timeout: config.resource_proxy_timeout,
            argocd_namespace: spoke.namespace.as_str().to_owned(),
            pod_security: config.resource_proxy_pod_security,
        };
        spoke.proxy = Some(Arc::new(proxy::SpokeProxy::new(
            proxy_client,
            limits,
            spoke.metrics.clone(),
        )));
    }
    if let Some(svid) = dialer.svid() {
        spoke.metrics.follow_svid(svid);
    }
    spoke
}

/// Hands the spoke's local changes to it until shutdown, and samples its queue.
fn follow_local_changes(
    spoke: &Arc<Spoke>,
    watches: SpokeWatches,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) {
    for (kind, mut kind_stream) in watches.config_changes {
        let spoke = spoke.clone();
        let shutdown = shutdown.clone();
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    change = kind_stream.next() => match change {
                        Some(change) => spoke.on_local_config_change(kind, change).await,
                        None => return,
                    },
                }
            }
        });
    }
    {
        let (spoke, shutdown) = (spoke.clone(), shutdown.clone());
        let mut changes = watches.changes;
        tasks.spawn(async move {
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    change = changes.next() => match change {
                        Some(change) => spoke.on_local_change(change).await,
                        None => return,
                    },
                }
            }
        });
    }
    let (spoke, shutdown) = (spoke.clone(), shutdown.clone());
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => spoke.metrics.sample_queue(&spoke.queue),
            }
        }
    });
}

/// Asks the principal again for what the guard refused or narrowed, after each change of
/// the guard.
fn follow_guard_changes(spoke: &Arc<Spoke>, tasks: &TaskTracker, shutdown: &CancellationToken) {
    let mut changes = spoke.guard.changes();
    changes.mark_unchanged();
    let (spoke, shutdown) = (spoke.clone(), shutdown.clone());
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = changes.changed() => match changed {
                    Ok(()) => spoke.on_guard_change(),
                    Err(_) => return,
                },
            }
        }
    });
}

/// The metrics and health listeners, when configured; returns the metrics address.
async fn serve_health(
    config: &AgentConfig,
    health_state: HealthState,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
) -> Result<Option<SocketAddr>, AgentError> {
    let metrics_addr = match config.metrics_listen {
        Some(addr) => Some(
            health::serve(addr, health_state.clone(), true, tasks, shutdown.clone())
                .await
                .map_err(|source| AgentError::Listen { addr, source })?,
        ),
        None => None,
    };
    if let Some(addr) = config.healthz_listen {
        health::serve(addr, health_state, false, tasks, shutdown.clone())
            .await
            .map_err(|source| AgentError::Listen { addr, source })?;
    }
    Ok(metrics_addr)
}

/// Whether the principal ended the session to send the agent to another replica
/// ([`argocd_agent_domain::event::RECONNECT_METADATA`]).
fn redirected<T>(result: &Result<T, SessionError>) -> bool {
    matches!(result, Err(SessionError::Status(s)) if sends_elsewhere(s))
}

/// Whether `status` ends a session to send the agent to another replica at once
/// ([`argocd_agent_domain::event::RECONNECT_METADATA`]): the agent then redials without
/// waiting out its backoff ([`redial::Attempt::Redirected`]).
pub fn sends_elsewhere(status: &tonic::Status) -> bool {
    status
        .metadata()
        .get(argocd_agent_domain::event::RECONNECT_METADATA)
        .is_some_and(|v| v == "now")
}

/// How a session attempt ended, for the backoff.
fn attempt_of<T>(result: &Result<T, SessionError>) -> redial::Attempt {
    if redirected(result) {
        redial::Attempt::Redirected
    } else if result.as_ref().is_err_and(SessionError::is_refused) {
        redial::Attempt::Refused
    } else {
        redial::Attempt::Session
    }
}

/// Connects, and reconnects with exponential backoff and jitter, until shutdown.
async fn reconnect_loop(
    spoke: Arc<Spoke>,
    dialer: Dialer,
    config: AgentConfig,
    connected: Arc<AtomicBool>,
    ready: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = async {
            spoke.cache.wait_synced().await;
            spoke.config.wait_synced().await;
        } => {}
    }
    spoke.seed_desired();
    ready.send_replace(true);
    let mut backoff = redial::Backoff::new(config.backoff_initial, config.backoff_max);
    loop {
        let started = tokio::time::Instant::now();
        // The connection watches for shutdown itself, so it can drain first.
        let result = connection::run(&spoke, &dialer, &config, &connected, &shutdown).await;
        connected.store(false, Ordering::Relaxed);
        if shutdown.is_cancelled() {
            spoke.metrics.connection(false);
            return;
        }
        spoke.metrics.connection(false);
        let attempt = attempt_of(&result);
        if let Err(SessionError::Status(s)) = &result
            && matches!(
                s.code(),
                tonic::Code::PermissionDenied | tonic::Code::Unauthenticated
            )
        {
            spoke.metrics.upstream.auth_failures.inc();
        }
        match result {
            Ok(()) => tracing::info!("stream closed by the principal; reconnecting"),
            Err(SessionError::Status(s))
                if argocd_agent_identity::transport::is_connection_loss(&s) =>
            {
                tracing::warn!(
                    reason = s.message(),
                    "connection to the principal lost; reconnecting"
                )
            }
            Err(e) => {
                tracing::warn!(error = %argocd_agent_domain::error_chain(&e), "connection to principal failed")
            }
        }
        // A replica that sends the agent elsewhere asks it to come back at once; so does
        // a session that lasted. A refused dial (nothing listens) is retried within seconds.
        let wait = backoff.after(started.elapsed(), attempt);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_replica_redirect_resets_the_backoff() {
        let mut status = tonic::Status::unavailable("session closed by the principal: rebalancing");
        assert!(!redirected::<()>(&Err(SessionError::Status(
            status.clone()
        ))));
        status.metadata_mut().insert(
            argocd_agent_domain::event::RECONNECT_METADATA,
            tonic::metadata::MetadataValue::from_static("now"),
        );
        assert!(redirected::<()>(&Err(SessionError::Status(status.clone()))));
        // The status as it reaches the agent: parsed back from the trailers.
        let mut trailers = http::HeaderMap::new();
        status.add_header(&mut trailers).unwrap();
        let parsed = tonic::Status::from_header_map(&trailers).unwrap();
        assert!(redirected::<()>(&Err(SessionError::Status(parsed))));
        let mut other = tonic::Status::unavailable("x");
        other.metadata_mut().insert(
            argocd_agent_domain::event::RECONNECT_METADATA,
            tonic::metadata::MetadataValue::from_static("later"),
        );
        assert!(!redirected::<()>(&Err(SessionError::Status(other))));
        assert!(!redirected::<()>(&Err(SessionError::NoToken)));
        assert!(!redirected(&Ok(())));
    }
}
