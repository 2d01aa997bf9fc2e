//! The resource proxy's serving certificate. argocd-server and kubectl verify it like a
//! Kubernetes API server's (client-go: the CA data of the cluster secret, and the URL's
//! host among the certificate's names), and do not speak SPIFFE. So the proxy serves either
//! the principal's SVID, when SPIRE gave it a DNS SAN naming the URL's host (clients then
//! trust the trust domain's bundle), or a certificate the principal issues from its own CA
//! for the configured host names, renewed at two thirds of its life.

use argocd_agent_identity::text;
use argocd_agent_identity::text::quoted;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use argocd_agent_identity::source::SvidSource;
use argocd_agent_identity::svid::SvidState;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::credentials::{KeyError, ProxyKeys, pem};

/// Which certificate the proxy serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServingMode {
    /// The SVID when it names the URL's host as a DNS SAN, else an issued certificate.
    Auto,
    /// Always the principal's SVID (start-up fails unless it names the host).
    Svid,
    /// Always a certificate from the principal's resource proxy CA.
    Issued,
}

/// A `--resource-proxy-tls` value that is none of the modes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: expected auto, svid or issued", quoted(.0))]
pub struct UnknownServingMode(pub String);

impl std::str::FromStr for ServingMode {
    type Err = UnknownServingMode;
    fn from_str(s: &str) -> Result<Self, UnknownServingMode> {
        match s {
            "auto" => Ok(ServingMode::Auto),
            "svid" => Ok(ServingMode::Svid),
            "issued" => Ok(ServingMode::Issued),
            other => Err(UnknownServingMode(other.to_owned())),
        }
    }
}

/// The certificate handed out at each handshake, replaced as it is renewed.
#[derive(Debug)]
pub struct ServingCert {
    current: RwLock<Arc<CertifiedKey>>,
}

impl ServingCert {
    fn new(ck: Arc<CertifiedKey>) -> Arc<Self> {
        Arc::new(ServingCert {
            current: RwLock::new(ck),
        })
    }

    fn set(&self, ck: Arc<CertifiedKey>) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = ck;
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        )
    }
}

/// The DNS SANs of an SVID's leaf.
fn dns_names(state: &SvidState) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(state.svid.leaf().as_ref()) else {
        return Vec::new();
    };
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            x509_parser::extensions::GeneralName::DNSName(d) => Some(d.to_string()),
            _ => None,
        })
        .collect()
}

/// The PEM bundle of the SVID's own trust domain.
fn bundle_pem(state: &SvidState) -> String {
    let td = state.svid.spiffe_id().trust_domain();
    state
        .bundles
        .get(td)
        .unwrap_or_default()
        .iter()
        .map(pem)
        .collect()
}

/// What serves TLS, and the CA data clients must trust (follows rotation).
pub struct Serving {
    /// The certificate served at each handshake (renewed or rotated in place).
    pub cert: Arc<ServingCert>,
    /// PEM of the CA clients must trust: the trust domain's bundle (`svid`) or the
    /// principal's resource proxy CA (`issued`); cluster secrets' CA data follows it.
    pub ca_pem: watch::Receiver<String>,
    /// `svid` or `issued`.
    pub mode: &'static str,
}

