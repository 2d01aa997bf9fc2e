//! The principal (hub): accepts agent streams authenticated by SPIFFE identity, keeps one
//! session per agent, sends hub changes to managed agents, writes what agents report into
//! their hub namespaces, and refuses every event an agent's identity does not allow.
//!
//! Walk of one event: [`auth`] identifies the caller ([`argocd_agent_identity::ClientIdentity`])
//! -> the mapping rules make it an [`argocd_agent_identity::AgentIdentity`] ([`server`]) ->
//! [`session`] runs hello, welcome and resync -> each inbound event is decided by
//! [`inbound::decide`] and applied by [`hub::Hub::apply`]; hub changes reach agents through
//! [`hub::Hub::route`] and one worker per agent.
#![forbid(unsafe_code)]

pub mod admin;
pub mod apps;
pub mod auth;
pub mod blocklist;
pub mod clusterinfo;
pub mod clustersecret;
pub mod config;
pub mod error;
pub mod ha;
pub mod hub;
pub mod inbound;
pub mod link;
pub mod metrics;
pub mod objects;
pub mod projects;
pub mod ratelimit;
pub mod redisproxy;
pub mod resourceproxy;
pub mod server;
pub mod session;
pub mod sessions;
pub mod tunnel;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_identity::mapping::LiveRules;
use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::tls::PeerPolicy;
use argocd_agent_kubernetes::{Kind, Resources, Scope};
use argocd_agent_proto::eventstream::event_stream_server::EventStreamServer;
use argocd_agent_proto::version::version_server::VersionServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::ListenerAuth;
use crate::hub::{Hub, HubParts};
use crate::metrics::Metrics;
use crate::objects::ConfigObjects;
use crate::server::{EventStreamService, VersionService};
use crate::session::SessionContext;
use crate::sessions::Sessions;
use argocd_agent_identity::{Namespace, ResourceKind};
use futures::StreamExt;

pub use argocd_agent_identity::source::SvidConfig;
pub use config::{AdminAddress, AuthConfig, PrincipalConfig};
pub use error::{ApplyError, PrincipalError};

/// How long shutdown waits for sessions and workers to finish.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A started principal.
pub struct Running {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// Where the operator API listens (`None`: turned off).
    pub admin_addr: Option<config::AdminAddress>,
    /// Where the Redis proxy listens (`None`: turned off).
    pub redis_proxy_addr: Option<SocketAddr>,
    /// Where the resource proxy listens (`None`: turned off).
    pub resource_proxy_addr: Option<SocketAddr>,
    pub hub: Arc<Hub>,
    tasks: TaskTracker,
    done: tokio::task::JoinHandle<Result<(), PrincipalError>>,
}

impl Running {
    /// Waits until the server stops (after shutdown), then drains sessions and workers.
    pub async fn wait(self) -> Result<(), PrincipalError> {
        let served = self.done.await?;
        self.tasks.close();
        if tokio::time::timeout(DRAIN_TIMEOUT, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                remaining = self.tasks.len(),
                "shutdown: tasks still running after {DRAIN_TIMEOUT:?}"
            );
        }
        served
    }
}

/// Loads the mapping rules and closes sessions whose identity stops mapping.
fn start_rules(config: &PrincipalConfig) -> Result<Arc<LiveRules>, PrincipalError> {
    let rules = LiveRules::start(
        config.rules_file.clone(),
        config.rules.clone(),
        config.rules_poll,
    )
    .map_err(PrincipalError::Rules)?;
    if rules.current().is_empty() {
        tracing::warn!(
            "no identity mapping rules configured: every agent will be refused (deny by default)"
        );
    }
    Ok(Arc::new(rules))
}

fn watch_revocations(rules: &LiveRules, sessions: &Arc<Sessions>) {
    let (h1, h2) = (sessions.clone(), sessions.clone());
    rules.on_revoked(
        Arc::new(move || h1.connected_identities()),
        Arc::new(move |identity, why| {
            tracing::warn!(agent = %identity.agent, client = %identity.client, reason = %why,
                "identity no longer maps: closing session");
            h2.disconnect(&identity.agent);
        }),
    );
}

