//! What marks a managed copy (an object the agent received from the principal): its label,
//! its source-uid annotation, and the small helpers the spoke's modules share to read them.

use std::collections::HashMap;

use argocd_agent_kubernetes::object;
use kube::api::DynamicObject;

/// Label the agent puts on Applications it received from the principal (managed mode).
pub const MANAGED_LABEL: &str = "argocd-agent.argoproj-labs.io/managed-by-principal";

pub(crate) use argocd_agent_domain::sync::lock;

/// The name of a local object (empty when it has none).
pub(crate) fn name_of(obj: &DynamicObject) -> String {
    obj.metadata.name.clone().unwrap_or_default()
}

/// Whether `obj` carries [`MANAGED_LABEL`].
pub(crate) fn is_managed_copy(obj: &DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(MANAGED_LABEL))
}

/// The source-uid annotation of a managed copy.
pub(crate) fn source_uid(obj: &DynamicObject) -> Option<String> {
    obj.metadata
        .annotations
        .as_ref()?
        .get(object::SOURCE_UID_ANNOTATION)
        .cloned()
}

/// Puts back what `map` held under `key` before an insert that did not take effect.
pub(crate) fn restore<K: std::hash::Hash + Eq, V>(
    map: &mut HashMap<K, V>,
    key: K,
    previous: Option<V>,
) {
    match previous {
        Some(p) => map.insert(key, p),
        None => map.remove(&key),
    };
}
