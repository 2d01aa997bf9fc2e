//! The spoke's side of a handshake and of resyncs: what the hello said, what is published
//! after the welcome, and the statuses reported to the principal.

use super::*;

impl Spoke {
    /// Called after each welcome: remember the hub namespace, report what the principal
    /// needs from us.
    pub fn after_welcome(&self, hub_namespace: Namespace) {
        // The hub namespace first: whatever is reported from now on is this session's,
        // and what was reported before is reported again.
        let hello = self.session.welcomed(hub_namespace);
        self.sent.forget_all();
        self.reset_published_config();
        match self.mode {
            AgentMode::Managed => {
                for obj in self.local().values() {
                    self.report_status(obj);
                }
                self.report_guard_refusals();
                self.publish_children();
            }
            AgentMode::Autonomous => {
                if let Some(said) = hello {
                    self.publish_changed_since_hello(&said.apps, &said.statuses);
                    self.publish_config_changed_since_hello(&said.config);
                }
            }
        }
    }

    /// The resync state for the hello, remembered until the welcome. Autonomous agents
    /// report each Application's status checksum too: the status is theirs, and a status
    /// change the hub missed (made while this agent was down, say) is requested again.
    pub fn hello_state(&self) -> ResyncState {
        let (state, said) = self.view();
        self.session.said_hello(said);
        state
    }

    /// What this agent holds now, as a periodic resync request reports it (as the hello
    /// does, without remembering it: the welcome that uses the hello's is long past).
    /// A managed agent reports, per copy, the checksum of the status it last sent (its
    /// statuses are the hub copy's): the principal asks again for those its copy lacks.
    pub fn resync_view(&self) -> ResyncState {
        let mut state = self.view().0;
        if self.mode == AgentMode::Managed {
            for r in state
                .resources
                .iter_mut()
                .filter(|r| r.kind == ResourceKind::Application.as_str())
            {
                if let Some(sum) = self.sent.status(&r.name) {
                    r.status_checksum = sum;
                }
            }
        }
        state
    }

    pub(super) fn view(&self) -> (ResyncState, HelloState) {
        let (apps, statuses) = self.hello_checksums();
        let config = self.config_checksums();
        let mut state = argocd_agent_domain::resync::to_state("Application", &apps);
        let uids = self.source_uids();
        for r in &mut state.resources {
            r.source_uid = uids.get(&r.name).cloned().unwrap_or_default();
            r.status_checksum = statuses.get(&r.name).cloned().unwrap_or_default();
        }
        state.resources.extend(config.iter().cloned());
        state.resources.extend(self.children_hello());
        let said = HelloState {
            apps,
            statuses,
            config,
        };
        (state, said)
    }

    /// Autonomous: local changes the principal cannot know from the hello (made while the
    /// handshake was in flight, when there was no hub namespace to publish them under),
    /// status changes included.
    pub(super) fn publish_changed_since_hello(&self, said: &Checksums, said_status: &Checksums) {
        let local = self.local();
        for (name, obj) in &local {
            if is_being_deleted(obj) {
                continue;
            }
            if said.get(name) != Some(&spec_checksum(obj))
                || said_status.get(name) != Some(&status_checksum(obj))
            {
                self.publish(obj);
            }
        }
        for name in said.keys().filter(|n| !local.contains_key(*n)) {
            self.push_delete(name);
        }
    }

    pub(super) fn report_status(&self, obj: &DynamicObject) {
        self.report_status_with(obj, None);
    }

    /// Managed: whether the spoke's Argo CD has carried out the hub's refresh request
    /// written on the copy `key` (it removed the annotation, as its application controller
    /// does after reconciling: argoproj/argo-cd `controller/appcontroller.go`,
    /// `processAppRefreshQueueItem`). Returns the request's value, once; what is reverted
    /// to from then on has no refresh request.
    pub(super) fn refresh_done(&self, key: &str, obj: &DynamicObject) -> Option<String> {
        let has = obj
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(object::REFRESH_ANNOTATION));
        if has {
            return None;
        }
        self.desired.refresh_done(key)
    }

    /// Reports the status of `obj` when it changed, or when `refreshed` says the hub's
    /// refresh request was carried out.
    pub(super) fn report_status_with(&self, obj: &DynamicObject, refreshed: Option<String>) {
        let key = self.key_of(obj);
        let name = name_of(obj);
        let guard_condition = self.guard_condition(&key);
        let Some(mut status) = object::status(obj)
            .cloned()
            .or_else(|| (refreshed.is_some() || guard_condition.is_some()).then(|| json!({})))
        else {
            return;
        };
        if let Some(c) = guard_condition {
            add_condition(&mut status, c);
        }
        let Some(r) = self.key_ref(&key) else { return };
        let sum = object::checksum_of(&status);
        if !self.sent.record_status(key, sum) && refreshed.is_none() {
            return;
        }
        // A managed copy names the hub object it was made from, so the principal can tell
        // the status of a copy it has since replaced.
        let mut metadata = json!({ "name": name });
        if let Some(uid) = source_uid(obj) {
            metadata["annotations"] = json!({ object::SOURCE_UID_ANNOTATION: uid });
        }
        if let Some(value) = refreshed {
            metadata["annotations"][REFRESHED_ANNOTATION] = Value::String(value);
        }
        self.push(Event::resource(
            &self.source,
            EventType::StatusUpdate,
            r,
            Payload::Object(Arc::new(json!({"metadata": metadata, "status": status}))),
        ));
    }

    /// Managed: the principal asks for a copy's status again; it is sent even if this
    /// agent sent the same before (that one was lost on the way).
    pub(super) fn report_status_again(&self, resource: &ResourceRef) {
        let (ns, name) = self.local_target(resource);
        self.sent.forget_status(&self.key_for(&ns, &name));
        match self.cache.get(Some(&ns), &name) {
            Some(obj) if !is_being_deleted(&obj) => self.report_status(&obj),
            _ => {
                tracing::debug!(object = %resource, "status asked for of a copy this agent does not hold")
            }
        }
    }

    /// Autonomous: publishes a local Application under its hub name.
    pub(super) fn publish(&self, obj: &DynamicObject) {
        let Ok(hub) = self.hub_key(obj) else { return };
        let Some(r) = self.app_ref(&hub) else { return };
        let mut w = Arc::unwrap_or_clone(wire(obj));
        w["metadata"]["namespace"] = Value::String(r.namespace.to_string());
        w["metadata"]["name"] = Value::String(hub.clone());
        let sum = object::checksum_of(&w);
        if !self.sent.record_object(hub, sum) {
            return;
        }
        self.push(Event::resource(
            &self.source,
            EventType::SpecUpdate,
            r,
            Payload::Object(Arc::new(w)),
        ));
    }
}
