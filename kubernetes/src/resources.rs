//! Reads and writes of one kind of object through the API server, with optimistic
//! concurrency: the kube-rs [`ObjectStore`].
//!
//! Every update goes through `resourceVersion`: read, change, `PUT` with the version
//! read; a `409 Conflict` means someone else wrote in between, so re-read and try again
//! (at most [`MAX_UPDATE_ATTEMPTS`](crate::store::MAX_UPDATE_ATTEMPTS) times). Status is written only through the `/status`
//! subresource, so a status write never touches spec and a spec write never touches
//! status (the API server enforces that split for CRDs with a status subresource).

use std::collections::BTreeMap;

use kube::Client;
use kube::api::{
    Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams, TypeMeta,
};
use kube::discovery::ApiResource;
use serde_json::Value;

use crate::error::ObjectRef;
use crate::object::is_being_deleted;
use crate::scope::Scope;
use crate::store::{DeleteOutcome, Known, Mutation, ObjectStore, UpdateOutcome, UpsertOutcome};
use crate::{Error, Kind};

/// Typed access to one [`Kind`] of object through the API server.
#[derive(Clone)]
pub struct Resources {
    client: Client,
    kind: Kind,
    ar: ApiResource,
}

impl std::fmt::Debug for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Resources")
            .field("kind", &self.kind)
            .finish()
    }
}

impl Resources {
    /// Access to `kind` through `client`.
    pub fn new(client: Client, kind: Kind) -> Self {
        Self {
            client,
            ar: kind.api_resource(),
            kind,
        }
    }

