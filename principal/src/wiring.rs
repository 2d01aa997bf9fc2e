//! The steps that start a principal, in the order [`crate::start`] takes them: the hub
//! watches, the core (sessions, hub), the optional features (replicas, operator API,
//! resource proxy, Redis proxy), then the gRPC listener.

use argocd_agent_identity::text;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_domain::{Namespace, ResourceKind};
use argocd_agent_identity::source::SvidSource;
use argocd_agent_kubernetes::{Cache, Change, Kind, Resources, Scope};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::auth::ListenerAuth;
use crate::config::PrincipalConfig;
use crate::config_objects::ConfigObjects;
use crate::error::PrincipalError;
use crate::hooks::{SessionGate, SessionObserver};
use crate::hub::{Hub, HubParts, HubShared};
use crate::metrics::Metrics;
use crate::partition::Partition;
use crate::session::SessionContext;
use crate::sessions::Sessions;
use crate::{admin, blocklist, clusterinfo, clustersecret, config, ha, health, hub};
use crate::{config_objects, redisproxy, resourceproxy, tunnel};

/// What every step needs: the configuration, the hub's client, the listener's
/// authentication, the metrics, the task tracker and the shutdown token.
pub(crate) struct Wiring {
    pub config: PrincipalConfig,
    pub tasks: TaskTracker,
    pub shutdown: CancellationToken,
    pub client: kube::Client,
    /// The hub's client for watches: its own, larger QPS budget
    /// ([`argocd_agent_kubernetes::clients`]).
    pub watch_client: kube::Client,
    pub listener_auth: ListenerAuth,
    pub rules: Arc<LiveRules>,
    pub metrics: Metrics,
    pub partition: Arc<Partition>,
    /// What both admin listeners share: tenants, the blocklist writer, kubeconfigs.
    pub admin: Arc<admin::AdminContext>,
}

/// The hub's watches: the Applications' and the configuration objects' caches and changes,
/// and the blocklist ConfigMap's.
pub(crate) struct HubWatches {
    apps: Cache,
    config_objects: ConfigObjects,
    changes: Vec<(ResourceKind, BoxStream<'static, Change>)>,
    blocklist_cache: Cache,
    blocklist_changed: Arc<tokio::sync::Notify>,
}

/// The optional features' handles the sessions use.
#[derive(Default)]
pub(crate) struct Features {
    pub leases: Option<Arc<ha::Leases>>,
    pub cluster_info: Option<Arc<clusterinfo::ClusterInfoWriter>>,
    pub cluster_secrets: Option<Arc<clustersecret::ClusterSecrets>>,
    pub resource_proxy: Option<(SocketAddr, String)>,
    pub redis_proxy: Option<SocketAddr>,
    pub admin: Option<config::AdminAddress>,
    pub metrics: Option<SocketAddr>,
}

impl Features {
    /// The features told of sessions starting and ending.
    fn session_observers(&self) -> Vec<Arc<dyn SessionObserver>> {
        let info = self
            .cluster_info
            .clone()
            .map(|w| w as Arc<dyn SessionObserver>);
        let secrets = self
            .cluster_secrets
            .clone()
            .map(|s| s as Arc<dyn SessionObserver>);
        info.into_iter().chain(secrets).collect()
    }
}

/// The principal's partition from `--allowed-namespaces` and `--label-selector`, checked.
fn partition_of(config: &PrincipalConfig) -> Result<Partition, PrincipalError> {
    let partition = Partition::new(
        &config.allowed_namespaces,
        config.label_selector.as_deref(),
        &config.argocd_namespace,
        config.destination_based_mapping,
    )
    .map_err(PrincipalError::Partition)?;
    if !partition.unstampable().is_empty() {
        tracing::warn!(terms = %text::quoted_list(partition.unstampable()),
            "--label-selector terms that fix no label value: objects the principal creates (autonomous agents' hub copies, cluster Secrets, Leases) cannot carry them, and its own watches will not see those objects; use k=v terms");
    }
    if partition.limits_namespaces() || partition.selector().is_some() {
        tracing::info!(allowed_namespaces = %partition.describe(), label_selector = %text::or_dash(partition.selector()),
            labels = %partition.labels().iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","), "principal partition");
    }
    Ok(partition)
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

impl Wiring {
    /// The rules, the listener's authentication, the hub's client and the metrics.
    pub async fn new(
        config: PrincipalConfig,
        shutdown: CancellationToken,
    ) -> Result<Wiring, PrincipalError> {
        let rules = start_rules(&config)?;
        let partition = Arc::new(partition_of(&config)?);
        let listener_auth = ListenerAuth::from_config(&config.auth, config.listen).await?;
        let (client, watch_client) = argocd_agent_kubernetes::clients(&config.kube).await?;
        let metrics = Metrics::with_agent_label_limit(config.metrics_max_agent_labels);
        if let Some(svid) = &listener_auth.svid {
            metrics.follow_svid(svid);
        }
        let admin = Arc::new(admin::AdminContext {
            rules: rules.clone(),
            blocklist: Some(blocklist::BlocklistStore {
                configmaps: Arc::new(Resources::new(client.clone(), Kind::ConfigMap)),
                namespace: config.argocd_namespace.clone(),
            }),
            kubeconfigs: std::sync::OnceLock::new(),
        });
        Ok(Wiring {
            config,
            tasks: TaskTracker::new(),
            shutdown,
            client,
            watch_client,
            listener_auth,
            rules,
            metrics,
            partition,
            admin,
        })
    }

