//! A development SPIFFE Workload API server that behaves like a SPIRE agent for tests and
//! local demos: dev CAs kept in a directory, X.509-SVIDs streamed on every rotation, JWT-SVIDs,
//! X.509 and JWT bundles (own and federated), the `workload.spiffe.io` security header. Callers
//! are identified only by the socket they connect to and their uid (no workload attestation).
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use argocd_agent_testkit::workload_api::DevWorkloadApi;
//! use argocd_agent_identity::{SpiffeId, TrustDomain};
//! let td = TrustDomain::new("example.org")?;
//! let server = DevWorkloadApi::builder("/tmp/dev-spiffe", td)
//!     .socket("/tmp/dev-spiffe/agent.sock", SpiffeId::parse("spiffe://example.org/agent")?)
//!     .serve()
//!     .await?;
//! println!("SPIFFE_ENDPOINT_SOCKET={}", server.endpoint(&server.sockets()[0]));
//! server.shutdown().await;
//! # Ok(()) }
//! ```

mod ca;
mod registration;
mod service;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApiServer;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

pub use ca::{DevCa, IssuedSvid};
pub use registration::{Registration, RegistrationFile};

use argocd_agent_identity::id::{SpiffeId, TrustDomain};
use service::{Shared, WorkloadService};

/// Default X.509-SVID lifetime (SPIRE's default is one hour).
pub const DEFAULT_SVID_TTL: Duration = Duration::from_secs(3600);
/// Default JWT-SVID lifetime (SPIRE's default is five minutes).
pub const DEFAULT_JWT_TTL: Duration = Duration::from_secs(300);

/// Development server failures.
#[derive(Debug, thiserror::Error)]
pub enum DevServerError {
    /// A file or directory could not be read or written.
    #[error("{path}: {reason}")]
    Io {
        /// The path.
        path: String,
        /// Why.
        reason: String,
    },
    /// Key or certificate generation or loading failed.
    #[error("development CA: {0}")]
    Ca(String),
    /// The registration file is invalid.
    #[error("registrations in {origin}: {reason}")]
    Registration {
        /// File name or `command line`.
        origin: String,
        /// Why.
        reason: String,
    },
    /// The configuration cannot be served.
    #[error("development Workload API: {0}")]
    Config(String),
}

/// Builder for the development Workload API server.
#[derive(Clone, Debug)]
pub struct DevWorkloadApi {
    dir: PathBuf,
    trust_domain: TrustDomain,
    registrations: Vec<Registration>,
    federated: Vec<TrustDomain>,
    default_socket: Option<PathBuf>,
    svid_ttl: Duration,
    jwt_ttl: Duration,
    rotate_every: Option<Duration>,
}

impl DevWorkloadApi {
    /// A server whose CA for `trust_domain` lives in `dir/<trust-domain>/` (created if
    /// missing, reused if present).
    pub fn builder(dir: impl Into<PathBuf>, trust_domain: TrustDomain) -> Self {
        Self {
            dir: dir.into(),
            trust_domain,
            registrations: Vec::new(),
            federated: Vec::new(),
            default_socket: None,
            svid_ttl: DEFAULT_SVID_TTL,
            jwt_ttl: DEFAULT_JWT_TTL,
            rotate_every: None,
        }
    }

    /// Adds the entries, default socket and federated trust domains of a registration file.
    pub fn registrations(mut self, file: RegistrationFile) -> Self {
        self.registrations.extend(file.registrations);
        self.federated.extend(file.federates_with);
        if file.default_socket.is_some() {
            self.default_socket = file.default_socket;
        }
        self
    }

    /// Adds one registration entry.
    pub fn registration(mut self, registration: Registration) -> Self {
        self.registrations.push(registration);
        self
    }

    /// Serves `spiffe_id` to every caller of the socket at `path`.
    pub fn socket(mut self, path: impl Into<PathBuf>, spiffe_id: SpiffeId) -> Self {
        self.registrations.push(Registration {
            spiffe_id,
            socket: Some(path.into()),
            uid: None,
        });
        self
    }

    /// The socket for entries without one (default `<dir>/api.sock`).
    pub fn default_socket(mut self, path: impl Into<PathBuf>) -> Self {
        self.default_socket = Some(path.into());
        self
    }

    /// Also serves the bundle of a federated trust domain (its own dev CA in `dir`).
    pub fn federate_with(mut self, trust_domain: TrustDomain) -> Self {
        self.federated.push(trust_domain);
        self
    }

    /// Lifetime of issued X.509-SVIDs.
    pub fn svid_ttl(mut self, ttl: Duration) -> Self {
        self.svid_ttl = ttl;
        self
    }

    /// Lifetime of issued JWT-SVIDs.
    pub fn jwt_ttl(mut self, ttl: Duration) -> Self {
        self.jwt_ttl = ttl;
        self
    }

    /// Re-issue every SVID at this interval (`None`: only on [`DevWorkloadApiHandle::rotate_now`]).
    pub fn rotate_every(mut self, every: Option<Duration>) -> Self {
        self.rotate_every = every;
        self
    }

