//! The replica Lease: renewed, fenced when it cannot be, and read for liveness and the
//! addresses other replicas publish on theirs.

use argocd_agent_identity::text;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use argocd_agent_domain::AgentName;
use argocd_agent_kubernetes::{CompactLease, Kind, Mutation, UpdateOutcome};
use kube::api::DynamicObject;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::config::*;
use super::state::*;
use crate::error::chain;

impl Leases {
    /// This replica's holder identity.
    pub fn holder(&self) -> &str {
        &self.me
    }

    /// Published on the replica Lease so other replicas can forward resource proxy calls.
    pub fn set_resource_proxy_url(&self, url: &str) {
        *lock(&self.resource_proxy_url) = Some(url.to_string());
    }

    /// Published on the replica Lease so other replicas can forward Redis proxy commands.
    pub fn set_redis_proxy_address(&self, addr: &str) {
        *lock(&self.redis_proxy_address) = Some(addr.to_string());
    }

    /// The Redis proxy address a live replica published, by holder identity.
    pub fn redis_proxy_address_of(&self, holder: &str) -> Option<String> {
        self.published_by(holder, REDIS_PROXY_ANNOTATION)
    }

    /// An annotation of `holder`'s replica Lease, while `holder` is its current holder.
    pub(super) fn published_by(&self, holder: &str, annotation: &str) -> Option<String> {
        let lease = self.cache.lease(
            Some(&self.namespace),
            &replica_lease_name(replica_of(holder)),
        )?;
        if holder_str(&lease) != Some(holder) {
            return None;
        }
        lease.annotation(annotation).map(str::to_owned)
    }

    /// Readiness: the replica Lease was renewed recently.
    pub fn ready(&self) -> Result<(), NotReady> {
        let limit = self.cfg.replica_lease_duration / 2;
        match *lock(&self.renewed) {
            Some(at) if at.elapsed() <= limit => Ok(()),
            Some(at) => Err(NotReady::Stale {
                elapsed: at.elapsed(),
                limit,
            }),
            None => Err(NotReady::NotWritten),
        }
    }

    /// The resource proxy URL a live replica published, by holder identity.
    pub fn resource_proxy_url_of(&self, holder: &str) -> Option<String> {
        self.published_by(holder, RESOURCE_PROXY_ANNOTATION)
    }

    /// Whether the replica with holder identity `holder` renewed its Lease within its
    /// duration, as observed here. Ourselves: whether we are not fenced.
    pub fn alive(&self, holder: &str) -> bool {
        if holder == self.me {
            return !self.fenced.load(Ordering::Acquire);
        }
        let name = replica_lease_name(replica_of(holder));
        let Some(lease) = self.cache.lease(Some(&self.namespace), &name) else {
            return false;
        };
        let view = LeaseView::of_lease(&lease);
        if view.holder.as_deref() != Some(holder) {
            return false; // restarted (a new incarnation) or released
        }
        let duration = view.duration.unwrap_or(self.cfg.replica_lease_duration);
        let observed = lock(&self.observed)
            .get(&name)
            .map(|(_, at)| *at)
            .unwrap_or_else(Instant::now);
        observed.elapsed() < duration
    }

    /// Whether `holder`'s replica Lease has gone without a renewal seen here for longer
    /// than one and a half of its renewal periods (a fifth of its duration each): a replica
    /// that renews on time is never silent, one killed is within seconds, long before it
    /// is judged gone at the end of its duration.
    pub(super) fn silent(&self, holder: &str) -> bool {
        if holder == self.me {
            return false;
        }
        let name = replica_lease_name(replica_of(holder));
        let duration = self
            .cache
            .lease(Some(&self.namespace), &name)
            .and_then(|l| LeaseView::of_lease(&l).duration)
            .unwrap_or(self.cfg.replica_lease_duration);
        lock(&self.observed)
            .get(&name)
            .is_some_and(|(_, at)| at.elapsed() > duration.mul_f64(0.3))
    }

    /// Live replicas' holder identities (ourselves included unless fenced).
    pub(super) fn live_replicas(&self, leases: &[Arc<CompactLease>]) -> Vec<String> {
        leases
            .iter()
            .filter(|l| lease_label(l) == Some("replica"))
            .filter_map(|l| holder_str(l))
            .filter(|h| self.alive(h))
            .map(str::to_owned)
            .collect()
    }

