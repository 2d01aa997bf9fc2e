//! Kubernetes API test server: an in-memory apiserver that follows the API contract written
//! down in `docs/kube-test-server.md` (resourceVersions, watch with bookmarks and 410 Gone,
//! conflicts, status subresource, patches, selectors, finalizers, `Status` errors, discovery),
//! so the real binaries, kube-rs and kubectl can run against it where no cluster exists.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use argocd_agent_kube_test_server::KubeTestServer;
//! let server = KubeTestServer::start().await?;
//! let dir = tempfile::tempdir()?;
//! // Every kubeconfig carries a bearer token the server issued; requests without one get 401.
//! server.write_kubeconfig(&dir.path().join("kubeconfig"), "test")?;
//! server.write_kubeconfig_for_user(&dir.path().join("agent"), "test", "agent")?;
//! // What each user asked for, as an RBAC authorizer sees it.
//! let by_agent = server.requests().into_iter().filter(|r| r.user.as_deref() == Some("agent"));
//! # drop(by_agent);
//! server.shutdown().await;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

mod audit;
mod auth;
mod exec;
#[doc(hidden)]
pub mod fuzzing;
mod http;
mod managed_fields;
mod openapi;
mod pods;
mod protobuf;
mod review;
mod selector;
mod status;
mod store;
mod strategic;
mod tls;
mod validation;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

pub use audit::{REQUEST_LOG_LIMIT, RecordedRequest};
pub use auth::User;
pub use exec::{ExecSession, MOTD};
pub use pods::{LOG_EVERY_ANNOTATION, POD_LOG_LIMIT};
pub use selector::{FieldSelector, LabelSelector};
pub use status::ApiError;

/// A resource type the server serves, registered by group/version/plural.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; `""` for the core group.
    pub group: String,
    /// Version, e.g. `v1alpha1`.
    pub version: String,
    /// Plural (the URL segment), e.g. `applications`.
    pub plural: String,
    /// Singular name, e.g. `application`.
    pub singular: String,
    /// Kind, e.g. `Application`.
    pub kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Whether the `/status` subresource exists (then main-resource writes keep `.status`).
    pub status_subresource: bool,
    /// Short names for kubectl (`app`).
    pub short_names: Vec<String>,
    /// Extra `kubectl get` columns between NAME and AGE, like a CRD's
    /// `additionalPrinterColumns`.
    pub columns: Vec<PrinterColumn>,
    /// A custom resource (CRD): `PUT` needs `metadata.resourceVersion`, strategic merge patch
    /// is 415, `metadata.generation` is kept. [`ResourceType::new`] sets it for non-core groups;
    /// [`ResourceType::built_in`] clears it.
    pub custom: bool,
    /// Whether the kind keeps `metadata.generation` (CRDs and kinds with a spec do;
    /// ConfigMap, Secret, Namespace, Lease and Event do not).
    pub generation: bool,
    /// Discovery categories (`all` makes `kubectl get all` list the resource).
    pub categories: Vec<String>,
    /// `fieldSelector` fields besides `metadata.name` / `metadata.namespace`, with the JSON
    /// pointer each one reads.
    pub field_selectors: Vec<(String, String)>,
    /// What the resource stores.
    pub storage: Storage,
}

/// How a resource is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// Objects are stored: every verb.
    Objects,
    /// A review: `create` only, answered from the request and never stored
    /// (SelfSubjectAccessReview, SelfSubjectReview).
    Review,
}

/// A `kubectl get` column taken from the object by a simple JSONPath (`.status.sync.status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrinterColumn {
    /// Column title.
    pub name: String,
    /// Dotted path into the object; for [`ColumnValue::KeyCount`], paths separated by `,`.
    pub json_path: String,
    /// 0: always shown; higher: only with `-o wide`.
    pub priority: u32,
    /// What the cell shows.
    pub value: ColumnValue,
}

/// What a printer column cell shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnValue {
    /// The value at the path.
    Value,
    /// The number of keys of the maps at the paths (ConfigMap and Secret `DATA`).
    KeyCount,
}

