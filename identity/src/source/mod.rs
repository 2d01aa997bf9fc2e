//! Where the workload's SVID comes from: the SPIFFE Workload API (SPIRE agent or the
//! development server) or PEM files on disk (cert-manager, csi-driver-spiffe). Either way the
//! current [`SvidState`] is published through a `watch` channel that rustls configs read at
//! every handshake, so rotation needs no restart.

mod files;
mod workload;

use crate::text;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::svid::{SvidError, SvidState};

pub use workload::WorkloadApiOptions;
pub(crate) use workload::resolve_endpoint;

/// Environment variable naming the Workload API socket (`unix:///path`).
pub const SPIFFE_ENDPOINT_SOCKET: &str = "SPIFFE_ENDPOINT_SOCKET";

/// Where a workload's own SVID comes from (principal and agent configuration).
#[derive(Debug, Clone)]
pub enum SvidConfig {
    /// SPIFFE Workload API (endpoint, or `SPIFFE_ENDPOINT_SOCKET`).
    WorkloadApi {
        /// `unix:///path`, `unix:/path`, a bare `/path`, or `tcp://host:port`; `None`
        /// reads `SPIFFE_ENDPOINT_SOCKET`.
        endpoint: Option<String>,
    },
    /// PEM files (cert-manager, csi-driver-spiffe), reloaded when they change (checked every
    /// 5 s).
    Files {
        /// Certificate chain, leaf first.
        cert: std::path::PathBuf,
        /// Private key of the leaf (PKCS#8, SEC1 or PKCS#1).
        key: std::path::PathBuf,
        /// CA bundles; `None` is the SVID's own trust domain, `Some` a federated one.
        bundles: Vec<(Option<crate::TrustDomain>, std::path::PathBuf)>,
    },
}

/// How the startup line names the source: `Workload API unix:///run/spire/agent.sock`,
/// `PEM files /etc/svid/tls.crt, /etc/svid/tls.key`.
impl std::fmt::Display for SvidConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SvidConfig::WorkloadApi {
                endpoint: Some(endpoint),
            } => write!(f, "Workload API {endpoint}"),
            SvidConfig::WorkloadApi { endpoint: None } => {
                f.write_str("Workload API at SPIFFE_ENDPOINT_SOCKET")
            }
            SvidConfig::Files { cert, key, .. } => {
                write!(f, "PEM files {}, {}", cert.display(), key.display())
            }
        }
    }
}

impl SvidConfig {
    /// Builds the source and waits up to `timeout` for its first SVID.
    pub async fn load(&self, timeout: Duration) -> Result<SvidSource, SourceError> {
        let source = match self {
            SvidConfig::WorkloadApi { endpoint } => {
                SvidSource::workload_api(endpoint.clone()).await?
            }
            SvidConfig::Files { cert, key, bundles } => SvidSource::pem_files(
                cert.clone(),
                key.clone(),
                bundles.clone(),
                Duration::from_secs(5),
            )?,
        };
        source.wait_ready(timeout).await?;
        Ok(source)
    }
}

/// Why a source could not be built or produced no SVID.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Neither an endpoint nor `SPIFFE_ENDPOINT_SOCKET` was given.
    #[error("no Workload API endpoint: pass one or set SPIFFE_ENDPOINT_SOCKET")]
    NoEndpoint,
    /// No SVID arrived in time.
    #[error("no X.509-SVID from {from} within {timeout}{}", last_error.as_ref().map(|e| format!(" (last error: {e})")).unwrap_or_default(), timeout = text::duration(*.timeout))]
    Timeout {
        /// Where it was expected from.
        from: String,
        /// How long we waited.
        timeout: Duration,
        /// The most recent failure, if any.
        last_error: Option<String>,
    },
    /// The source's background task has stopped.
    #[error("SVID source stopped")]
    Closed,
    /// A file could not be read.
    #[error("cannot read {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The material is not a usable SVID or bundle.
    #[error("{from}: {source}")]
    Invalid {
        /// Where the material came from.
        from: String,
        /// What is wrong with it.
        #[source]
        source: SvidError,
    },
    /// Sources run a background task and must be created inside a tokio runtime.
    #[error("SVID sources must be created inside a tokio runtime")]
    NoRuntime,
}

/// Aborts the background task when the last clone of the source is dropped.
struct TaskGuard(JoinHandle<()>);

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A live view of the workload's SVID and trust bundles. Cheap to clone; the background task
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct SvidSource {
    rx: watch::Receiver<Option<Arc<SvidState>>>,
    description: Arc<str>,
    _task: Option<Arc<TaskGuard>>,
}

impl std::fmt::Debug for SvidSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SvidSource")
            .field("from", &self.description)
            .field("ready", &self.rx.borrow().is_some())
            .finish()
    }
}

