//! The writes agents' events cause on the hub's Applications: status, autonomous agents'
//! copies and deletions, and what an acknowledgement finishes.

use argocd_agent_domain::queue::{Lane, QueueKey};
use argocd_agent_domain::{AgentMode, AgentName, Namespace, ResourceKind};
use argocd_agent_domain::{Event, EventType, ResourceRef};
use argocd_agent_kubernetes::Mutation;
use argocd_agent_kubernetes::UpsertOutcome;
use argocd_agent_kubernetes::object::{self, is_being_deleted};
use serde_json::{Value, json};
use tracing::Instrument;

use super::{Applications, Applied, hub_copy_of_agent_app, hub_write_span};
use crate::error::{ApplyError, chain};
use crate::inbound::Command;
use crate::metrics::HubWrite;
use crate::sessions::AgentState;

impl Applications {
    /// Applies an authorized command about an Application from the agent `state` (see
    /// [`crate::inbound`]).
    pub async fn apply(&self, state: &AgentState, command: Command) -> Result<Applied, ApplyError> {
        match command {
            Command::WriteStatus {
                resource,
                status,
                source_uid,
                refreshed,
            } => {
                let Some(cur) = self
                    .cache
                    .get(Some(resource.namespace.as_str()), &resource.name)
                else {
                    return Err(ApplyError::Missing { resource });
                };
                // The status of a copy of an earlier hub object of this name (deleted and
                // created again since): the agent replaces that copy next, so the status
                // describes nothing on the hub any more.
                if let Some(uid) = source_uid
                    && cur.metadata.uid.as_deref().is_some_and(|u| u != uid)
                {
                    tracing::debug!(%resource, source_uid = %uid, "status of a replaced hub object ignored");
                    return Ok(Applied::Ack);
                }
                self.write_status(&resource, status).await?;
                if let Some(value) = refreshed {
                    self.end_refresh(&resource, &value).await;
                }
            }
            Command::Upsert { resource, object } => {
                // Recorded before the write, so the hub watch does not take our own write
                // for a hub edit to revert; restored if the write fails.
                let previous = state
                    .inner()
                    .record_desired_app(&resource.name, object.clone());
                let result = self
                    .upsert_from_agent_after(&resource, state, &object, previous.as_deref())
                    .await;
                if result.is_err() {
                    state.inner().restore_desired_app(&resource.name, previous);
                }
                result?;
                // A hub operation set while this object was unknown here (after a restart,
                // before the agent's resync) goes out now: an unchanged upsert makes no
                // hub change that would forward it.
                if let Some(cur) = self
                    .cache
                    .get(Some(resource.namespace.as_str()), &resource.name)
                {
                    self.forward_operation(state, &cur);
                }
            }
            Command::Delete { resource } => {
                state.inner().forget_agent_app(&resource.name);
                if !self
                    .delete_hub_copy(&resource.namespace, &resource.name)
                    .await
                {
                    return Ok(Applied::NotFound);
                }
            }
            Command::ResendCurrent { resource } => {
                self.send_current(state, resource);
                return Ok(Applied::Silent);
            }
        }
        Ok(Applied::Ack)
    }

    /// Removes an autonomous agent's hub copy (finalizers first: the spoke already deleted it).
    /// Returns `false` when the API server had no such object.
    pub(crate) async fn delete_hub_copy(&self, ns: &Namespace, name: &str) -> bool {
        let ns = Some(ns.as_str());
        if let Err(e) = self.apps.remove_finalizers(ns, name).await
            && !e.is_not_found()
        {
            tracing::warn!(error = %chain(&e), "could not remove finalizers");
        }
        match self.apps.delete(ns, name).await {
            Ok(argocd_agent_kubernetes::DeleteOutcome::NotFound) => false,
            Ok(_) => {
                self.metrics
                    .hub_write(ResourceKind::Application, HubWrite::Deleted);
                true
            }
            Err(e) if e.is_not_found() => false,
            Err(e) => {
                self.metrics.hub_write_errors.inc();
                tracing::warn!(error = %chain(&e), "could not delete hub copy");
                true
            }
        }
    }

