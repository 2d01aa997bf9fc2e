//! [`SvidSource`] over the SPIFFE Workload API, using the `spiffe` crate's streaming client.
//! The reconnect loop is ours (not `X509Source`) so that the last good SVID stays published
//! while the agent is away, and so the first-SVID wait has a bounded, reported timeout.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use spiffe::{WorkloadApiClient, X509Context};
use tokio::sync::watch;

use super::error::SourceError;
use super::handle::SvidSource;
use crate::id::TrustDomain;
use crate::svid::{SvidError, SvidState, TrustBundles, X509Svid};

/// Environment variable naming the Workload API socket (`unix:///path`).
pub const SPIFFE_ENDPOINT_SOCKET: &str = "SPIFFE_ENDPOINT_SOCKET";

/// How to follow the Workload API.
#[derive(Clone, Debug)]
pub struct WorkloadApiOptions {
    /// `unix:///path`, `unix:/path`, a bare `/path`, or `tcp://host:port`;
    /// `None` reads `SPIFFE_ENDPOINT_SOCKET`.
    pub endpoint: Option<String>,
    /// How long to wait for the first SVID.
    pub initial_timeout: Duration,
    /// First retry delay after a failure.
    pub min_backoff: Duration,
    /// Longest retry delay.
    pub max_backoff: Duration,
}

impl Default for WorkloadApiOptions {
    fn default() -> Self {
        Self {
            endpoint: None,
            initial_timeout: Duration::from_secs(15),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
        }
    }
}

/// Resolves the endpoint: explicit, else `SPIFFE_ENDPOINT_SOCKET`; a bare path means `unix:`.
pub(crate) fn resolve_endpoint(endpoint: Option<String>) -> Result<String, SourceError> {
    let raw = match endpoint {
        Some(e) if !e.trim().is_empty() => e,
        _ => std::env::var(SPIFFE_ENDPOINT_SOCKET)
            .ok()
            .filter(|e| !e.trim().is_empty())
            .ok_or(SourceError::NoEndpoint)?,
    };
    Ok(if raw.starts_with('/') {
        format!("unix:{raw}")
    } else {
        raw
    })
}

pub(super) async fn start(options: WorkloadApiOptions) -> Result<SvidSource, SourceError> {
    let endpoint = resolve_endpoint(options.endpoint.clone())?;
    let (tx, rx) = watch::channel(None);
    let last_error = Arc::new(Mutex::new(None::<String>));
    let task = tokio::spawn(follow(
        endpoint.clone(),
        options.clone(),
        tx,
        last_error.clone(),
    ));
    let source = SvidSource::from_parts(rx, format!("Workload API {endpoint}"), task);
    match source.wait_ready(options.initial_timeout).await {
        Ok(_) => Ok(source),
        Err(SourceError::Timeout { from, timeout, .. }) => Err(SourceError::Timeout {
            from,
            timeout,
            last_error: last_error.lock().ok().and_then(|e| e.clone()),
        }),
        Err(e) => Err(e),
    }
}

/// When `endpoint` is a Unix socket path that does not exist: what to tell the operator
/// (the usual first mistake, which the gRPC client reports only as a transport error).
pub(crate) fn missing_socket(endpoint: &str) -> Option<String> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))?;
    (!std::path::Path::new(path).exists()).then(|| {
        format!(
            "the Workload API socket {path} does not exist: is the SPIRE agent running, and its socket mounted here? (set with --spiffe-endpoint-socket or SPIFFE_ENDPOINT_SOCKET)"
        )
    })
}

/// Connects, streams X.509 contexts, publishes each one; reconnects with jittered backoff.
async fn follow(
    endpoint: String,
    options: WorkloadApiOptions,
    tx: watch::Sender<Option<Arc<SvidState>>>,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let record = |e: String| {
        if let Ok(mut slot) = last_error.lock() {
            *slot = Some(e);
        }
    };
    let mut backoff = options.min_backoff;
    loop {
        match WorkloadApiClient::connect_to(&endpoint).await {
            Ok(client) => match client.stream_x509_contexts().await {
                Ok(mut stream) => {
                    while let Some(item) = stream.next().await {
                        match item.map_err(|e| e.to_string()).and_then(|ctx| {
                            state_from_context(&ctx).map_err(|e| format!("invalid update: {e}"))
                        }) {
                            Ok(state) => {
                                tracing::info!(
                                    endpoint = %endpoint,
                                    spiffe_id = state.svid.spiffe_id().as_str(),
                                    not_after = %crate::text::rfc3339(state.svid.not_after()),
                                    trust_domains = state.bundles.len(),
                                    "X.509-SVID update from the Workload API"
                                );
                                tx.send_replace(Some(Arc::new(state)));
                                backoff = options.min_backoff;
                            }
                            Err(e) => {
                                tracing::warn!(endpoint = %endpoint, error = %e, "Workload API stream error; keeping the last SVID");
                                record(e);
                                break;
                            }
                        }
                    }
                }
                Err(e) => {
                    let e = crate::text::error_chain(&e);
                    tracing::warn!(endpoint = %endpoint, error = %e, "FetchX509SVID failed");
                    record(e);
                }
            },
            Err(e) => {
                let e = missing_socket(&endpoint).unwrap_or_else(|| crate::text::error_chain(&e));
                tracing::warn!(endpoint = %endpoint, error = %e, "cannot connect to the Workload API");
                record(e);
            }
        }
        if tx.is_closed() {
            return;
        }
        if let Some(state) = tx.borrow().as_ref()
            && state.svid.is_expired_at(SystemTime::now())
        {
            tracing::error!(
                spiffe_id = state.svid.spiffe_id().as_str(),
                "the last X.509-SVID has expired and the Workload API is unreachable"
            );
        }
        let jitter = fastrand::u64(0..=backoff.as_millis() as u64 / 4 + 1);
        tokio::time::sleep(backoff + Duration::from_millis(jitter)).await;
        backoff = (backoff * 2).min(options.max_backoff);
    }
}

/// Converts the `spiffe` crate's context (default SVID + all bundles incl. federated).
pub(crate) fn state_from_context(ctx: &X509Context) -> Result<SvidState, SvidError> {
    let svid = ctx.default_svid().ok_or(SvidError::EmptyChain)?;
    let chain: Vec<CertificateDer<'static>> = svid
        .cert_chain()
        .iter()
        .map(|c| CertificateDer::from(c.as_bytes().to_vec()))
        .collect();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        svid.private_key().as_bytes().to_vec(),
    ));
    let svid = X509Svid::new(chain, key)?;
    let mut bundles = TrustBundles::new();
    for (td, bundle) in ctx.bundle_set().iter() {
        let our_td = TrustDomain::new(td.as_str()).map_err(|e| SvidError::Certificate {
            what: format!("bundle trust domain {td}"),
            reason: e.to_string(),
        })?;
        let certs: Vec<_> = bundle
            .authorities()
            .iter()
            .map(|c| CertificateDer::from(c.as_bytes().to_vec()))
            .collect();
        if certs.is_empty() {
            // The Workload API allows an empty federated bundle; nothing can chain to it.
            continue;
        }
        bundles.insert(our_td, certs)?;
    }
    Ok(SvidState {
        svid: Arc::new(svid),
        bundles: Arc::new(bundles),
    })
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
        start(options).await
    }
}