impl ResourceType {
    /// A resource type; `singular` is the lower-cased kind.
    pub fn new(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        status_subresource: bool,
    ) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            status_subresource,
            short_names: Vec::new(),
            columns: Vec::new(),
            custom: !group.is_empty(),
            generation: true,
            categories: Vec::new(),
            field_selectors: Vec::new(),
            storage: Storage::Objects,
        }
    }

    /// A built-in kind (not a CRD); `generation` says whether it keeps `metadata.generation`.
    pub fn built_in(mut self, generation: bool) -> Self {
        self.custom = false;
        self.generation = generation;
        self
    }

    /// Adds discovery categories.
    pub fn with_categories(mut self, categories: &[&str]) -> Self {
        self.categories = categories.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Adds `fieldSelector` fields: `(field, JSON pointer)`.
    pub fn with_field_selectors(mut self, fields: &[(&str, &str)]) -> Self {
        self.field_selectors
            .extend(fields.iter().map(|(f, p)| (f.to_string(), p.to_string())));
        self
    }

    /// Makes this a create-only review resource.
    pub fn review(mut self) -> Self {
        self.storage = Storage::Review;
        self.generation = false;
        self
    }

    /// Adds a column counting the keys of the maps at `json_paths` (comma-separated).
    pub fn with_key_count_column(mut self, name: &str, json_paths: &str) -> Self {
        self.columns.push(PrinterColumn {
            name: name.into(),
            json_path: json_paths.into(),
            priority: 0,
            value: ColumnValue::KeyCount,
        });
        self
    }

    /// Adds kubectl short names.
    pub fn with_short_names(mut self, names: &[&str]) -> Self {
        self.short_names = names.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Adds a `kubectl get` column.
    pub fn with_column(mut self, name: &str, json_path: &str, priority: u32) -> Self {
        self.columns.push(PrinterColumn {
            name: name.into(),
            json_path: json_path.into(),
            priority,
            value: ColumnValue::Value,
        });
        self
    }

    /// `group/version`, or `version` for the core group.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` (or `plural`), as in apiserver messages.
    pub fn qualified_plural(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }

    /// The resources registered by default: `v1` namespaces, secrets, configmaps, pods (with
    /// `/status`, `/log`, `/exec`) and events; `coordination.k8s.io/v1` leases;
    /// `events.k8s.io/v1` events; the self reviews of `authorization.k8s.io/v1` and
    /// `authentication.k8s.io/v1`; `argoproj.io/v1alpha1` applications (with `/status`) and
    /// appprojects.
    pub fn defaults() -> Vec<ResourceType> {
        let involved = [
            ("involvedObject.kind", "/involvedObject/kind"),
            ("involvedObject.namespace", "/involvedObject/namespace"),
            ("involvedObject.name", "/involvedObject/name"),
            ("involvedObject.uid", "/involvedObject/uid"),
            ("involvedObject.apiVersion", "/involvedObject/apiVersion"),
            (
                "involvedObject.resourceVersion",
                "/involvedObject/resourceVersion",
            ),
            ("involvedObject.fieldPath", "/involvedObject/fieldPath"),
            ("reason", "/reason"),
            ("reportingComponent", "/reportingComponent"),
            ("source", "/source/component"),
            ("type", "/type"),
        ];
        vec![
            ResourceType::new("", "v1", "namespaces", "Namespace", false, true)
                .built_in(false)
                .with_short_names(&["ns"])
                .with_column("Status", ".status.phase", 0)
                .with_field_selectors(&[("status.phase", "/status/phase")]),
            ResourceType::new("", "v1", "secrets", "Secret", true, false)
                .built_in(false)
                .with_column("Type", ".type", 0)
                .with_key_count_column("Data", ".data")
                .with_field_selectors(&[("type", "/type")]),
            ResourceType::new("", "v1", "configmaps", "ConfigMap", true, false)
                .built_in(false)
                .with_short_names(&["cm"])
                .with_key_count_column("Data", ".data,.binaryData"),
            ResourceType::new("", "v1", "pods", "Pod", true, true)
                .built_in(true)
                .with_short_names(&["po"])
                .with_categories(&["all"])
                .with_column("Status", ".status.phase", 0)
                .with_column("Node", ".spec.nodeName", 10)
                .with_field_selectors(&[
                    ("spec.nodeName", "/spec/nodeName"),
                    ("spec.restartPolicy", "/spec/restartPolicy"),
                    ("spec.schedulerName", "/spec/schedulerName"),
                    ("spec.serviceAccountName", "/spec/serviceAccountName"),
                    ("status.phase", "/status/phase"),
                    ("status.podIP", "/status/podIP"),
                    ("status.nominatedNodeName", "/status/nominatedNodeName"),
                ]),
            ResourceType::new("", "v1", "events", "Event", true, false)
                .built_in(false)
                .with_short_names(&["ev"])
                .with_column("Type", ".type", 0)
                .with_column("Reason", ".reason", 0)
                .with_column("Message", ".message", 0)
                .with_field_selectors(&involved),
            ResourceType::new("coordination.k8s.io", "v1", "leases", "Lease", true, false)
                .built_in(false)
                .with_column("Holder", ".spec.holderIdentity", 0),
            ResourceType::new("events.k8s.io", "v1", "events", "Event", true, false)
                .built_in(false)
                .with_short_names(&["ev"])
                .with_column("Type", ".type", 0)
                .with_column("Reason", ".reason", 0)
                .with_field_selectors(&[
                    ("regarding.kind", "/regarding/kind"),
                    ("regarding.namespace", "/regarding/namespace"),
                    ("regarding.name", "/regarding/name"),
                    ("regarding.uid", "/regarding/uid"),
                    ("reason", "/reason"),
                    ("reportingController", "/reportingController"),
                    ("type", "/type"),
                ]),
            ResourceType::new(
                "authorization.k8s.io",
                "v1",
                "selfsubjectaccessreviews",
                "SelfSubjectAccessReview",
                false,
                false,
            )
            .built_in(false)
            .review(),
            ResourceType::new(
                "authentication.k8s.io",
                "v1",
                "selfsubjectreviews",
                "SelfSubjectReview",
                false,
                false,
            )
            .built_in(false)
            .review(),
            ResourceType::new(
                "argoproj.io",
                "v1alpha1",
                "applications",
                "Application",
                true,
                true,
            )
            .with_short_names(&["app", "apps"])
            // The columns of Argo CD's Application CRD.
            .with_column("Sync Status", ".status.sync.status", 0)
            .with_column("Health Status", ".status.health.status", 0)
            .with_column("Revision", ".status.sync.revision", 10)
            .with_column("Project", ".spec.project", 10),
            ResourceType::new(
                "argoproj.io",
                "v1alpha1",
                "appprojects",
                "AppProject",
                true,
                false,
            )
            .with_short_names(&["appproj", "appprojs"]),
            ResourceType::new(
                "argoproj.io",
                "v1alpha1",
                "applicationsets",
                "ApplicationSet",
                true,
                true,
            )
            .with_short_names(&["appset", "appsets"]),
        ]
    }
}

/// Server settings; [`Default`] gives what the docs describe.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Resource types served (default: [`ResourceType::defaults`]).
    pub resources: Vec<ResourceType>,
    /// How many events the history keeps; watches from older RVs get 410 (default 1000).
    pub history_limit: usize,
    /// Silence after which a watch with `allowWatchBookmarks=true` gets a BOOKMARK (default 1 s).
    pub bookmark_interval: Duration,
    /// Create a missing namespace on the fly instead of answering 404 (default false, as a
    /// real apiserver).
    pub auto_create_namespaces: bool,
    /// Namespaces that exist at start (default `default`, `kube-system`).
    pub initial_namespaces: Vec<String>,
    /// Users with fixed tokens (default none). Every kubeconfig the server writes also
    /// registers its user with a random token on first use; a request with no token or an
    /// unknown one is 401, as on a cluster without anonymous access.
    pub users: Vec<User>,
    /// Serve plain HTTP instead of HTTPS (default false). kube-rs sends bearer tokens over
    /// plain HTTP, kubectl (client-go) does not, so kubectl needs the default.
    pub plain_http: bool,
    /// Demand a client certificate signed by the server's CA in the TLS handshake (default
    /// false); kubeconfigs written by the server then carry one for their user. The bearer
    /// token is still what names the user.
    pub require_client_cert: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            resources: ResourceType::defaults(),
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(1),
            auto_create_namespaces: false,
            initial_namespaces: vec!["default".into(), "kube-system".into()],
            users: Vec::new(),
            plain_http: false,
            require_client_cert: false,
        }
    }
}

