//! Agent Leases: acquired for a session, renewed, released, and read from the watch; the
//! guard a session holds and the census of agents served elsewhere.

use argocd_agent_identity::text;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use argocd_agent_domain::{AgentName, Namespace};
use argocd_agent_kubernetes::{Change, CompactLease, Kind, Mutation, UpdateOutcome};
use kube::api::DynamicObject;
use tokio::time::Instant;
use tonic::Status;

use super::config::*;
use super::state::*;
use crate::error::chain;

/// The agent Lease a session took: the session ends by [`LeaseGuard::release`], which
/// releases (or hands over) the Lease and waits for the write. A guard dropped without it
/// (a session task that panicked) releases on the Leases' task tracker.
pub struct LeaseGuard {
    leases: Arc<Leases>,
    agent: AgentName,
    session: u64,
    released: bool,
}

impl LeaseGuard {
    /// Releases (or hands over) the Lease now and waits for the API server's answer.
    pub async fn release(mut self) {
        self.released = true;
        self.leases.release(&self.agent, self.session).await;
    }
}

impl crate::hooks::SessionPass for LeaseGuard {
    fn release(self: Box<Self>) -> crate::hooks::BoxFuture<'static, ()> {
        Box::pin(LeaseGuard::release(*self))
    }
}

/// Replicas admit a session only with the agent's Lease: one session per agent across
/// replicas, handed over when the agent connects elsewhere.
impl crate::hooks::SessionGate for Arc<Leases> {
    fn enter<'a>(
        &'a self,
        agent: &'a AgentName,
        namespace: &'a Namespace,
        session: u64,
    ) -> crate::hooks::BoxFuture<'a, Result<Box<dyn crate::hooks::SessionPass>, Status>> {
        Box::pin(async move {
            let guard = self.acquire(agent, namespace, session).await?;
            Ok(Box::new(guard) as Box<dyn crate::hooks::SessionPass>)
        })
    }

    fn must_yield(&self, agent: &AgentName, session: u64) -> bool {
        self.handover_pending(agent, session)
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let leases = self.leases.clone();
        let agent = self.agent.clone();
        let session = self.session;
        self.leases
            .tasks
            .spawn(async move { leases.release(&agent, session).await });
    }
}

impl Leases {
    /// The holder identity serving `agent`, when a live replica holds its Lease.
    pub fn holder_of(&self, agent: &AgentName) -> Option<String> {
        let lease = self
            .cache
            .lease(Some(&self.namespace), &agent_lease_name(agent))?;
        let view = LeaseView::of_lease(&lease);
        let holder = view.holder.clone()?;
        (self.alive(&holder) && !view.expired(jiff::Timestamp::now(), Duration::from_secs(5)))
            .then_some(holder)
    }

    /// The agent whose hub namespace is `namespace`, as its Lease says (any agent that ever
    /// had a session on any replica).
    pub fn agent_for_namespace(&self, namespace: &str) -> Option<AgentName> {
        lock(&self.by_namespace).get(namespace).cloned()
    }

    /// Takes `agent`'s Lease for session `session`, waiting for a live holder to hand it
    /// over (at most a replica Lease duration and a bit). The guard releases it.
    pub async fn acquire(
        self: &Arc<Self>,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
    ) -> Result<LeaseGuard, Status> {
        if self.fenced.load(Ordering::Acquire) || lock(&self.renewed).is_none() {
            self.metrics.deferred("Fenced");
            return Err(Status::unavailable(format!(
                "principal replica {} cannot renew its Lease on the hub: reconnect to another replica",
                self.cfg.replica
            )));
        }
        lock(&self.acquiring).insert(agent.clone());
        let result = self.acquire_loop(agent, namespace, session).await;
        // Held before no longer acquiring: the orphan sweep must never see neither.
        if let Ok(rv) = &result {
            lock(&self.held).insert(
                agent.clone(),
                Held {
                    session,
                    rv: *rv,
                    next_renew: Instant::now() + self.renew_after(),
                    handover_to: None,
                },
            );
        }
        lock(&self.acquiring).remove(agent);
        result?;
        Ok(LeaseGuard {
            leases: self.clone(),
            agent: agent.clone(),
            session,
            released: false,
        })
    }