    /// Renews the replica Lease every fifth of its duration, on its own task and its own
    /// client: nothing the agents' Leases wait for delays it (a renewal older than half the
    /// duration makes the replica not ready, and its listener refuse every dial).
    pub(super) async fn replica_loop(self: Arc<Self>, shutdown: CancellationToken) {
        self.cache.wait_synced().await;
        let mut tick = tokio::time::interval(self.cfg.replica_lease_duration / 5);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    self.retire().await;
                    return;
                }
                _ = tick.tick() => {}
            }
            self.renew_replica().await;
        }
    }

    /// Renews agent Leases when due, releases Leases held in our name that no session
    /// uses, and drops the queues of agents other replicas serve.
    pub(super) async fn agents_loop(self: Arc<Self>, shutdown: CancellationToken) {
        self.cache.wait_synced().await;
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_sweep = Instant::now();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            self.renew_agents().await;
            if last_sweep.elapsed() >= ORPHAN_SWEEP {
                last_sweep = Instant::now();
                self.release_orphans().await;
                self.release_queues_served_elsewhere();
            }
        }
    }

    pub(super) async fn renew_replica(&self) {
        let name = replica_lease_name(&self.cfg.replica);
        let me = self.me.clone();
        let url = lock(&self.resource_proxy_url).clone();
        let redis = lock(&self.redis_proxy_address).clone();
        let duration = secs(self.cfg.replica_lease_duration);
        let cached = self
            .cache
            .get(Some(&self.namespace), &name)
            .map(|o| (*o).clone());
        let result = if cached.is_none()
            && matches!(
                self.replica_api.get(Some(&self.namespace), &name).await,
                Ok(None)
            ) {
            let mut obj =
                DynamicObject::new(&name, &Kind::Lease.api_resource()).within(&self.namespace);
            obj.metadata.labels = Some([(LEASE_LABEL.to_string(), "replica".to_string())].into());
            self.sessions.partition.stamp(&mut obj);
            if let Some(url) = &url {
                set_annotation(&mut obj, RESOURCE_PROXY_ANNOTATION, Some(url));
            }
            if let Some(redis) = &redis {
                set_annotation(&mut obj, REDIS_PROXY_ANNOTATION, Some(redis));
            }
            set_spec(&mut obj, |s| {
                s.holder_identity = Some(me.clone());
                s.acquire_time = Some(now_micro());
                s.renew_time = Some(now_micro());
                s.lease_duration_seconds = Some(duration);
                s.lease_transitions = Some(0);
            });
            self.replica_api.create(&obj).await.map(|_| ())
        } else {
            self.replica_api
                .update_from(Some(&self.namespace), &name, cached, &mut |obj| {
                    let v = LeaseView::of(obj);
                    set_spec(obj, |s| {
                        if v.holder.as_deref() != Some(me.as_str()) {
                            s.acquire_time = Some(now_micro());
                            s.lease_transitions = Some(v.transitions + 1);
                        }
                        s.holder_identity = Some(me.clone());
                        s.renew_time = Some(now_micro());
                        s.lease_duration_seconds = Some(duration);
                    });
                    set_annotation(obj, RESOURCE_PROXY_ANNOTATION, url.as_deref());
                    set_annotation(obj, REDIS_PROXY_ANNOTATION, redis.as_deref());
                    self.sessions.partition.stamp(obj);
                    Mutation::Changed
                })
                .await
                .map(|_| ())
        };
        match result {
            Ok(()) => {
                self.metrics.lease_write("replica", "renew", "ok");
                if lock(&self.renewed).replace(Instant::now()).is_none() {
                    tracing::info!(replica = %self.me, "replica Lease written");
                }
                if self.fenced.swap(false, Ordering::AcqRel) {
                    tracing::info!("replica Lease renewed again: accepting agents");
                }
            }
            Err(e) => {
                self.metrics.lease_write("replica", "renew", "error");
                let since = lock(&self.renewed).map(|t| t.elapsed());
                tracing::warn!(error = %chain(&e), since_last = %text::or_dash(since.map(text::duration)), "could not renew the replica Lease");
                if since.is_some_and(|s| s >= self.cfg.replica_lease_duration)
                    && !self.fenced.swap(true, Ordering::AcqRel)
                {
                    self.fence();
                }
            }
        }
    }

    /// Our replica Lease is stale: other replicas take our agents over, so close every
    /// session here (they reconnect elsewhere) and refuse new ones until renewed.
    pub(super) fn fence(&self) {
        let agents: Vec<AgentName> = lock(&self.held).drain().map(|(a, _)| a).collect();
        tracing::error!(
            sessions = agents.len(),
            "replica Lease stale for a whole duration: closing every session so other replicas serve the agents"
        );
        for agent in agents {
            self.metrics.deferred("Fenced");
            self.sessions.close_session(
                &agent,
                Some(format!(
                    "principal replica {} cannot renew its Lease on the hub",
                    self.cfg.replica
                )),
            );
        }
    }

    /// Shutting down: release the replica Lease so others do not wait for it to expire
    /// (agent Leases are released by the sessions' guards as they end).
    pub(super) async fn retire(&self) {
        let name = replica_lease_name(&self.cfg.replica);
        let me = self.me.clone();
        let first = self
            .cache
            .get(Some(&self.namespace), &name)
            .map(|o| (*o).clone());
        let cleared = self
            .replica_api
            .update_from(Some(&self.namespace), &name, first, &mut |obj| {
                if LeaseView::of(obj).holder.as_deref() != Some(me.as_str()) {
                    return Mutation::Abort;
                }
                set_spec(obj, |s| s.holder_identity = None);
                Mutation::Changed
            })
            .await;
        self.retired
            .send_replace(Some(matches!(cleared, Ok(UpdateOutcome::Updated(_)))));
    }
}

/// Why this replica is not ready.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// The replica Lease was last renewed too long ago.
    #[error(
        "replica Lease not renewed for {:.1}s (limit {})",
        .elapsed.as_secs_f64(),
        text::duration(*.limit)
    )]
    Stale {
        /// Since the last renewal.
        elapsed: Duration,
        /// The most allowed.
        limit: Duration,
    },
    /// The replica Lease was never written.
    #[error("replica Lease not written yet")]
    NotWritten,
}
