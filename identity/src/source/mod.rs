//! Where the workload's SVID comes from: the SPIFFE Workload API (SPIRE agent or the
//! development server) or PEM files on disk (cert-manager, csi-driver-spiffe). Either way the
//! current [`SvidState`](crate::svid::SvidState) is published through a `watch` channel that
//! rustls configs read at every handshake, so rotation needs no restart.

mod error;
mod files;
mod handle;
mod workload;

use std::time::Duration;

pub use error::{SourceError, SvidNotReady};
pub use handle::SvidSource;
pub(crate) use workload::resolve_endpoint;
pub use workload::{SPIFFE_ENDPOINT_SOCKET, WorkloadApiOptions};

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
