//! App-of-apps on a managed spoke: the Applications a parent Application (a managed copy)
//! creates on this cluster, published to the hub as read-only copies.
//!
//! A child is a local Application in the agent's Argo CD namespace that is not a managed
//! copy and that Argo CD tracks as a resource of a managed copy held here: its tracking-id
//! annotation or instance label (per argocd-cm's tracking settings, as the resource proxy
//! reads them) names that parent. The agent publishes each child, status included, with
//! [`PARENT_ANNOTATION`]; the principal writes it into this agent's hub namespace, never
//! over an Application created on the hub, and reverts hub edits to it. A child deleted
//! here (pruned by its parent, say), or no longer tracked by a managed parent, is deleted on
//! the hub. The hello lists the children under [`CHILD_APPLICATION_KIND`], so the principal
//! deletes the hub copies of children that went while this agent was away; after each
//! welcome every child is published again.
//!
//! Not covered: children with destination-based mapping (the agent then watches only
//! managed copies), and grandchildren (a child that is itself a parent: its own children
//! track a spoke-authored Application, not a managed copy).

use std::collections::HashMap;
use std::sync::Arc;

use argocd_agent_domain::resync::{CHILD_APPLICATION_KIND, Checksums};
use argocd_agent_domain::{AgentMode, Event, EventType, Payload};
use argocd_agent_kubernetes::object::{self, PARENT_ANNOTATION, is_being_deleted};
use argocd_agent_proto::eventstream::ResourceChecksum;
use kube::api::DynamicObject;
use serde_json::{Value, json};

use crate::managed::{is_managed_copy, lock, name_of};
use crate::proxy::rules::Tracking;
use crate::spoke::Spoke;

/// The children state.
pub(crate) mod state;

use state::ChildState;

