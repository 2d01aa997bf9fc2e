//! An in-memory backend for tests (feature `memory`): [`MemoryStore`] keeps one kind of
//! object in a map and behaves as the API server does where the logic depends on it.
//!
//! - Objects are keyed by namespace and name; every write takes the next
//!   `resourceVersion`, creates get a `uid`, `generation` 1 and a `creationTimestamp`.
//! - A replace carrying a `resourceVersion` other than the stored one is a
//!   [`Error::Conflict`] (optimistic concurrency); so is a merge patch that carries one.
//! - Kinds with a status subresource (Application, Namespace) keep `.status` on creates,
//!   replaces and patches of the object; only the status writes change it. `generation`
//!   grows when anything but metadata and status changes.
//! - A delete of an object with finalizers sets `deletionTimestamp` and keeps it
//!   ([`DeleteOutcome::Pending`]); the write that removes the last finalizer deletes it.
//! - A write that changes nothing is not a write (no new `resourceVersion`, no event).
//!
//! [`MemoryStore::watch`] gives the same [`Cache`] and [`Change`] stream a watch of the API
//! server gives (through a [`Feed`]): the current objects, `Synced`, then every write as it
//! is made. The cache is updated by the write itself, before the write returns. Label
//! selectors other than the ignore-sync exclusion are not evaluated.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt};
use kube::api::DynamicObject;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::error::ObjectRef;
use crate::object::is_being_deleted;
use crate::scope::{Namespaces, Scope, is_sync_ignored};
use crate::store::{DeleteOutcome, ObjectStore};
use crate::watch::{Cache, Change, Feed};
use crate::{Error, Kind};

type Key = (String, String);

/// One watch of a [`MemoryStore`].
struct Watcher {
    namespaces: Namespaces,
    /// The scope's label selector (empty: every object).
    selector: String,
    feed: Feed,
    tx: mpsc::UnboundedSender<Change>,
}

impl Watcher {
    fn covers(&self, namespace: &str) -> bool {
        match &self.namespaces {
            Namespaces::All => true,
            Namespaces::One(ns) => ns == namespace,
            Namespaces::Set(set) => set.iter().any(|ns| ns == namespace),
        }
    }

    fn selects(&self, obj: &DynamicObject) -> bool {
        selector_matches(&self.selector, obj.metadata.labels.as_ref())
    }
}

#[derive(Default)]
struct State {
    objects: BTreeMap<Key, DynamicObject>,
    revision: u64,
    uids: u64,
    watchers: Vec<Watcher>,
}

impl State {
    /// Tells every watcher covering the object; watchers whose stream is gone are dropped.
    fn announce(&mut self, obj: &DynamicObject, deleted: bool) {
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        self.watchers.retain(|w| {
            if !w.covers(&ns) && !ns.is_empty() {
                return true;
            }
            // An object that leaves the selector is gone from the watch, as the API server's
            // watch of a label selector has it.
            let change = if deleted || !w.selects(obj) {
                w.feed.deleted(obj.clone())
            } else {
                w.feed.applied(obj.clone())
            };
            change.is_none_or(|c| w.tx.send(c).is_ok())
        });
    }
}

/// One kind of object held in memory: an [`ObjectStore`] with the API server's concurrency,
/// status and finalizer rules, and watches fed from its writes. Clones share the objects.
#[derive(Clone)]
pub struct MemoryStore {
    kind: Kind,
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("kind", &self.kind)
            .finish()
    }
}

/// A Secret's `stringData` merged into its `data` (base64) on write, as the API server does:
/// `stringData` is write-only and wins over `data` for the same key.
fn merge_string_data(kind: Kind, obj: &mut DynamicObject) {
    if kind != Kind::Secret {
        return;
    }
    let Some(m) = obj.data.as_object_mut() else {
        return;
    };
    let Some(Value::Object(string_data)) = m.remove("stringData") else {
        return;
    };
    if !m.get("data").is_some_and(Value::is_object) {
        m.insert("data".into(), Value::Object(Default::default()));
    }
    if let Some(Value::Object(data)) = m.get_mut("data") {
        for (k, v) in string_data {
            let bytes = k8s_openapi::ByteString(v.as_str().unwrap_or_default().as_bytes().to_vec());
            if let Ok(encoded) = serde_json::to_value(bytes) {
                data.insert(k, encoded);
            }
        }
    }
}

