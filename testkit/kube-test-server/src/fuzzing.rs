//! Entry points for the fuzz targets (`fuzz/`) and the property tests
//! (`tests/proptest_inputs.rs`): the request-body handling of create, update and the four
//! patch types, on a fresh in-memory store, without the HTTP layer. Hidden from the docs; not
//! a stable API.

use serde_json::{Value, json};

use crate::ResourceType;
use crate::managed_fields::Writer;
use crate::status::ApiError;
use crate::store::{PatchKind, Store, WriteMode};

/// What a request does with its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyOp {
    /// POST: the body is the new object.
    Create,
    /// PUT: the body replaces the seeded object.
    Update,
    /// PATCH with `application/merge-patch+json`.
    MergePatch,
    /// PATCH with `application/json-patch+json`.
    JsonPatch,
    /// PATCH with `application/strategic-merge-patch+json`.
    StrategicPatch,
    /// PATCH with `application/apply-patch+yaml` (server-side apply).
    ApplyPatch,
}

impl BodyOp {
    /// Every operation, for picking one from a fuzzer byte.
    pub const ALL: [BodyOp; 6] = [
        BodyOp::Create,
        BodyOp::Update,
        BodyOp::MergePatch,
        BodyOp::JsonPatch,
        BodyOp::StrategicPatch,
        BodyOp::ApplyPatch,
    ];
}

/// The resources a body can be written to (plural, seeded object).
pub const RESOURCES: [&str; 4] = ["configmaps", "secrets", "pods", "applications"];

/// The object each store is seeded with, named `obj` (in namespace `default` for namespaced
/// kinds), which `Update` and the patches apply to.
pub fn seed_object(plural: &str) -> Value {
    let meta = json!({"name": "obj", "namespace": "default", "labels": {"app": "demo"}});
    match plural {
        "configmaps" => json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"key": "value"}}),
        "secrets" => json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
            "type": "Opaque", "data": {"key": "dmFsdWU="}}),
        "pods" => json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "busybox",
                "env": [{"name": "A", "value": "1"}]}]}}),
        _ => json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": meta, "spec": {"project": "default"}}),
    }
}

/// Writes `body` (of `media_type` for create and update: `application/json`,
/// `application/yaml` or `application/vnd.kubernetes.protobuf`) to `plural` in a fresh store
/// holding [`seed_object`], and returns what the store answered. On success the stored object
/// is returned alongside, read back with a GET.
pub fn write_body(
    plural: &str,
    op: BodyOp,
    media_type: &str,
    body: &[u8],
) -> Result<(Value, Value), ApiError> {
    let resources: Vec<ResourceType> = ResourceType::defaults()
        .into_iter()
        .filter(|r| r.plural == "namespaces" || RESOURCES.contains(&r.plural.as_str()))
        .collect();
    let store = Store::new(resources, 16, true);
    let res = store
        .resources
        .iter()
        .position(|r| r.plural == plural)
        .unwrap_or_else(|| panic!("unknown resource {plural:?}"));
    let ns = "default";
    let writer = Writer {
        manager: "fuzz".into(),
        status: false,
    };
    store
        .create(res, ns, seed_object(plural), false, &writer)
        .expect("the seed object is valid");
    let mode = WriteMode {
        writer: writer.clone(),
        ..WriteMode::default()
    };
    let decode = || crate::http::decode_object_as(media_type, body);
    let written = match op {
        BodyOp::Create => store.create(res, ns, decode()?, false, &writer)?,
        BodyOp::Update => store.update(res, ns, "obj", decode()?, mode)?,
        BodyOp::MergePatch => store.patch(res, ns, "obj", PatchKind::Merge, body, mode)?,
        BodyOp::JsonPatch => store.patch(res, ns, "obj", PatchKind::Json, body, mode)?,
        BodyOp::StrategicPatch => store.patch(res, ns, "obj", PatchKind::Strategic, body, mode)?,
        BodyOp::ApplyPatch => store.patch(res, ns, "obj", PatchKind::Apply, body, mode)?,
    };
    let name = written
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .expect("a written object has a name");
    let stored = store.get(res, ns, name)?;
    Ok((written, stored))
}

/// The strategic merge patch of the built-in kinds (`doc` patched in place).
pub fn strategic_merge(doc: &mut Value, patch: &Value) -> Result<(), String> {
    crate::strategic::apply(doc, patch)
}
