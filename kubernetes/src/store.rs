//! The write side of a backend: [`ObjectStore`], one kind of object read and written with
//! optimistic concurrency, whatever holds the objects.
//!
//! [`crate::Resources`] is the implementation over the API server (kube-rs); the in-memory
//! one (`memory`, behind the crate's `memory` feature) serves tests. What the principal
//! and the agent decide is written through `Arc<dyn ObjectStore>`, so their logic runs the
//! same against either.
//!
//! Implementations provide the primitive requests (get, list, create, replace, the status
//! writes, merge patch, delete); the read-modify-write loop, `upsert_copy*`,
//! `remove_finalizers`, `terminate_operation` and `ensure_namespace` are provided here on
//! top of them, so every backend behaves the same way.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use kube::api::DynamicObject;
use kube::core::ObjectMeta;
use serde_json::Value;

use crate::error::ObjectRef;
use crate::scope::Scope;
use crate::{Error, Kind};

/// How many times [`ObjectStore::update_with`] writes before giving up on conflicts.
pub const MAX_UPDATE_ATTEMPTS: u32 = 5;

/// What an update closure decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// The object was changed: write it.
    Changed,
    /// Nothing to write.
    Unchanged,
    /// The current state makes the update wrong: write nothing.
    Abort,
}

/// Result of [`ObjectStore::update_with`].
#[derive(Debug, Clone)]
pub enum UpdateOutcome {
    /// Written; the object as the store returned it.
    Updated(DynamicObject),
    /// The closure changed nothing; the object as read.
    Unchanged(DynamicObject),
    /// The closure aborted; the object as read.
    Aborted(DynamicObject),
}

impl UpdateOutcome {
    /// The object after the call (written, or as read).
    pub fn object(&self) -> &DynamicObject {
        match self {
            Self::Updated(o) | Self::Unchanged(o) | Self::Aborted(o) => o,
        }
    }
}

/// What the caller's watch cache knows about an object before a write (see
/// [`ObjectStore::upsert_copy_known`]).
#[derive(Debug, Clone)]
pub enum Known {
    /// No synced cache: read the object first.
    Unknown,
    /// A synced cache does not have it: create it.
    Absent,
    /// A synced cache has this version: update from it.
    Present(Arc<DynamicObject>),
}

/// Result of [`ObjectStore::upsert_copy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpsertOutcome {
    /// The copy did not exist and was created.
    Created,
    /// The copy existed and differed: updated.
    Updated,
    /// The copy already said the same.
    Unchanged,
}

/// Result of [`ObjectStore::delete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The object is gone.
    Deleted,
    /// Finalizers hold the object: `deletionTimestamp` is set, it is being deleted.
    Pending,
    /// There was no such object.
    NotFound,
}

/// The closure of a read-modify-write ([`ObjectStore::update_from`]).
pub type Mutate<'a> = &'a mut (dyn FnMut(&mut DynamicObject) -> Mutation + Send);

/// Which labels and annotations of the current object an upsert keeps
/// ([`ObjectStore::upsert_copy_keeping`]).
pub type Keep<'a> = &'a (dyn Fn(&str) -> bool + Sync);

/// One kind of object, read and written with optimistic concurrency: every replace carries
/// the `resourceVersion` it was read at and conflicts when someone wrote in between; status
/// is written only through [`ObjectStore::replace_status`] (for kinds with a status
/// subresource a replace keeps the stored status).
#[async_trait]
pub trait ObjectStore: Send + Sync {
    /// The kind of object this store reads and writes.
    fn kind(&self) -> Kind;