    /// A slot for one round of agent Lease calls ([`Leases::calls`]).
    /// `None` only if the semaphore were closed, which nothing does.
    pub(super) async fn call_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.calls.acquire().await.ok()
    }

    /// When to renew an agent Lease next: a random point between a third and two thirds
    /// of its duration, so renewals spread evenly.
    pub(super) fn renew_after(&self) -> Duration {
        let d = self.cfg.agent_lease_duration;
        d / 3 + d.mul_f64(fastrand::f64() / 3.0)
    }

    pub(super) async fn acquire_loop(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
    ) -> Result<u64, Status> {
        let mut tries = Tries {
            name: agent_lease_name(agent),
            deadline: Instant::now()
                + self.cfg.replica_lease_duration
                + Duration::from_secs(2).max(self.cfg.replica_lease_duration / 2),
            asked: false,
            unseen: false,
        };
        // A session of this agent that just ended here is still releasing the Lease: let
        // it finish, so its write does not clear the holder we are about to write.
        while lock(&self.releasing).contains(agent) && Instant::now() < tries.deadline {
            let notified = self.changed.notified();
            let _ = tokio::time::timeout(Duration::from_millis(50), notified).await;
        }
        loop {
            // Register for changes before reading, so a handover written after the read
            // wakes us.
            let notified = self.changed.notified();
            // Held until this round's calls are answered, not while waiting for a holder.
            let slot = self.call_slot().await;
            // Boxed: a session waiting for its slot holds only this loop's few words, and
            // the round's futures (a read Lease, a write in flight) exist only while it runs.
            match Box::pin(self.acquire_round(agent, namespace, session, &mut tries)).await? {
                Round::Taken(rv) => return Ok(rv),
                Round::Again => continue,
                Round::Wait => {}
            }
            // Wait for the holder's answer (or its replica Lease to go stale).
            drop(slot);
            let wait = tries
                .deadline
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(500));
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }

    /// One look at the agent's Lease, and the write it calls for: create it, take it, or
    /// ask its live holder for it.
    async fn acquire_round(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
        tries: &mut Tries,
    ) -> Result<Round, Status> {
        let name = tries.name.as_str();
        let Some(current) = self.read_agent_lease(name, tries.unseen).await? else {
            return Ok(
                match self.create_agent_lease(agent, namespace, session).await? {
                    Some(rv) => Round::Taken(rv),
                    None => {
                        // Only a partitioned principal has Leases its cache cannot show.
                        tries.unseen = !self.sessions.partition.labels().is_empty();
                        Round::Again
                    }
                },
            );
        };
        let view = LeaseView::of(&current);
        let now = jiff::Timestamp::now();
        let holder = view.holder.clone();
        let free = match holder.as_deref() {
            None => true,
            Some(h) if h == self.me => true,
            Some(h) => !self.alive(h) || view.expired(now, Duration::ZERO),
        };
        if free {
            return Ok(
                match self
                    .take_agent_lease(agent, namespace, name, current, holder)
                    .await?
                {
                    Some(rv) => Round::Taken(rv),
                    None => Round::Again,
                },
            );
        }
        let holder = holder.unwrap_or_default();
        if Instant::now() >= tries.deadline {
            self.metrics.deferred("HeldElsewhere");
            return Err(Status::unavailable(format!(
                "agent {agent} is served by principal replica {}, which did not hand it over in time; retry",
                replica_of(&holder)
            )));
        }
        // A silent holder (likely killed) is not asked: the ask would be a Lease write it
        // cannot answer, taken from the budget the takeovers need once it is judged gone.
        // It is asked if it renews again.
        if (!tries.asked || view.takeover.as_deref() != Some(self.me.as_str()))
            && !self.silent(&holder)
        {
            if !self.ask_handover(agent, name, current, &holder).await? {
                return Ok(Round::Again);
            }
            tries.asked = true;
        }
        Ok(Round::Wait)
    }

    /// The agent Lease `name`. The watch cache decides when it is complete: a first
    /// connect costs one create, a reconnect one update (a stale cache costs a conflict and
    /// a read).
    /// `absent_unsure`: a create found the Lease present, so a cache without it is read
    /// again from the API server (a Lease outside this partition's selector, or a cache
    /// that is behind).
    pub(super) async fn read_agent_lease(
        &self,
        name: &str,
        absent_unsure: bool,
    ) -> Result<Option<DynamicObject>, Status> {
        let known = match self.cache.known(Some(&self.namespace), name) {
            argocd_agent_kubernetes::Known::Absent if absent_unsure => {
                argocd_agent_kubernetes::Known::Unknown
            }
            known => known,
        };
        Ok(match known {
            argocd_agent_kubernetes::Known::Present(c) => Some((*c).clone()),
            argocd_agent_kubernetes::Known::Absent => None,
            argocd_agent_kubernetes::Known::Unknown => self
                .api
                .get(Some(&self.namespace), name)
                .await
                .map_err(|e| self.lease_error("get", &e))?,
        })
    }

    /// Creates the agent's Lease held by us; `None`: another replica created it first
    /// (look again).
    pub(super) async fn create_agent_lease(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        session: u64,
    ) -> Result<Option<u64>, Status> {
        match self
            .api
            .create(&self.new_agent_lease(agent, namespace))
            .await
        {
            Ok(created) => {
                self.metrics.lease_write("agent", "create", "ok");
                tracing::debug!(%agent, session, "agent Lease created");
                Ok(Some(rv(&created).unwrap_or(0)))
            }
            Err(e) if e.is_already_exists() => {
                self.metrics.lease_write("agent", "create", "conflict");
                tokio::time::sleep(Duration::from_millis(20)).await;
                Ok(None)
            }
            Err(e) => Err(self.lease_error("create", &e)),
        }
    }

    pub(super) fn lease_error(&self, op: &str, e: &argocd_agent_kubernetes::Error) -> Status {
        self.metrics.lease_write("agent", op, "error");
        tracing::warn!(op, error = %chain(e), "agent Lease write failed");
        Status::unavailable(format!(
            "principal replica {} could not {op} the agent's Lease on the hub: {}",
            self.cfg.replica,
            chain(e)
        ))
    }

    pub(super) fn new_agent_lease(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
    ) -> DynamicObject {
        let mut obj = DynamicObject::new(&agent_lease_name(agent), &Kind::Lease.api_resource())
            .within(&self.namespace);
        obj.metadata.labels = Some(
            [
                (LEASE_LABEL.to_string(), "agent".to_string()),
                (AGENT_LABEL.to_string(), agent.to_string()),
            ]
            .into(),
        );
        set_annotation(&mut obj, HUB_NAMESPACE_ANNOTATION, Some(namespace.as_str()));
        self.sessions.partition.stamp(&mut obj);
        set_spec(&mut obj, |s| {
            s.holder_identity = Some(self.me.clone());
            s.acquire_time = Some(now_micro());
            s.renew_time = Some(now_micro());
            s.lease_duration_seconds = Some(secs(self.cfg.agent_lease_duration));
            s.lease_transitions = Some(0);
        });
        obj
    }

    /// The session that took `agent`'s Lease ended: release it, or write the replica that
    /// asked for it as holder.
    pub(super) async fn release(&self, agent: &AgentName, session: u64) {
        let handover_to = {
            let mut held = lock(&self.held);
            match held.get(agent) {
                Some(h) if h.session == session => held.remove(agent).and_then(|h| h.handover_to),
                _ => return, // a newer session of this agent (here) holds it now
            }
        };
        lock(&self.releasing).insert(agent.clone());
        self.write_release(agent, handover_to).await;
        lock(&self.releasing).remove(agent);
        self.changed.notify_waiters();
    }

    pub(super) async fn write_release(&self, agent: &AgentName, handover_to: Option<String>) {
        if self.retired_cleanly().await {
            // Shutting down with the replica Lease cleared: the other replicas take this
            // agent's Lease over as from a replica that is gone. Releasing it too would
            // double the hub writes of a rolling update, at this replica's Lease budget,
            // while its agents are moving.
            tracing::debug!(%agent, "agent Lease left to the other replicas (retired)");
            return;
        }
        let _slot = self.call_slot().await;
        let name = agent_lease_name(agent);
        let me = self.me.clone();
        let first = self
            .cache
            .get(Some(&self.namespace), &name)
            .map(|o| (*o).clone());
        let to = handover_to.clone();
        let result = self
            .api
            .update_from(Some(&self.namespace), &name, first, &mut |obj| {
                let v = LeaseView::of(obj);
                if v.holder.as_deref() != Some(me.as_str()) {
                    return Mutation::Abort;
                }
                // A requester may have asked after the session ended: hand over to it.
                let to = to.clone().or(v.takeover.clone());
                set_spec(obj, |s| {
                    s.holder_identity = to.clone();
                    s.renew_time = Some(now_micro());
                    if to.is_some() {
                        s.acquire_time = Some(now_micro());
                        s.lease_transitions = Some(v.transitions + 1);
                    }
                });
                set_annotation(obj, TAKEOVER_ANNOTATION, None);
                Mutation::Changed
            })
            .await;
        let op = if handover_to.is_some() {
            "handover"
        } else {
            "release"
        };
        match result {
            Ok(UpdateOutcome::Updated(obj)) => {
                self.metrics.lease_write("agent", op, "ok");
                let to = LeaseView::of(&obj).holder;
                tracing::debug!(%agent, to = %text::or_dash(to), "agent Lease {op}d");
            }
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                self.metrics.lease_write("agent", op, "error");
                tracing::warn!(%agent, error = %chain(&e), "could not {op} the agent Lease (it expires by itself)");
            }
        }
    }

    /// Shutting down and the replica Lease cleared: waits (at most 2 s) for that write's
    /// answer once the shutdown has begun.
    async fn retired_cleanly(&self) -> bool {
        if !self.shutdown.is_cancelled() {
            return false;
        }
        let mut retired = self.retired.subscribe();
        let answered =
            tokio::time::timeout(Duration::from_secs(2), retired.wait_for(Option::is_some)).await;
        matches!(answered, Ok(Ok(v)) if *v == Some(true))
    }

    /// A Lease changed on the hub.
    pub(super) fn on_change(&self, change: Change) {
        match &change {
            Change::Applied(obj) => self.on_applied(&CompactLease::read(obj)),
            Change::Deleted(obj) => {
                if let Some(name) = obj.metadata.name.as_ref() {
                    lock(&self.observed).remove(name);
                }
            }
            Change::Synced => {}
        }
        self.changed.notify_waiters();
    }

    /// A Lease was created or changed.
    fn on_applied(&self, lease: &CompactLease) {
        match lease_label(lease) {
            Some("replica") => {
                let name = lease.name().unwrap_or_default().to_owned();
                let version = lease.resource_version().and_then(|v| v.parse().ok());
                tracing::debug!(lease = %name, holder = %text::or_dash(holder_str(lease)), resource_version = %text::or_dash(lease.resource_version()), "replica Lease seen");
                let mut observed = lock(&self.observed);
                let entry = observed.entry(name).or_insert((version, Instant::now()));
                if entry.0 != version {
                    *entry = (version, Instant::now());
                }
            }
            Some("agent") => {
                if let (Some(ns), Some(agent)) =
                    (lease.annotation(HUB_NAMESPACE_ANNOTATION), agent_of(lease))
                {
                    lock(&self.by_namespace).insert(ns.to_owned(), agent);
                }
                self.on_agent_lease(lease)
            }
            _ => {}
        }
    }

    /// An agent Lease changed: hand our agent over when asked, or close our session when
    /// another replica took the Lease (it judged us gone).
    pub(super) fn on_agent_lease(&self, lease: &CompactLease) {
        let Some(agent) = agent_of(lease) else {
            return;
        };
        let view = LeaseView::of_lease(lease);
        let mut held = lock(&self.held);
        let Some(h) = held.get_mut(&agent) else {
            drop(held);
            if let Some(holder) = view.holder.as_deref()
                && holder != self.me
            {
                self.served_elsewhere(&agent, holder);
            }
            return;
        };
        if view.resource_version.is_some_and(|v| v <= h.rv) {
            return; // our own write, or older
        }
        match (view.holder.as_deref(), view.takeover.as_deref()) {
            (Some(holder), Some(requester))
                if holder == self.me && requester != self.me && h.handover_to.is_none() =>
            {
                h.handover_to = Some(requester.to_string());
                drop(held);
                self.metrics.deferred("HandedOver");
                tracing::info!(%agent, to = %requester,
                    "another replica asked for this agent (it reconnected there): closing our session and handing the agent over");
                let reason = format!(
                    "the agent opened a session on principal replica {}",
                    replica_of(requester)
                );
                // Without a session left here (it is ending), the guard hands over.
                self.sessions.close_session(&agent, Some(reason));
            }
            (Some(holder), Some(_)) if holder == self.me => {} // handover under way
            (holder, _) if holder != Some(self.me.as_str()) => {
                let holder = holder.unwrap_or("nobody").to_string();
                held.remove(&agent);
                drop(held);
                self.metrics.deferred("LeaseLost");
                tracing::warn!(%agent, holder = %holder,
                    "this replica lost the agent's Lease: closing its session here");
                self.sessions.close_session(
                    &agent,
                    Some(format!(
                        "principal replica {} no longer holds the agent's Lease",
                        self.cfg.replica
                    )),
                );
            }
            _ => {}
        }
    }

    pub(super) async fn renew_agents(&self) {
        let now = Instant::now();
        let due: Vec<(AgentName, u64)> = lock(&self.held)
            .iter()
            .filter(|(_, h)| h.next_renew <= now && h.handover_to.is_none())
            .take(RENEWS_PER_TICK)
            .map(|(a, h)| (a.clone(), h.session))
            .collect();
        for (agent, session) in due {
            let name = agent_lease_name(&agent);
            let me = self.me.clone();
            let first = self
                .cache
                .get(Some(&self.namespace), &name)
                .map(|o| (*o).clone());
            let result = self
                .api
                .update_from(Some(&self.namespace), &name, first, &mut |obj| {
                    if LeaseView::of(obj).holder.as_deref() != Some(me.as_str()) {
                        return Mutation::Abort;
                    }
                    set_spec(obj, |s| s.renew_time = Some(now_micro()));
                    Mutation::Changed
                })
                .await;
            let mut held = lock(&self.held);
            let ours = held.get_mut(&agent).filter(|h| h.session == session);
            match (result, ours) {
                (Ok(UpdateOutcome::Updated(obj)), Some(h)) => {
                    self.metrics.lease_write("agent", "renew", "ok");
                    h.rv = rv(&obj).unwrap_or(h.rv);
                    h.next_renew = Instant::now() + self.renew_after();
                }
                (Ok(UpdateOutcome::Aborted(_)) | Err(_), Some(_))
                    if !self.lease_still_ours(&agent) =>
                {
                    held.remove(&agent);
                    drop(held);
                    self.metrics.deferred("LeaseLost");
                    tracing::warn!(%agent, "agent Lease held by another replica at renewal: closing the session here");
                    self.sessions.close_session(
                        &agent,
                        Some(format!(
                            "principal replica {} no longer holds the agent's Lease",
                            self.cfg.replica
                        )),
                    );
                }
                (Err(e), Some(h)) => {
                    self.metrics.lease_write("agent", "renew", "error");
                    tracing::warn!(%agent, error = %chain(&e), "could not renew the agent Lease; retrying");
                    h.next_renew = Instant::now() + Duration::from_secs(5);
                }
                _ => {}
            }
        }
    }

    pub(super) fn lease_still_ours(&self, agent: &AgentName) -> bool {
        self.cache
            .lease(Some(&self.namespace), &agent_lease_name(agent))
            .is_some_and(|l| holder_str(&l) == Some(self.me.as_str()))
    }

    /// Leases naming us that no session here uses (a requester gave up before we handed
    /// over): release them so the agent is free.
    pub(super) async fn release_orphans(&self) {
        let orphans: Vec<AgentName> = {
            let held = lock(&self.held);
            let acquiring = lock(&self.acquiring);
            let releasing = lock(&self.releasing);
            self.cache
                .leases(&self.namespace)
                .iter()
                .filter(|l| lease_label(l) == Some("agent"))
                .filter(|l| holder_str(l) == Some(self.me.as_str()))
                .filter_map(|l| agent_of(l))
                .filter(|a| {
                    !held.contains_key(a) && !acquiring.contains(a) && !releasing.contains(a)
                })
                .collect()
        };
        for agent in orphans {
            tracing::info!(%agent, "releasing an agent Lease no session here uses");
            self.write_release(&agent, None).await;
        }
    }
}

