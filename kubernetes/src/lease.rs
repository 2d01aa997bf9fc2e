//! Leases (`coordination.k8s.io/v1`) in typed fields instead of a generic JSON tree.
//!
//! A principal with `--ha` keeps one Lease per agent in its watch cache. As a
//! [`DynamicObject`] each one is an `ObjectMeta` of some thirty fields, two label and
//! annotation maps and a JSON tree for the spec: about 3 KB of heap per agent for a
//! holder, a few timestamps and a resourceVersion. [`CompactLease`] keeps what a Lease
//! holds in fields of its own (a few hundred bytes), and rebuilds the object when a write
//! needs it. The cache keeps a Lease this way only when the rebuilt object is equal to the
//! one received ([`CompactLease::exact`]), so whatever reads or writes the cached object
//! sees exactly what the API server sent.

use k8s_openapi::api::coordination::v1::LeaseSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{DynamicObject, ObjectMeta, TypeMeta};
use serde::Deserialize;

use crate::Kind;

/// Labels or annotations, in the order of the object's map (sorted by key).
type Pairs = Option<Box<[(Box<str>, Box<str>)]>>;

/// A Lease as typed fields: identity, resourceVersion, labels, annotations and the spec.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CompactLease {
    /// Whether the object carried its `apiVersion` and `kind`.
    typed: bool,
    name: Option<Box<str>>,
    namespace: Option<Box<str>>,
    uid: Option<Box<str>>,
    resource_version: Option<Box<str>>,
    creation_timestamp: Option<Time>,
    labels: Pairs,
    annotations: Pairs,
    /// Whether the object had a `spec` (all of whose fields may be unset).
    has_spec: bool,
    holder: Option<Box<str>>,
    acquire_time: Option<MicroTime>,
    renew_time: Option<MicroTime>,
    duration_seconds: Option<i32>,
    transitions: Option<i32>,
}

fn boxed(s: &Option<String>) -> Option<Box<str>> {
    s.as_deref().map(Box::from)
}

fn pairs(map: &Option<std::collections::BTreeMap<String, String>>) -> Pairs {
    map.as_ref().map(|m| {
        m.iter()
            .map(|(k, v)| (Box::from(k.as_str()), Box::from(v.as_str())))
            .collect()
    })
}

fn map_of(pairs: &Pairs) -> Option<std::collections::BTreeMap<String, String>> {
    pairs.as_ref().map(|p| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    })
}

fn lookup<'a>(pairs: &'a Pairs, key: &str) -> Option<&'a str> {
    let pairs = pairs.as_deref()?;
    pairs
        .binary_search_by(|(k, _)| k.as_ref().cmp(key))
        .ok()
        .map(|i| pairs[i].1.as_ref())
}

impl CompactLease {
    /// What the Lease `obj` says, as far as it fits these fields (everything else, and a
    /// spec that does not read as a Lease's, is left out): for reading, not for a write.
    pub fn read(obj: &DynamicObject) -> CompactLease {
        let spec = obj.data.get("spec");
        let LeaseSpec {
            acquire_time,
            holder_identity,
            lease_duration_seconds,
            lease_transitions,
            renew_time,
            ..
        } = spec
            .and_then(|s| LeaseSpec::deserialize(s).ok())
            .unwrap_or_default();
        let meta = &obj.metadata;
        CompactLease {
            typed: obj.types.is_some(),
            name: boxed(&meta.name),
            namespace: boxed(&meta.namespace),
            uid: boxed(&meta.uid),
            resource_version: boxed(&meta.resource_version),
            creation_timestamp: meta.creation_timestamp.clone(),
            labels: pairs(&meta.labels),
            annotations: pairs(&meta.annotations),
            has_spec: spec.is_some(),
            holder: holder_identity.map(String::into_boxed_str),
            acquire_time,
            renew_time,
            duration_seconds: lease_duration_seconds,
            transitions: lease_transitions,
        }
    }

    /// The Lease `obj` in typed fields, when they hold all of it: [`CompactLease::to_object`]
    /// gives back an object equal to `obj`. `None` for anything else (other metadata such
    /// as finalizers or owners, other spec fields, another kind).
    pub fn exact(obj: &DynamicObject) -> Option<CompactLease> {
        if obj.types.as_ref().is_some_and(|t| *t != Self::type_meta()) {
            return None;
        }
        let lease = Self::read(obj);
        (lease.to_object() == *obj).then_some(lease)
    }

    fn type_meta() -> TypeMeta {
        let ar = Kind::Lease.api_resource();
        TypeMeta {
            api_version: ar.api_version,
            kind: ar.kind,
        }
    }

    /// The Lease as an object (for a write, or a reader of objects).
    pub fn to_object(&self) -> DynamicObject {
        let mut data = serde_json::Map::new();
        if self.has_spec {
            let spec = LeaseSpec {
                acquire_time: self.acquire_time.clone(),
                holder_identity: self.holder.as_deref().map(str::to_owned),
                lease_duration_seconds: self.duration_seconds,
                lease_transitions: self.transitions,
                renew_time: self.renew_time.clone(),
                ..LeaseSpec::default()
            };
            if let Ok(v) = serde_json::to_value(spec) {
                data.insert("spec".into(), v);
            }
        }
        DynamicObject {
            types: self.typed.then(Self::type_meta),
            metadata: ObjectMeta {
                name: self.name.as_deref().map(str::to_owned),
                namespace: self.namespace.as_deref().map(str::to_owned),
                uid: self.uid.as_deref().map(str::to_owned),
                resource_version: self.resource_version.as_deref().map(str::to_owned),
                creation_timestamp: self.creation_timestamp.clone(),
                labels: map_of(&self.labels),
                annotations: map_of(&self.annotations),
                ..ObjectMeta::default()
            },
            data: serde_json::Value::Object(data),
        }
    }

    /// `metadata.name`.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// `metadata.namespace`.
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// `metadata.resourceVersion`.
    pub fn resource_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }

    /// The label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        lookup(&self.labels, key)
    }

    /// The annotation `key`.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        lookup(&self.annotations, key)
    }

    /// `spec.holderIdentity` as written (possibly empty).
    pub fn holder_identity(&self) -> Option<&str> {
        self.holder.as_deref()
    }

    /// `spec.acquireTime`.
    pub fn acquire_time(&self) -> Option<jiff::Timestamp> {
        self.acquire_time.as_ref().map(|t| t.0)
    }

    /// `spec.renewTime`.
    pub fn renew_time(&self) -> Option<jiff::Timestamp> {
        self.renew_time.as_ref().map(|t| t.0)
    }

    /// `spec.leaseDurationSeconds`.
    pub fn duration_seconds(&self) -> Option<i32> {
        self.duration_seconds
    }

    /// `spec.leaseTransitions`.
    pub fn transitions(&self) -> Option<i32> {
        self.transitions
    }
}

#[cfg(test)]
mod tests;