/// Fault-injection state shared by the handle and the request handler.
struct Faults {
    fail_remaining: AtomicUsize,
    fail_status: AtomicU16,
    latency_ms: AtomicU64,
    /// Bumped to end every open watch.
    drop_watches: watch::Sender<u64>,
}

/// Everything a request handler needs.
struct Shared {
    store: store::Store,
    users: auth::Users,
    requests: audit::RequestLog,
    /// `None` when serving plain HTTP.
    tls: Option<tls::ServerTls>,
    pod_logs: pods::PodLogs,
    exec_handlers: exec::ExecHandlers,
    exec_sessions: exec::ExecSessions,
    faults: Faults,
    bookmark_interval: Duration,
    addr: SocketAddr,
    /// Set on shutdown so watches end and the server can drain.
    shutdown: watch::Sender<bool>,
}

impl Shared {
    fn drop_watches(&self) {
        self.faults.drop_watches.send_modify(|g| *g += 1);
    }
}

/// Handle to a running server. Dropping it, or [`KubeTestServer::shutdown`], stops it.
pub struct KubeTestServer {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl KubeTestServer {
    /// Starts a server with default options on `127.0.0.1:0`.
    pub async fn start() -> std::io::Result<KubeTestServer> {
        Self::start_on(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            ServerOptions::default(),
        )
        .await
    }