    /// The object, or `None` when it does not exist.
    async fn get(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error>;

    /// Objects in `namespace` (`None`: all namespaces, or cluster-scoped), excluding
    /// those labelled ignore-sync and filtered by the scope's label selector.
    async fn list(
        &self,
        namespace: Option<&str>,
        scope: &Scope,
    ) -> Result<Vec<DynamicObject>, Error>;

    /// Creates `obj` in its `metadata.namespace` (a `resourceVersion` on it is dropped). An
    /// existing object with the same name gives [`Error::AlreadyExists`].
    async fn create(&self, obj: &DynamicObject) -> Result<DynamicObject, Error>;

    /// Replaces the object named by `obj` (`PUT`), conditional on `obj`'s
    /// `metadata.resourceVersion`: [`Error::Conflict`] when the stored one differs.
    async fn replace(&self, obj: &DynamicObject) -> Result<DynamicObject, Error>;

    /// Replaces `.status` through the `/status` subresource, whole (keys absent from
    /// `status` are removed), with no `resourceVersion` check: the status belongs to one
    /// writer. Returns the object after the call.
    async fn replace_status(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> Result<DynamicObject, Error>;

    /// Applies a JSON merge patch (RFC 7386) to the object. No `resourceVersion` check
    /// unless the patch itself carries `metadata.resourceVersion`.
    async fn patch_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error>;

    /// Applies a JSON merge patch to the `/status` subresource (only `.status` changes).
    async fn patch_status_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error>;

    /// Deletes the object. Objects held by finalizers come back with `deletionTimestamp`
    /// set and give [`DeleteOutcome::Pending`]; a missing object is not an error.
    async fn delete(&self, namespace: Option<&str>, name: &str) -> Result<DeleteOutcome, Error>;

    /// The object as [`ObjectStore::update_from`] reads it; a missing object is
    /// [`Error::NotFound`] (a backend may say more about it than this default does).
    async fn read_for_update(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<DynamicObject, Error> {
        self.get(namespace, name)
            .await?
            .ok_or_else(|| Error::NotFound {
                object: ObjectRef::new(self.kind(), namespace, name),
                message: "no such object to update".into(),
            })
    }

    /// Read-modify-write: reads the object, lets `mutate` change it, and replaces it with
    /// the `resourceVersion` it was read at; on a conflict reads again and `mutate` runs
    /// again, up to [`MAX_UPDATE_ATTEMPTS`] writes. The closure cannot move the object:
    /// name, namespace and resourceVersion are reset to what was read. A missing object is
    /// [`Error::NotFound`].
    async fn update_with(
        &self,
        namespace: Option<&str>,
        name: &str,
        mutate: Mutate<'_>,
    ) -> Result<UpdateOutcome, Error> {
        self.update_from(namespace, name, None, mutate).await
    }

    /// [`ObjectStore::update_with`] whose first attempt starts from `first` (a watch
    /// cache's copy) instead of a read: an unchanged object costs no request, a changed one
    /// one write; a stale copy conflicts and the loop continues with reads.
    async fn update_from(
        &self,
        namespace: Option<&str>,
        name: &str,
        mut first: Option<DynamicObject>,
        mutate: Mutate<'_>,
    ) -> Result<UpdateOutcome, Error> {
        let object = ObjectRef::new(self.kind(), namespace, name);
        for attempt in 1..=MAX_UPDATE_ATTEMPTS {
            let current = match first.take() {
                Some(cached) => cached,
                None => self.read_for_update(namespace, name).await?,
            };
            let mut desired = current.clone();
            match mutate(&mut desired) {
                Mutation::Unchanged => return Ok(UpdateOutcome::Unchanged(current)),
                Mutation::Abort => return Ok(UpdateOutcome::Aborted(current)),
                Mutation::Changed => {}
            }
            desired.metadata.name = current.metadata.name.clone();
            desired.metadata.namespace = current.metadata.namespace.clone();
            desired.metadata.resource_version = current.metadata.resource_version.clone();
            match self.replace(&desired).await {
                Ok(written) => return Ok(UpdateOutcome::Updated(written)),
                Err(err) if err.is_conflict() => {
                    tracing::debug!(%object, attempt, "update conflicted; re-reading");
                }
                Err(err) => return Err(err),
            }
        }
        Err(Error::ConflictRetriesExhausted {
            object,
            attempts: MAX_UPDATE_ATTEMPTS,
        })
    }

    /// Removes every finalizer (merge patch `metadata.finalizers: null`), letting a
    /// pending deletion finish. Returns `false` when the object does not exist.
    async fn remove_finalizers(&self, namespace: Option<&str>, name: &str) -> Result<bool, Error> {
        let patch = serde_json::json!({ "metadata": { "finalizers": null } });
        match self.patch_merge(namespace, name, &patch).await {
            Ok(_) => Ok(true),
            Err(err) if err.is_not_found() => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Creates or updates this cluster's copy of an object whose source of truth is the
    /// other side. `copy` is the object as it should be (see
    /// [`crate::object::received_copy`]); an existing object gets the top-level `owned`
    /// fields (e.g. `spec`, `operation`; absent ones are removed), labels and annotations
    /// of `copy`, and keeps everything else (status, finalizers, fields others own). The
    /// write is skipped when nothing differs.
    async fn upsert_copy(
        &self,
        copy: &DynamicObject,
        owned: &[&str],
    ) -> Result<UpsertOutcome, Error> {
        self.upsert_copy_known(copy, owned, Known::Unknown).await
    }

    /// [`ObjectStore::upsert_copy`] informed by the caller's watch cache: `Absent` creates
    /// at once (one request), `Present` updates from the cached version (no request when
    /// nothing differs, one write otherwise); a cache that is behind costs a conflict or an
    /// `AlreadyExists` and falls back to reading. `Unknown` reads first (two requests).
    async fn upsert_copy_known(
        &self,
        copy: &DynamicObject,
        owned: &[&str],
        known: Known,
    ) -> Result<UpsertOutcome, Error> {
        self.upsert_copy_keeping(copy, owned, known, &|_| false)
            .await
    }

    /// [`ObjectStore::upsert_copy_known`] that keeps the labels and annotations of the
    /// current object for which `keep` is true and which `copy` does not set (metadata
    /// another party owns on this side, e.g. Argo CD's notification state).
    async fn upsert_copy_keeping(
        &self,
        copy: &DynamicObject,
        owned: &[&str],
        known: Known,
        keep: Keep<'_>,
    ) -> Result<UpsertOutcome, Error> {
        let first = match known {
            Known::Absent => return create_copy(self, copy, owned, keep).await,
            Known::Present(cached) => Some((*cached).clone()),
            Known::Unknown => None,
        };
        match update_copy(self, copy, owned, first, keep).await {
            // Deleted since the cache saw it, or never there.
            Err(e) if e.is_not_found() => create_copy(self, copy, owned, keep).await,
            other => other,
        }
    }

    /// Terminates the running operation of an Argo CD Application the way
    /// `argocd app terminate-op` does: `.status.operationState.phase = Terminating`, as a
    /// merge patch of the status subresource (nothing else in the status is touched, so a
    /// concurrent status write is not lost).
    async fn terminate_operation(&self, namespace: &str, name: &str) -> Result<(), Error> {
        let patch = serde_json::json!({"status": {"operationState": {"phase": "Terminating"}}});
        match self.patch_status_merge(Some(namespace), name, &patch).await {
            Ok(_) => Ok(()),
            Err(Error::NotFound { object, .. }) => Err(Error::NotFound {
                object,
                message: "no such application to terminate an operation of".into(),
            }),
            Err(other) => Err(other),
        }
    }

    /// On a store of namespaces: creates namespace `name` with `labels` unless it exists;
    /// `true` when it was created. An existing namespace is left as it is (its labels are
    /// not changed).
    async fn ensure_namespace(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<bool, Error> {
        create_namespace(self, name, labels).await
    }
}

/// Creates namespace `name` with `labels` in `namespaces` (a store of namespaces) unless it
/// exists; `true` when it was created. An existing namespace is left as it is.
pub(crate) async fn create_namespace<S: ObjectStore + ?Sized>(
    namespaces: &S,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<bool, Error> {
    if namespaces.get(None, name).await?.is_some() {
        return Ok(false);
    }
    match namespaces.create(&namespace_object(name, labels)).await {
        Ok(_) => Ok(true),
        // Someone else created it between our read and our create.
        Err(err) if err.is_already_exists() => Ok(false),
        Err(err) => Err(err),
    }
}

/// A Namespace object named `name` with `labels`.
pub(crate) fn namespace_object(name: &str, labels: BTreeMap<String, String>) -> DynamicObject {
    DynamicObject {
        types: None,
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: (!labels.is_empty()).then_some(labels),
            ..Default::default()
        },
        data: serde_json::json!({}),
    }
}

/// Creates `copy`; when it exists meanwhile (or the cache is behind), updates it instead.
async fn create_copy<S: ObjectStore + ?Sized>(
    store: &S,
    copy: &DynamicObject,
    owned: &[&str],
    keep: Keep<'_>,
) -> Result<UpsertOutcome, Error> {
    match store.create(copy).await {
        Ok(_) => Ok(UpsertOutcome::Created),
        Err(e) if e.is_already_exists() => update_copy(store, copy, owned, None, keep).await,
        Err(e) => Err(e),
    }
}

async fn update_copy<S: ObjectStore + ?Sized>(
    store: &S,
    copy: &DynamicObject,
    owned: &[&str],
    first: Option<DynamicObject>,
    keep: Keep<'_>,
) -> Result<UpsertOutcome, Error> {
    let name = copy.metadata.name.as_deref().unwrap_or_default();
    let namespace = copy.metadata.namespace.as_deref();
    let outcome = store
        .update_from(namespace, name, first, &mut |cur| {
            apply_owned(cur, copy, owned, keep)
        })
        .await?;
    Ok(match outcome {
        UpdateOutcome::Updated(_) => UpsertOutcome::Updated,
        UpdateOutcome::Unchanged(_) | UpdateOutcome::Aborted(_) => UpsertOutcome::Unchanged,
    })
}

/// Copies the `owned` top-level fields, labels and annotations of `want` onto `cur`; the
/// labels and annotations of `cur` for which `keep` is true stay unless `want` sets them.
fn apply_owned(
    cur: &mut DynamicObject,
    want: &DynamicObject,
    owned: &[&str],
    keep: Keep<'_>,
) -> Mutation {
    let before = (
        cur.data.clone(),
        cur.metadata.labels.clone(),
        cur.metadata.annotations.clone(),
    );
    if let Some(m) = cur.data.as_object_mut() {
        for &field in owned {
            match want.data.get(field) {
                Some(v) => m.insert(field.to_owned(), v.clone()),
                None => m.remove(field),
            };
        }
    }
    cur.metadata.labels = merge_kept(before.1.as_ref(), want.metadata.labels.as_ref(), keep);
    cur.metadata.annotations =
        merge_kept(before.2.as_ref(), want.metadata.annotations.as_ref(), keep);
    let after = (&cur.data, &cur.metadata.labels, &cur.metadata.annotations);
    if (&before.0, &before.1, &before.2) == after {
        Mutation::Unchanged
    } else {
        Mutation::Changed
    }
}

/// `want`, plus the entries of `cur` for which `keep` is true and that `want` lacks.
fn merge_kept(
    cur: Option<&BTreeMap<String, String>>,
    want: Option<&BTreeMap<String, String>>,
    keep: Keep<'_>,
) -> Option<BTreeMap<String, String>> {
    let mut out = want.cloned();
    for (k, v) in cur.into_iter().flatten() {
        if keep(k) && !want.is_some_and(|w| w.contains_key(k)) {
            out.get_or_insert_with(Default::default)
                .insert(k.clone(), v.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn kept_labels_and_annotations_stay_unless_the_copy_sets_them() {
        let mut cur = obj(json!({
            "metadata": {"name": "a", "namespace": "n",
                         "annotations": {"mine": "1", "local": "2", "shared": "old"}},
            "spec": {"x": 1}
        }));
        let want = obj(json!({
            "metadata": {"name": "a", "namespace": "n", "annotations": {"shared": "new"}},
            "spec": {"x": 1}
        }));
        let keep = |k: &str| k == "local" || k == "shared";
        assert_eq!(
            apply_owned(&mut cur, &want, &["spec"], &keep),
            Mutation::Changed
        );
        assert_eq!(
            cur.metadata.annotations,
            Some(
                [
                    ("local".to_string(), "2".to_string()),
                    ("shared".to_string(), "new".to_string())
                ]
                .into()
            )
        );
        assert_eq!(
            apply_owned(&mut cur, &want, &["spec"], &keep),
            Mutation::Unchanged
        );
    }

    #[test]
    fn copy_takes_owned_fields_labels_and_annotations_and_keeps_the_rest() {
        let mut cur = obj(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n", "labels": {"old": "1"},
                         "finalizers": ["f"]},
            "spec": {"x": 1}, "operation": {"sync": {}}, "status": {"health": "Healthy"},
            "extra": true
        }));
        let want = obj(json!({
            "metadata": {"name": "a", "namespace": "n", "labels": {"new": "2"},
                         "annotations": {"a": "b"}},
            "spec": {"x": 2}
        }));
        assert_eq!(
            apply_owned(&mut cur, &want, &["spec", "operation"], &|_| false),
            Mutation::Changed
        );
        assert_eq!(cur.data["spec"], json!({"x": 2}));
        assert!(
            cur.data.get("operation").is_none(),
            "absent owned field removed"
        );
        assert_eq!(cur.data["status"], json!({"health": "Healthy"}));
        assert_eq!(cur.data["extra"], json!(true));
        assert_eq!(cur.metadata.finalizers, Some(vec!["f".to_string()]));
        assert_eq!(
            cur.metadata.labels,
            Some([("new".to_string(), "2".to_string())].into())
        );
        // A second application changes nothing.
        assert_eq!(
            apply_owned(&mut cur, &want, &["spec", "operation"], &|_| false),
            Mutation::Unchanged
        );
    }

    #[test]
    fn fields_not_owned_are_left_alone() {
        let mut cur = obj(json!({"metadata": {"name": "a"}, "spec": {"x": 1},
                                 "operation": {"sync": {}}}));
        let want = obj(json!({"metadata": {"name": "a"}, "spec": {"x": 1}}));
        assert_eq!(
            apply_owned(&mut cur, &want, &["spec"], &|_| false),
            Mutation::Unchanged
        );
        assert!(cur.data.get("operation").is_some());
    }
}