impl Leases {
    /// Another live replica (`holder`) serves `agent`: what was queued for it here is
    /// dropped, unless a session is still open here (see
    /// [`crate::sessions::AgentState::served_elsewhere`]).
    pub(super) fn served_elsewhere(&self, agent: &AgentName, holder: &str) {
        if lock(&self.acquiring).contains(agent) || !self.alive(holder) {
            return;
        }
        let Some(state) = self.sessions.agent(agent) else {
            return;
        };
        if let Some(dropped) = state.served_elsewhere().filter(|n| *n > 0) {
            self.metrics.queue_released.inc_by(dropped as u64);
            tracing::debug!(%agent, holder = %holder, dropped,
                "another replica serves the agent: dropped what was queued for it here");
        }
    }

    /// Every agent another live replica holds: see [`Leases::served_elsewhere`]. Run with
    /// the orphan sweep, for the Lease changes seen while a session here was still ending.
    pub(super) fn release_queues_served_elsewhere(&self) {
        let elsewhere: Vec<(AgentName, String)> = self
            .cache
            .leases(&self.namespace)
            .iter()
            .filter(|l| lease_label(l) == Some("agent"))
            .filter_map(|l| {
                let holder = holder_str(l).filter(|h| *h != self.me)?;
                Some((agent_of(l)?, holder.to_owned()))
            })
            .collect();
        for (agent, holder) in elsewhere {
            if !lock(&self.held).contains_key(&agent) {
                self.served_elsewhere(&agent, &holder);
            }
        }
    }
}

