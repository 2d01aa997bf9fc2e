//! Events from the principal about Applications: planned (see [`super::plan`]), then
//! applied to the local copies and answered.

use super::*;

impl Spoke {
    /// Managed: deletes the copy of `resource` the principal asked to delete. Returns its
    /// key when finalizers hold it (the spoke's Argo CD deletes its resources first).
    pub(super) async fn delete_copy(
        &self,
        resource: &ResourceRef,
    ) -> Result<Option<String>, SpokeError> {
        let (ns, name) = self.local_target(resource);
        let (ns, name) = (ns.as_str(), name.as_str());
        let key = self.key_for(ns, name);
        self.desired.forget(&key);
        self.sent.forget_status(&key);
        self.guard_forget_app(&key);
        match self.delete_local(ns, name).await? {
            DeleteOutcome::Pending => Ok(Some(key)),
            DeleteOutcome::Deleted | DeleteOutcome::NotFound => Ok(None),
        }
    }

    /// Acknowledges `event` (a delete) once the copy `key` is gone; at once if it already is.
    pub(super) fn ack_when_gone(&self, key: String, event: &Event) {
        let (ns, name) = match key.split_once('/') {
            Some((ns, name)) => (ns.to_owned(), name.to_owned()),
            None => (self.namespace.as_str().to_owned(), key.clone()),
        };
        tracing::info!(name = %key, "copy held by finalizers: acknowledged once the spoke's Argo CD has deleted it");
        self.deletes.wait_for(key.clone(), event.clone());
        // Gone meanwhile (the watch reported it before the entry above existed).
        if self.cache.get(Some(ns.as_str()), &name).is_none() {
            self.deleted_locally(&key);
        }
    }

    /// A local copy is gone: a delete waiting for that is acknowledged now.
    pub(super) fn deleted_locally(&self, key: &str) {
        let Some(event) = self.deletes.gone(key) else {
            return;
        };
        if self.session.send_late(event.ack(&self.source)).is_err() {
            // No session, or its channel full: the principal sends the delete again and
            // finds the copy gone.
            tracing::debug!(name = %key, "late acknowledgement not sent");
        }
    }

    /// The current session's channel for answers that come later than their event.
    pub(crate) fn set_late_replies(&self, tx: Option<tokio::sync::mpsc::Sender<Event>>) {
        self.session.set_late_replies(tx);
    }

