//! Changes to the spoke's own Applications (from its watch): reverted, republished or
//! reported, by mode; and the writes of local copies.

use super::*;

impl Spoke {
    /// Handles a change of a local Application.
    /// Span `agent.local_change`: the root of the trace of what the change sends up
    /// (status, or an autonomous agent's object).
    pub async fn on_local_change(&self, change: Change) {
        let (obj, deleted) = match change {
            Change::Applied(o) => (o, false),
            Change::Deleted(o) => (o, true),
            Change::Synced => return,
        };
        if !self.takes_namespace(obj.metadata.namespace.as_deref().unwrap_or_default()) {
            return;
        }
        if deleted {
            self.deleted_locally(&self.key_of(&obj));
        }
        let span = tracing::info_span!(parent: None, "agent.local_change",
            source = %self.source,
            "object.kind" = ResourceKind::Application.as_str(),
            "object.namespace" = obj.metadata.namespace.as_deref().unwrap_or_default(),
            "object.name" = obj.metadata.name.as_deref().unwrap_or_default(),
            change = if deleted { "deleted" } else { "applied" });
        async {
            match self.mode {
                AgentMode::Managed => {
                    let has_desired = self.desired.contains(&self.key_of(&obj));
                    if self.is_child_candidate(&obj, has_desired) {
                        self.on_child_change(&obj, deleted).await;
                    } else {
                        self.on_managed_change(&obj, deleted).await;
                        self.after_parent_change(&obj, deleted);
                    }
                }
                AgentMode::Autonomous => self.on_autonomous_change(&obj, deleted),
            }
        }
        .instrument(span)
        .await
    }

    /// Managed: local edits and deletions are reverted; status goes up.
    pub(super) async fn on_managed_change(&self, obj: &DynamicObject, deleted: bool) {
        let name = self.key_of(obj);
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let desired = self.desired.get(&name);
        let Some(desired) = desired else { return };
        if is_being_deleted(obj) && !deleted {
            return;
        }
        let what = if deleted {
            "deletion"
        } else if spec_checksum(obj)
            != object::checksum_of(desired.get("spec").unwrap_or(&Value::Null))
            || !is_managed_copy(obj)
            || hub_metadata(&wire(obj)) != hub_metadata(&desired)
        {
            "edit"
        } else {
            let refreshed = self.refresh_done(&name, obj);
            self.report_status_with(obj, refreshed);
            return;
        };
        tracing::info!(name = %name, "reverting local {what} of managed application");
        let known = self.cache.known(Some(&ns), &name_of(obj));
        match self.upsert_local(&desired, &ns, known).await {
            Ok(()) if deleted => self.after_recreate(&ns, &name_of(obj)).await,
            Ok(()) => {}
            Err(e) => tracing::warn!(name = %name, error = %e, "could not revert local {what}"),
        }
        if !deleted {
            self.report_status(obj);
        }
    }