    /// Managed: the spoke's Argo CD carried out the hub's refresh request `value`: the hub
    /// copy's request is removed (if it still holds that value), so the hub UI stops showing
    /// the Application refreshing.
    pub(crate) async fn end_refresh(&self, resource: &ResourceRef, value: &str) {
        let ns = Some(resource.namespace.as_str());
        // The watch cache's copy may predate the status just written: a conflict re-reads
        // the object and decides again (a request still holding `value` is removed, a new
        // one is kept), so the end of a refresh is never lost to a stale resourceVersion.
        let cached = self.cache.get(ns, &resource.name).map(|o| (*o).clone());
        let result = self
            .apps
            .update_from(ns, &resource.name, cached, &mut |obj| {
                let held = obj.metadata.annotations.as_mut().filter(|a| {
                    a.get(object::REFRESH_ANNOTATION).map(String::as_str) == Some(value)
                });
                match held {
                    Some(a) => {
                        a.remove(object::REFRESH_ANNOTATION);
                        Mutation::Changed
                    }
                    None => Mutation::Abort,
                }
            })
            .await;
        match result {
            Ok(_) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => {
                self.metrics.hub_write_errors.inc();
                tracing::warn!(%resource, error = %chain(&e), "could not remove the refresh request")
            }
        }
    }

    /// Autonomous: writes the object an autonomous agent sent, knowing the object the agent sent
    /// before (`previous`), so that labels and annotations the hub copy has and the spoke
    /// never sent are kept ([`keep_on_hub`]).
    pub(crate) async fn upsert_from_agent_after(
        &self,
        resource: &ResourceRef,
        state: &AgentState,
        incoming: &Value,
        previous: Option<&Value>,
    ) -> Result<(), ApplyError> {
        let delivered = state.inner().take_refresh_delivered(&resource.name);
        let keep = |key: &str| keep_on_hub(key, previous, delivered);
        self.upsert_with(resource, &state.name, state.mode(), incoming, &keep)
            .await
    }