    /// Handles one event from the principal. Returns the reply to send, if any.
    pub async fn on_principal_event(&self, event: &Event) -> Option<Event> {
        let resource = event.resource.as_ref()?;
        if resource.kind != ResourceKind::Application {
            return self.on_config_event(event, resource).await;
        }
        if self.across_namespaces()
            && self.hub_namespace().is_some()
            && let Some(result) = outside_allowed(&self.allowed, event, resource)
        {
            if result.is_ok() {
                tracing::info!(object = %resource, "delete of an application in a namespace this agent does not take: nothing to delete");
            }
            return Some(self.answer(event, resource, result));
        }
        let planned = plan(
            self.mode,
            self.hub_namespace().as_ref(),
            self.across_namespaces(),
            event,
        );
        if matches!(planned, Ok(Command::Upsert(_) | Command::SetOperation(_)))
            && let Some(refusal) = self.guard_app_event(event)
        {
            return Some(self.refuse_app_event(event, resource, refusal));
        }
        let result = match planned {
            Ok(Command::Republish) => {
                self.republish(&resource.name);
                return None;
            }
            Ok(Command::ReportStatus) => {
                self.report_status_again(resource);
                return None;
            }
            Ok(Command::Delete) => {
                let span = tracing::info_span!("agent.apply", command = "delete");
                match self.delete_copy(resource).instrument(span).await {
                    Ok(Some(key)) => {
                        self.ack_when_gone(key, event);
                        return None;
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Ok(command) => {
                let span = tracing::info_span!("agent.apply", command = command.name());
                let upsert = matches!(command, Command::Upsert(_));
                let result = self.apply(resource, command).instrument(span).await;
                if upsert && result.is_ok() {
                    self.guard_accepted_app(resource);
                }
                result
            }
            Err(e) => Err(e),
        };
        Some(self.answer(event, resource, result))
    }

    /// The answer to an event from the principal: `processed`, or an `error` naming the
    /// object (never the payload, which may be a Secret) and the cause.
    pub(crate) fn answer(
        &self,
        event: &Event,
        resource: &ResourceRef,
        result: Result<(), SpokeError>,
    ) -> Event {
        match result {
            Ok(()) => event.ack(&self.source),
            Err(e) => {
                let message = argocd_agent_domain::error_chain(&e);
                tracing::warn!(object = %resource, r#type = %event.ty, error = %message, "could not apply event");
                let reason = match e {
                    SpokeError::WrongNamespace(_) => "Forbidden",
                    SpokeError::NamespaceNotPermitted { .. } => {
                        self.metrics.refused("namespace_not_permitted");
                        "Forbidden"
                    }
                    SpokeError::NamespaceMissing(_) => {
                        self.metrics.refused("namespace_missing");
                        "ApplyFailed"
                    }
                    _ => "ApplyFailed",
                };
                event.error_reply(&self.source, reason, message)
            }
        }
    }

    /// Autonomous: the principal asks for one application again, by hub name.
    pub(super) fn republish(&self, hub: &str) {
        self.sent.forget_object(hub);
        let local = self
            .hub_owner(hub)
            .and_then(|(ns, name)| self.cache.get(Some(&ns), &name));
        match local {
            Some(obj) if !is_being_deleted(&obj) => self.publish(&obj),
            _ => self.push_delete(hub),
        }
    }

    pub(super) async fn apply(
        &self,
        resource: &ResourceRef,
        command: Command,
    ) -> Result<(), SpokeError> {
        let (ns, name) = self.local_target(resource);
        let (ns, name) = (ns.as_str(), name.as_str());
        match command {
            Command::Upsert(obj) => self.apply_upsert(ns, name, obj).await,
            Command::Refresh(value) => {
                self.apps
                    .patch_merge(
                        Some(ns),
                        name,
                        &json!({"metadata": {"annotations": {object::REFRESH_ANNOTATION: value}}}),
                    )
                    .instrument(spoke_write_span("refresh", ns, name))
                    .await?;
                Ok(())
            }
            Command::Delete => self.delete_copy(resource).await.map(|_| ()),
            Command::SetOperation(op) => {
                self.apps
                    .patch_merge(Some(ns), name, &json!({"operation": op}))
                    .instrument(spoke_write_span("set-operation", ns, name))
                    .await?;
                Ok(())
            }
            Command::TerminateOperation => {
                self.apps
                    .terminate_operation(ns, name)
                    .instrument(spoke_write_span("terminate-operation", ns, name))
                    .await?;
                Ok(())
            }
            Command::Republish | Command::ReportStatus => Ok(()),
        }
    }
    /// Managed: writes the principal's object as the local copy `ns`/`name`.
    pub(super) async fn apply_upsert(
        &self,
        ns: &str,
        name: &str,
        obj: Arc<Value>,
    ) -> Result<(), SpokeError> {
        let key = self.key_for(ns, name);
        let local = self.cache.get(Some(ns), name);
        if local.is_none() && self.across_namespaces() && self.create_namespace {
            self.ensure_namespace(ns).await?;
        }
        // What local changes are reverted to from now on, set before a recreate
        // deletes the local copy: the watch may report that deletion (and revert
        // it) before the delete call returns here, and a revert to the previous
        // object would overwrite this write.
        let previous = self.desired.record(key.clone(), obj.clone());
        let deleted = match self.prepare_write(&*self.apps, local, &obj).await {
            Ok(deleted) => deleted,
            Err(e) => {
                self.desired.restore(key, previous);
                return Err(e);
            }
        };
        let known = if deleted {
            Known::Unknown
        } else {
            self.cache.known(Some(ns), name)
        };
        if let Err(e) = self.upsert_local(&obj, ns, known).await {
            return Err(self.explain_write_error(ns, e).await);
        }
        if let Some(v) = object::annotation_of(&obj, object::REFRESH_ANNOTATION) {
            self.desired.note_refresh_applied(key, v.to_owned());
        }
        Ok(())
    }

    /// `--create-namespace`: creates namespace `ns` unless it exists.
    pub(super) async fn ensure_namespace(&self, ns: &str) -> Result<(), SpokeError> {
        let Some(api) = &self.namespace_api else {
            return Ok(());
        };
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        }))
        .map_err(SpokeError::NotAnObject)?;
        match api.create(&obj).await {
            Ok(_) => {
                tracing::info!(
                    namespace = ns,
                    "created namespace for a managed application"
                );
                Ok(())
            }
            Err(e) if e.is_already_exists() => Ok(()),
            Err(source) => Err(SpokeError::CreateNamespace {
                namespace: ns.to_owned(),
                source: Box::new(source),
            }),
        }
    }

    /// A write of a copy in `ns` the API server answered "not found": said as a missing
    /// namespace when that is why.
    pub(super) async fn explain_write_error(&self, ns: &str, e: SpokeError) -> SpokeError {
        let not_found = matches!(&e, SpokeError::Kube(k) if k.is_not_found());
        match &self.namespace_api {
            Some(api) if not_found && self.across_namespaces() => match api.get(None, ns).await {
                Ok(None) => SpokeError::NamespaceMissing(ns.to_owned()),
                _ => e,
            },
            _ => e,
        }
    }
}