/// Whether `labels` match a label selector (Kubernetes' syntax, comma-separated terms:
/// `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`); the empty selector
/// matches everything, a term it cannot read matches nothing.
fn selector_matches(selector: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
    let empty = BTreeMap::new();
    let labels = labels.unwrap_or(&empty);
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&selector[start..]);
    terms
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|t| term_matches(t, labels))
}

fn term_matches(term: &str, labels: &BTreeMap<String, String>) -> bool {
    let set = |rest: &str| -> Option<Vec<String>> {
        let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
        Some(inner.split(',').map(|v| v.trim().to_owned()).collect())
    };
    if let Some(key) = term.strip_prefix('!') {
        return !labels.contains_key(key.trim());
    }
    if let Some((key, rest)) = term.split_once(" notin ") {
        return set(rest).is_some_and(|vs| labels.get(key.trim()).is_none_or(|v| !vs.contains(v)));
    }
    if let Some((key, rest)) = term.split_once(" in ") {
        return set(rest).is_some_and(|vs| labels.get(key.trim()).is_some_and(|v| vs.contains(v)));
    }
    if let Some((key, value)) = term.split_once("!=") {
        return labels.get(key.trim()).is_none_or(|v| v != value.trim());
    }
    if let Some((key, value)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return labels.get(key.trim()).is_some_and(|v| v == value.trim());
    }
    labels.contains_key(term)
}

/// Whether `kind` has a `/status` subresource (the main resource's writes keep `.status`).
fn has_status_subresource(kind: Kind) -> bool {
    matches!(kind, Kind::Application | Kind::Namespace)
}

fn key_of(obj: &DynamicObject) -> Key {
    (
        obj.metadata.namespace.clone().unwrap_or_default(),
        obj.metadata.name.clone().unwrap_or_default(),
    )
}

/// The part of an object `generation` counts: everything but metadata and status.
fn content(obj: &DynamicObject) -> Value {
    let mut data = obj.data.clone();
    if let Some(m) = data.as_object_mut() {
        m.remove("status");
        m.remove("metadata");
    }
    data
}

/// Now, as a Kubernetes timestamp (RFC 3339, seconds).
fn now() -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let days = i64::try_from(secs / 86_400).unwrap_or_default();
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    );
    serde_json::from_value(Value::String(text)).ok()
}