    /// Creates or loads the CAs, issues the SVIDs, binds every socket (removing stale socket
    /// files) and starts serving.
    pub async fn serve(self) -> Result<DevWorkloadApiHandle, DevServerError> {
        if self.registrations.is_empty() {
            return Err(DevServerError::Config("no registrations".into()));
        }
        if self.svid_ttl < Duration::from_secs(1) {
            return Err(DevServerError::Config(
                "SVID TTL must be at least 1s".into(),
            ));
        }
        let ca = Arc::new(DevCa::load_or_create(&self.dir, self.trust_domain.clone())?);
        let mut federated = Vec::new();
        for td in &self.federated {
            if *td == self.trust_domain {
                continue;
            }
            federated.push(Arc::new(DevCa::load_or_create(&self.dir, td.clone())?));
        }
        let default_socket = self
            .default_socket
            .clone()
            .unwrap_or_else(|| self.dir.join("api.sock"));
        let mut sockets: Vec<PathBuf> = Vec::new();
        for r in &self.registrations {
            let s = r.socket.clone().unwrap_or_else(|| default_socket.clone());
            if !sockets.contains(&s) {
                sockets.push(s);
            }
        }
        let issued = Shared::issue_all(&ca, &self.registrations, self.svid_ttl, 0)?;
        let (issued_tx, _) = watch::channel(Arc::new(issued));
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        // uid-only entries apply on every socket; entries with no selector at all (possible
        // only through the builder) belong to the default socket.
        let registrations = self
            .registrations
            .iter()
            .cloned()
            .map(|mut r| {
                if r.socket.is_none() && r.uid.is_none() {
                    r.socket = Some(default_socket.clone());
                }
                r
            })
            .collect();
        let shared = Arc::new(Shared {
            ca,
            federated,
            registrations,
            svid_ttl: self.svid_ttl,
            jwt_ttl: self.jwt_ttl,
            issued: issued_tx,
            shutdown: shutdown_rx.clone(),
        });
        let mut tasks = Vec::new();
        for socket in &sockets {
            let listener = bind(socket)?;
            let svc = SpiffeWorkloadApiServer::new(WorkloadService {
                shared: shared.clone(),
                socket: socket.clone(),
            });
            let mut stop = shutdown_rx.clone();
            let path = socket.clone();
            tasks.push(tokio::spawn(async move {
                let result = tonic::transport::Server::builder()
                    .add_service(svc)
                    .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                        let _ = stop.wait_for(|s| *s).await;
                    })
                    .await;
                if let Err(e) = result {
                    tracing::error!(socket = %path.display(), error = %e, "Workload API server failed");
                }
            }));
            tracing::info!(socket = %socket.display(), "development Workload API listening");
        }
        if let Some(every) = self.rotate_every {
            let shared = shared.clone();
            let mut stop = shutdown_rx.clone();
            tasks.push(tokio::spawn(async move {
                let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {
                            if let Err(e) = shared.rotate() {
                                tracing::error!(error = %e, "SVID rotation failed");
                            }
                        }
                        _ = stop.wait_for(|s| *s) => return,
                    }
                }
            }));
        }
        Ok(DevWorkloadApiHandle {
            shared,
            sockets,
            shutdown: shutdown_tx,
            tasks,
        })
    }
}

/// Binds a Unix socket, replacing a stale socket file left by a previous run.
fn bind(path: &Path) -> Result<UnixListener, DevServerError> {
    use std::os::unix::fs::FileTypeExt as _;
    let io = |e: std::io::Error| DevServerError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(path).map_err(io)?,
        Ok(_) => {
            return Err(DevServerError::Io {
                path: path.display().to_string(),
                reason: "exists and is not a socket; refusing to replace it".into(),
            });
        }
        Err(_) => {}
    }
    UnixListener::bind(path).map_err(io)
}

/// A running development Workload API server. Dropping it stops serving; prefer
/// [`DevWorkloadApiHandle::shutdown`], which also waits and removes the socket files.
pub struct DevWorkloadApiHandle {
    shared: Arc<Shared>,
    sockets: Vec<PathBuf>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for DevWorkloadApiHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevWorkloadApiHandle")
            .field("sockets", &self.sockets)
            .finish()
    }
}

impl DevWorkloadApiHandle {
    /// The socket paths being served.
    pub fn sockets(&self) -> &[PathBuf] {
        &self.sockets
    }

    /// The `SPIFFE_ENDPOINT_SOCKET` value for a socket path.
    pub fn endpoint(&self, socket: &Path) -> String {
        format!("unix://{}", socket.display())
    }

    /// The main trust domain's CA.
    pub fn ca(&self) -> &Arc<DevCa> {
        &self.shared.ca
    }

    /// The CA of a federated trust domain.
    pub fn federated_ca(&self, trust_domain: &TrustDomain) -> Option<&Arc<DevCa>> {
        self.shared
            .federated
            .iter()
            .find(|ca| ca.trust_domain() == trust_domain)
    }

    /// The currently issued X.509-SVID for `id`.
    pub fn current_svid(&self, id: &SpiffeId) -> Option<IssuedSvid> {
        self.shared.issued.borrow().svids.get(id).cloned()
    }

    /// Re-issues every SVID now and streams them to connected workloads; returns the new
    /// generation number.
    pub fn rotate_now(&self) -> Result<u64, DevServerError> {
        self.shared.rotate()
    }

    /// Stops serving (ending open streams), waits for the servers and removes the sockets.
    pub async fn shutdown(mut self) {
        self.shutdown.send_replace(true);
        for task in self.tasks.drain(..) {
            let abort = task.abort_handle();
            if tokio::time::timeout(Duration::from_secs(5), task)
                .await
                .is_err()
            {
                abort.abort();
            }
        }
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

impl Drop for DevWorkloadApiHandle {
    fn drop(&mut self) {
        self.shutdown.send_replace(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}
