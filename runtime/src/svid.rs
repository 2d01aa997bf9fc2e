//! The SVID series both binaries export: the current SVID's expiry and the rotations seen.

use argocd_agent_identity::source::SvidSource;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

/// Keeps `expiry` at the current SVID's `notAfter` (Unix seconds) and counts each update of
/// `source` in `rotations`, for as long as the source runs.
pub fn follow_svid(source: &SvidSource, expiry: &Gauge, rotations: &Counter) {
    let (expiry, rotations) = (expiry.clone(), rotations.clone());
    source.on_update(move |state| {
        let t = state
            .svid
            .not_after()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        expiry.set(t);
        rotations.inc();
    });
}