/// Keeps the blocklist current from its ConfigMap and closes the sessions it denies.
async fn enforce_blocklist(
    sessions: Arc<Sessions>,
    metrics: Metrics,
    configmaps: argocd_agent_kubernetes::Cache,
    namespace: String,
    changed: Arc<tokio::sync::Notify>,
    shutdown: CancellationToken,
) {
    configmaps.wait_synced().await;
    loop {
        let cm = configmaps.get(Some(&namespace), blocklist::CONFIGMAP);
        let list = blocklist::Blocklist::from_configmap(cm.as_deref());
        if sessions.blocklist.set(list) {
            tracing::info!(configmap = blocklist::CONFIGMAP, "blocklist updated");
            let list = sessions.blocklist.current();
            for state in sessions.agents().into_iter().filter(|s| s.is_connected()) {
                let identity = state.identity();
                let fingerprint = state.session_info().fingerprint;
                if let Some(why) = list.denies(&identity.client, fingerprint.as_deref())
                    && sessions.disconnect(&state.name)
                {
                    metrics.auth_failed("Blocked");
                    tracing::warn!(agent = %state.name, client = %identity.client, reason = %why,
                        "session closed: identity blocked");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changed.notified() => {}
        }
    }
}

/// Starts the principal; it runs until `shutdown` is cancelled.
pub async fn start(
    config: PrincipalConfig,
    shutdown: CancellationToken,
) -> Result<Running, PrincipalError> {
    let tasks = TaskTracker::new();
    let rules = start_rules(&config)?;
    let listener_auth = ListenerAuth::from_config(&config.auth, config.listen).await?;

    let client = argocd_agent_kubernetes::client(&config.kube).await?;
    let argocd_ns = Namespace::new(&config.argocd_namespace)
        .map_err(|e| PrincipalError::Config(format!("--namespace: {e}")))?;
    let scoped = |scope: Scope, extra: Option<&str>| {
        let selector: Vec<&str> = extra
            .into_iter()
            .chain(config.label_selector.as_deref())
            .collect();
        if selector.is_empty() {
            scope
        } else {
            scope.with_label_selector(selector.join(","))
        }
    };
    let (cache, changes) = argocd_agent_kubernetes::watch(
        client.clone(),
        Kind::Application,
        scoped(Scope::all(), None),
    );
    let in_argocd = || Scope::namespace(argocd_ns.to_string());
    let (projects, project_changes) =
        argocd_agent_kubernetes::watch(client.clone(), Kind::AppProject, scoped(in_argocd(), None));
    let (repositories, repository_changes) = argocd_agent_kubernetes::watch(
        client.clone(),
        Kind::Secret,
        scoped(in_argocd(), Some(objects::REPOSITORY_SELECTOR)),
    );
    let (gpg_keys, gpg_changes) =
        argocd_agent_kubernetes::watch(client.clone(), Kind::ConfigMap, scoped(in_argocd(), None));
    // The blocklist ConfigMap is one of the Argo CD namespace's ConfigMaps, already watched.
    let blocklist_changed = Arc::new(tokio::sync::Notify::new());
    let blocklist_cache = gpg_keys.clone();
    let gpg_changes = {
        let notify = blocklist_changed.clone();
        gpg_changes.inspect(move |c| {
            let name = match c {
                argocd_agent_kubernetes::Change::Applied(o)
                | argocd_agent_kubernetes::Change::Deleted(o) => o.metadata.name.as_deref(),
                argocd_agent_kubernetes::Change::Synced => None,
            };
            if name == Some(blocklist::CONFIGMAP) {
                notify.notify_one();
            }
        })
    };
    let config_objects = ConfigObjects::new(
        argocd_ns,
        !config.destination_based_mapping,
        projects,
        repositories,
        gpg_keys,
        Resources::new(client.clone(), Kind::AppProject),
    );
    let metrics = Metrics::with_agent_label_limit(config.metrics_max_agent_labels);
    if let Some(svid) = &listener_auth.svid {
        metrics.follow_svid(svid);
    }
    // With namespace creation on, the hub's namespaces are watched: connecting agents whose
    // namespace exists cost no API call (a restart storm of 10,000 agents would otherwise
    // be 10,000 reads at --kube-qps).
    let namespace_cache = if config.create_namespace {
        let (cache, changes) =
            argocd_agent_kubernetes::watch(client.clone(), Kind::Namespace, Scope::all());
        let stop = shutdown.clone();
        tasks.spawn(async move {
            futures::pin_mut!(changes);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    c = changes.next() => if c.is_none() { return },
                }
            }
        });
        Some(cache)
    } else {
        None
    };
    let sessions = Arc::new(Sessions::new(config.queue.clone(), config.event_rate));
    let hub = Arc::new(Hub::new(HubParts {
        source: source_id(listener_auth.svid.as_ref()),
        apps: Resources::new(client.clone(), Kind::Application),
        namespaces: Resources::new(client.clone(), Kind::Namespace),
        cache,
        metrics: metrics.clone(),
        sessions: sessions.clone(),
        create_namespace: config.create_namespace,
        namespace_cache,
        namespace_labels: config.namespace_labels.clone(),
        config: config_objects,
        by_destination: config.destination_based_mapping,
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
    }));
    for (kind, stream) in [
        (ResourceKind::Application, changes.boxed()),
        (ResourceKind::AppProject, project_changes.boxed()),
        (ResourceKind::Repository, repository_changes.boxed()),
        (ResourceKind::GpgKeys, gpg_changes.boxed()),
    ] {
        tasks.spawn(hub::run_hub_watch(
            hub.clone(),
            kind,
            stream,
            shutdown.clone(),
        ));
    }
    let lease_client = match &config.ha {
        Some(ha) => Some(
            argocd_agent_kubernetes::bounded_client(
                &argocd_agent_kubernetes::ClientOptions {
                    qps: ha.lease_qps,
                    burst: ha.lease_burst,
                    ..config.kube.clone()
                },
                ha::LEASE_REQUESTS_IN_FLIGHT,
            )
            .await?,
        ),
        None => None,
    };
    let leases = config
        .ha
        .clone()
        .zip(lease_client)
        .map(|(ha, lease_client)| {
            ha::Leases::start(
                lease_client,
                &config.argocd_namespace,
                ha,
                sessions.clone(),
                metrics.clone(),
                &tasks,
                shutdown.clone(),
            )
        });
    watch_revocations(&rules, &sessions);
    tasks.spawn(enforce_blocklist(
        sessions.clone(),
        metrics.clone(),
        blocklist_cache,
        config.argocd_namespace.clone(),
        blocklist_changed,
        shutdown.clone(),
    ));
    tasks.spawn(sessions::sample_queues(
        sessions.clone(),
        metrics.clone(),
        shutdown.clone(),
    ));

    let (ready_tx, ready_rx) = watch::channel(false);
    let readiness = metrics::Readiness {
        synced: ready_rx,
        svid: listener_auth.svid.clone(),
        leases: leases.clone(),
    };
    let metrics_addr = match config.metrics_listen {
        Some(addr) => Some(
            metrics::serve(
                addr,
                Some(metrics.clone()),
                readiness.clone(),
                &tasks,
                shutdown.clone(),
            )
            .await
            .map_err(|source| PrincipalError::Listen { addr, source })?,
        ),
        None => None,
    };
    if let Some(addr) = config.healthz_listen {
        metrics::serve(addr, None, readiness, &tasks, shutdown.clone())
            .await
            .map_err(|source| PrincipalError::Listen { addr, source })?;
    }
    let admin_addr = match &config.admin_listen {
        Some(address) => {
            let bound = admin::serve(
                address,
                sessions.clone(),
                metrics.clone(),
                &tasks,
                shutdown.clone(),
            )
            .await?;
            tracing::info!(admin = %bound, "admin API listening (plaintext, local operators only)");
            Some(bound)
        }
        None => None,
    };
    let tunnels = Arc::new(tunnel::Tunnels::default());
    let (resource_proxy_addr, resource_proxy_url, cluster_secrets) = match &config.resource_proxy {
        Some(rp) => {
            let (addr, url, secrets) = start_resource_proxy(
                rp,
                client.clone(),
                &config.argocd_namespace,
                listener_auth.svid.as_ref(),
                &hub,
                tunnels.clone(),
                leases.clone(),
                &tasks,
                shutdown.clone(),
            )
            .await?;
            (Some(addr), Some(url), secrets)
        }
        None => (None, None, None),
    };
    // Agents' cluster info goes to the hub Redis the proxy fronts, under each cluster's
    // server URL (the resource proxy's when it is on and no template was given).
    let cluster_info = config.redis_proxy.as_ref().map(|r| {
        let template = match &resource_proxy_url {
            Some(url) if r.cluster_server_template == clusterinfo::DEFAULT_SERVER_TEMPLATE => {
                format!(
                    "{}{}{}",
                    url.trim_end_matches('/'),
                    resourceproxy::AGENT_PREFIX,
                    clusterinfo::AGENT_PLACEHOLDER
                )
            }
            _ => r.cluster_server_template.clone(),
        };
        let writer =
            clusterinfo::ClusterInfoWriter::new(r.upstream.clone(), r.compression, template);
        tasks.spawn(writer.clone().refresh(sessions.clone(), shutdown.clone()));
        writer
    });
    let redis_proxy_addr = match &config.redis_proxy {
        Some(redis) => Some(
            redisproxy::serve(
                redis.clone(),
                hub.owners.clone(),
                metrics.clone(),
                hub.source.clone(),
                leases.clone(),
                &tasks,
                shutdown.clone(),
            )
            .await
            .map_err(|source| PrincipalError::Listen {
                addr: redis.listen,
                source,
            })?,
        ),
        None => None,
    };
    let listener =
        TcpListener::bind(config.listen)
            .await
            .map_err(|source| PrincipalError::Listen {
                addr: config.listen,
                source,
            })?;
    let addr = listener
        .local_addr()
        .map_err(|source| PrincipalError::Listen {
            addr: config.listen,
            source,
        })?;
    {
        // Ready once the hub watch has listed everything (the listener is bound already).
        let hub = hub.clone();
        tasks.spawn(async move {
            hub.cache.wait_synced().await;
            hub.config.wait_synced().await;
            ready_tx.send_replace(true);
        });
    }

    let sessions = SessionContext {
        hub: hub.clone(),
        tasks: tasks.clone(),
        shutdown: shutdown.clone(),
        idle_timeout: config.idle_timeout,
        hello_timeout: config.hello_timeout,
        cluster_info: cluster_info.clone(),
        max_requests_in_flight: config
            .redis_proxy
            .as_ref()
            .map_or(redisproxy::DEFAULT_AGENT_IN_FLIGHT, |r| {
                r.max_in_flight_per_agent
            })
            .max(
                config
                    .resource_proxy
                    .as_ref()
                    .map_or(0, |r| r.max_in_flight_per_agent),
            ),
        cluster_secrets,
        leases,
    };
    tracing::info!(%addr, auth = ?config.auth, "principal listening");
    let done = serve(
        &config,
        listener,
        listener_auth,
        rules,
        sessions,
        tunnels,
        shutdown,
    )?;
    Ok(Running {
        addr,
        metrics_addr,
        admin_addr,
        redis_proxy_addr,
        resource_proxy_addr,
        hub,
        tasks,
        done,
    })
}