impl MemoryStore {
    /// An empty store of `kind`.
    pub fn new(kind: Kind) -> MemoryStore {
        MemoryStore {
            kind,
            state: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn object_ref(&self, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef::new(self.kind, namespace, name)
    }

    /// The key of `namespace/name`, refusing a namespace that does not fit the kind (as
    /// [`crate::Resources`] does).
    fn key(&self, namespace: Option<&str>, name: &str) -> Result<Key, Error> {
        let reason = match (self.kind.namespaced(), namespace) {
            _ if name.is_empty() => "object has no metadata.name",
            (true, Some(ns)) if !ns.is_empty() => return Ok((ns.to_string(), name.to_string())),
            (false, None) => return Ok((String::new(), name.to_string())),
            (true, _) => "namespaced kind needs a namespace",
            (false, Some(_)) => "cluster-scoped kind takes no namespace",
        };
        Err(Error::InvalidRequest {
            object: self.object_ref(namespace, name),
            reason: reason.to_string(),
        })
    }

    fn not_found(&self, namespace: Option<&str>, name: &str) -> Error {
        Error::NotFound {
            object: self.object_ref(namespace, name),
            message: format!("{} \"{name}\" not found", self.kind),
        }
    }

    fn conflict(&self, namespace: Option<&str>, name: &str) -> Error {
        Error::Conflict {
            object: self.object_ref(namespace, name),
            message: "the object has been modified; please apply your changes to the latest \
                      version and try again"
                .into(),
        }
    }

    /// Watches the store's objects in `scope`'s namespaces: the cache and its changes (the
    /// objects held now, `Synced`, then every write), as [`crate::watch`] gives them.
    pub fn watch(&self, scope: Scope) -> (Cache, BoxStream<'static, Change>) {
        let feed = Feed::new(self.kind);
        let (tx, rx) = mpsc::unbounded_channel();
        let watcher = Watcher {
            namespaces: if self.kind.namespaced() {
                scope.namespaces
            } else {
                Namespaces::All
            },
            selector: scope.label_selector.clone().unwrap_or_default(),
            feed: feed.clone(),
            tx,
        };
        let mut state = self.lock();
        for obj in state.objects.values() {
            if watcher.covers(obj.metadata.namespace.as_deref().unwrap_or_default())
                && watcher.selects(obj)
                && let Some(change) = feed.applied(obj.clone())
            {
                let _ = watcher.tx.send(change);
            }
        }
        let _ = watcher.tx.send(feed.synced());
        state.watchers.push(watcher);
        drop(state);
        let changes = stream::unfold(rx, |mut rx| async move {
            let change = rx.recv().await?;
            Some((change, rx))
        })
        .boxed();
        (feed.cache(), changes)
    }

    /// The object as stored now (for assertions).
    pub fn object(&self, namespace: Option<&str>, name: &str) -> Option<DynamicObject> {
        self.lock()
            .objects
            .get(&(namespace.unwrap_or_default().to_string(), name.to_string()))
            .cloned()
    }

    /// Every object stored now, ordered by namespace then name.
    pub fn objects(&self) -> Vec<DynamicObject> {
        self.lock().objects.values().cloned().collect()
    }

    /// The last `resourceVersion` given out: how many writes were made.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    /// Writes `obj` as it is, status included, whatever is stored (an administrator's
    /// `kubectl apply` of the whole object, for setting up a test): created when absent.
    pub fn put(&self, obj: DynamicObject) -> Result<DynamicObject, Error> {
        let name = obj.metadata.name.clone().unwrap_or_default();
        let key = self.key(obj.metadata.namespace.as_deref(), &name)?;
        let mut state = self.lock();
        let mut obj = obj;
        obj.types = Some(self.types());
        match state.objects.get(&key).cloned() {
            Some(old) => {
                obj.metadata.resource_version = old.metadata.resource_version.clone();
                Ok(self.commit(&mut state, &old, obj, true))
            }
            None => Ok(self.insert_new(&mut state, key, obj)),
        }
    }

    fn types(&self) -> kube::api::TypeMeta {
        let ar = self.kind.api_resource();
        kube::api::TypeMeta {
            api_version: ar.api_version,
            kind: ar.kind,
        }
    }

    fn next_revision(state: &mut State) -> String {
        state.revision += 1;
        state.revision.to_string()
    }

    fn insert_new(&self, state: &mut State, key: Key, mut obj: DynamicObject) -> DynamicObject {
        state.uids += 1;
        obj.types = Some(self.types());
        obj.metadata.uid = Some(format!("memory-{:012}", state.uids));
        obj.metadata.generation = Some(1);
        obj.metadata.deletion_timestamp = None;
        if obj.metadata.creation_timestamp.is_none() {
            obj.metadata.creation_timestamp = now();
        }
        obj.metadata.resource_version = Some(Self::next_revision(state));
        state.objects.insert(key, obj.clone());
        state.announce(&obj, false);
        obj
    }

    /// Stores `new` over `old` as the API server would: server-owned metadata from `old`,
    /// `.status` from `old` unless `status_write` (for kinds with a status subresource),
    /// `generation` bumped by content changes; a deleting object without finalizers goes.
    fn commit(
        &self,
        state: &mut State,
        old: &DynamicObject,
        mut new: DynamicObject,
        status_write: bool,
    ) -> DynamicObject {
        new.types = Some(self.types());
        new.metadata.uid = old.metadata.uid.clone();
        new.metadata.creation_timestamp = old.metadata.creation_timestamp.clone();
        new.metadata.deletion_timestamp = old.metadata.deletion_timestamp.clone();
        new.metadata.name = old.metadata.name.clone();
        new.metadata.namespace = old.metadata.namespace.clone();
        new.metadata.generation = old.metadata.generation;
        new.metadata.resource_version = old.metadata.resource_version.clone();
        if has_status_subresource(self.kind)
            && !status_write
            && let Some(m) = new.data.as_object_mut()
        {
            match old.data.get("status") {
                Some(s) => m.insert("status".into(), s.clone()),
                None => m.remove("status"),
            };
        }
        if content(&new) != content(old) {
            new.metadata.generation = Some(old.metadata.generation.unwrap_or(0) + 1);
        }
        let key = key_of(old);
        let finalized = new.metadata.finalizers.as_ref().is_none_or(Vec::is_empty);
        if is_being_deleted(old) && finalized {
            state.objects.remove(&key);
            state.announce(&new, true);
            return new;
        }
        if &new == old {
            return new;
        }
        new.metadata.resource_version = Some(Self::next_revision(state));
        state.objects.insert(key, new.clone());
        state.announce(&new, false);
        new
    }

    /// Applies a merge patch to the stored object under the lock.
    fn patch(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
        status_write: bool,
    ) -> Result<DynamicObject, Error> {
        let key = self.key(namespace, name)?;
        let mut state = self.lock();
        let old = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(namespace, name))?;
        if let Some(rv) = patch.pointer("/metadata/resourceVersion")
            && rv.as_str() != old.metadata.resource_version.as_deref()
        {
            return Err(self.conflict(namespace, name));
        }
        let mut value =
            serde_json::to_value(&old).map_err(|e| self.invalid(namespace, name, &e))?;
        json_patch::merge(&mut value, patch);
        let new: DynamicObject =
            serde_json::from_value(value).map_err(|e| self.invalid(namespace, name, &e))?;
        Ok(self.commit(&mut state, &old, new, status_write))
    }

    fn invalid(&self, namespace: Option<&str>, name: &str, e: &serde_json::Error) -> Error {
        Error::Invalid {
            object: self.object_ref(namespace, name),
            message: e.to_string(),
        }
    }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    fn kind(&self) -> Kind {
        self.kind
    }

    async fn get(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error> {
        let key = self.key(namespace, name)?;
        Ok(self.lock().objects.get(&key).cloned())
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        scope: &Scope,
    ) -> Result<Vec<DynamicObject>, Error> {
        let selector = scope.label_selector.as_deref().unwrap_or("");
        Ok(self
            .lock()
            .objects
            .values()
            .filter(|o| namespace.is_none_or(|ns| o.metadata.namespace.as_deref() == Some(ns)))
            .filter(|o| !is_sync_ignored(o))
            .filter(|o| selector_matches(selector, o.metadata.labels.as_ref()))
            .cloned()
            .collect())
    }

    async fn create(&self, obj: &DynamicObject) -> Result<DynamicObject, Error> {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let namespace = obj.metadata.namespace.as_deref();
        let key = self.key(namespace, name)?;
        let mut state = self.lock();
        if state.objects.contains_key(&key) {
            return Err(Error::AlreadyExists {
                object: self.object_ref(namespace, name),
                message: format!("{} \"{name}\" already exists", self.kind),
            });
        }
        let mut obj = obj.clone();
        if has_status_subresource(self.kind)
            && let Some(m) = obj.data.as_object_mut()
        {
            m.remove("status");
        }
        merge_string_data(self.kind, &mut obj);
        Ok(self.insert_new(&mut state, key, obj))
    }

    async fn replace(&self, obj: &DynamicObject) -> Result<DynamicObject, Error> {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let namespace = obj.metadata.namespace.as_deref();
        let key = self.key(namespace, name)?;
        let mut state = self.lock();
        let old = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(namespace, name))?;
        if obj
            .metadata
            .resource_version
            .as_ref()
            .is_some_and(|rv| Some(rv) != old.metadata.resource_version.as_ref())
        {
            return Err(self.conflict(namespace, name));
        }
        let mut obj = obj.clone();
        merge_string_data(self.kind, &mut obj);
        Ok(self.commit(&mut state, &old, obj, false))
    }

    async fn replace_status(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> Result<DynamicObject, Error> {
        let key = self.key(namespace, name)?;
        let mut state = self.lock();
        let old = state
            .objects
            .get(&key)
            .cloned()
            .ok_or_else(|| self.not_found(namespace, name))?;
        let mut new = old.clone();
        if let Some(m) = new.data.as_object_mut() {
            m.insert("status".into(), status);
        }
        Ok(self.commit(&mut state, &old, new, true))
    }

    async fn patch_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error> {
        self.patch(namespace, name, patch, !has_status_subresource(self.kind))
    }

    async fn patch_status_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error> {
        let status_only = match patch.get("status") {
            Some(s) => serde_json::json!({ "status": s }),
            None => serde_json::json!({}),
        };
        self.patch(namespace, name, &status_only, true)
    }

    async fn delete(&self, namespace: Option<&str>, name: &str) -> Result<DeleteOutcome, Error> {
        let key = self.key(namespace, name)?;
        let mut state = self.lock();
        let Some(old) = state.objects.get(&key).cloned() else {
            return Ok(DeleteOutcome::NotFound);
        };
        if old.metadata.finalizers.as_ref().is_none_or(Vec::is_empty) {
            state.objects.remove(&key);
            state.announce(&old, true);
            return Ok(DeleteOutcome::Deleted);
        }
        if !is_being_deleted(&old) {
            let mut marked = old.clone();
            marked.metadata.deletion_timestamp = now();
            marked.metadata.resource_version = Some(Self::next_revision(&mut state));
            state.objects.insert(key, marked.clone());
            state.announce(&marked, false);
        }
        Ok(DeleteOutcome::Pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Known, Mutation, UpdateOutcome, UpsertOutcome};
    use futures::FutureExt;
    use serde_json::json;

    fn app(name: &str, spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": spec,
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn a_stale_resource_version_conflicts_and_update_from_re_reads() {
        let store = MemoryStore::new(Kind::Application);
        let created = store.create(&app("a", json!({"x": 1}))).await.unwrap();
        assert_eq!(created.metadata.generation, Some(1));
        let mut newer = created.clone();
        newer.data["spec"] = json!({"x": 2});
        let written = store.replace(&newer).await.unwrap();
        assert_eq!(written.metadata.generation, Some(2));
        // The first copy is stale now.
        let err = store.replace(&created).await.unwrap_err();
        assert!(err.is_conflict(), "{err}");
        let mut calls = 0;
        let outcome = store
            .update_from(Some("ns"), "a", Some(created), &mut |o| {
                calls += 1;
                o.data["spec"]["y"] = json!(true);
                Mutation::Changed
            })
            .await
            .unwrap();
        assert_eq!(
            calls, 2,
            "the stale copy conflicted, the re-read one was written"
        );
        assert!(matches!(outcome, UpdateOutcome::Updated(_)));
        assert_eq!(
            store.object(Some("ns"), "a").unwrap().data["spec"],
            json!({"x": 2, "y": true})
        );
    }

    #[tokio::test]
    async fn status_is_written_apart_and_finalizers_hold_a_delete() {
        let store = MemoryStore::new(Kind::Application);
        let (cache, mut changes) = store.watch(Scope::all());
        assert!(matches!(changes.next().await, Some(Change::Synced)));
        let mut a = app("a", json!({"x": 1}));
        a.data["status"] = json!({"ignored": true});
        a.metadata.finalizers = Some(vec!["f".into()]);
        store.create(&a).await.unwrap();
        assert!(
            store
                .object(Some("ns"), "a")
                .unwrap()
                .data
                .get("status")
                .is_none()
        );
        store
            .replace_status(Some("ns"), "a", json!({"health": "Healthy"}))
            .await
            .unwrap();
        // A replace of the object keeps the status; so does an upsert of the spec.
        let outcome = store
            .upsert_copy_known(&app("a", json!({"x": 2})), &["spec"], Known::Unknown)
            .await
            .unwrap();
        assert_eq!(outcome, UpsertOutcome::Updated);
        let cached = cache.get(Some("ns"), "a").unwrap();
        assert_eq!(cached.data["status"], json!({"health": "Healthy"}));
        assert_eq!(cached.data["spec"], json!({"x": 2}));
        assert_eq!(
            store.delete(Some("ns"), "a").await.unwrap(),
            DeleteOutcome::Pending
        );
        assert!(is_being_deleted(&cache.get(Some("ns"), "a").unwrap()));
        assert!(store.remove_finalizers(Some("ns"), "a").await.unwrap());
        assert!(cache.get(Some("ns"), "a").is_none());
        let seen: Vec<_> = std::iter::from_fn(|| changes.next().now_or_never().flatten())
            .map(|c| matches!(c, Change::Deleted(_)))
            .collect();
        assert_eq!(seen, [false, false, false, false, true]);
    }

    #[tokio::test]
    async fn a_merge_patch_with_a_stale_resource_version_conflicts() {
        let store = MemoryStore::new(Kind::Application);
        let created = store.create(&app("a", json!({"x": 1}))).await.unwrap();
        let rv = created.metadata.resource_version.clone().unwrap();
        store
            .patch_merge(Some("ns"), "a", &json!({"operation": {"sync": {}}}))
            .await
            .unwrap();
        let stale = json!({"metadata": {"resourceVersion": rv}, "operation": null});
        let err = store
            .patch_merge(Some("ns"), "a", &stale)
            .await
            .unwrap_err();
        assert!(err.is_conflict(), "{err}");
        let current = store.object(Some("ns"), "a").unwrap();
        let fresh = json!({"metadata": {"resourceVersion": current.metadata.resource_version},
                           "operation": null});
        let patched = store.patch_merge(Some("ns"), "a", &fresh).await.unwrap();
        assert!(patched.data.get("operation").is_none());
        // A patch of the object does not reach a status-subresource kind's status.
        store
            .patch_merge(Some("ns"), "a", &json!({"status": {"x": 1}}))
            .await
            .unwrap();
        assert!(
            store
                .object(Some("ns"), "a")
                .unwrap()
                .data
                .get("status")
                .is_none()
        );
        store.terminate_operation("ns", "a").await.unwrap();
        assert_eq!(
            store.object(Some("ns"), "a").unwrap().data["status"],
            json!({"operationState": {"phase": "Terminating"}})
        );
        assert!(
            store
                .terminate_operation("ns", "b")
                .await
                .unwrap_err()
                .is_not_found()
        );
    }

    #[tokio::test]
    async fn a_watch_sees_its_namespaces_and_ignore_sync_looks_like_a_deletion() {
        let store = MemoryStore::new(Kind::Application);
        store.create(&app("before", json!({}))).await.unwrap();
        let (cache, mut changes) = store.watch(Scope::namespace("ns"));
        let (_, mut elsewhere) = store.watch(Scope::namespace("other"));
        assert!(matches!(changes.next().await, Some(Change::Applied(_))));
        assert!(matches!(changes.next().await, Some(Change::Synced)));
        assert!(matches!(elsewhere.next().await, Some(Change::Synced)));
        assert!(cache.is_synced());
        let mut ignored = app("before", json!({}));
        ignored.metadata.labels =
            Some([(crate::IGNORE_SYNC_LABEL.to_string(), "true".to_string())].into());
        ignored.metadata.resource_version = None;
        store.replace(&ignored).await.unwrap();
        assert!(matches!(changes.next().await, Some(Change::Deleted(_))));
        assert!(cache.get(Some("ns"), "before").is_none());
        assert!(
            elsewhere.next().now_or_never().is_none(),
            "another namespace"
        );
    }

    #[tokio::test]
    async fn ensure_namespace_creates_once() {
        let store = MemoryStore::new(Kind::Namespace);
        let labels: BTreeMap<String, String> = [("a".to_string(), "b".to_string())].into();
        assert!(
            store
                .ensure_namespace("edge-1", labels.clone())
                .await
                .unwrap()
        );
        assert!(
            !store
                .ensure_namespace("edge-1", labels.clone())
                .await
                .unwrap()
        );
        let ns = store.object(None, "edge-1").unwrap();
        assert_eq!(ns.metadata.labels, Some(labels));
        assert!(
            store.get(Some("x"), "edge-1").await.is_err(),
            "cluster-scoped"
        );
    }
}

#[cfg(test)]
mod selector_and_secret_tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_selectors_match_as_the_api_server_reads_them() {
        let l = labels(&[("team", "a"), ("tier", "web")]);
        for (selector, want) in [
            ("", true),
            ("team=a", true),
            ("team==a", true),
            ("team=b", false),
            ("team!=b", true),
            ("team!=a", false),
            ("owner!=x", true),
            ("team", true),
            ("owner", false),
            ("!owner", true),
            ("!team", false),
            ("team in (a,b)", true),
            ("team in (b, c)", false),
            ("team notin (b,c)", true),
            ("owner notin (b)", true),
            ("team=a,tier in (web,api)", true),
            ("team=a,tier=db", false),
            ("team in (a", false),
        ] {
            assert_eq!(selector_matches(selector, Some(&l)), want, "{selector}");
        }
        assert!(!selector_matches("team", None));
        assert!(selector_matches("!team", None));
    }

    fn secret(name: &str, label: &str) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "namespace": "argocd", "labels": {"agent": label}},
            "data": {"keep": "a2VlcA=="},
            "stringData": {"token": "t0"},
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn secrets_keep_string_data_as_data_and_lists_and_watches_follow_the_selector() {
        let store = MemoryStore::new(Kind::Secret);
        let scope = Scope::namespace("argocd").with_label_selector("agent=a");
        let (cache, _changes) = store.watch(scope.clone());
        let created = store.create(&secret("one", "a")).await.unwrap();
        assert!(created.data.get("stringData").is_none());
        assert_eq!(created.data["data"]["token"], "dDA=", "base64 of t0");
        assert_eq!(created.data["data"]["keep"], "a2VlcA==");
        store.create(&secret("two", "b")).await.unwrap();
        let listed = store.list(Some("argocd"), &scope).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].metadata.name.as_deref(), Some("one"));
        assert!(cache.get(Some("argocd"), "one").is_some());
        assert!(cache.get(Some("argocd"), "two").is_none());
        // Relabelled out of the selector: gone from the watch.
        let mut moved = store.get(Some("argocd"), "one").await.unwrap().unwrap();
        moved.metadata.labels = Some(labels(&[("agent", "c")]));
        store.replace(&moved).await.unwrap();
        assert!(cache.get(Some("argocd"), "one").is_none());
    }
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[tokio::test]
    async fn caches_keep_no_managed_fields() {
        let store = MemoryStore::new(Kind::Lease);
        let (cache, _changes) = store.watch(Scope::namespace("argocd"));
        let lease: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "agent-a", "namespace": "argocd",
                "managedFields": [{"manager": "principal", "operation": "Update",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:holderIdentity": {}}}}]},
            "spec": {"holderIdentity": "principal-0", "leaseDurationSeconds": 900},
        }))
        .unwrap();
        let stored = store.create(&lease).await.unwrap();
        assert!(
            stored.metadata.managed_fields.is_some(),
            "the store keeps them"
        );
        let cached = cache.get(Some("argocd"), "agent-a").unwrap();
        assert!(cached.metadata.managed_fields.is_none());
        assert_eq!(cached.data["spec"]["holderIdentity"], "principal-0");
    }
}
