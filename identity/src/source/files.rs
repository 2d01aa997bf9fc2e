//! [`SvidSource`] from PEM files that another component rotates in place (cert-manager,
//! csi-driver-spiffe, spiffe-helper). Files are polled because atomic symlink swaps in
//! Kubernetes volumes are not reliably reported by inotify-style watchers.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::sync::watch;

use super::error::SourceError;
use super::handle::SvidSource;
use crate::id::TrustDomain;
use crate::svid::{SvidState, TrustBundles, X509Svid};

struct Paths {
    cert_chain: PathBuf,
    key: PathBuf,
    bundles: Vec<(Option<TrustDomain>, PathBuf)>,
}

pub(super) fn start(
    cert_chain: PathBuf,
    key: PathBuf,
    bundles: Vec<(Option<TrustDomain>, PathBuf)>,
    poll: Duration,
) -> Result<SvidSource, SourceError> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| SourceError::NoRuntime)?;
    let paths = Arc::new(Paths {
        cert_chain,
        key,
        bundles,
    });
    let (bytes, state) = load(&paths)?;
    let description = format!("PEM files {}", paths.cert_chain.display());
    let (tx, rx) = watch::channel(Some(Arc::new(state)));
    let poll = poll.max(Duration::from_millis(10));
    let task = handle.spawn(async move {
        let mut last = bytes;
        let mut interval = tokio::time::interval(poll);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            if tx.is_closed() {
                return;
            }
            // On tokio's blocking pool: a slow volume must not stall a runtime worker.
            let reader = paths.clone();
            let read = tokio::task::spawn_blocking(move || read_all(&reader))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string()));
            let current = match read {
                Ok(b) => b,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot re-read SVID files; keeping the last good SVID");
                    continue;
                }
            };
            if current == last {
                continue;
            }
            match parse(&paths, &current) {
                Ok(state) => {
                    tracing::info!(
                        spiffe_id = state.svid.spiffe_id().as_str(),
                        not_after = %crate::text::rfc3339(state.svid.not_after()),
                        "reloaded X.509-SVID from files"
                    );
                    tx.send_replace(Some(Arc::new(state)));
                }
                Err(e) => {
                    // Half-written files during a rotation are common; the next poll retries.
                    tracing::warn!(error = %e, "new SVID files are not usable; keeping the last good SVID");
                }
            }
            last = current;
        }
    });
    Ok(SvidSource::from_parts(rx, description, task))
}

type FileBytes = Vec<Vec<u8>>;

fn read_all(paths: &Paths) -> Result<FileBytes, SourceError> {
    let read = |p: &PathBuf| {
        std::fs::read(p).map_err(|e| SourceError::File {
            path: p.display().to_string(),
            reason: e.to_string(),
        })
    };
    let mut out = vec![read(&paths.cert_chain)?, read(&paths.key)?];
    for (_, p) in &paths.bundles {
        out.push(read(p)?);
    }
    Ok(out)
}

fn load(paths: &Paths) -> Result<(FileBytes, SvidState), SourceError> {
    let bytes = read_all(paths)?;
    let state = parse(paths, &bytes)?;
    Ok((bytes, state))
}

fn certs(path: &std::path::Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, SourceError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| SourceError::File {
            path: path.display().to_string(),
            reason: format!("not PEM certificates: {e}"),
        })?;
    if certs.is_empty() {
        return Err(SourceError::File {
            path: path.display().to_string(),
            reason: "no CERTIFICATE block".into(),
        });
    }
    Ok(certs)
}

fn parse(paths: &Paths, bytes: &FileBytes) -> Result<SvidState, SourceError> {
    let chain = certs(&paths.cert_chain, &bytes[0])?;
    let key = PrivateKeyDer::from_pem_slice(&bytes[1]).map_err(|e| SourceError::File {
        path: paths.key.display().to_string(),
        reason: format!("no usable PEM private key: {e}"),
    })?;
    let from = paths.cert_chain.display().to_string();
    let svid = X509Svid::new(chain, key).map_err(|cause| SourceError::Invalid {
        from: from.clone(),
        cause,
    })?;
    let mut bundles = TrustBundles::new();
    for (i, (td, path)) in paths.bundles.iter().enumerate() {
        let td = td
            .clone()
            .unwrap_or_else(|| svid.spiffe_id().trust_domain().clone());
        let mut certs = certs(path, &bytes[i + 2])?;
        // Several files may add to the same trust domain (e.g. during a CA rollover).
        if let Some(existing) = bundles.get(&td) {
            certs.extend(existing.iter().cloned());
        }
        bundles
            .insert(td, certs)
            .map_err(|cause| SourceError::Invalid {
                from: path.display().to_string(),
                cause,
            })?;
    }
    Ok(SvidState {
        svid: Arc::new(svid),
        bundles: Arc::new(bundles),
    })
}

impl SvidSource {
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
        start(cert_chain, key, bundles, poll)
    }
}