    /// A watch of `kind` in `scope`, narrowed by `extra` and the configured label selector.
    fn watch(
        &self,
        kind: Kind,
        scope: Scope,
        extra: Option<&str>,
    ) -> (Cache, impl futures::Stream<Item = Change> + Send + 'static) {
        let scope = match self.partition.selector_with(extra) {
            Some(selector) => scope.with_label_selector(selector),
            None => scope,
        };
        argocd_agent_kubernetes::watch(self.watch_client.clone(), kind, scope)
    }

    /// Watches the hub's Applications, and AppProjects, repositories and GPG keys in Argo
    /// CD's namespace.
    pub fn watch_hub(&self) -> Result<HubWatches, PrincipalError> {
        let config = &self.config;
        let argocd_ns = Namespace::new(&config.argocd_namespace)
            .map_err(|e| PrincipalError::Config(format!("--namespace: {e}")))?;
        let (apps, changes) = self.watch_applications();
        let in_argocd = || Scope::namespace(argocd_ns.to_string());
        let (projects, project_changes) = self.watch(Kind::AppProject, in_argocd(), None);
        let (repositories, repository_changes) = self.watch(
            Kind::Secret,
            in_argocd(),
            Some(config_objects::REPOSITORY_SELECTOR),
        );
        let (gpg_keys, gpg_changes) = self.watch(Kind::ConfigMap, in_argocd(), None);
        let blocklist_changed = Arc::new(tokio::sync::Notify::new());
        // The blocklist ConfigMap is one of the Argo CD namespace's ConfigMaps, already
        // watched; with a label selector it is watched apart, unfiltered: a blocklist
        // applies to every principal on the hub, whatever its partition.
        let (blocklist_cache, notify_gpg) = if self.partition.selector().is_some() {
            (
                self.watch_blocklist(&argocd_ns, blocklist_changed.clone()),
                None,
            )
        } else {
            (gpg_keys.clone(), Some(blocklist_changed.clone()))
        };
        let gpg_changes = {
            let metrics = self.metrics.clone();
            gpg_changes.inspect(move |c| {
                let name = match c {
                    Change::Applied(o) | Change::Deleted(o) => o.metadata.name.as_deref(),
                    Change::Synced => None,
                };
                if name == Some(blocklist::CONFIGMAP)
                    && let Some(notify) = &notify_gpg
                {
                    notify.notify_one();
                }
                // Upstream's argocd_principal_gpg_keys_count: the keys of the hub's GPG
                // ConfigMap, 0 once it is deleted.
                if name == Some(crate::config_objects::GPG_KEYS_CONFIGMAP) {
                    metrics.gpg_keys(match c {
                        Change::Applied(o) => gpg_key_count(o),
                        _ => 0,
                    });
                }
            })
        };
        let config_objects = ConfigObjects::new(
            argocd_ns,
            !config.destination_based_mapping,
            Arc::new(projects),
            Arc::new(repositories),
            Arc::new(gpg_keys),
            Arc::new(Resources::new(self.client.clone(), Kind::AppProject)),
        );
        Ok(HubWatches {
            apps,
            config_objects,
            changes: vec![
                (ResourceKind::Application, changes.boxed()),
                (ResourceKind::AppProject, project_changes.boxed()),
                (ResourceKind::Repository, repository_changes.boxed()),
                (ResourceKind::GpgKeys, gpg_changes.boxed()),
            ],
            blocklist_cache,
            blocklist_changed,
        })
    }