impl Spoke {
    fn children(&self) -> std::sync::MutexGuard<'_, ChildState> {
        lock(&self.children)
    }

    /// Whether children are looked for at all: managed agents with namespace mapping,
    /// unless `--ignore-unmanaged-apps`.
    fn has_children(&self) -> bool {
        self.mode == AgentMode::Managed && !self.by_destination && !self.ignore_unmanaged_apps
    }

    /// Reads the spoke's tracking settings again (through the resource proxy's cache of
    /// argocd-cm when the agent serves it; Argo CD's defaults otherwise). Only when a local
    /// Application that is not a managed copy changes: until then the hello and the
    /// after-welcome publish use what was read last (Argo CD's defaults at first, which
    /// accept both the tracking annotation and the instance label).
    pub(crate) async fn refresh_tracking(&self) {
        if !self.has_children() {
            return;
        }
        let tracking = match &self.proxy {
            Some(p) => p.tracking().await,
            None => Tracking::default(),
        };
        self.children().tracking = Some(tracking);
    }

    fn tracking(&self) -> Tracking {
        self.children().tracking.clone().unwrap_or_default()
    }

    /// Whether `obj` (a local Application with no desired state from the principal) is
    /// handled here rather than as a managed copy.
    pub(crate) fn is_child_candidate(&self, obj: &DynamicObject, has_desired: bool) -> bool {
        self.has_children()
            && !has_desired
            && !is_managed_copy(obj)
            && obj.metadata.namespace.as_deref() == Some(self.namespace.as_str())
    }

    /// The managed copy that tracks `obj` as one of its resources, if any; otherwise the
    /// names its tracking points at.
    fn parent_of(&self, obj: &DynamicObject, tracking: &Tracking) -> Result<String, Vec<String>> {
        let metadata = serde_json::to_value(&obj.metadata).unwrap_or(Value::Null);
        let named = tracking.app_names(&metadata);
        let ns = self.namespace.as_str();
        named
            .iter()
            // Argo CD names an Application in its own namespace by its name alone.
            .find(|p| {
                **p != name_of(obj)
                    && self
                        .cache
                        .get(Some(ns), p)
                        .is_some_and(|o| is_managed_copy(&o) && !is_being_deleted(&o))
            })
            .map(|p| (*p).to_owned())
            .ok_or_else(|| named.iter().map(|n| (*n).to_owned()).collect())
    }

    /// A local Application that is not a managed copy changed (or went).
    pub(crate) async fn on_child_change(&self, obj: &DynamicObject, deleted: bool) {
        self.refresh_tracking().await;
        self.consider_child(obj, deleted);
    }

    fn consider_child(&self, obj: &DynamicObject, deleted: bool) {
        let name = name_of(obj);
        if deleted || argocd_agent_kubernetes::is_sync_ignored(obj) {
            self.unpublish_child(&name);
            // Nothing waits for a parent on its behalf any more.
            self.children().waiting.retain(|_, names| {
                names.remove(&name);
                !names.is_empty()
            });
            return;
        }
        match self.parent_of(obj, &self.tracking()) {
            Ok(parent) => {
                // A child being deleted (its finalizers at work) goes from the hub once gone.
                if !is_being_deleted(obj) {
                    self.publish_child(obj, &parent);
                }
            }
            Err(tracked) => {
                self.unpublish_child(&name);
                let mut children = self.children();
                for t in tracked {
                    children.waiting.entry(t).or_default().insert(name.clone());
                }
            }
        }
    }

    /// A managed copy changed: Applications waiting for it as their parent are looked at
    /// again; when it is gone, so are the children it had.
    pub(crate) fn after_parent_change(&self, parent: &DynamicObject, deleted: bool) {
        if !self.has_children() || !is_managed_copy(parent) {
            return;
        }
        let name = name_of(parent);
        let affected: Vec<String> = {
            let mut children = self.children();
            let mut names: Vec<String> = children
                .waiting
                .remove(&name)
                .unwrap_or_default()
                .into_iter()
                .collect();
            if deleted || is_being_deleted(parent) {
                names.extend(
                    children
                        .sent
                        .iter()
                        .filter(|(_, (p, _))| *p == name)
                        .map(|(c, _)| c.clone()),
                );
            }
            names
        };
        for child in affected {
            match self.cache.get(Some(self.namespace.as_str()), &child) {
                Some(obj) if !is_managed_copy(&obj) => self.consider_child(&obj, false),
                Some(_) => {}
                None => self.unpublish_child(&child),
            }
        }
    }

    fn publish_child(&self, obj: &DynamicObject, parent: &str) {
        let name = name_of(obj);
        let Some(hub_ns) = self.hub_namespace() else {
            return;
        };
        let mut w = serde_json::to_value(object::strip_for_transfer(obj)).unwrap_or(Value::Null);
        w["metadata"]["namespace"] = Value::String(hub_ns.to_string());
        if !w["metadata"]["annotations"].is_object() {
            w["metadata"]["annotations"] = json!({});
        }
        w["metadata"]["annotations"][PARENT_ANNOTATION] = Value::String(parent.to_owned());
        let sum = object::checksum_of(&w);
        let previous = self
            .children()
            .sent
            .insert(name.clone(), (parent.to_owned(), sum.clone()));
        if previous.is_some_and(|(_, s)| s == sum) {
            return;
        }
        tracing::debug!(%name, %parent, "publishing spoke-authored child application");
        self.push(Event::resource(
            &self.source,
            EventType::SpecUpdate,
            argocd_agent_domain::ResourceRef::new(
                argocd_agent_domain::ResourceKind::Application,
                hub_ns,
                &name,
            ),
            Payload::Object(Arc::new(w)),
        ));
    }

    /// Deletes the hub copy of a child this agent published (the delete names the parent,
    /// so the principal takes it as a child's and never deletes a hub-authored object).
    fn unpublish_child(&self, name: &str) {
        let Some((parent, _)) = self.children().sent.remove(name) else {
            return;
        };
        self.push_child_delete(name, &parent);
    }

    fn push_child_delete(&self, name: &str, parent: &str) {
        let Some(hub_ns) = self.hub_namespace() else {
            return;
        };
        tracing::debug!(%name, %parent, "spoke-authored child application gone");
        self.push(Event::resource(
            &self.source,
            EventType::Delete,
            argocd_agent_domain::ResourceRef::new(
                argocd_agent_domain::ResourceKind::Application,
                hub_ns,
                name,
            ),
            Payload::Object(Arc::new(json!({
                "metadata": {"name": name, "annotations": {PARENT_ANNOTATION: parent}}
            }))),
        ));
    }

    /// The children this spoke holds now, by name: their parent and the local object.
    fn current_children(&self) -> HashMap<String, (String, Arc<DynamicObject>)> {
        if !self.has_children() {
            return HashMap::new();
        }
        let tracking = self.tracking();
        self.cache
            .list_namespace(self.namespace.as_str())
            .into_iter()
            .filter(|o| {
                !is_managed_copy(o)
                    && !is_being_deleted(o)
                    && !argocd_agent_kubernetes::is_sync_ignored(o)
            })
            .filter_map(|o| {
                let parent = self.parent_of(&o, &tracking).ok()?;
                Some((name_of(&o), (parent, o)))
            })
            .collect()
    }

    /// The hello's entries for the children held now (remembered until the welcome).
    pub(crate) fn children_hello(&self) -> Vec<ResourceChecksum> {
        let current = self.current_children();
        let sums: Checksums = current
            .iter()
            .map(|(n, (_, o))| (n.clone(), object::spec_checksum(o)))
            .collect();
        self.children().hello = current.into_iter().map(|(n, (p, _))| (n, p)).collect();
        argocd_agent_domain::resync::to_state(CHILD_APPLICATION_KIND, &sums).resources
    }

    /// After a welcome: every child is published again (the principal deleted the hub
    /// copies of those the hello did not list); one published or listed before that is no
    /// longer a child is deleted on the hub now.
    pub(crate) fn publish_children(&self) {
        if !self.has_children() {
            return;
        }
        let current = self.current_children();
        let known = {
            let mut children = self.children();
            let mut known = std::mem::take(&mut children.hello);
            known.extend(
                std::mem::take(&mut children.sent)
                    .into_iter()
                    .map(|(n, (p, _))| (n, p)),
            );
            known
        };
        for (parent, obj) in current.values() {
            self.publish_child(obj, parent);
        }
        for (name, parent) in known {
            if !current.contains_key(&name) {
                self.push_child_delete(&name, &parent);
            }
        }
    }
}
