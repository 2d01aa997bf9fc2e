//! The spoke guard ([`crate::guard`]) at work on the spoke: what the principal sends is
//! checked before anything is written, refusals are answered, counted, logged and shown on
//! the hub copy, and a changed guard asks the principal for the refused objects again.
//!
//! A refused event is acknowledged (`processed`): the spoke has decided, and an
//! unacknowledged event would be resent forever and hold its resource's place in the
//! principal's queue, so later legitimate changes to it would never arrive. The refusal
//! travels instead as an `error` event without acknowledgement id (the principal logs it)
//! and, for an Application, as an `InvalidSpecError` condition in the status the agent
//! reports for it (the status path managed agents already use).

use std::sync::Arc;

use argocd_agent_domain::{AgentMode, Event, EventType, Payload, ResourceKind, ResourceRef};
use argocd_agent_kubernetes::object;
use serde_json::{Value, json};

use crate::guard::refused::AppRefusal;
use crate::guard::{self, Refusal};
use crate::managed::lock;
use crate::spoke::Spoke;

impl Spoke {
    /// Managed Application upserts and sync operations (both modes): `Some` when the guard
    /// refuses them.
    pub(crate) fn guard_app_event(&self, event: &Event) -> Option<Refusal> {
        let guard = self.guard.current();
        if guard.guards.is_empty() {
            return None;
        }
        match event.ty {
            EventType::Create | EventType::SpecUpdate if self.mode == AgentMode::Managed => {
                guard.check_application(event.object()?).err()
            }
            EventType::SetOperation => {
                // A sync may override the source; and the hub may not start one on a local
                // Application the guard would not take (autonomous: the spoke's own, which
                // the guard never saw; managed: written before a stricter guard).
                if let Some(op) = event.object().and_then(|o| o.get("operation"))
                    && let Err(r) = guard.check_operation(op)
                {
                    return Some(r);
                }
                let (ns, name) = self.local_target(event.resource.as_ref()?);
                let local = self.cache.get(Some(&ns), &name)?;
                let spec = serde_json::to_value(local.as_ref()).ok()?;
                guard.check_application(&spec).err()
            }
            _ => None,
        }
    }

    /// Answers an Application event the guard refused: counted, logged, told to the
    /// principal; a refused spec is shown as a condition on the hub copy.
    pub(crate) fn refuse_app_event(
        &self,
        event: &Event,
        resource: &ResourceRef,
        refusal: Refusal,
    ) -> Event {
        let what = if event.ty == EventType::SetOperation {
            "Operation"
        } else {
            resource.kind.as_str()
        };
        self.guard_refused(event, resource, what, &refusal);
        if event.ty != EventType::SetOperation {
            let (ns, name) = self.local_target(resource);
            let key = self.key_for(&ns, &name);
            let source_uid = event
                .object()
                .and_then(|o| object::annotation_of(o, object::SOURCE_UID_ANNOTATION))
                .map(str::to_owned);
            let mut st = lock(&self.guard_state);
            let since = match st.apps.get(&key) {
                Some(prev) if prev.refusal == refusal => prev.since.clone(),
                _ => guard::now_rfc3339(),
            };
            st.apps.insert(
                key.clone(),
                AppRefusal {
                    refusal,
                    since,
                    source_uid,
                },
            );
            drop(st);
            self.report_guard_status(&ns, &name, &key);
        }
        event.ack(&self.source)
    }

    /// The count, the log line and the principal's notice of one refusal.
    fn guard_refused(&self, event: &Event, resource: &ResourceRef, what: &str, refusal: &Refusal) {
        self.metrics.guard_refused(what, refusal.rule);
        tracing::warn!(object = %resource, r#type = %event.ty, rule = refusal.rule,
            message = %refusal.message, "refused by the spoke guard: nothing written");
        let mut notice = event.error_reply(&self.source, "Forbidden", refusal.to_string());
        notice.ack_id = None;
        self.send_direct(notice);
    }

    /// The guard took an Application from the hub: a condition it had goes.
    pub(crate) fn guard_accepted_app(&self, resource: &ResourceRef) {
        let (ns, name) = self.local_target(resource);
        let key = self.key_for(&ns, &name);
        if lock(&self.guard_state).apps.remove(&key).is_some() {
            tracing::info!(object = %resource, "the spoke guard takes the application again: condition cleared");
            self.report_guard_status(&ns, &name, &key);
        }
    }

    /// The principal deleted an Application: what the guard said of it is moot.
    pub(crate) fn guard_forget_app(&self, key: &str) {
        lock(&self.guard_state).apps.remove(key);
    }