    /// The hub's Applications in the partition's namespaces: one watch per namespace when
    /// `--allowed-namespaces` lists plain names, otherwise one cluster-wide watch whose
    /// changes outside the partition are dropped (and listings filtered by the router).
    fn watch_applications(&self) -> (Cache, BoxStream<'static, Change>) {
        if let Some(names) = self.partition.literal_namespaces() {
            let scope = Scope {
                namespaces: argocd_agent_kubernetes::Namespaces::Set(names),
                label_selector: None,
            };
            let (cache, changes) = self.watch(Kind::Application, scope, None);
            return (cache, changes.boxed());
        }
        let (cache, changes) = self.watch(Kind::Application, Scope::all(), None);
        if !self.partition.limits_namespaces() {
            return (cache, changes.boxed());
        }
        let partition = self.partition.clone();
        let changes = changes.filter(move |c| {
            let keep = match c {
                Change::Applied(o) | Change::Deleted(o) => o
                    .metadata
                    .namespace
                    .as_deref()
                    .is_some_and(|ns| partition.allows_namespace(ns)),
                Change::Synced => true,
            };
            futures::future::ready(keep)
        });
        (cache, changes.boxed())
    }

    /// An unfiltered watch of the Argo CD namespace's ConfigMaps for the blocklist (a
    /// principal with a label selector); `changed` is told of blocklist changes.
    fn watch_blocklist(&self, ns: &Namespace, changed: Arc<tokio::sync::Notify>) -> Cache {
        let (cache, changes) = argocd_agent_kubernetes::watch(
            self.watch_client.clone(),
            Kind::ConfigMap,
            Scope::namespace(ns.to_string()),
        );
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            futures::pin_mut!(changes);
            loop {
                let c = tokio::select! {
                    _ = stop.cancelled() => return,
                    c = changes.next() => match c { Some(c) => c, None => return },
                };
                if let Change::Applied(o) | Change::Deleted(o) = &c
                    && o.metadata.name.as_deref() == Some(blocklist::CONFIGMAP)
                {
                    changed.notify_one();
                }
            }
        });
        cache
    }

    /// With namespace creation on, the hub's namespaces are watched: connecting agents whose
    /// namespace exists cost no API call (a restart storm of 10,000 agents would otherwise
    /// be 10,000 reads at --kube-qps).
    fn namespace_cache(&self) -> Option<Cache> {
        if !self.config.create_namespace {
            return None;
        }
        let (cache, changes) = argocd_agent_kubernetes::watch(
            self.watch_client.clone(),
            Kind::Namespace,
            Scope::all(),
        );
        let stop = self.shutdown.clone();
        self.tasks.spawn(async move {
            futures::pin_mut!(changes);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    c = changes.next() => if c.is_none() { return },
                }
            }
        });
        Some(cache)
    }

    /// The core: the session registry and the hub, its watches routed to the agents'
    /// workers; revoked and blocked identities' sessions closed; queues sampled.
    pub fn core(&self, watches: HubWatches) -> Arc<Hub> {
        let config = &self.config;
        let sessions = Arc::new(
            Sessions::new(config.queue.clone(), config.event_rate)
                .with_partition(self.partition.clone())
                .with_tenancy(crate::tenant_limits::Tenancy::new(
                    self.rules.clone(),
                    self.metrics.clone(),
                )),
        );
        let hub = Arc::new(Hub::new(HubParts {
            shared: HubShared {
                source: source_id(self.listener_auth.svid.as_ref()),
                namespaces: Arc::new(Resources::new(self.client.clone(), Kind::Namespace)),
                metrics: self.metrics.clone(),
                sessions: sessions.clone(),
                create_namespace: config.create_namespace,
                namespace_cache: self
                    .namespace_cache()
                    .map(|c| Arc::new(c) as Arc<dyn argocd_agent_kubernetes::ObjectView>),
                namespace_labels: config.namespace_labels.clone(),
                by_destination: config.destination_based_mapping,
                bounds: config.agent_bounds,
                tasks: self.tasks.clone(),
                shutdown: self.shutdown.clone(),
            },
            apps: Arc::new(Resources::new(self.client.clone(), Kind::Application)),
            cache: {
                if config.ha.as_ref().is_some_and(|ha| ha.shard_cache) {
                    watches.apps.shard();
                }
                Arc::new(watches.apps)
            },
            config: watches.config_objects,
            tenants: crate::tenancy::TenantView::new(self.rules.subscribe()),
        }));
        for (kind, stream) in watches.changes {
            self.tasks.spawn(hub::run_hub_watch(
                hub.clone(),
                kind,
                stream,
                self.shutdown.clone(),
            ));
        }
        watch_revocations(&self.rules, &sessions);
        self.tasks.spawn(crate::hub::watch_reloads(
            hub.clone(),
            self.shutdown.clone(),
        ));
        self.tasks.spawn(crate::sessions::enforce_blocklist(
            sessions.clone(),
            self.metrics.clone(),
            Arc::new(watches.blocklist_cache),
            config.argocd_namespace.clone(),
            watches.blocklist_changed,
            self.shutdown.clone(),
        ));
        self.tasks.spawn(crate::sessions::sample_queues(
            sessions,
            self.metrics.clone(),
            self.shutdown.clone(),
        ));
        self.tasks.spawn(hub::sample_cache_forms(
            hub.apps.cache.clone(),
            self.metrics.clone(),
            self.shutdown.clone(),
        ));
        hub
    }

    /// With `--ha`: the replica Lease and the agent Leases.
    pub async fn leases(&self, hub: &Hub) -> Result<Option<Arc<ha::Leases>>, PrincipalError> {
        let Some(ha) = self.config.ha.clone() else {
            return Ok(None);
        };
        let lease_client = argocd_agent_kubernetes::bounded_client(
            &argocd_agent_kubernetes::ClientOptions {
                qps: ha.lease_qps,
                burst: ha.lease_burst,
                ..self.config.kube.clone()
            },
            ha::LEASE_REQUESTS_IN_FLIGHT,
        )
        .await?;
        // The replica Lease's own client: one renewal every fifth of its duration, never
        // queued behind agent Lease writes.
        let replica_client = argocd_agent_kubernetes::bounded_client(
            &argocd_agent_kubernetes::ClientOptions {
                qps: ha::REPLICA_LEASE_QPS,
                burst: ha::REPLICA_LEASE_BURST,
                ..self.config.kube.clone()
            },
            1,
        )
        .await?;
        let leases = ha::Leases::start(
            ha::LeaseBackend::kube(
                lease_client,
                replica_client,
                &self.config.argocd_namespace,
                &hub.shared.sessions,
            ),
            &self.config.argocd_namespace,
            ha,
            hub.shared.sessions.clone(),
            self.metrics.clone(),
            &self.tasks,
            self.shutdown.clone(),
        );
        // Tenants' agents quotas count the agents other replicas serve.
        hub.shared.sessions.tenancy.set_census(leases.clone());
        Ok(Some(leases))
    }

    /// The metrics and health listeners, the sender that makes them ready, and the
    /// readiness they answer `/readyz` with (the agent listener's too).
    pub async fn serve_health(
        &self,
        leases: Option<Arc<ha::Leases>>,
    ) -> Result<(Option<SocketAddr>, watch::Sender<bool>, health::Readiness), PrincipalError> {
        let config = &self.config;
        let (ready_tx, ready_rx) = watch::channel(false);
        let readiness = health::Readiness {
            synced: ready_rx,
            svid: self.listener_auth.svid.clone(),
            checks: leases
                .map(|l| {
                    Arc::new(move || l.ready().map_err(Into::into))
                        as argocd_agent_runtime::health::Probe
                })
                .into_iter()
                .collect(),
        };
        let metrics_addr = match config.metrics_listen {
            Some(addr) => Some(
                health::serve(
                    addr,
                    Some(self.metrics.clone()),
                    readiness.clone(),
                    &self.tasks,
                    self.shutdown.clone(),
                )
                .await
                .map_err(|source| PrincipalError::Listen { addr, source })?,
            ),
            None => None,
        };
        if let Some(addr) = config.healthz_listen {
            health::serve(
                addr,
                None,
                readiness.clone(),
                &self.tasks,
                self.shutdown.clone(),
            )
            .await
            .map_err(|source| PrincipalError::Listen { addr, source })?;
        }
        Ok((metrics_addr, ready_tx, readiness))
    }

    /// Ready once the hub watches have listed everything (the listener is bound already).
    pub fn ready_when_synced(&self, hub: &Arc<Hub>, ready: watch::Sender<bool>) {
        let hub = hub.clone();
        let since = std::time::Instant::now();
        self.tasks.spawn(async move {
            hub.apps.cache.wait_synced().await;
            hub.config.wait_synced().await;
            ready.send_replace(true);
            tracing::info!(
                seconds = since.elapsed().as_secs_f64(),
                "hub watches listed (ready, with a fresh replica Lease under --ha)"
            );
        });
    }

    /// The operator API's own listener, when configured.
    pub async fn serve_admin(
        &self,
        hub: &Hub,
    ) -> Result<Option<config::AdminAddress>, PrincipalError> {
        let Some(address) = &self.config.admin_listen else {
            return Ok(None);
        };
        let bound = admin::serve(
            address,
            hub.shared.sessions.clone(),
            self.admin.clone(),
            self.metrics.clone(),
            &self.tasks,
            self.shutdown.clone(),
        )
        .await?;
        tracing::info!(admin = %bound, "admin API listening (plaintext, local operators only)");
        Ok(Some(bound))
    }

    /// The resource proxy, when configured: its address, URL and the cluster secrets keeper.
    pub async fn resource_proxy(
        &self,
        hub: &Hub,
        tunnels: &Arc<tunnel::Tunnels>,
        features: &mut Features,
    ) -> Result<(), PrincipalError> {
        let Some(rp) = &self.config.resource_proxy else {
            return Ok(());
        };
        let (addr, url, secrets) =
            start_resource_proxy(self, rp, hub, tunnels.clone(), features.leases.clone()).await?;
        features.resource_proxy = Some((addr, url));
        features.cluster_secrets = secrets;
        Ok(())
    }

    /// Agents' cluster info goes to the hub Redis the proxy fronts, under each cluster's
    /// server URL (the resource proxy's when it is on and no template was given).
    pub fn cluster_info(&self, hub: &Hub, features: &mut Features) {
        let Some(r) = &self.config.redis_proxy else {
            return;
        };
        let template = match &features.resource_proxy {
            Some((_, url)) if r.cluster_server_template == clusterinfo::DEFAULT_SERVER_TEMPLATE => {
                format!(
                    "{}{}{}",
                    url.trim_end_matches('/'),
                    resourceproxy::AGENT_PREFIX,
                    clusterinfo::AGENT_PLACEHOLDER
                )
            }
            _ => r.cluster_server_template.clone(),
        };
        let writer = clusterinfo::ClusterInfoWriter::new(
            r.upstream.clone(),
            r.compression,
            template,
            Arc::downgrade(&hub.shared.sessions),
        );
        self.tasks.spawn(
            writer
                .clone()
                .refresh(hub.shared.sessions.clone(), self.shutdown.clone()),
        );
        features.cluster_info = Some(writer);
    }

    /// The Redis proxy, when configured.
    pub async fn redis_proxy(
        &self,
        hub: &Hub,
        features: &mut Features,
    ) -> Result<(), PrincipalError> {
        let Some(redis) = &self.config.redis_proxy else {
            return Ok(());
        };
        let addr = redisproxy::serve(
            redis.clone(),
            hub.owners.clone(),
            self.metrics.clone(),
            hub.shared.source.clone(),
            features.leases.clone(),
            &self.tasks,
            self.shutdown.clone(),
        )
        .await
        .map_err(|source| PrincipalError::Listen {
            addr: redis.listen,
            source,
        })?;
        features.redis_proxy = Some(addr);
        Ok(())
    }

    /// Where sessions run, and the features they use.
    pub fn session_context(&self, hub: Arc<Hub>, features: &Features) -> SessionContext {
        let config = &self.config;
        SessionContext {
            hub,
            tasks: self.tasks.clone(),
            shutdown: self.shutdown.clone(),
            idle_timeout: config.idle_timeout,
            hello_timeout: config.hello_timeout,
            resync_min_interval: config.resync_min_interval,
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
            gate: features
                .leases
                .clone()
                .map(|l| Arc::new(l) as Arc<dyn SessionGate>),
            observers: features.session_observers(),
        }
    }

    /// Binds the gRPC listener.
    pub async fn bind(&self) -> Result<(TcpListener, SocketAddr), PrincipalError> {
        let addr = self.config.listen;
        let listen_error = |source| PrincipalError::Listen { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(listen_error)?;
        let bound = listener.local_addr().map_err(listen_error)?;
        Ok((listener, bound))
    }
}