    /// Writes an object received from an autonomous agent into its hub namespace; the hub
    /// copy's labels and annotations for which `keep` is true stay.
    async fn upsert_with(
        &self,
        resource: &ResourceRef,
        agent: &AgentName,
        mode: AgentMode,
        incoming: &Value,
        keep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<(), ApplyError> {
        let mut copy = hub_copy_of_agent_app(agent, mode, &resource.namespace, incoming).map_err(
            |source| ApplyError::NotAnObject {
                resource: resource.clone(),
                source,
            },
        )?;
        // Labelled for this principal's partition, so its watch sees the copy.
        self.sessions.partition.stamp(&mut copy);
        // Status goes through the status subresource, after the object exists.
        let status = object::take_field(&mut copy, "status");
        // `.operation` on the hub copy is the hub's request to the spoke (`argocd app sync`
        // there), not the spoke's: the spoke's own would overwrite one not yet delivered.
        object::take_field(&mut copy, "operation");
        let outcome = self
            .apps
            .upsert_copy_keeping(
                &copy,
                &["spec"],
                self.cache
                    .known(Some(resource.namespace.as_str()), &resource.name),
                keep,
            )
            .instrument(hub_write_span("upsert", resource))
            .await
            .inspect_err(|_| {
                self.metrics.hub_write_errors.inc();
            })?;
        self.count_upsert(ResourceKind::Application, outcome);
        match status.filter(|s| !s.is_null()) {
            Some(status) => self.write_status(resource, status).await?,
            // The spoke copy has no status (created again under this name, say): neither
            // has the hub copy, whatever an earlier object of this name reported.
            None => {
                let stale = self
                    .cache
                    .get(Some(resource.namespace.as_str()), &resource.name)
                    .and_then(|cur| object::status(&cur).cloned())
                    .is_some_and(|s| s.as_object().is_some_and(|m| !m.is_empty()));
                if stale {
                    self.write_status(resource, json!({})).await?;
                }
            }
        }
        Ok(())
    }

    /// Counts a hub write made by an upsert.
    pub(crate) fn count_upsert(&self, kind: ResourceKind, outcome: UpsertOutcome) {
        match outcome {
            UpsertOutcome::Created => self.metrics.hub_write(kind, HubWrite::Created),
            UpsertOutcome::Updated => self.metrics.hub_write(kind, HubWrite::Updated),
            UpsertOutcome::Unchanged => {}
        }
    }

    /// Keeps a terminate requested on the hub (`argocd app terminate-op`: operation phase
    /// `Terminating`) in the status the spoke reports, until the spoke has taken it up (its
    /// phase is `Terminating` too) or the operation ended there. Otherwise a status report
    /// written a moment after the request would erase it before it was forwarded (and a
    /// principal restart in between would lose it).
    pub(crate) fn keep_pending_terminate(hub: Option<&Value>, incoming: &mut Value) {
        let phase = |s: &Value| {
            s.pointer("/operationState/phase")
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let Some(hub) = hub else { return };
        if phase(hub).as_deref() != Some("Terminating") {
            return;
        }
        let still_running = matches!(phase(incoming).as_deref(), None | Some("Running"));
        if let (true, Some(m), Some(op)) = (
            still_running,
            incoming.as_object_mut(),
            hub.get("operationState"),
        ) {
            m.insert("operationState".into(), op.clone());
        }
    }

    /// Removes the hub copy's `.operation` if it is still `delivered`, with a precondition
    /// on the resourceVersion it was read at (so an operation set meanwhile survives).
    pub(crate) async fn clear_delivered_operation(
        &self,
        ns: Option<&str>,
        name: &str,
        delivered: Option<&Value>,
    ) {
        let Some(delivered) = delivered else { return };
        for _ in 0..3 {
            let Some(cur) = self.cache.get(ns, name) else {
                return;
            };
            if object::operation(&cur) != Some(delivered) {
                return;
            }
            let rv = cur.metadata.resource_version.clone().unwrap_or_default();
            let patch = json!({"metadata": {"resourceVersion": rv}, "operation": null});
            match self.apps.patch_merge(ns, name, &patch).await {
                Ok(_) => return,
                Err(e) if e.is_not_found() => return,
                // The cache was behind, or something else changed the object: look again.
                Err(e) if e.is_conflict() => {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => {
                    tracing::warn!(namespace = ns.unwrap_or_default(), name, error = %chain(&e), "could not clear operation");
                    return;
                }
            }
        }
    }

    /// Writes `.status` of a hub Application through the status subresource.
    pub(crate) async fn write_status(
        &self,
        resource: &ResourceRef,
        mut status: Value,
    ) -> Result<(), ApplyError> {
        let ns = Some(resource.namespace.as_str());
        let cur = self.cache.get(ns, &resource.name);
        if let Some(cur) = &cur {
            Self::keep_pending_terminate(object::status(cur), &mut status);
            if object::status(cur) == Some(&status) {
                return Ok(());
            }
        }
        self.apps
            .replace_status(ns, &resource.name, status)
            .instrument(hub_write_span("status", resource))
            .await
            .inspect_err(|_| {
                self.metrics.hub_write_errors.inc();
            })?;
        Ok(())
    }

    /// Called when the agent acknowledged an event of ours.
    pub async fn on_ack(&self, state: &AgentState, key: QueueKey, delivered: &Event) {
        let ns = Some(key.resource.namespace.as_str());
        let name = key.resource.name.as_str();
        let ty = delivered.ty;
        match key.lane {
            Lane::Operation if ty == EventType::SetOperation => {
                // Delivered: the hub copy's `.operation` has done its job (the hub runs no
                // application controller for agent namespaces); the agent reports progress
                // in `.status.operationState`. Only that operation is cleared: a newer one
                // set on the hub meanwhile is still to be delivered.
                let op = delivered.object().and_then(|o| o.get("operation")).cloned();
                self.clear_delivered_operation(ns, name, op.as_ref()).await;
            }
            Lane::Object
                if ty == EventType::SpecUpdate && state.mode() == AgentMode::Autonomous =>
            {
                // A forwarded refresh request reached the spoke: the next object from the
                // spoke without it ends it on the hub copy.
                state.inner().note_refresh_delivered(name);
            }
            Lane::Object if ty == EventType::Delete && state.mode() == AgentMode::Managed => {
                // The spoke deleted its copy: finish a pending hub deletion.
                if let Some(obj) = self.cache.get(ns, name)
                    && is_being_deleted(&obj)
                {
                    let _ = self.apps.remove_finalizers(ns, name).await;
                }
            }
            _ => {}
        }
    }
}

/// Autonomous: whether a label or annotation `key` that the hub copy has and the agent's
/// object lacks stays on the hub copy. The spoke's labels and annotations win; these stay:
/// - the hub's own ([`object::hub_owned_key`]: notification state and subscriptions),
///   whatever the spoke sent before;
/// - any other key the spoke's previous object (`previous`) did not have either: the hub
///   wrote it, not the spoke (when the previous object is unknown, after a restart, only
///   the hub's own are kept);
/// - a refresh request made on the hub copy until the agent acknowledged it (`delivered`)
///   or the spoke had it and removed it (its Argo CD carried it out).
pub(crate) fn keep_on_hub(key: &str, previous: Option<&Value>, delivered: bool) -> bool {
    if object::hub_owned_key(key) {
        return true;
    }
    let in_previous = previous.is_some_and(|p| {
        ["labels", "annotations"].iter().any(|f| {
            p.get("metadata")
                .and_then(|m| m.get(*f))
                .and_then(|m| m.get(key))
                .is_some()
        })
    });
    if key == object::REFRESH_ANNOTATION {
        return !delivered && !in_previous;
    }
    previous.is_some() && !in_previous
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_hubs_notification_state_and_its_own_annotations_survive_the_spoke() {
        let previous = json!({"metadata": {"annotations": {"team": "a", "gone": "x"},
                                           "labels": {"env": "prod"}}});
        // Notification state and subscriptions are the hub's, whatever the spoke sent.
        for key in [
            object::NOTIFIED_ANNOTATION,
            "notifications.argoproj.io/subscribe.on-sync-succeeded.slack",
        ] {
            assert!(keep_on_hub(key, Some(&previous), false), "{key}");
            assert!(keep_on_hub(key, None, false), "{key}");
        }
        // A key the spoke sent before and no longer sends: the spoke removed it.
        assert!(!keep_on_hub("gone", Some(&previous), false));
        assert!(!keep_on_hub("env", Some(&previous), false));
        // A key the spoke never sent: written on the hub, kept.
        assert!(keep_on_hub("hub.example.com/owner", Some(&previous), false));
        // Previous object unknown (after a restart): only the hub's own are kept.
        assert!(!keep_on_hub("hub.example.com/owner", None, false));
    }

    #[test]
    fn a_hub_refresh_request_stays_until_delivered_or_carried_out_on_the_spoke() {
        let r = object::REFRESH_ANNOTATION;
        let without = json!({"metadata": {"annotations": {}}});
        let with = json!({"metadata": {"annotations": {r: "hard"}}});
        // Not yet delivered: a spoke object without it does not end it.
        assert!(keep_on_hub(r, Some(&without), false));
        assert!(keep_on_hub(r, None, false));
        // Delivered (acknowledged by the agent): the spoke's object decides.
        assert!(!keep_on_hub(r, Some(&without), true));
        // The spoke had it and removed it: carried out.
        assert!(!keep_on_hub(r, Some(&with), false));
    }

    #[test]
    fn a_pending_terminate_survives_the_spokes_status_until_taken_up() {
        let hub = json!({"sync": {"status": "Synced"},
                         "operationState": {"phase": "Terminating", "startedAt": "t0"}});
        // The spoke still runs the operation (or reports none yet): the request stays.
        for phase in [json!({"phase": "Running", "startedAt": "t0"}), Value::Null] {
            let mut incoming = json!({"sync": {"status": "OutOfSync"}});
            if !phase.is_null() {
                incoming["operationState"] = phase;
            }
            Applications::keep_pending_terminate(Some(&hub), &mut incoming);
            assert_eq!(incoming["operationState"]["phase"], "Terminating");
            assert_eq!(
                incoming["sync"]["status"], "OutOfSync",
                "the rest is the spoke's"
            );
        }
        // Taken up, or ended there: the spoke's state wins.
        for phase in ["Terminating", "Failed", "Succeeded"] {
            let mut incoming = json!({"operationState": {"phase": phase, "message": "m"}});
            Applications::keep_pending_terminate(Some(&hub), &mut incoming);
            assert_eq!(incoming["operationState"]["phase"], phase);
            assert_eq!(incoming["operationState"]["message"], "m");
        }
        // No terminate on the hub: nothing to keep.
        let mut incoming = json!({"operationState": {"phase": "Running"}});
        Applications::keep_pending_terminate(
            Some(&json!({"operationState": {"phase": "Running"}})),
            &mut incoming,
        );
        Applications::keep_pending_terminate(None, &mut incoming);
        assert_eq!(incoming["operationState"]["phase"], "Running");
    }
}
