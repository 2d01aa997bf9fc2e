//! Resync of an agent's Applications on connect: the hub is the source for managed agents,
//! the agent for autonomous ones.

use std::collections::HashMap;
use std::sync::Arc;

use argocd_agent_domain::AgentName;
use argocd_agent_domain::resync::Checksums;
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_kubernetes::object::is_being_deleted;
use kube::api::DynamicObject;

use super::{Applications, agent_form, app_ref, for_wire, obj_ref, value_checksum, written_by};
use crate::sessions::AgentState;

impl Applications {
    /// Spec checksums of hub objects (those being deleted count as gone), each computed
    /// once per version by the watch cache.
    pub(crate) fn checksums(&self, objects: &HashMap<String, Arc<DynamicObject>>) -> Checksums {
        objects
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| (n.clone(), self.cache.spec_checksum(o)))
            .collect()
    }

    /// Autonomous: checksums of hub copies in the agent's form (project names as on the
    /// spoke), comparable with the checksums the agent sends.
    pub(crate) fn agent_form_checksums(
        agent: &AgentName,
        objects: &HashMap<String, Arc<DynamicObject>>,
    ) -> Checksums {
        objects
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| {
                let v = agent_form(agent, &for_wire(o));
                (n.clone(), value_checksum(v.get("spec")))
            })
            .collect()
    }

    /// Queues everything a managed agent needs to converge on the hub state; returns the
    /// requests for statuses the hub lacks (`agent_statuses`: the checksums of the statuses
    /// the agent last sent, which only its periodic requests carry).
    pub fn resync_managed(
        &self,
        state: &AgentState,
        agent_state: &Checksums,
        agent_uids: &argocd_agent_domain::resync::SourceUids,
        agent_statuses: &Checksums,
    ) -> Vec<Event> {
        let ns = state.namespace();
        let mut objects = self.managed_objects(state);
        // Past a tenant's quota: not sent, and what the agent holds of them stays.
        let held_back = self.split_held_back(state, &mut objects, |k| agent_state.contains_key(k));
        let hub = self.checksums(&objects);
        let mut plan = argocd_agent_domain::resync::plan(&hub, agent_state);
        plan.delete.retain(|k| !held_back.contains(k));
        let hub_uids = objects
            .iter()
            .filter_map(|(n, o)| Some((n.clone(), o.metadata.uid.clone()?)))
            .collect();
        for name in argocd_agent_domain::resync::stale_copies(&hub_uids, agent_uids) {
            if !plan.send.contains(&name) {
                plan.send.push(name);
            }
        }
        tracing::info!(agent = %state.name, send = plan.send.len(), delete = plan.delete.len(),
            "resync (managed): hub is the source");
        if self.routes_by_destination(state) {
            // Known from now on, so a later destination change deletes this agent's copy.
            let mut placements = self.owners.placements();
            for obj in objects.values() {
                if let (Some(ns), Some(name)) = (&obj.metadata.namespace, &obj.metadata.name) {
                    placements.insert((ns.clone(), name.clone()), state.name.clone());
                }
            }
        }
        // What the agent holds from now on, as the hub change handling compares it (spec,
        // labels and annotations); the hello reports specs only, so a label or annotation
        // changed on the hub while apart goes down with the next change of the object.
        let sums = objects
            .iter()
            .filter(|(_, o)| !is_being_deleted(o))
            .map(|(n, o)| (n.clone(), self.sent_checksum(o)))
            .collect();
        state.inner().replace_sent_specs(sums);
        for key in plan.send {
            if let Some(obj) = objects.get(&key) {
                self.push_spec(state, obj);
            }
        }
        for key in plan.delete {
            if let Some(r) = self.key_ref(&ns, &key) {
                self.push_delete(state, r);
            }
        }
        // Objects being deleted on the hub: the agent deletes its copy, then we finish.
        for obj in objects.values() {
            if is_being_deleted(obj)
                && let Some(r) = obj_ref(obj)
            {
                self.push_delete(state, r);
            }
        }
        for obj in objects.values() {
            self.forward_operation(state, obj);
        }
        self.stale_statuses(state, &objects, agent_statuses)
    }

    /// Managed: the Applications among `objects` whose hub copy holds another status than
    /// the one the agent reports it last sent (`agent_statuses`: a status the hub refused,
    /// or lost with a restart), asked for again with `request-update`. Objects being
    /// deleted, and objects the agent reports no status for, are left alone.
    fn stale_statuses(
        &self,
        state: &AgentState,
        objects: &HashMap<String, Arc<DynamicObject>>,
        agent_statuses: &Checksums,
    ) -> Vec<Event> {
        let ns = state.namespace();
        let stale: Vec<Event> = agent_statuses
            .iter()
            .filter(|(key, sum)| {
                objects.get(*key).is_some_and(|o| {
                    !is_being_deleted(o)
                        && argocd_agent_kubernetes::object::status_checksum(o) != **sum
                })
            })
            .filter_map(|(key, _)| self.key_ref(&ns, key))
            .map(|r| Event::resource(&self.source, EventType::RequestUpdate, r, Payload::None))
            .collect();
        if !stale.is_empty() {
            tracing::info!(agent = %state.name, stale_status = stale.len(),
                "resync (managed): statuses the hub lacks asked for again");
        }
        stale
    }

    /// Managed agent reconnected: the hub copies of its spoke-authored children
    /// (app-of-apps) that its hello no longer lists are deleted; the agent publishes every
    /// child it holds after the welcome. `listed` is `None` for an agent that sent no
    /// resync state (what it holds is unknown: nothing is deleted).
    pub async fn resync_children(&self, state: &AgentState, listed: Option<&Checksums>) {
        let Some(listed) = listed else { return };
        let ns = state.namespace();
        let stale: Vec<String> = self
            .hub_objects(&ns)
            .into_iter()
            .filter(|(name, o)| {
                super::is_spoke_child_copy(o)
                    && written_by(o, &state.name)
                    && !listed.contains_key(name)
            })
            .map(|(name, _)| name)
            .collect();
        if !stale.is_empty() {
            tracing::info!(agent = %state.name, delete = stale.len(), "resync (managed): spoke-authored children gone from the spoke");
        }
        for name in stale {
            state.inner().forget_desired_app(&name);
            let _ = self.delete_hub_copy(&ns, &name).await;
        }
    }

    /// Autonomous agent reconnected: ask for what differs, delete what it no longer has.
    ///
    /// `agent_state` is `None` for an agent that sent no resync state (one of the previous
    /// protocol version): what it holds is unknown, so none of its hub copies is deleted
    /// (nor forgotten as its desired state); its events keep them current.
    ///
    /// `agent_statuses` are the status checksums the agent reported (none from an agent of
    /// an earlier version): an object whose hub copy holds another status is asked for
    /// too, even when the specs agree. Otherwise a status change the hub missed (written
    /// on the spoke while the agent was down, or lost with a restart) would never come
    /// again. A hub copy holding a terminate the spoke has not taken up yet differs until
    /// it has (one more request per reconnect meanwhile).
    pub async fn resync_autonomous(
        &self,
        state: &AgentState,
        agent_state: Option<&Checksums>,
        agent_statuses: &Checksums,
    ) -> Vec<Event> {
        let ns = state.namespace();
        // Only the copies this agent wrote: hub-authored objects in its namespace are never
        // requested from it nor deleted because it lacks them.
        let mut objects = self.hub_objects(&ns);
        objects.retain(|_, o| written_by(o, &state.name));
        let hub = Self::agent_form_checksums(&state.name, &objects);
        let Some(agent_state) = agent_state else {
            tracing::info!(agent = %state.name, "resync (autonomous): the agent sent no resync state; its hub copies are kept");
            for obj in objects.values() {
                self.forward_operation(state, obj);
            }
            return Vec::new();
        };
        let mut plan = argocd_agent_domain::resync::plan(agent_state, &hub);
        let spec_requests = plan.send.len();
        let hub_statuses: Checksums = objects
            .iter()
            .filter(|(n, o)| agent_statuses.contains_key(*n) && !is_being_deleted(o))
            .map(|(n, o)| {
                (
                    n.clone(),
                    argocd_agent_kubernetes::object::status_checksum(o),
                )
            })
            .collect();
        plan.send_stale_statuses(agent_statuses, &hub_statuses);
        tracing::info!(agent = %state.name, request = plan.send.len(),
            stale_status = plan.send.len() - spec_requests, delete = plan.delete.len(),
            "resync (autonomous): agent is the source");
        {
            let mut inner = state.inner();
            inner.retain_desired_apps(|n| agent_state.contains_key(n));
            for (name, obj) in &objects {
                if agent_state.get(name) == hub.get(name) {
                    inner.adopt_desired_app(name, || {
                        Arc::new(agent_form(&state.name, &for_wire(obj)))
                    });
                }
            }
        }
        for name in &plan.delete {
            let _ = self.delete_hub_copy(&ns, name).await;
        }
        // Hub operations not yet delivered (set while no session was up, or queued in a
        // principal that since restarted) go out now.
        for (name, obj) in &objects {
            if !plan.delete.contains(name) {
                self.forward_operation(state, obj);
            }
        }
        plan.send
            .into_iter()
            .map(|name| {
                Event::resource(
                    &self.source,
                    EventType::RequestUpdate,
                    app_ref(&ns, &name),
                    Payload::None,
                )
            })
            .collect()
    }
}
