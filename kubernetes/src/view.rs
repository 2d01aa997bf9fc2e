//! The read side of a backend: [`ObjectView`], what a watch has seen of one kind of
//! object, read without a request.
//!
//! [`Cache`] is the implementation, fed by the API server's [`crate::watch`] or by hand
//! through a [`crate::Feed`] (the in-memory store feeds one that way). The principal's and
//! the agent's logic read through `Arc<dyn ObjectView>`.

use std::sync::Arc;

use kube::api::DynamicObject;

use crate::Kind;
use crate::lease::CompactLease;
use crate::store::Known;
use crate::watch::Cache;

/// The objects of one kind a watch has seen, kept current as its changes arrive.
#[async_trait::async_trait]
pub trait ObjectView: Send + Sync {
    /// The kind of object held.
    fn kind(&self) -> Kind;

    /// The object `namespace/name` (`namespace` is `None` for cluster-scoped kinds).
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>>;

    /// Every object, ordered by namespace then name.
    fn list(&self) -> Vec<Arc<DynamicObject>>;

    /// The Lease `namespace/name` in typed fields (for a view of Leases: it reads what a
    /// Lease says without rebuilding the object from the compact form it is kept in).
    fn lease(&self, namespace: Option<&str>, name: &str) -> Option<Arc<CompactLease>> {
        self.get(namespace, name)
            .map(|o| Arc::new(CompactLease::read(&o)))
    }

    /// The Leases of one namespace in typed fields, ordered by name (see
    /// [`ObjectView::lease`]).
    fn leases(&self, namespace: &str) -> Vec<Arc<CompactLease>> {
        self.list_namespace(namespace)
            .iter()
            .map(|o| Arc::new(CompactLease::read(o)))
            .collect()
    }

    /// The objects of one namespace, ordered by name.
    fn list_namespace(&self, namespace: &str) -> Vec<Arc<DynamicObject>>;

    /// Number of objects held.
    fn len(&self) -> usize;

    /// True when nothing is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once everything watched has been listed once.
    fn is_synced(&self) -> bool;

    /// Waits until [`ObjectView::is_synced`] (someone must be feeding the view).
    async fn wait_synced(&self);

    /// What is known of `namespace/name` for a write (see
    /// [`crate::ObjectStore::upsert_copy_known`]).
    fn known(&self, namespace: Option<&str>, name: &str) -> Known;

    /// The spec checksum of `obj`, computed once per held version.
    fn spec_checksum(&self, obj: &Arc<DynamicObject>) -> String;

    /// The metadata checksum of `obj`, computed once per held version.
    fn metadata_checksum(&self, obj: &Arc<DynamicObject>) -> String;

    /// `obj` as a managed copy receives it, for an event's payload: its JSON written at
    /// most once per held version and shared by every event that sends that version (see
    /// [`Cache::managed_json`]).
    fn managed_json(&self, obj: &Arc<DynamicObject>) -> argocd_agent_domain::LazyObject;

    /// The weight of `obj` as received (for a stub, of the object it stands for).
    fn object_size(&self, obj: &Arc<DynamicObject>) -> usize;

    /// Whether `obj` is a stub kept for an object too large to hold.
    fn is_stub(&self, obj: &Arc<DynamicObject>) -> bool;

    /// From now on, objects for which `applies` holds and heavier than `max` are kept as
    /// stubs (see [`Cache::stub_oversized`]).
    fn stub_oversized(&self, max: usize, applies: fn(&DynamicObject) -> bool);

    /// From now on, objects of namespaces nobody holds are kept compact (see
    /// [`Cache::shard`]). Views that do not shard ignore it.
    fn shard(&self) {}

    /// Keeps `namespace`'s objects decoded until as many [`ObjectView::unhold`]s (see
    /// [`Cache::hold`]).
    fn hold(&self, _namespace: &str) {}

    /// Undoes one [`ObjectView::hold`].
    fn unhold(&self, _namespace: &str) {}

    /// How many objects are kept decoded and how many compact.
    fn forms(&self) -> (usize, usize) {
        (self.len(), 0)
    }
}

#[async_trait::async_trait]
impl ObjectView for Cache {
    fn kind(&self) -> Kind {
        Cache::kind(self)
    }
    fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<DynamicObject>> {
        Cache::get(self, namespace, name)
    }
    fn list(&self) -> Vec<Arc<DynamicObject>> {
        Cache::list(self)
    }
    fn lease(&self, namespace: Option<&str>, name: &str) -> Option<Arc<CompactLease>> {
        Cache::lease(self, namespace, name)
    }
    fn leases(&self, namespace: &str) -> Vec<Arc<CompactLease>> {
        Cache::leases(self, namespace)
    }
    fn list_namespace(&self, namespace: &str) -> Vec<Arc<DynamicObject>> {
        Cache::list_namespace(self, namespace)
    }
    fn len(&self) -> usize {
        Cache::len(self)
    }
    fn is_synced(&self) -> bool {
        Cache::is_synced(self)
    }
    async fn wait_synced(&self) {
        Cache::wait_synced(self).await;
    }
    fn known(&self, namespace: Option<&str>, name: &str) -> Known {
        Cache::known(self, namespace, name)
    }
    fn spec_checksum(&self, obj: &Arc<DynamicObject>) -> String {
        Cache::spec_checksum(self, obj)
    }
    fn metadata_checksum(&self, obj: &Arc<DynamicObject>) -> String {
        Cache::metadata_checksum(self, obj)
    }
    fn managed_json(&self, obj: &Arc<DynamicObject>) -> argocd_agent_domain::LazyObject {
        Cache::managed_json(self, obj)
    }
    fn object_size(&self, obj: &Arc<DynamicObject>) -> usize {
        Cache::object_size(self, obj)
    }
    fn is_stub(&self, obj: &Arc<DynamicObject>) -> bool {
        Cache::is_stub(self, obj)
    }
    fn stub_oversized(&self, max: usize, applies: fn(&DynamicObject) -> bool) {
        Cache::stub_oversized(self, max, applies)
    }
    fn shard(&self) {
        Cache::shard(self)
    }
    fn hold(&self, namespace: &str) {
        Cache::hold(self, namespace)
    }
    fn unhold(&self, namespace: &str) {
        Cache::unhold(self, namespace)
    }
    fn forms(&self) -> (usize, usize) {
        Cache::forms(self)
    }
}
