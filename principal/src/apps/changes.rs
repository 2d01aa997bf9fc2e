//! Hub changes of one agent's Applications, handled by its worker: managed agents get
//! them as events, autonomous agents' copies are restored; hub operations are forwarded.

use std::sync::Arc;

use argocd_agent_domain::{AgentMode, Namespace};
use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_kubernetes::Change;
use argocd_agent_kubernetes::object::{self, is_being_deleted, spec_checksum};
use kube::api::DynamicObject;
use serde_json::{Value, json};

use super::{Applications, app_ref, hub_form_in, name_of, obj_ref, value_checksum};
use crate::error::chain;
use crate::sessions::AgentState;

impl Applications {
    /// Handles one change of a hub Application in the agent's namespace.
    pub async fn on_hub_change(&self, state: &AgentState, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        let ns = state.namespace();
        if !self.routes_by_destination(state)
            && obj.metadata.namespace.as_deref() != Some(ns.as_str())
        {
            return;
        }
        match state.mode() {
            // An app-of-apps child the agent's spoke created: the spoke's, as an autonomous
            // agent's Applications are (hub edits and deletions are reverted).
            AgentMode::Managed if super::is_spoke_child_copy(&obj) => {
                if super::written_by(&obj, &state.name) {
                    self.on_autonomous_change(state, &ns, &obj, deleted).await;
                }
            }
            AgentMode::Managed => {
                if !deleted && self.hold_back(state, &obj).await {
                    return;
                }
                self.on_managed_change(state, &ns, &obj, deleted)
            }
            AgentMode::Autonomous => self.on_autonomous_change(state, &ns, &obj, deleted).await,
        }
    }

    /// Managed: what a managed agent receives of a hub Application, as one checksum: its
    /// `.spec`, labels and annotations (a change of any of them is sent; status and
    /// operation writes are not).
    pub(crate) fn sent_checksum(&self, obj: &Arc<DynamicObject>) -> String {
        format!(
            "{}:{}",
            self.cache.spec_checksum(obj),
            self.cache.metadata_checksum(obj)
        )
    }

    /// Managed: hub spec, label and annotation changes and deletions go to the agent.
    pub(crate) fn on_managed_change(
        &self,
        state: &AgentState,
        ns: &Namespace,
        obj: &Arc<DynamicObject>,
        deleted: bool,
    ) {
        let name = self.app_key(obj);
        if deleted || is_being_deleted(obj) {
            state.inner().forget_sent_app(&name);
            if let Some(r) = obj_ref(obj).or_else(|| self.key_ref(ns, &name)) {
                self.push_delete(state, r);
            }
            return;
        }
        let sum = self.sent_checksum(obj);
        let changed = state.inner().record_sent_spec(&name, sum);
        if changed {
            self.push_spec(state, obj);
        }
        self.forward_operation(state, obj);
    }

    /// Autonomous (and a managed agent's spoke-authored children): hub edits and deletions
    /// are reverted to what the agent sent.
    pub(crate) async fn on_autonomous_change(
        &self,
        state: &AgentState,
        ns: &Namespace,
        obj: &DynamicObject,
        deleted: bool,
    ) {
        let name = name_of(obj);
        let desired = state.inner().desired_app(&name);
        let Some(desired) = desired else { return };
        let resource = app_ref(ns, &name);
        if is_being_deleted(obj) && !deleted {
            // Hub deletion of an autonomous app: let it go, then recreate it from the
            // agent's copy when the deletion completes.
            let _ = self.apps.remove_finalizers(Some(ns.as_str()), &name).await;
            return;
        }
        if deleted && self.moved_to_another_partition(ns, &name).await {
            tracing::info!(%resource, "hub copy now belongs to another principal's partition: not restored");
            state.inner().forget_desired_app(&name);
            return;
        }
        let what = if deleted {
            "deletion"
        } else if spec_checksum(obj)
            != value_checksum(hub_form_in(state.mode(), &state.name, &desired).get("spec"))
        {
            "edit"
        } else {
            self.forward_operation(state, obj);
            self.forward_refresh(state, obj, &desired);
            return;
        };
        tracing::info!(%resource, "reverting hub {what} of autonomous application");
        if let Err(e) = self
            .upsert_from_agent_after(&resource, state, &desired, Some(&desired))
            .await
        {
            tracing::warn!(%resource, error = %chain(&e), "could not revert hub {what}");
        }
        if !deleted {
            self.forward_operation(state, obj);
            self.forward_refresh(state, obj, &desired);
        }
    }