/// Chooses and starts the serving certificate for `host` (the URL's host) and, with
/// replicas, `replica_host` (the host other replicas forward to: `auto` serves the SVID only
/// when it names both).
#[allow(clippy::too_many_arguments)]
pub fn start(
    mode: ServingMode,
    host: &str,
    replica_host: Option<&str>,
    hostnames: &[String],
    lifetime: Duration,
    keys: Arc<ProxyKeys>,
    svid: Option<&SvidSource>,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<Serving, KeyError> {
    let svid_state = svid.and_then(|s| s.current());
    let svid_names = svid_state.as_deref().map(dns_names).unwrap_or_default();
    let use_svid = serves_svid(mode, host, replica_host, &svid_names)?;
    if let (true, Some(source), Some(state)) = (use_svid, svid, svid_state) {
        tracing::info!(host, "resource proxy serves the principal's SVID (DNS SAN)");
        return Ok(serve_rotating_svid(source, &state, tasks, shutdown));
    }
    let serving = issue_own(keys, hostnames, lifetime, tasks, shutdown)?;
    tracing::info!(hostnames = %text::quoted_list(hostnames), "resource proxy serves a certificate from its own CA");
    Ok(serving)
}

/// Whether the proxy serves the principal's SVID, whose DNS SANs are `svid_names`.
fn serves_svid(
    mode: ServingMode,
    host: &str,
    replica_host: Option<&str>,
    svid_names: &[String],
) -> Result<bool, KeyError> {
    Ok(match mode {
        ServingMode::Issued => false,
        ServingMode::Auto => {
            svid_names.iter().any(|n| n == host)
                && replica_host.is_none_or(|r| svid_names.iter().any(|n| n == r))
        }
        ServingMode::Svid => {
            if !svid_names.iter().any(|n| n == host) {
                return Err(KeyError::Invalid(format!(
                    "--resource-proxy-tls svid: the principal's SVID has no DNS SAN {host} (it has {svid_names})",
                    host = quoted(&host),
                    svid_names = argocd_agent_identity::text::quoted_list(svid_names)
                )));
            }
            if let Some(r) = replica_host
                && !svid_names.iter().any(|n| n == r)
            {
                tracing::warn!(replica_host = r, svid_names = %text::quoted_list(svid_names),
                    "the principal's SVID does not name this replica's resource proxy host: other replicas cannot forward to it");
            }
            true
        }
    })
}

/// Serves the SVID, following its rotations.
fn serve_rotating_svid(
    source: &SvidSource,
    state: &SvidState,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Serving {
    let cert = ServingCert::new(state.svid.certified_key());
    let (ca_tx, ca_rx) = watch::channel(bundle_pem(state));
    let mut updates = source.subscribe();
    let c = cert.clone();
    tasks.spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = updates.changed() => if changed.is_err() { return },
            }
            let Some(state) = updates.borrow_and_update().clone() else {
                continue;
            };
            c.set(state.svid.certified_key());
            ca_tx.send_if_modified(|ca| {
                let new = bundle_pem(&state);
                let changed = *ca != new;
                *ca = new;
                changed
            });
        }
    });
    Serving {
        cert,
        ca_pem: ca_rx,
        mode: "svid",
    }
}

/// Serves a certificate from the proxy's own CA, renewed at two thirds of its lifetime.
fn issue_own(
    keys: Arc<ProxyKeys>,
    hostnames: &[String],
    lifetime: Duration,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Result<Serving, KeyError> {
    let cert = ServingCert::new(keys.issue_serving(hostnames, lifetime)?);
    let (_ca_tx, ca_rx) = watch::channel(keys.ca_pem().to_owned());
    let c = cert.clone();
    let hosts = hostnames.to_vec();
    tasks.spawn(async move {
        // The CA is stable; only the leaf is renewed.
        let _keep = _ca_tx;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(lifetime * 2 / 3) => {}
            }
            match keys.issue_serving(&hosts, lifetime) {
                Ok(ck) => {
                    c.set(ck);
                    tracing::info!("resource proxy serving certificate renewed");
                }
                Err(e) => {
                    tracing::error!(error = %e, "resource proxy serving certificate not renewed")
                }
            }
        }
    });
    Ok(Serving {
        cert,
        ca_pem: ca_rx,
        mode: "issued",
    })
}

/// TLS configuration of the proxy listener: no client certificate (argocd-server presents
/// a bearer token), ALPN h2 and http/1.1 (exec's WebSocket upgrade is HTTP/1.1). TLS
/// versions and suites are the process's (TLS 1.3 only unless configured).
pub fn server_config(cert: Arc<ServingCert>) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config = argocd_agent_identity::tls::TlsProfile::process()
        .server_builder()?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}