/// The agents whose live session another replica serves, with their hub namespace (the
/// tenants' `agents` quotas count them), from the agent Leases in the cache.
impl crate::tenant_limits::Census for Leases {
    fn elsewhere(&self) -> Vec<(AgentName, String)> {
        let now = jiff::Timestamp::now();
        self.cache
            .leases(&self.namespace)
            .iter()
            .filter(|l| lease_label(l) == Some("agent"))
            .filter_map(|l| {
                let view = LeaseView::of_lease(l);
                let holder = view.holder.as_deref()?;
                if holder == self.me
                    || !self.alive(holder)
                    || view.expired(now, Duration::from_secs(5))
                {
                    return None;
                }
                let ns = l.annotation(HUB_NAMESPACE_ANNOTATION)?.to_owned();
                Some((agent_of(l)?, ns))
            })
            .collect()
    }
}

/// What a session acquiring its agent's Lease carries from one round to the next.
pub(super) struct Tries {
    /// The agent Lease's name.
    name: String,
    /// When a holder that does not hand the agent over is given up on.
    deadline: Instant,
    /// This session asked the current holder for the agent.
    asked: bool,
    /// A create found the Lease present though the watch cache has none: a Lease of
    /// another partition (an agent moving here); read it from the API.
    unseen: bool,
}

/// How a round of [`Leases::acquire_round`] ended.
pub(super) enum Round {
    /// The Lease is ours, written at this resourceVersion.
    Taken(u64),
    /// It changed meanwhile: look again at once.
    Again,
    /// Held by a live replica (asked, or silent): wait for a change.
    Wait,
}