/// Starts the resource proxy: keys from the hub, the serving certificate, the listener,
/// and (with self-registration) the cluster secrets keeper.
async fn start_resource_proxy(
    w: &Wiring,
    rp: &resourceproxy::ResourceProxyConfig,
    hub: &Hub,
    tunnels: Arc<tunnel::Tunnels>,
    leases: Option<Arc<ha::Leases>>,
) -> Result<
    (
        SocketAddr,
        String,
        Option<Arc<clustersecret::ClusterSecrets>>,
    ),
    PrincipalError,
> {
    let (tasks, shutdown) = (&w.tasks, w.shutdown.clone());
    let argocd_namespace = w.config.argocd_namespace.as_str();
    let proxy_err = |e: resourceproxy::credentials::KeyError| PrincipalError::Config(e.to_string());
    let keys = Arc::new(
        resourceproxy::credentials::ProxyKeys::load_or_create(
            &Resources::new(w.client.clone(), Kind::Secret),
            argocd_namespace,
        )
        .await
        .map_err(proxy_err)?,
    );
    let listen_error = |source| PrincipalError::Listen {
        addr: rp.listen,
        source,
    };
    let listener = TcpListener::bind(rp.listen).await.map_err(listen_error)?;
    let addr = listener.local_addr().map_err(listen_error)?;
    let rp = with_default_urls(rp, addr, leases.is_some());
    let (host, replica_host, hostnames) = serving_hostnames(&rp, leases.is_some());
    let serving = resourceproxy::tls::start(
        rp.tls,
        &host,
        replica_host.as_deref(),
        &hostnames,
        rp.cert_lifetime,
        keys.clone(),
        w.listener_auth.svid.as_ref(),
        tasks,
        shutdown.clone(),
    )
    .map_err(proxy_err)?;
    let tls = resourceproxy::tls::server_config(serving.cert.clone())
        .map_err(|e| PrincipalError::Config(format!("resource proxy TLS: {e}")))?;
    let _ = w.admin.kubeconfigs.set(admin::KubeconfigIssuer {
        keys: keys.clone(),
        config: rp.clone(),
        ca_pem: serving.ca_pem.clone(),
    });
    let secrets = rp
        .self_cluster_registration
        .then(|| start_cluster_secrets(w, &rp, keys.clone(), serving.ca_pem.clone()));
    if let Some(secrets) = &secrets {
        let sessions = hub.shared.sessions.clone();
        secrets.follow_tenants(Arc::new(move |agent| {
            sessions.agent(agent).map(|s| s.identity().tenant)
        }));
    }
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
    let proxy = resourceproxy::ResourceProxy::new(resourceproxy::ResourceProxyParts {
        sessions: hub.shared.sessions.clone(),
        metrics: hub.shared.metrics.clone(),
        source: hub.shared.source.clone(),
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

/// Self-registration: the keeper of the agents' cluster Secrets, refreshing until shutdown.
fn start_cluster_secrets(
    w: &Wiring,
    rp: &resourceproxy::ResourceProxyConfig,
    keys: Arc<resourceproxy::credentials::ProxyKeys>,
    ca_pem: tokio::sync::watch::Receiver<String>,
) -> Arc<clustersecret::ClusterSecrets> {
    let secrets = clustersecret::ClusterSecrets::new(
        Arc::new(Resources::new(w.client.clone(), Kind::Secret)),
        w.config.argocd_namespace.as_str(),
        keys,
        rp.clone(),
        ca_pem,
        w.partition.clone(),
    );
    w.tasks.spawn(secrets.clone().refresh(w.shutdown.clone()));
    secrets
}

/// The resource proxy's configuration with its URLs filled in: without a configured URL,
/// the bound address (loopback for an unspecified one); with replicas, this replica's own
/// URL, which the others forward to.
fn with_default_urls(
    rp: &resourceproxy::ResourceProxyConfig,
    addr: SocketAddr,
    replicas: bool,
) -> resourceproxy::ResourceProxyConfig {
    let mut rp = rp.clone();
    if rp.url.is_empty() {
        let ip = if addr.ip().is_unspecified() {
            std::net::IpAddr::from([127, 0, 0, 1])
        } else {
            addr.ip()
        };
        rp.url = format!("https://{}", SocketAddr::new(ip, addr.port()));
    }
    if replicas && rp.replica_url.is_empty() {
        let pod_ip = std::env::var("POD_IP")
            .ok()
            .filter(|s| !s.trim().is_empty());
        rp.replica_url = resourceproxy::forward::default_replica_url(pod_ip.as_deref(), addr);
    }
    rp
}

/// The names the resource proxy's certificate serves: the URL's host, with replicas the
/// replica URL's host, and the configured ones.
fn serving_hostnames(
    rp: &resourceproxy::ResourceProxyConfig,
    replicas: bool,
) -> (String, Option<String>, Vec<String>) {
    let host = rp.host();
    let mut hostnames = rp.hostnames.clone();
    if !hostnames.contains(&host) {
        hostnames.insert(0, host.clone());
    }
    let replica_host = replicas.then(|| rp.replica_host());
    if let Some(r) = &replica_host
        && !hostnames.contains(r)
    {
        hostnames.push(r.clone());
    }
    (host, replica_host, hostnames)
}

/// CloudEvents `source` of our events: our SPIFFE ID when we have an SVID.
/// The GPG keys in Argo CD's GPG ConfigMap `cm`: its `data` entries, as upstream counts them.
fn gpg_key_count(cm: &kube::api::DynamicObject) -> usize {
    cm.data
        .get("data")
        .and_then(serde_json::Value::as_object)
        .map_or(0, |d| d.len())
}

fn source_id(svid: Option<&SvidSource>) -> String {
    svid.and_then(|s| s.current())
        .map(|s| s.svid.spiffe_id().to_string())
        .unwrap_or_else(|| "argocd-agent-principal".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpg_keys_are_the_configmaps_data_entries() {
        let cm = |data: serde_json::Value| -> kube::api::DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "argocd-gpg-keys-cm"},
                "data": data,
            }))
            .unwrap()
        };
        assert_eq!(
            gpg_key_count(&cm(serde_json::json!({"A": "k1", "B": "k2"}))),
            2
        );
        assert_eq!(gpg_key_count(&cm(serde_json::json!({}))), 0);
        assert_eq!(gpg_key_count(&cm(serde_json::Value::Null)), 0);
    }
}