impl SvidSource {
    /// Follows the Workload API at `endpoint` (or `SPIFFE_ENDPOINT_SOCKET`): every rotation and
    /// bundle update is published; a broken connection is retried with backoff while the last
    /// good SVID keeps being served. Waits up to 15 s for the first SVID.
    pub async fn workload_api(endpoint: Option<String>) -> Result<SvidSource, SourceError> {
        Self::workload_api_with(WorkloadApiOptions {
            endpoint,
            ..WorkloadApiOptions::default()
        })
        .await
    }

    /// [`SvidSource::workload_api`] with explicit timeouts and backoff.
    pub async fn workload_api_with(options: WorkloadApiOptions) -> Result<SvidSource, SourceError> {
        workload::start(options).await
    }

    /// Reads an SVID from PEM files (chain with the leaf first, PKCS#8/SEC1/PKCS#1 key) and
    /// CA bundles; a bundle tagged `None` belongs to the SVID's own trust domain, others to the
    /// named (federated) trust domain. The files are re-read every `poll`; a change is
    /// published, and broken new files are logged while the last good state is kept.
    pub fn pem_files(
        cert_chain: std::path::PathBuf,
        key: std::path::PathBuf,
        bundles: Vec<(Option<crate::id::TrustDomain>, std::path::PathBuf)>,
        poll: Duration,
    ) -> Result<SvidSource, SourceError> {
        files::start(cert_chain, key, bundles, poll)
    }

    /// A source that never changes (tests, or material obtained elsewhere).
    pub fn fixed(state: SvidState) -> SvidSource {
        let (tx, rx) = watch::channel(Some(Arc::new(state)));
        // Keep the sender alive for as long as the source exists so `wait_ready` never sees a
        // closed channel.
        let task = tokio::runtime::Handle::try_current().ok().map(|h| {
            Arc::new(TaskGuard(h.spawn(async move {
                tx.closed().await;
            })))
        });
        SvidSource {
            rx,
            description: Arc::from("fixed SVID"),
            _task: task,
        }
    }

    /// A source fed by someone else's channel.
    pub fn from_receiver(rx: watch::Receiver<Option<Arc<SvidState>>>) -> SvidSource {
        SvidSource {
            rx,
            description: Arc::from("external channel"),
            _task: None,
        }
    }

    pub(crate) fn from_parts(
        rx: watch::Receiver<Option<Arc<SvidState>>>,
        description: String,
        task: JoinHandle<()>,
    ) -> SvidSource {
        SvidSource {
            rx,
            description: Arc::from(description),
            _task: Some(Arc::new(TaskGuard(task))),
        }
    }

    /// The latest state, if any SVID has been received yet.
    pub fn current(&self) -> Option<Arc<SvidState>> {
        self.rx.borrow().clone()
    }

    /// A receiver that sees every new state.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<SvidState>>> {
        self.rx.clone()
    }

    /// Calls `f` with the current state (if any) and with every new one, from a task that
    /// ends with the source. Used by metrics (expiry, rotations).
    pub fn on_update(&self, f: impl Fn(&SvidState) + Send + 'static) {
        let mut rx = self.rx.clone();
        tokio::spawn(async move {
            loop {
                if let Some(state) = rx.borrow_and_update().clone() {
                    f(&state);
                }
                if rx.changed().await.is_err() {
                    return;
                }
            }
        });
    }

    /// Why this source cannot serve a handshake now (no SVID yet, or the current one has
    /// expired), for readiness probes; `Ok` when it can.
    pub fn readiness(&self) -> Result<(), String> {
        match self.current() {
            None => Err(format!("no X.509-SVID yet from {}", self.description)),
            Some(s) if s.svid.is_expired_at(std::time::SystemTime::now()) => Err(format!(
                "X.509-SVID {} expired (rotation from {} stopped)",
                s.svid.spiffe_id(),
                self.description
            )),
            Some(_) => Ok(()),
        }
    }

    /// Where this source reads from, for logs.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Waits until an SVID is available.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<Arc<SvidState>, SourceError> {
        let mut rx = self.rx.clone();
        let wait = async {
            match rx.wait_for(|s| s.is_some()).await {
                Ok(state) => state.clone().ok_or(SourceError::Closed),
                Err(_) => Err(SourceError::Closed),
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::Timeout {
                from: self.description.to_string(),
                timeout,
                last_error: None,
            }),
        }
    }
}

/// A human-readable report of what a source currently holds: SPIFFE ID, expiry, chain
/// subjects and bundle trust domains (for `argocd-agentctl identity inspect`).
pub async fn inspect(source: &SvidSource) -> String {
    match source.current() {
        Some(state) => format!(
            "Source:     {}\n{}",
            source.description(),
            crate::svid::describe(&state)
        ),
        None => format!(
            "Source:     {}\nno SVID received yet\n",
            source.description()
        ),
    }
}