    /// Starts a server on `addr` (port 0 picks a free port).
    pub async fn start_on(
        addr: SocketAddr,
        options: ServerOptions,
    ) -> std::io::Result<KubeTestServer> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let store = store::Store::new(
            options.resources,
            options.history_limit,
            options.auto_create_namespaces,
        );
        if let Some(ns_res) = store.find("", "v1", "namespaces") {
            for ns in &options.initial_namespaces {
                store
                    .create(
                        ns_res,
                        "",
                        serde_json::json!({"metadata": {"name": ns}}),
                        false,
                        &managed_fields::Writer {
                            manager: "kube-test-server".into(),
                            status: false,
                        },
                    )
                    .map_err(|e| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!("initial namespace {ns:?}: {e}"),
                        )
                    })?;
            }
        }
        if options.plain_http && options.require_client_cert {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "require_client_cert needs TLS (plain_http is set)",
            ));
        }
        let tls = if options.plain_http {
            None
        } else {
            Some(tls::ServerTls::new(options.require_client_cert)?)
        };
        let users = auth::Users::default();
        for u in &options.users {
            users.register(u);
        }
        let (shutdown, mut shutdown_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            store,
            users,
            requests: audit::RequestLog::default(),
            tls,
            pod_logs: pods::PodLogs::default(),
            exec_handlers: exec::ExecHandlers::default(),
            exec_sessions: exec::ExecSessions::default(),
            faults: Faults {
                fail_remaining: AtomicUsize::new(0),
                fail_status: AtomicU16::new(500),
                latency_ms: AtomicU64::new(0),
                drop_watches: watch::channel(0).0,
            },
            bookmark_interval: options.bookmark_interval,
            addr,
            shutdown,
        });
        tokio::spawn(pods::run_log_generators(shared.clone()));
        let app = http::router(shared.clone());
        let stop = async move {
            let _ = shutdown_rx.wait_for(|s| *s).await;
        };
        let task = match &shared.tls {
            Some(tls) => {
                let served = axum::serve(tls.listen(listener)?, app).with_graceful_shutdown(stop);
                tokio::spawn(async move {
                    if let Err(e) = served.await {
                        tracing::warn!(error = %e, "kube test server stopped with an error");
                    }
                })
            }
            None => {
                let served = axum::serve(listener, app).with_graceful_shutdown(stop);
                tokio::spawn(async move {
                    if let Err(e) = served.await {
                        tracing::warn!(error = %e, "kube test server stopped with an error");
                    }
                })
            }
        };
        Ok(KubeTestServer {
            shared,
            task: Some(task),
        })
    }

    /// Base URL, `https://127.0.0.1:<port>` (`http://` with [`ServerOptions::plain_http`]).
    pub fn url(&self) -> String {
        let scheme = if self.shared.tls.is_some() {
            "https"
        } else {
            "http"
        };
        format!("{scheme}://{}", self.shared.addr)
    }

    /// The CA certificate (DER) clients must trust, `None` when serving plain HTTP.
    pub fn ca_certificate_der(&self) -> Option<Vec<u8>> {
        self.shared.tls.as_ref().map(|t| t.ca_der().to_vec())
    }

    /// The CA certificate (PEM), `None` when serving plain HTTP.
    pub fn ca_certificate_pem(&self) -> Option<String> {
        self.shared.tls.as_ref().map(|t| t.ca_pem().to_string())
    }

    /// A client certificate and key (PEM) for `user`, signed by the server's CA; `None` when
    /// serving plain HTTP.
    pub fn client_certificate_pem(&self, user: &str) -> Option<(String, String)> {
        let tls = self.shared.tls.as_ref()?;
        match tls.client_cert(user) {
            Ok(c) => Some((c.cert_pem, c.key_pem)),
            Err(e) => {
                tracing::warn!(error = %e, user, "cannot issue a client certificate");
                None
            }
        }
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// A kubeconfig with one cluster, user and context named `context_name`, namespace
    /// `default`; the user (also named `context_name`) carries its bearer token.
    pub fn kubeconfig_yaml(&self, context_name: &str) -> String {
        self.kubeconfig_yaml_for_user(context_name, context_name)
    }

    /// Like [`Self::kubeconfig_yaml`] for user `user` with its own token (issued on first use),
    /// so requests of different clients can be told apart in [`Self::requests`].
    pub fn kubeconfig_yaml_for_user(&self, context_name: &str, user: &str) -> String {
        let tls = self.shared.tls.as_ref();
        let client = tls
            .filter(|t| t.require_client_cert)
            .and_then(|_| self.client_certificate_pem(user));
        render_kubeconfig(
            &self.url(),
            context_name,
            user,
            &self.token_for(user),
            tls.map(|t| t.ca_pem()),
            client.as_ref(),
        )
    }

    /// Writes [`Self::kubeconfig_yaml`] to `path`.
    pub fn write_kubeconfig(&self, path: &Path, context_name: &str) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(context_name))
    }

    /// Writes [`Self::kubeconfig_yaml_for_user`] to `path`.
    pub fn write_kubeconfig_for_user(
        &self,
        path: &Path,
        context_name: &str,
        user: &str,
    ) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml_for_user(context_name, user))
    }

    /// The bearer token of `user`, issued on first use (for clients built without a
    /// kubeconfig: send `Authorization: Bearer <token>`).
    pub fn token_for(&self, user: &str) -> String {
        self.shared.users.token_for(user)
    }

    /// Registers a user with a fixed token (replacing that user's earlier token).
    pub fn add_user(&self, user: &User) {
        self.shared.users.register(user);
    }

    /// Every resource request answered so far (discovery and OpenAPI excluded), oldest first;
    /// the last [`REQUEST_LOG_LIMIT`] are kept.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.snapshot()
    }

    /// Replaces the log of one container with `text`'s lines, stamped now (UTC, ns); at most
    /// [`POD_LOG_LIMIT`] bytes are kept (the oldest lines go first).
    pub fn set_pod_log(&self, ns: &str, pod: &str, container: &str, text: &str) {
        self.shared.pod_logs.set(ns, pod, container, text);
    }

    /// Appends `text`'s lines to one container's log, stamped now, and sends them to every
    /// `follow=true` reader of that log.
    pub fn append_pod_log(&self, ns: &str, pod: &str, container: &str, text: &str) {
        self.shared.pod_logs.append(ns, pod, container, text);
    }

    /// Sets what `pods/<pod>/exec` runs in namespace `ns` (every container): the handler gets
    /// the command (argv) and all of stdin, and returns `(stdout, stderr, exit_code)`; it
    /// runs once stdin has ended. Without one, the built-in commands answer (see
    /// `docs/kube-test-server.md`; anything else exits 127 with `<cmd>: command not found`).
    pub fn set_exec_handler(
        &self,
        ns: &str,
        pod: &str,
        handler: impl Fn(&[String], &[u8]) -> (Vec<u8>, Vec<u8>, i32) + Send + Sync + 'static,
    ) {
        self.shared
            .exec_handlers
            .set(ns, pod, std::sync::Arc::new(handler));
    }

    /// Every `pods/<pod>/exec` session so far, oldest first, as it stands now (a running
    /// session has `exit_code: None` and the resizes received so far).
    pub fn exec_sessions(&self) -> Vec<ExecSession> {
        self.shared.exec_sessions.snapshot()
    }

    /// Forgets the request log (e.g. after a test's setup).
    pub fn clear_requests(&self) {
        self.shared.requests.clear();
    }

    /// Ends every open watch stream now (clients see the stream close and must re-watch).
    pub fn drop_watches(&self) {
        self.shared.drop_watches();
    }

    /// Answers the next `n` API requests with a `Status` of HTTP code `status`
    /// (429 also carries `Retry-After: 1`).
    pub fn fail_next(&self, n: usize, status: u16) {
        self.shared
            .faults
            .fail_status
            .store(status, Ordering::SeqCst);
        self.shared.faults.fail_remaining.store(n, Ordering::SeqCst);
    }

    /// Delays every API request by `d` (zero turns it off).
    pub fn set_latency(&self, d: Duration) {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self.shared.faults.latency_ms.store(ms, Ordering::SeqCst);
    }

    /// Forgets the event history, so a watch from any earlier resourceVersion gets 410.
    pub fn compact_history(&self) {
        self.shared.store.compact();
    }

    /// Current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store.current_rv()
    }

    /// One stored object, or `None`; `ns` is `None` (or ignored) for cluster-scoped types.
    pub fn get_object(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        ns: Option<&str>,
        name: &str,
    ) -> Option<Value> {
        let store = &self.shared.store;
        let res = store.find(group, version, plural)?;
        let ns = if store.resources[res].namespaced {
            ns.unwrap_or("")
        } else {
            ""
        };
        store.get(res, ns, name).ok()
    }

    /// Stored objects of a type, in one namespace or (`ns == None`) all.
    pub fn list_objects(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        ns: Option<&str>,
    ) -> Vec<Value> {
        let store = &self.shared.store;
        match store.find(group, version, plural) {
            Some(res) => store.list(res, ns).0,
            None => Vec::new(),
        }
    }

    /// Stops the server: ends watches, closes the listener and waits for it to stop.
    pub async fn shutdown(mut self) {
        self.signal_stop();
        if let Some(task) = self.task.take() {
            // Bounded so a client holding a connection open cannot block a test.
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                tracing::warn!("kube test server did not stop within 5s");
            }
        }
    }

    fn signal_stop(&self) {
        self.shared.shutdown.send_replace(true);
        self.shared.drop_watches();
    }
}

