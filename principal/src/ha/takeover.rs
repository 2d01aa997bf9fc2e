//! Takeover: asking the holder of an agent Lease to hand it over, and taking a Lease whose
//! holder is gone.

use argocd_agent_domain::{AgentName, Namespace};
use argocd_agent_kubernetes::{Mutation, UpdateOutcome};
use kube::api::DynamicObject;
use tonic::Status;

use super::config::*;
use super::state::*;

impl Leases {
    /// Whether another replica asked for `agent` while `session` was starting here.
    pub fn handover_pending(&self, agent: &AgentName, session: u64) -> bool {
        lock(&self.held)
            .get(agent)
            .is_some_and(|h| h.session == session && h.handover_to.is_some())
    }

    /// Writes us as holder of a free agent Lease (`current`, held by `previous`); `None`:
    /// someone else moved first (decide again).
    pub(super) async fn take_agent_lease(
        &self,
        agent: &AgentName,
        namespace: &Namespace,
        name: &str,
        current: DynamicObject,
        previous: Option<String>,
    ) -> Result<Option<u64>, Status> {
        let me = self.me.clone();
        let expected = previous.clone();
        let written = self
            .api
            .update_from(Some(&self.namespace), name, Some(current), &mut |obj| {
                let v = LeaseView::of(obj);
                if v.holder != expected {
                    return Mutation::Abort; // someone else moved first: decide again
                }
                let changing = v.holder.as_deref() != Some(me.as_str());
                set_spec(obj, |s| {
                    if changing {
                        s.acquire_time = Some(now_micro());
                        if v.holder.is_some() {
                            s.lease_transitions = Some(v.transitions + 1);
                        }
                    }
                    s.holder_identity = Some(me.clone());
                    s.renew_time = Some(now_micro());
                    s.lease_duration_seconds = Some(secs(self.cfg.agent_lease_duration));
                });
                set_annotation(obj, TAKEOVER_ANNOTATION, None);
                set_annotation(obj, HUB_NAMESPACE_ANNOTATION, Some(namespace.as_str()));
                // Into this partition (a Lease another principal's partition held moves).
                self.sessions.partition.stamp(obj);
                Mutation::Changed
            })
            .await;
        match written {
            Ok(UpdateOutcome::Updated(obj)) => {
                self.metrics.lease_write("agent", "acquire", "ok");
                if let Some(p) = previous.filter(|p| *p != self.me) {
                    tracing::info!(%agent, previous = %p, "agent Lease taken over from a replica that is gone");
                }
                Ok(Some(rv(&obj).unwrap_or(0)))
            }
            Ok(_) => {
                self.metrics.lease_write("agent", "acquire", "conflict");
                Ok(None)
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(self.lease_error("acquire", &e)),
        }
    }

    /// Asks `holder` to hand the agent over (the takeover annotation); `false`: the Lease
    /// changed meanwhile (look again).
    pub(super) async fn ask_handover(
        &self,
        agent: &AgentName,
        name: &str,
        current: DynamicObject,
        holder: &str,
    ) -> Result<bool, Status> {
        let me = self.me.clone();
        let expected = holder.to_owned();
        let asked_now = self
            .api
            .update_from(Some(&self.namespace), name, Some(current), &mut |obj| {
                let v = LeaseView::of(obj);
                if v.holder.as_deref() != Some(expected.as_str()) {
                    return Mutation::Abort;
                }
                if v.takeover.as_deref() == Some(me.as_str()) {
                    return Mutation::Unchanged;
                }
                set_annotation(obj, TAKEOVER_ANNOTATION, Some(&me));
                Mutation::Changed
            })
            .await;
        match asked_now {
            Ok(UpdateOutcome::Updated(_)) => {
                self.metrics.lease_write("agent", "takeover-request", "ok");
                tracing::info!(%agent, holder = %holder,
                    "agent is held by another replica: asked it to hand the agent over");
                Ok(true)
            }
            Ok(UpdateOutcome::Unchanged(_)) => Ok(true),
            Ok(UpdateOutcome::Aborted(_)) => Ok(false),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(self.lease_error("takeover-request", &e)),
        }
    }
}