/// Starts the resource proxy: keys from the hub, the serving certificate, the listener,
/// and (with self-registration) the cluster secrets keeper.
#[allow(clippy::too_many_arguments)]
async fn start_resource_proxy(
    rp: &resourceproxy::ResourceProxyConfig,
    client: kube::Client,
    argocd_namespace: &str,
    svid: Option<&SvidSource>,
    hub: &Hub,
    tunnels: Arc<tunnel::Tunnels>,
    leases: Option<Arc<ha::Leases>>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<
    (
        SocketAddr,
        String,
        Option<Arc<clustersecret::ClusterSecrets>>,
    ),
    PrincipalError,
> {
    let proxy_err = |e: resourceproxy::credentials::KeyError| PrincipalError::Config(e.to_string());
    let keys = Arc::new(
        resourceproxy::credentials::ProxyKeys::load_or_create(client.clone(), argocd_namespace)
            .await
            .map_err(proxy_err)?,
    );
    let listener = TcpListener::bind(rp.listen)
        .await
        .map_err(|source| PrincipalError::Listen {
            addr: rp.listen,
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| PrincipalError::Listen {
            addr: rp.listen,
            source,
        })?;
    // Without a configured URL: the bound address (loopback for an unspecified one).
    let mut rp = rp.clone();
    if rp.url.is_empty() {
        let ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        rp.url = format!("https://{}", SocketAddr::new(ip, addr.port()));
    }
    // With replicas: this replica's own URL, which the others forward to.
    if leases.is_some() && rp.replica_url.is_empty() {
        let pod_ip = std::env::var("POD_IP")
            .ok()
            .filter(|s| !s.trim().is_empty());
        rp.replica_url = resourceproxy::forward::default_replica_url(pod_ip.as_deref(), addr);
    }
    let host = rp.host();
    let mut hostnames = rp.hostnames.clone();
    if !hostnames.contains(&host) {
        hostnames.insert(0, host.clone());
    }
    let replica_host = leases.as_ref().map(|_| rp.replica_host());
    if let Some(r) = &replica_host
        && !hostnames.contains(r)
    {
        hostnames.push(r.clone());
    }
    let serving = resourceproxy::tls::start(
        rp.tls,
        &host,
        replica_host.as_deref(),
        &hostnames,
        rp.cert_lifetime,
        keys.clone(),
        svid,
        tasks,
        shutdown.clone(),
    )
    .map_err(proxy_err)?;
    let tls = resourceproxy::tls::server_config(serving.cert.clone())
        .map_err(|e| PrincipalError::Config(format!("resource proxy TLS: {e}")))?;
    let secrets = rp.self_cluster_registration.then(|| {
        let secrets = clustersecret::ClusterSecrets::new(
            client,
            argocd_namespace,
            keys.clone(),
            rp.clone(),
            serving.ca_pem.clone(),
        );
        tasks.spawn(secrets.clone().refresh(shutdown.clone()));
        secrets
    });
    let url = rp.url.clone();
    let forwarder = leases.map(|leases| {
        leases.set_resource_proxy_url(&rp.replica_url);
        resourceproxy::forward::Forwarder::new(
            leases,
            serving.ca_pem.clone(),
            rp.request_timeout + Duration::from_secs(5),
            tasks.clone(),
        )
    });
    let proxy = resourceproxy::Proxy::new(resourceproxy::ProxyParts {
        sessions: hub.sessions.clone(),
        metrics: hub.metrics.clone(),
        source: hub.source.clone(),
        keys,
        tunnels,
        config: rp.clone(),
        forwarder,
        tasks: tasks.clone(),
    });
    resourceproxy::serve(proxy, listener, tls, tasks, shutdown);
    tracing::info!(%addr, url = %rp.url, replica_url = %rp.replica_url, tls = serving.mode,
        self_registration = rp.self_cluster_registration, "resource proxy listening");
    Ok((addr, url, secrets))
}

/// CloudEvents `source` of our events: our SPIFFE ID when we have an SVID.
fn source_id(svid: Option<&SvidSource>) -> String {
    svid.and_then(|s| s.current())
        .map(|s| s.svid.spiffe_id().to_string())
        .unwrap_or_else(|| "argocd-agent-principal".into())
}

/// Serves gRPC on `listener` (TLS with SVIDs, or plaintext behind a mesh or ingress) until
/// `shutdown`.
fn serve(
    config: &PrincipalConfig,
    listener: TcpListener,
    auth: ListenerAuth,
    rules: Arc<LiveRules>,
    sessions: SessionContext,
    tunnels: Arc<tunnel::Tunnels>,
    shutdown: CancellationToken,
) -> Result<tokio::task::JoinHandle<Result<(), PrincipalError>>, PrincipalError> {
    // Connections dropped before their first request count as auth failures.
    let metrics = sessions.hub.metrics.clone();
    let tasks = sessions.tasks.clone();
    // The operator API on the agent listener: only SPIFFE IDs with an admin rule.
    let admin = argocd_agent_proto::admin::admin_server::AdminServer::new(admin::AdminService {
        sessions: sessions.hub.sessions.clone(),
        metrics: metrics.clone(),
        access: admin::AdminAccess::Rules {
            auth: auth.authenticator.clone(),
            rules: rules.clone(),
        },
    });
    let tunnel =
        argocd_agent_proto::eventstream::tunnel_server::TunnelServer::new(tunnel::TunnelService {
            tunnels,
            rules: rules.clone(),
            auth: auth.authenticator.clone(),
            sessions: sessions.hub.sessions.clone(),
            metrics: metrics.clone(),
        })
        .max_decoding_message_size(config.max_message_size)
        .max_encoding_message_size(config.max_message_size);
    let events = EventStreamServer::new(EventStreamService {
        sessions,
        rules,
        auth: auth.authenticator,
    })
    .max_decoding_message_size(config.max_message_size)
    .max_encoding_message_size(config.max_message_size);
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .max_concurrent_streams(Some(config.max_concurrent_streams))
        .add_service(events)
        .add_service(tunnel)
        .add_service(admin)
        .add_service(VersionServer::new(VersionService));
    let handle = match (&config.auth, auth.svid) {
        (config::AuthConfig::Mtls { trust_domains, .. }, Some(source)) => {
            let policy = if trust_domains.is_empty() {
                PeerPolicy::Any
            } else {
                PeerPolicy::TrustDomains(trust_domains.clone())
            };
            let tls = argocd_agent_identity::tls::server_config(&source, policy)
                .map_err(PrincipalError::Tls)?;
            let incoming = argocd_agent_identity::transport::tls_incoming_with_options(
                listener,
                tls,
                argocd_agent_identity::transport::IncomingOptions {
                    max_handshakes: config.max_concurrent_handshakes,
                    on_refused: Some(argocd_agent_identity::transport::RefusedHook(Arc::new(
                        move |reason| metrics.auth_failed(reason),
                    ))),
                    ..Default::default()
                },
            );
            tasks.spawn(async move {
                // The source feeds every handshake's certificate: keep it while serving.
                let _keep = source;
                router
                    .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                    .await
                    .map_err(PrincipalError::from)
            })
        }
        _ => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            tasks.spawn(async move {
                router
                    .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                    .await
                    .map_err(PrincipalError::from)
            })
        }
    };
    Ok(handle)
}