    /// Whether the Application `ns/name`, gone from the watch, still exists on the hub
    /// without this principal's partition labels: relabelled for another principal (an
    /// agent moved to it), whose object it now is. Without partition labels, never.
    pub(crate) async fn moved_to_another_partition(&self, ns: &Namespace, name: &str) -> bool {
        let partition = &self.sessions.partition;
        if partition.labels().is_empty() {
            return false;
        }
        match self.apps.get(Some(ns.as_str()), name).await {
            Ok(Some(obj)) => !partition.owns(obj.metadata.labels.as_ref()),
            _ => false,
        }
    }

    /// Autonomous: a refresh requested on the hub copy (Argo CD's refresh annotation, what
    /// the UI's Refresh and Hard refresh write) goes to the agent once, as a spec-update
    /// holding only the name and that annotation; the spoke's Argo CD carries it out and
    /// removes it, and the hub copy follows the spoke. A request the spoke's own object
    /// carries (`desired`) came from the spoke and is not sent back.
    pub(crate) fn forward_refresh(&self, state: &AgentState, obj: &DynamicObject, desired: &Value) {
        // A managed agent takes a spec-update as the hub's copy to write: a refresh of a
        // spoke-authored child is not carried (refresh its parent, or the child on the spoke).
        if state.mode() != argocd_agent_domain::AgentMode::Autonomous {
            return;
        }
        let name = name_of(obj);
        let value = obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(object::REFRESH_ANNOTATION))
            .cloned();
        let send = {
            let mut inner = state.inner();
            match &value {
                Some(v)
                    if object::annotation_of(desired, object::REFRESH_ANNOTATION) == Some(v) =>
                {
                    false
                }
                Some(v) => inner.record_sent_refresh(&name, v),
                None => {
                    inner.forget_refresh(&name);
                    false
                }
            }
        };
        if let (true, Some(v)) = (send, value) {
            let resource = obj_ref(obj).unwrap_or_else(|| app_ref(&state.namespace(), &name));
            let payload = Payload::Object(Arc::new(json!({
                "metadata": {"name": name, "annotations": {object::REFRESH_ANNOTATION: v}}
            })));
            self.push(
                state,
                Event::resource(&self.source, EventType::SpecUpdate, resource, payload),
            );
        }
    }

    /// Sends a hub-side `.operation` to the agent once, and a terminate request (the hub's
    /// `.status.operationState.phase` turning `Terminating`, what `argocd app terminate-op`
    /// writes) once, also after the operation itself was delivered and cleared on the hub.
    pub(crate) fn forward_operation(&self, state: &AgentState, obj: &DynamicObject) {
        let name = self.app_key(obj);
        let op = object::operation(obj).filter(|v| !v.is_null());
        let terminating = obj
            .data
            .pointer("/status/operationState/phase")
            .and_then(Value::as_str)
            == Some("Terminating");
        let (send_op, send_terminate) = {
            let mut inner = state.inner();
            let send_op = inner.record_sent_operation(&name, op.map(|op| value_checksum(Some(op))));
            let send_terminate = inner.record_terminate(&name, terminating);
            (send_op, send_terminate)
        };
        let resource = || obj_ref(obj).unwrap_or_else(|| app_ref(&state.namespace(), &name));
        if let (true, Some(op)) = (send_op, op) {
            let payload = Payload::Object(Arc::new(json!({ "operation": op })));
            self.push(
                state,
                Event::resource(&self.source, EventType::SetOperation, resource(), payload),
            );
        }
        if send_terminate {
            self.push(
                state,
                Event::resource(
                    &self.source,
                    EventType::TerminateOperation,
                    resource(),
                    Payload::None,
                ),
            );
        }
    }
}