    /// `--on-application-recreate`: what follows the recreation of a locally deleted
    /// Application.
    pub(super) async fn after_recreate(&self, ns: &str, name: &str) {
        let ns = Some(ns);
        let result = match self.policies.on_recreate {
            RecreateAction::Ignore => return,
            RecreateAction::ClearStatus => match self.apps.get(ns, name).await {
                Ok(Some(cur)) => match object::status(&cur) {
                    Some(status) if status.get("operationState").is_some() => {
                        let mut status = status.clone();
                        if let Some(m) = status.as_object_mut() {
                            m.remove("operationState");
                        }
                        self.apps.replace_status(ns, name, status).await.map(|_| ())
                    }
                    _ => Ok(()),
                },
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
            RecreateAction::Resync => self
                .apps
                .patch_merge(
                    ns,
                    name,
                    &json!({"operation": {"initiatedBy": {"username": "argocd-agent"}, "sync": {}}}),
                )
                .await
                .map(|_| ()),
        };
        match result {
            Ok(()) => {
                tracing::info!(%name, action = %self.policies.on_recreate, "recreated application handled")
            }
            Err(e) => {
                tracing::warn!(%name, action = %self.policies.on_recreate, error = %argocd_agent_domain::error_chain(&e), "could not handle recreated application")
            }
        }
    }

    /// Managed: before the principal's object is written over a local one, applies the
    /// adoption and source-UID mismatch policies ([`policy::plan_write`]). Returns whether
    /// it deleted the local object (the watch cache still holds it until the watch says so).
    pub(crate) async fn prepare_write(
        &self,
        resources: &dyn ObjectStore,
        local: Option<Arc<DynamicObject>>,
        incoming: &Value,
    ) -> Result<bool, SpokeError> {
        let is_ours = local.as_deref().is_some_and(is_managed_copy);
        match policy::plan_write(&self.policies, local.as_deref(), is_ours, incoming) {
            WritePlan::Upsert => Ok(false),
            WritePlan::Refuse(why) => Err(SpokeError::AdoptionRefused(why)),
            WritePlan::Recreate => {
                let name = local.as_deref().map(name_of).unwrap_or_default();
                let ns = local
                    .as_deref()
                    .and_then(|l| l.metadata.namespace.clone())
                    .unwrap_or_else(|| self.namespace.to_string());
                tracing::info!(kind = %resources.kind(), %name, "the hub object was recreated: recreating the local copy");
                match resources.delete(Some(&ns), &name).await {
                    Ok(_) => Ok(true),
                    Err(e) if e.is_not_found() => Ok(true),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Autonomous: every local change is published, under the Application's hub name.
    pub(super) fn on_autonomous_change(&self, obj: &DynamicObject, deleted: bool) {
        if argocd_agent_kubernetes::is_sync_ignored(obj) {
            return;
        }
        let hub = match self.hub_key(obj) {
            Ok(hub) => hub,
            Err(why) => {
                if !deleted {
                    self.report_unpublished(obj, &why);
                }
                return;
            }
        };
        if deleted {
            self.sent.forget_object(&hub);
            // The hub name passes to another namespace's Application (`x`/`y` once the Argo
            // CD namespace's `x.y` is gone), or the hub copy goes.
            let next = self
                .hub_owner(&hub)
                .and_then(|(ns, name)| self.cache.get(Some(&ns), &name))
                .filter(|o| !is_being_deleted(o) && !argocd_agent_kubernetes::is_sync_ignored(o));
            match next {
                Some(next) => self.publish(&next),
                None => self.push_delete(&hub),
            }
            return;
        }
        if !is_being_deleted(obj) {
            self.warn_takeover(obj, &hub);
            self.publish(obj);
        }
    }

    /// Autonomous: an Application of the Argo CD namespace published for the first time
    /// under a hub name another namespace's Application had: that one is published no more.
    pub(super) fn warn_takeover(&self, obj: &DynamicObject, hub: &str) {
        if obj.metadata.namespace.as_deref() != Some(self.namespace.as_str())
            || self.sent.has_object(hub)
        {
            return;
        }
        if let Some((ns, name)) = namespaces::split_hub_name(hub)
            && ns != self.namespace.as_str()
            && self.allowed.allows(ns)
            && self.cache.get(Some(ns), name).is_some()
        {
            self.metrics.refused("name_collision");
            tracing::warn!(hub_name = %hub, namespace = ns, %name,
                "the Argo CD namespace's application takes the hub name: the other namespace's application is not published");
        }
    }

    /// Creates or updates the local copy of a managed Application from the principal's object.
    /// `known` is what the watch cache says of the local object ([`Known::Unknown`] when the
    /// cache cannot be trusted, e.g. right after this agent deleted it).
    pub(super) async fn upsert_local(
        &self,
        incoming: &Value,
        ns: &str,
        known: Known,
    ) -> Result<(), SpokeError> {
        let mut copy = object::received_copy(incoming, ns, (MANAGED_LABEL, "true"))
            .map_err(SpokeError::NotAnObject)?;
        if name_of(&copy).is_empty() {
            return Err(SpokeError::NoName);
        }
        // Status is the spoke's own; the operation comes as its own event. The hub's
        // notification state and last-applied record are the hub's: the spoke keeps its own.
        if let Some(a) = copy.metadata.annotations.as_mut() {
            a.retain(|k, _| !object::side_local_key(k));
        }
        object::take_field(&mut copy, "status");
        object::take_field(&mut copy, "operation");
        self.apps
            .upsert_copy_keeping(&copy, &["spec"], known, &object::spoke_owned_key)
            .instrument(spoke_write_span("upsert", ns, &name_of(&copy)))
            .await?;
        Ok(())
    }

    pub(super) async fn delete_local(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<DeleteOutcome, SpokeError> {
        match self
            .apps
            .delete(Some(ns), name)
            .instrument(spoke_write_span("delete", ns, name))
            .await
        {
            Ok(outcome) => Ok(outcome),
            Err(e) if e.is_not_found() => Ok(DeleteOutcome::NotFound),
            Err(e) => Err(e.into()),
        }
    }
}