    /// The guard's condition for the Application `key`, if it refused it.
    pub(crate) fn guard_condition(&self, key: &str) -> Option<Value> {
        let st = lock(&self.guard_state);
        let r = st.apps.get(key)?;
        Some(guard::condition(&r.refusal, &r.since))
    }

    /// Reports the status of the Application `key` now: the local copy's, with the guard's
    /// condition when it stands; without a local copy, the condition alone.
    fn report_guard_status(&self, ns: &str, name: &str, key: &str) {
        self.forget_sent_status(key);
        let local = self.cache.get(Some(ns), name).filter(|o| self.relevant(o));
        if let Some(local) = local.as_ref().filter(|o| object::status(o).is_some()) {
            self.report_status_forced(local);
            return;
        }
        let Some(r) = self.key_ref(key) else { return };
        let (condition, uid) = {
            let st = lock(&self.guard_state);
            match st.apps.get(key) {
                Some(a) => (
                    Some(guard::condition(&a.refusal, &a.since)),
                    a.source_uid.clone(),
                ),
                None => (None, local.as_deref().and_then(crate::managed::source_uid)),
            }
        };
        let mut metadata = json!({ "name": r.name });
        if let Some(uid) = uid {
            metadata["annotations"] = json!({ object::SOURCE_UID_ANNOTATION: uid });
        }
        let status = match condition {
            Some(c) => json!({ "conditions": [c] }),
            None => json!({}),
        };
        self.push(Event::resource(
            &self.source,
            EventType::StatusUpdate,
            r,
            Payload::Object(Arc::new(json!({"metadata": metadata, "status": status}))),
        ));
    }

    /// After a welcome: the conditions of refused Applications without a local copy (the
    /// others go with their status).
    pub(crate) fn report_guard_refusals(&self) {
        let keys: Vec<String> = lock(&self.guard_state).apps.keys().cloned().collect();
        for key in keys {
            let (ns, name) = match key.split_once('/') {
                Some((ns, name)) => (ns.to_owned(), name.to_owned()),
                None => (self.namespace.as_str().to_owned(), key.clone()),
            };
            if self.cache.get(Some(&ns), &name).is_none() {
                self.report_guard_status(&ns, &name, &key);
            }
        }
    }

    /// A configuration object from the hub as the guard lets it be written (an AppProject
    /// narrowed to the guard), or why it is refused.
    pub(crate) fn guard_config(
        &self,
        kind: ResourceKind,
        obj: Arc<Value>,
    ) -> Result<Arc<Value>, Refusal> {
        let guard = self.guard.current();
        if !guard.is_active() {
            return Ok(obj);
        }
        match kind {
            ResourceKind::AppProject => guard.shape_project(&obj).map(Arc::new),
            ResourceKind::Repository => guard.check_repository(&obj).map(|()| obj),
            ResourceKind::GpgKeys => {
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                guard.check_configmap(name).map(|()| obj)
            }
            _ => Ok(obj),
        }
    }

    /// Answers a configuration event the guard refused (the object is not written).
    pub(crate) fn refuse_config_event(
        &self,
        event: &Event,
        resource: &ResourceRef,
        refusal: Refusal,
    ) -> Event {
        self.guard_refused(event, resource, resource.kind.as_str(), &refusal);
        lock(&self.guard_state)
            .config
            .insert((resource.kind, resource.name.clone()));
        event.ack(&self.source)
    }

    /// The guard took a configuration object.
    pub(crate) fn guard_accepted_config(&self, kind: ResourceKind, name: &str) {
        lock(&self.guard_state)
            .config
            .remove(&(kind, name.to_owned()));
    }

    /// The guard changed: the principal is asked again for everything it refused, and for
    /// every project and repository this spoke holds (so they are narrowed anew).
    pub(crate) fn on_guard_change(&self) {
        let Some(hub_ns) = self.hub_namespace() else {
            return;
        };
        let (apps, mut config): (Vec<String>, Vec<(ResourceKind, String)>) = {
            let st = lock(&self.guard_state);
            (
                st.apps.keys().cloned().collect(),
                st.config.iter().cloned().collect(),
            )
        };
        if self.mode == AgentMode::Managed {
            config.extend(self.desired_config_keys());
        }
        config.sort();
        config.dedup();
        let mut asked = 0usize;
        for r in apps.iter().filter_map(|k| self.key_ref(k)).chain(
            config
                .into_iter()
                .map(|(kind, name)| ResourceRef::new(kind, hub_ns.clone(), name)),
        ) {
            asked += 1;
            self.send_direct(Event::resource(
                &self.source,
                EventType::RequestUpdate,
                r,
                Payload::None,
            ));
        }
        tracing::info!(
            asked,
            "spoke guard changed: asked the principal again for refused and narrowed objects"
        );
    }
}
