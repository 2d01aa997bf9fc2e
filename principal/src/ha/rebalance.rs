//! Rebalancing: a replica above its fair share sheds its newest sessions.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use argocd_agent_domain::AgentName;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::shares::*;
use super::state::*;

impl Leases {
    /// Agents per live replica, from the agent Leases; computed at most once a second
    /// (a reconnect storm asks once per session), with our own count always current.
    pub fn shares(&self) -> Shares {
        let fresh = lock(&self.shares_cache)
            .as_ref()
            .filter(|(at, _)| at.elapsed() < Duration::from_secs(1))
            .map(|(_, s)| s.clone());
        let mut shares: Shares = match fresh {
            Some(s) => s,
            None => {
                let leases = self.cache.leases(&self.namespace);
                let live = self.live_replicas(&leases);
                let holders = leases
                    .iter()
                    .filter(|l| lease_label(l) == Some("agent"))
                    .filter_map(|l| holder_str(l).map(str::to_owned));
                let s = Shares::compute(&live, holders);
                *lock(&self.shares_cache) = Some((Instant::now(), s.clone()));
                s
            }
        };
        // Every replica counted from the same view (the Leases in the cache), ours too: a
        // fresh count of our own against stale counts of the others would make every
        // replica look above its share while agents are arriving.
        shares.held.entry(self.me.clone()).or_insert(0);
        let total: usize = shares.held.values().sum();
        shares.fair = total.div_ceil(shares.held.len().max(1));
        shares
    }

    /// Compares our share with the others' and sheds a few sessions when above it.
    pub(super) async fn rebalance_loop(self: Arc<Self>, shutdown: CancellationToken) {
        self.cache.wait_synced().await;
        // Shed only when above the share two rounds in a row: arrivals and the watch's lag
        // make single readings noisy. And only once the fleet is steady: during a reconnect
        // storm every move costs a Lease release and a takeover more, in the budget the
        // storm itself is waiting on.
        let mut above_before = false;
        let mut total_before: Option<usize> = None;
        loop {
            let jitter = self
                .cfg
                .rebalance_interval
                .mul_f64(0.75 + fastrand::f64() * 0.5);
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(jitter) => {}
            }
            if self.ready().is_err() {
                continue;
            }
            let shares = self.shares();
            let total = shares.held.values().sum();
            let steady = steady(total_before, total);
            total_before = Some(total);
            let excess = shares.shed(&self.me, self.cfg.rebalance_slack, self.cfg.rebalance_batch);
            let above = excess > 0;
            if !steady {
                above_before = false;
                continue;
            }
            if !(above && above_before) {
                above_before = above;
                continue;
            }
            above_before = false;
            let victims = newest_sessions(&lock(&self.held), excess);
            tracing::info!(
                held = shares.held.get(&self.me).copied().unwrap_or(0),
                fair = shares.fair,
                shedding = victims.len(),
                "above fair share while another replica has room: closing sessions so they reconnect elsewhere"
            );
            for agent in victims {
                self.metrics.deferred("Rebalance");
                self.sessions.close_session(
                    &agent,
                    Some(format!(
                        "principal replica {} is rebalancing agents across replicas; reconnect",
                        self.cfg.replica
                    )),
                );
            }
        }
    }
}

/// Whether the fleet is steady enough to rebalance: the agents held across live replicas
/// changed by at most 1 % (and at most 10 agents, whichever is more) since the last round.
/// While a storm brings agents back, the total climbs round after round.
pub(super) fn steady(before: Option<usize>, now: usize) -> bool {
    before.is_some_and(|b| now.abs_diff(b) <= (b / 100).max(10))
}

/// The agents of the `n` newest sessions not being handed over: whom rebalancing sheds. An
/// arrival is what put the replica above its share, and long-lived sessions stay
/// undisturbed (so the same agent is not shed round after round).
pub(super) fn newest_sessions(held: &HashMap<AgentName, Held>, n: usize) -> Vec<AgentName> {
    let mut candidates: Vec<(u64, &AgentName)> = held
        .iter()
        .filter(|(_, h)| h.handover_to.is_none())
        .map(|(a, h)| (h.session, a))
        .collect();
    candidates.sort_unstable_by_key(|c| std::cmp::Reverse(c.0));
    candidates
        .into_iter()
        .take(n)
        .map(|(_, a)| a.clone())
        .collect()
}