impl Drop for KubeTestServer {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

/// A kubeconfig for `server_url` with one cluster and context named `context_name` and one
/// user `user` authenticated by bearer `token` (no CA: for plain HTTP or a system-trusted CA).
pub fn kubeconfig_yaml(server_url: &str, context_name: &str, user: &str, token: &str) -> String {
    render_kubeconfig(server_url, context_name, user, token, None, None)
}

fn render_kubeconfig(
    server_url: &str,
    context_name: &str,
    user: &str,
    token: &str,
    ca_pem: Option<&str>,
    client: Option<&(String, String)>,
) -> String {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    // A JSON string is a valid YAML double-quoted scalar, so any name is safe.
    let quote = |s: &str| Value::String(s.to_string()).to_string();
    let (context_name, user, token) = (quote(context_name), quote(user), quote(token));
    let ca = ca_pem
        .map(|p| format!("\n    certificate-authority-data: {}", b64(p)))
        .unwrap_or_default();
    let cert = client
        .map(|(c, k)| {
            format!(
                "\n    client-certificate-data: {}\n    client-key-data: {}",
                b64(c),
                b64(k)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {context_name}
  cluster:
    server: {server_url}{ca}
users:
- name: {user}
  user:
    token: {token}{cert}
contexts:
- name: {context_name}
  context:
    cluster: {context_name}
    user: {user}
    namespace: default
current-context: {context_name}
"
    )
}

#[cfg(test)]
mod scale {
    use super::*;

    /// `cargo test --release -p argocd-agent-kube-test-server --lib -- --ignored http_paging_cost --nocapture`
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement, run by hand"]
    async fn http_paging_cost() {
        let server = KubeTestServer::start_on(
            SocketAddr::from(([127, 0, 0, 1], 0)),
            ServerOptions {
                auto_create_namespaces: true,
                history_limit: 50_000,
                ..ServerOptions::default()
            },
        )
        .await
        .unwrap();
        store::scale::seed_apps(&server.shared.store, 100_000);
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml("t")).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        let client = kube::Client::try_from(config).unwrap();
        let ar = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        );
        let api: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(client, &ar);
        let t = std::time::Instant::now();
        let mut lp = kube::api::ListParams::default().limit(500);
        let mut n = 0;
        let mut pages = 0;
        loop {
            let page = api.list(&lp).await.unwrap();
            n += page.items.len();
            pages += 1;
            match page.metadata.continue_ {
                Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
                _ => break,
            }
        }
        eprintln!("listed {n} in {pages} pages, {:?}", t.elapsed());
    }
}