    /// The kind these resources are.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    fn object_ref(&self, namespace: Option<&str>, name: &str) -> ObjectRef {
        ObjectRef::new(self.kind, namespace, name)
    }

    /// The API handle for `namespace`, refusing a namespace that does not fit the kind.
    fn api(&self, namespace: Option<&str>, name: &str) -> Result<Api<DynamicObject>, Error> {
        match (self.kind.namespaced(), namespace) {
            (true, Some(ns)) if !ns.is_empty() => {
                Ok(Api::namespaced_with(self.client.clone(), ns, &self.ar))
            }
            (false, None) => Ok(Api::all_with(self.client.clone(), &self.ar)),
            (true, _) => Err(Error::InvalidRequest {
                object: self.object_ref(namespace, name),
                reason: "namespaced kind needs a namespace".to_string(),
            }),
            (false, Some(_)) => Err(Error::InvalidRequest {
                object: self.object_ref(namespace, name),
                reason: "cluster-scoped kind takes no namespace".to_string(),
            }),
        }
    }

    fn types(&self) -> TypeMeta {
        TypeMeta {
            api_version: self.ar.api_version.clone(),
            kind: self.ar.kind.clone(),
        }
    }

    /// The object, or `None` when it does not exist.
    pub async fn get(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error> {
        let api = self.api(namespace, name)?;
        match api.get(name).await {
            Ok(obj) => Ok(Some(obj)),
            Err(e) => match Error::from_kube(self.object_ref(namespace, name), e) {
                err if err.is_not_found() => Ok(None),
                err => Err(err),
            },
        }
    }

    /// Objects in `namespace` (`None`: all namespaces, or cluster-scoped), excluding
    /// those labelled ignore-sync and filtered by the scope's label selector.
    pub async fn list(
        &self,
        namespace: Option<&str>,
        scope: &Scope,
    ) -> Result<Vec<DynamicObject>, Error> {
        let api = match namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &self.ar),
            None => Api::all_with(self.client.clone(), &self.ar),
        };
        let lp = ListParams::default().labels(&scope.server_label_selector());
        let list = api
            .list(&lp)
            .await
            .map_err(|e| Error::from_kube(self.object_ref(namespace, ""), e))?;
        Ok(list
            .items
            .into_iter()
            .filter(|o| !crate::scope::is_sync_ignored(o))
            .collect())
    }

    /// Creates `obj` in its `metadata.namespace`. A `resourceVersion` on `obj` is
    /// dropped (the API server refuses it on create). An existing object with the same
    /// name gives [`Error::AlreadyExists`].
    pub async fn create(&self, obj: &DynamicObject) -> Result<DynamicObject, Error> {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let namespace = obj.metadata.namespace.as_deref();
        let object = self.object_ref(namespace, name);
        if name.is_empty() {
            return Err(Error::InvalidRequest {
                object,
                reason: "object has no metadata.name".to_string(),
            });
        }
        let api = self.api(namespace, name)?;
        let mut body = obj.clone();
        body.types = Some(self.types());
        body.metadata.resource_version = None;
        api.create(&PostParams::default(), &body)
            .await
            .map_err(|e| Error::from_kube(object, e))
    }

    /// Read-modify-write with optimistic concurrency.
    ///
    /// Reads the object, lets `mutate` change it, and `PUT`s it with the
    /// `resourceVersion` it was read at. On `409 Conflict` the object is read again and
    /// `mutate` runs again on the fresh copy, up to [`MAX_UPDATE_ATTEMPTS`](crate::store::MAX_UPDATE_ATTEMPTS) PUTs. The
    /// closure cannot move the object: name, namespace and resourceVersion are reset
    /// to what was read. A missing object is [`Error::NotFound`]. For kinds with a status
    /// subresource (Application) the API server ignores `.status` in this write: use
    /// [`Resources::replace_status`].
    pub async fn update_with<F>(
        &self,
        namespace: Option<&str>,
        name: &str,
        mutate: F,
    ) -> Result<UpdateOutcome, Error>
    where
        F: FnMut(&mut DynamicObject) -> Mutation + Send,
    {
        self.update_from(namespace, name, None, mutate).await
    }

    /// [`Resources::update_with`] whose first attempt starts from `first` (a watch cache's
    /// copy) instead of a read: an unchanged object costs no request, a changed one one PUT;
    /// a stale copy conflicts and the loop continues with reads.
    pub async fn update_from<F>(
        &self,
        namespace: Option<&str>,
        name: &str,
        first: Option<DynamicObject>,
        mut mutate: F,
    ) -> Result<UpdateOutcome, Error>
    where
        F: FnMut(&mut DynamicObject) -> Mutation + Send,
    {
        ObjectStore::update_from(self, namespace, name, first, &mut mutate).await
    }

    /// Replaces `.status` through the `/status` subresource, whole (keys absent from
    /// `status` are removed, unlike a merge patch), in one request: a JSON patch
    /// `[{"op": "add", "path": "/status", "value": status}]` ("add" replaces an existing
    /// member). No read, no `resourceVersion`, so no conflicts: the status belongs to one
    /// writer. Returns the object after the call.
    pub async fn replace_status(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> Result<DynamicObject, Error> {
        let api = self.api(namespace, name)?;
        let patch: json_patch::Patch = serde_json::from_value(serde_json::json!([
            {"op": "add", "path": "/status", "value": status}
        ]))
        .map_err(|e| Error::Invalid {
            object: self.object_ref(namespace, name),
            message: format!("status patch: {e}"),
        })?;
        api.patch_status(name, &PatchParams::default(), &Patch::<()>::Json(patch))
            .await
            .map_err(|e| Error::from_kube(self.object_ref(namespace, name), e))
    }

    /// Applies a JSON merge patch (RFC 7386, `application/merge-patch+json`). No
    /// `resourceVersion` check unless the patch itself carries `metadata.resourceVersion`.
    pub async fn patch_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error> {
        let api = self.api(namespace, name)?;
        api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::from_kube(self.object_ref(namespace, name), e))
    }

    /// Deletes the object. Objects held by finalizers come back with `deletionTimestamp`
    /// set and give [`DeleteOutcome::Pending`]; a missing object is not an error.
    pub async fn delete(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<DeleteOutcome, Error> {
        let api = self.api(namespace, name)?;
        match api.delete(name, &DeleteParams::default()).await {
            Ok(either) => Ok(match either.left() {
                Some(obj)
                    if is_being_deleted(&obj)
                        && obj
                            .metadata
                            .finalizers
                            .as_ref()
                            .is_some_and(|f| !f.is_empty()) =>
                {
                    DeleteOutcome::Pending
                }
                _ => DeleteOutcome::Deleted,
            }),
            Err(e) => match Error::from_kube(self.object_ref(namespace, name), e) {
                err if err.is_not_found() => Ok(DeleteOutcome::NotFound),
                err => Err(err),
            },
        }
    }

    /// Removes every finalizer (merge patch `metadata.finalizers: null`), letting a
    /// pending deletion finish. Returns `false` when the object does not exist.
    pub async fn remove_finalizers(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<bool, Error> {
        ObjectStore::remove_finalizers(self, namespace, name).await
    }

    /// [`ObjectStore::upsert_copy`] (see there).
    pub async fn upsert_copy(
        &self,
        copy: &DynamicObject,
        owned: &[&str],
    ) -> Result<UpsertOutcome, Error> {
        ObjectStore::upsert_copy(self, copy, owned).await
    }

    /// [`ObjectStore::upsert_copy_known`] (see there).
    pub async fn upsert_copy_known(
        &self,
        copy: &DynamicObject,
        owned: &[&str],
        known: Known,
    ) -> Result<UpsertOutcome, Error> {
        ObjectStore::upsert_copy_known(self, copy, owned, known).await
    }

    /// [`ObjectStore::upsert_copy_keeping`] (see there).
    pub async fn upsert_copy_keeping(
        &self,
        copy: &DynamicObject,
        owned: &[&str],
        known: Known,
        keep: &(dyn Fn(&str) -> bool + Sync),
    ) -> Result<UpsertOutcome, Error> {
        ObjectStore::upsert_copy_keeping(self, copy, owned, known, keep).await
    }

    /// Terminates the running operation of an Argo CD Application the way
    /// `argocd app terminate-op` does: `.status.operationState.phase = Terminating`, as a
    /// merge patch of the status subresource (nothing else in the status is touched, so a
    /// concurrent status write is not lost).
    pub async fn terminate_operation(&self, namespace: &str, name: &str) -> Result<(), Error> {
        ObjectStore::terminate_operation(self, namespace, name).await
    }

    /// Creates namespace `name` with `labels` unless it exists (see [`ensure_namespace`]).
    pub async fn ensure_namespace(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<bool, Error> {
        ensure_namespace(&self.client, name, labels).await
    }
}

/// Creates namespace `name` with `labels` unless it exists; `true` when it was created.
/// An existing namespace is left as it is (its labels are not changed).
pub async fn ensure_namespace(
    client: &Client,
    name: &str,
    labels: BTreeMap<String, String>,
) -> Result<bool, Error> {
    crate::store::create_namespace(
        &Resources::new(client.clone(), Kind::Namespace),
        name,
        labels,
    )
    .await
}

/// The API server as an [`ObjectStore`]: the requests are the inherent methods of the same
/// name; the read-modify-write loop, finalizer removal and operation termination are the
/// trait's own (the inherent ones call them), reading with the API server's own not-found
/// answer.
#[async_trait::async_trait]
impl ObjectStore for Resources {
    fn kind(&self) -> Kind {
        self.kind
    }

    async fn get(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Option<DynamicObject>, Error> {
        Resources::get(self, namespace, name).await
    }

    async fn list(
        &self,
        namespace: Option<&str>,
        scope: &Scope,
    ) -> Result<Vec<DynamicObject>, Error> {
        Resources::list(self, namespace, scope).await
    }

    async fn create(&self, obj: &DynamicObject) -> Result<DynamicObject, Error> {
        Resources::create(self, obj).await
    }

    async fn replace(&self, obj: &DynamicObject) -> Result<DynamicObject, Error> {
        let name = obj.metadata.name.as_deref().unwrap_or_default();
        let namespace = obj.metadata.namespace.as_deref();
        let api = self.api(namespace, name)?;
        let mut body = obj.clone();
        body.types = Some(self.types());
        api.replace(name, &PostParams::default(), &body)
            .await
            .map_err(|e| Error::from_kube(self.object_ref(namespace, name), e))
    }

    async fn replace_status(
        &self,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) -> Result<DynamicObject, Error> {
        Resources::replace_status(self, namespace, name, status).await
    }

    async fn patch_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error> {
        Resources::patch_merge(self, namespace, name, patch).await
    }

    async fn patch_status_merge(
        &self,
        namespace: Option<&str>,
        name: &str,
        patch: &Value,
    ) -> Result<DynamicObject, Error> {
        let api = self.api(namespace, name)?;
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .map_err(|e| Error::from_kube(self.object_ref(namespace, name), e))
    }

    async fn delete(&self, namespace: Option<&str>, name: &str) -> Result<DeleteOutcome, Error> {
        Resources::delete(self, namespace, name).await
    }

    /// The API server's own answer when the object is missing.
    async fn read_for_update(
        &self,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<DynamicObject, Error> {
        self.api(namespace, name)?
            .get(name)
            .await
            .map_err(|e| Error::from_kube(self.object_ref(namespace, name), e))
    }

    async fn ensure_namespace(
        &self,
        name: &str,
        labels: BTreeMap<String, String>,
    ) -> Result<bool, Error> {
        ensure_namespace(&self.client, name, labels).await
    }
}
