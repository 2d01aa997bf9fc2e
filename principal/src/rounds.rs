//! Resync rounds: what the principal does with an agent's view of what it holds, at connect
//! (from the hello) and, with periodic resync, whenever the agent asks while connected
//! (a `resync` event, at most one per `--resync-min-interval`).
//!
//! A round compares the agent's checksums with the hub and puts right what differs: for a
//! managed agent the hub is the source (changed or missing objects are queued to it, its
//! copies the hub lacks deleted); for an autonomous agent the agent is (what differs is
//! asked for again, hub copies it no longer holds deleted). The session sends what a round
//! returns; nothing here writes to the stream.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use argocd_agent_domain::resync::{self, Checksums, SourceUids};
use argocd_agent_domain::{AgentMode, Event, ResourceKind};
use argocd_agent_proto::eventstream::ResyncState;

use crate::hub::Hub;
use crate::sessions::AgentState;

/// Refusal reason (`argocd_principal_events_refused_total`, and the error event's reason)
/// of a periodic resync request within `--resync-min-interval` of the agent's last round.
pub const RESYNC_TOO_SOON: &str = "ResyncTooSoon";

/// Whether a requested round may run now: `Err(wait)` when the agent's last round (at
/// connect or asked for) is less than `min_interval` ago, less a tenth for the jitter of
/// an agent that asks at exactly the minimum (its timer and the stream's delays move each
/// request by a few milliseconds either way). A round at connect always runs (a
/// reconnecting agent must be brought up to date), so only requests are checked; every
/// round that runs is recorded.
pub fn admit_request(
    state: &AgentState,
    min_interval: Duration,
    now: Instant,
) -> Result<(), Duration> {
    let on_time = min_interval - min_interval / 10;
    state.inner().admit_resync(now, on_time)
}

/// Records a round at connect (it counts towards the minimum interval of the next request).
pub fn record_connect(state: &AgentState, now: Instant) {
    state.inner().note_resync(now);
}

/// What the agent holds, by kind: checksums and source UIDs.
fn agent_view(
    view: &ResyncState,
) -> (
    BTreeMap<ResourceKind, Checksums>,
    BTreeMap<ResourceKind, SourceUids>,
) {
    let checksums = ResourceKind::ALL
        .into_iter()
        .map(|k| (k, resync::from_state(k.as_str(), view)))
        .collect();
    let uids = ResourceKind::ALL
        .into_iter()
        .map(|k| (k, resync::source_uids_from_state(k.as_str(), view)))
        .collect();
    (checksums, uids)
}

/// When a round runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Round {
    /// At connect, from the hello: what was in flight to the previous session is sent again.
    Connect,
    /// Asked for by the connected agent: events in flight on this session stay as they are.
    Requested,
}

/// One resync round against `view`, what the agent holds (`None`: an agent of the
/// previous protocol version sent none, which means "unknown", never "holds nothing").
/// Returns the requests to send the agent (autonomous); a managed agent's events go to
/// its queue.
pub async fn run(
    hub: &Hub,
    state: &AgentState,
    mode: AgentMode,
    view: Option<&ResyncState>,
    round: Round,
) -> Vec<Event> {
    let empty = ResyncState::default();
    let known = view.is_some();
    let view = view.unwrap_or(&empty);
    let (checksums, uids) = agent_view(view);
    let of = |k: ResourceKind| checksums.get(&k).cloned().unwrap_or_default();
    hub.apps.cache.wait_synced().await;
    hub.config.wait_synced().await;
    if round == Round::Connect {
        state.queue.requeue_in_flight();
    }
    match mode {
        AgentMode::Managed => {
            let app_uids = uids
                .get(&ResourceKind::Application)
                .cloned()
                .unwrap_or_default();
            // Statuses: a managed agent reports the checksum of the status it last sent in
            // periodic requests only (its hello leaves it out: it reports every status after
            // the welcome anyway).
            let statuses =
                resync::status_checksums_from_state(ResourceKind::Application.as_str(), view);
            let requests = hub.apps.resync_managed(
                state,
                &of(ResourceKind::Application),
                &app_uids,
                &statuses,
            );
            // The hub copies of its spoke-authored children its view no longer lists.
            let children = resync::from_state(resync::CHILD_APPLICATION_KIND, view);
            hub.apps
                .resync_children(state, known.then_some(&children))
                .await;
            hub.config.resync_config(state, &checksums, &uids);
            requests
        }
        AgentMode::Autonomous => {
            let statuses =
                resync::status_checksums_from_state(ResourceKind::Application.as_str(), view);
            let projects = of(ResourceKind::AppProject);
            let apps = of(ResourceKind::Application);
            let mut requests = hub
                .config
                .resync_autonomous_projects(state, known.then_some(&projects))
                .await;
            requests.extend(
                hub.apps
                    .resync_autonomous(state, known.then_some(&apps), &statuses)
                    .await,
            );
            requests
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_domain::{ClientIdentity, RuleSet};
    use argocd_agent_identity::SpiffeId;
    use tokio_util::sync::CancellationToken;

    fn agent() -> std::sync::Arc<AgentState> {
        let identity = RuleSet::from_flags(&[
            "template:spiffe://{trust_domain}/sa/{sa}=>{sa},mode=managed".to_string(),
        ])
        .unwrap()
        .map_client(&ClientIdentity::Spiffe(
            SpiffeId::parse("spiffe://example.org/sa/edge-1").unwrap(),
        ))
        .unwrap();
        let sessions = crate::sessions::Sessions::new(Default::default(), Default::default());
        sessions
            .attach(identity, AgentMode::Managed, 1, CancellationToken::new())
            .0
    }

    #[test]
    fn a_request_within_the_minimum_of_the_last_round_is_refused_with_the_wait() {
        let state = agent();
        let t0 = Instant::now();
        let min = Duration::from_secs(60);
        record_connect(&state, t0);
        // On time from 54 s (a tenth of the minimum is jitter).
        assert_eq!(
            admit_request(&state, min, t0 + Duration::from_secs(20)),
            Err(Duration::from_secs(34))
        );
        // A refused request does not move the window.
        assert_eq!(
            admit_request(&state, min, t0 + Duration::from_secs(53)),
            Err(Duration::from_secs(1))
        );
        // An agent asking every 60 s whose request comes a little early is on time.
        let early = t0 + min - Duration::from_millis(30);
        assert_eq!(admit_request(&state, min, early), Ok(()));
        // The admitted one moves the window.
        assert!(admit_request(&state, min, early + Duration::from_secs(1)).is_err());
        assert_eq!(admit_request(&state, min, early + min), Ok(()));
    }

    #[test]
    fn without_a_minimum_every_request_runs() {
        let state = agent();
        let t0 = Instant::now();
        record_connect(&state, t0);
        for _ in 0..3 {
            assert_eq!(admit_request(&state, Duration::ZERO, t0), Ok(()));
        }
    }

    #[test]
    fn the_first_request_of_an_agent_never_connected_here_runs() {
        let state = agent();
        assert_eq!(
            admit_request(&state, Duration::from_secs(3600), Instant::now()),
            Ok(())
        );
    }
}
