//! OpenAPI documents (`/openapi/v2`, `/openapi/v3`) and the unknown-field check behind
//! `fieldValidation=Strict|Warn`, both from the same structural schemas.
//!
//! Schemas are hand-written at the depth `kubectl explain` and field validation need, with
//! `x-kubernetes-preserve-unknown-fields: true` where Argo CD's CRDs have it or where we do
//! not model deeper: the `schemars` feature of `k8s-openapi` would pull a second schema crate
//! and a long build on a shared 2-core machine for kinds the tests only touch shallowly.

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::ResourceType;

fn string(desc: &str) -> Value {
    json!({"type": "string", "description": desc})
}

fn integer(desc: &str) -> Value {
    json!({"type": "integer", "format": "int64", "description": desc})
}

fn boolean(desc: &str) -> Value {
    json!({"type": "boolean", "description": desc})
}

fn string_map(desc: &str) -> Value {
    json!({"type": "object", "description": desc, "additionalProperties": {"type": "string"}})
}

fn array(desc: &str, items: Value) -> Value {
    json!({"type": "array", "description": desc, "items": items})
}

/// An object whose unknown fields are kept (and not reported).
fn open(desc: &str) -> Value {
    json!({"type": "object", "description": desc, "x-kubernetes-preserve-unknown-fields": true})
}

/// An object with exactly these fields.
fn object(desc: &str, props: &[(&str, Value)]) -> Value {
    let props: Map<String, Value> = props
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    json!({"type": "object", "description": desc, "properties": props})
}

/// `props` plus `x-kubernetes-preserve-unknown-fields`.
fn open_object(desc: &str, props: &[(&str, Value)]) -> Value {
    let mut o = object(desc, props);
    o["x-kubernetes-preserve-unknown-fields"] = json!(true);
    o
}

fn object_meta() -> Value {
    object(
        "Standard object's metadata.",
        &[
            ("name", string("Name must be unique within a namespace.")),
            (
                "generateName",
                string("Optional prefix the server uses to generate a unique name."),
            ),
            (
                "namespace",
                string("The namespace the object lives in; empty for cluster-scoped kinds."),
            ),
            (
                "uid",
                string("Unique in time and space value for this object."),
            ),
            (
                "resourceVersion",
                string("Opaque value for optimistic concurrency and watches."),
            ),
            (
                "generation",
                integer(
                    "A sequence number representing a specific generation of the desired state.",
                ),
            ),
            (
                "creationTimestamp",
                string("When this object was created (RFC 3339)."),
            ),
            (
                "deletionTimestamp",
                string("When this object will be deleted (RFC 3339)."),
            ),
            (
                "deletionGracePeriodSeconds",
                integer("Seconds allowed for graceful termination."),
            ),
            (
                "labels",
                string_map("Map of string keys and values for selecting objects."),
            ),
            (
                "annotations",
                string_map("Unstructured key value map stored with a resource."),
            ),
            (
                "finalizers",
                array(
                    "Must be empty before the object is deleted from the registry.",
                    json!({"type": "string"}),
                ),
            ),
            (
                "ownerReferences",
                array("Objects depended by this object.", open("OwnerReference")),
            ),
            (
                "managedFields",
                array(
                    "Which field managers own which fields.",
                    open("ManagedFieldsEntry"),
                ),
            ),
            ("selfLink", string("Deprecated; not set by the server.")),
        ],
    )
}

fn top(desc: &str, props: &[(&str, Value)]) -> Value {
    let mut all = vec![
        (
            "apiVersion",
            string("The versioned schema of this representation of an object."),
        ),
        ("kind", string("The REST resource this object represents.")),
        ("metadata", object_meta()),
    ];
    all.extend(props.iter().cloned());
    object(desc, &all)
}

fn source() -> Value {
    open_object(
        "Location of the application's manifests or chart.",
        &[
            ("repoURL", string("URL of the Git or Helm repository.")),
            ("path", string("Directory path within the Git repository.")),
            (
                "targetRevision",
                string("Revision of the source to sync to."),
            ),
            ("chart", string("Helm chart name (Helm repositories only).")),
            ("ref", string("Reference name for multiple sources.")),
            ("name", string("Name of the source.")),
            (
                "helm",
                open_object(
                    "Helm-specific options.",
                    &[
                        (
                            "valueFiles",
                            array("Helm value files.", json!({"type": "string"})),
                        ),
                        ("values", string("Helm values as a YAML string.")),
                        (
                            "valuesObject",
                            open("Helm values as an object (kept as given)."),
                        ),
                        ("releaseName", string("Helm release name.")),
                    ],
                ),
            ),
            ("kustomize", open("Kustomize-specific options.")),
            (
                "directory",
                open("Options for plain directories of manifests."),
            ),
            ("plugin", open("Config management plugin options.")),
        ],
    )
}

fn application() -> Value {
    let destination = object(
        "Where the application's resources are deployed.",
        &[
            ("server", string("URL of the target cluster's API server.")),
            (
                "namespace",
                string("Target namespace for namespaced resources."),
            ),
            ("name", string("Name of the target cluster.")),
        ],
    );
    let spec = object(
        "ApplicationSpec is the desired state of the Application.",
        &[
            (
                "project",
                string("The AppProject the application belongs to."),
            ),
            ("destination", destination),
            ("source", source()),
            ("sources", array("Multiple sources.", source())),
            (
                "syncPolicy",
                open("When and how the application is synced."),
            ),
            (
                "ignoreDifferences",
                array("Differences to ignore.", open("ResourceIgnoreDifferences")),
            ),
            (
                "info",
                array("Extra information shown in the UI.", open("Info")),
            ),
            (
                "revisionHistoryLimit",
                integer("How many deployed revisions to keep."),
            ),
        ],
    );
    // Argo CD's CRD requires these two.
    let mut spec = spec;
    spec["required"] = json!(["destination", "project"]);
    top(
        "Application is a definition of Application resource.",
        &[
            ("spec", spec),
            (
                "status",
                open("ApplicationStatus is the observed state of the Application."),
            ),
            (
                "operation",
                open("Operation requested on the application (e.g. a sync)."),
            ),
        ],
    )
}

fn app_project() -> Value {
    let spec = object(
        "AppProjectSpec is the specification of an AppProject.",
        &[
            ("description", string("Project description.")),
            (
                "sourceRepos",
                array(
                    "Repositories apps may deploy from.",
                    json!({"type": "string"}),
                ),
            ),
            (
                "sourceNamespaces",
                array(
                    "Namespaces Applications may live in.",
                    json!({"type": "string"}),
                ),
            ),
            (
                "destinations",
                array("Where apps may deploy to.", open("ApplicationDestination")),
            ),
            (
                "clusterResourceWhitelist",
                array("Cluster-scoped kinds allowed.", open("GroupKind")),
            ),
            (
                "clusterResourceBlacklist",
                array("Cluster-scoped kinds denied.", open("GroupKind")),
            ),
            (
                "namespaceResourceWhitelist",
                array("Namespaced kinds allowed.", open("GroupKind")),
            ),
            (
                "namespaceResourceBlacklist",
                array("Namespaced kinds denied.", open("GroupKind")),
            ),
            ("roles", array("Project roles.", open("ProjectRole"))),
            ("syncWindows", array("Sync windows.", open("SyncWindow"))),
            ("orphanedResources", open("Orphaned resources monitoring.")),
            (
                "signatureKeys",
                array(
                    "GnuPG keys commits must be signed with.",
                    open("SignatureKey"),
                ),
            ),
            (
                "permitOnlyProjectScopedClusters",
                boolean("Only project-scoped clusters."),
            ),
            (
                "destinationServiceAccounts",
                array("Service accounts to impersonate.", open("ServiceAccount")),
            ),
        ],
    );
    top(
        "AppProject provides a logical grouping of applications.",
        &[("spec", spec), ("status", open("AppProjectStatus"))],
    )
}

/// [`schema`], built once per kind: every write with field validation checks its body
/// against it (building it for each write was a seventh of a storm's hub CPU).
pub fn cached_schema(r: &ResourceType) -> std::sync::Arc<Value> {
    // By group, then version, then kind: a lookup borrows the names (no key is built per
    // write); only the first write of a kind allocates its entry.
    type ByKind = HashMap<String, std::sync::Arc<Value>>;
    type Schemas = std::sync::Mutex<HashMap<String, HashMap<String, ByKind>>>;
    static SCHEMAS: std::sync::LazyLock<Schemas> = std::sync::LazyLock::new(Default::default);
    let mut schemas = SCHEMAS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(found) = schemas
        .get(r.group.as_str())
        .and_then(|v| v.get(r.version.as_str()))
        .and_then(|k| k.get(r.kind.as_str()))
    {
        return found.clone();
    }
    let built = std::sync::Arc::new(schema(r));
    schemas
        .entry(r.group.clone())
        .or_default()
        .entry(r.version.clone())
        .or_default()
        .insert(r.kind.clone(), built.clone());
    built
}

/// The schema of a kind; kinds we do not describe keep everything below `metadata`.
pub fn schema(r: &ResourceType) -> Value {
    let data = string_map("Data contains the configuration data.");
    match (r.group.as_str(), r.kind.as_str()) {
        ("argoproj.io", "Application") => application(),
        ("argoproj.io", "AppProject") => app_project(),
        ("", "ConfigMap") => top(
            "ConfigMap holds configuration data for pods to consume.",
            &[
                ("data", data),
                ("binaryData", string_map("Base64-encoded binary data.")),
                ("immutable", boolean("If true, data cannot be updated.")),
            ],
        ),
        ("", "Secret") => top(
            "Secret holds secret data of a certain type.",
            &[
                ("data", string_map("Base64-encoded secret data.")),
                (
                    "stringData",
                    string_map("Write-only convenience field for data."),
                ),
                (
                    "type",
                    string("Used to facilitate programmatic handling of secret data."),
                ),
                ("immutable", boolean("If true, data cannot be updated.")),
            ],
        ),
        ("", "Namespace") => top(
            "Namespace provides a scope for Names.",
            &[
                (
                    "spec",
                    object(
                        "Spec of the namespace.",
                        &[(
                            "finalizers",
                            array("Finalizers.", json!({"type": "string"})),
                        )],
                    ),
                ),
                (
                    "status",
                    open_object(
                        "Status of the namespace.",
                        &[("phase", string("Active or Terminating."))],
                    ),
                ),
            ],
        ),
        ("", "Pod") => top(
            "Pod is a collection of containers that can run on a host.",
            &[
                (
                    "spec",
                    open_object(
                        "Specification of the desired behavior of the pod.",
                        &[
                            (
                                "containers",
                                array("Containers of the pod.", open("Container")),
                            ),
                            ("nodeName", string("Node the pod is scheduled to.")),
                            ("restartPolicy", string("Always, OnFailure or Never.")),
                            (
                                "serviceAccountName",
                                string("Service account the pod runs as."),
                            ),
                        ],
                    ),
                ),
                (
                    "status",
                    open_object(
                        "Most recently observed status of the pod.",
                        &[("phase", string("Pod phase."))],
                    ),
                ),
            ],
        ),
        ("coordination.k8s.io", "Lease") => top(
            "Lease defines a lease concept.",
            &[(
                "spec",
                object(
                    "Specification of the Lease.",
                    &[
                        ("holderIdentity", string("Identity of the holder.")),
                        (
                            "leaseDurationSeconds",
                            integer("Duration candidates wait to force acquire."),
                        ),
                        (
                            "acquireTime",
                            string("When the current lease was acquired."),
                        ),
                        ("renewTime", string("When the current holder last renewed.")),
                        ("leaseTransitions", integer("Number of holder transitions.")),
                        ("strategy", string("Coordinated leader election strategy.")),
                        ("preferredHolder", string("Holder the lease should go to.")),
                    ],
                ),
            )],
        ),
        // Events, reviews and registered kinds we do not describe: only the envelope is known.
        _ => {
            let mut s = top(&format!("{} ({})", r.kind, r.api_version()), &[]);
            s["x-kubernetes-preserve-unknown-fields"] = json!(true);
            s
        }
    }
}

/// The schema's name, as the apiserver names definitions.
pub fn schema_name(r: &ResourceType) -> String {
    let prefix = match r.group.as_str() {
        "" => "io.k8s.api.core".to_string(),
        g if g.ends_with(".k8s.io") => format!("io.k8s.api.{}", g.trim_end_matches(".k8s.io")),
        g => g.split('.').rev().collect::<Vec<_>>().join("."),
    };
    format!("{prefix}.{}.{}", r.version, r.kind)
}

fn gvk(r: &ResourceType) -> Value {
    json!([{"group": r.group, "version": r.version, "kind": r.kind}])
}

/// A schema with its `x-kubernetes-group-version-kind`.
pub fn definition(r: &ResourceType) -> Value {
    let mut s = schema(r);
    s["x-kubernetes-group-version-kind"] = gvk(r);
    s
}

/// The `/openapi/v2` document: definitions only. Without paths kubectl's patch-type lookup
/// falls back to its built-in rule (strategic merge for built-in kinds, merge patch for CRDs).
pub fn v2(resources: &[ResourceType]) -> Value {
    let defs: Map<String, Value> = resources
        .iter()
        .map(|r| (schema_name(r), definition(r)))
        .collect();
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0"},
        "paths": {},
        "definitions": defs,
    })
}

/// The `/openapi/v2` document in gnostic's protobuf encoding (`openapi_v2.Document`), which is
/// the only form client-go's `OpenAPISchema()` reads. Only the schema keywords we write are
/// encoded: description, format, required, additionalProperties, type, items, properties and
/// vendor extensions (as YAML, i.e. JSON, text).
pub fn v2_protobuf(resources: &[ResourceType]) -> Vec<u8> {
    let mut info = Vec::new();
    pb_string(&mut info, 1, "Kubernetes");
    pb_string(&mut info, 2, "v1.35.0");
    let mut defs = Vec::new();
    for r in resources {
        let mut named = Vec::new();
        pb_string(&mut named, 1, &schema_name(r));
        pb_bytes(&mut named, 2, &pb_schema(&definition(r)));
        pb_bytes(&mut defs, 1, &named);
    }
    let mut doc = Vec::new();
    pb_string(&mut doc, 1, "2.0");
    pb_bytes(&mut doc, 2, &info);
    pb_bytes(&mut doc, 8, &[]);
    pb_bytes(&mut doc, 9, &defs);
    doc
}

fn pb_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn pb_bytes(out: &mut Vec<u8>, field: u64, b: &[u8]) {
    pb_varint(out, (field << 3) | 2);
    pb_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

fn pb_string(out: &mut Vec<u8>, field: u64, s: &str) {
    pb_bytes(out, field, s.as_bytes());
}

/// `openapi_v2.Schema`.
fn pb_schema(s: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(f) = s["format"].as_str() {
        pb_string(&mut out, 2, f);
    }
    if let Some(d) = s["description"].as_str() {
        pb_string(&mut out, 4, d);
    }
    for r in s["required"].as_array().into_iter().flatten() {
        pb_string(&mut out, 19, r.as_str().unwrap_or_default());
    }
    if let Some(a) = s.get("additionalProperties").filter(|a| a.is_object()) {
        let mut item = Vec::new();
        pb_bytes(&mut item, 1, &pb_schema(a));
        pb_bytes(&mut out, 21, &item);
    }
    if let Some(t) = s["type"].as_str() {
        let mut item = Vec::new();
        pb_string(&mut item, 1, t);
        pb_bytes(&mut out, 22, &item);
    }
    if let Some(i) = s.get("items") {
        let mut item = Vec::new();
        pb_bytes(&mut item, 1, &pb_schema(i));
        pb_bytes(&mut out, 23, &item);
    }
    if let Some(props) = s["properties"].as_object() {
        let mut p = Vec::new();
        for (k, v) in props {
            let mut named = Vec::new();
            pb_string(&mut named, 1, k);
            pb_bytes(&mut named, 2, &pb_schema(v));
            pb_bytes(&mut p, 1, &named);
        }
        pb_bytes(&mut out, 25, &p);
    }
    if let Some(o) = s.as_object() {
        for (k, v) in o.iter().filter(|(k, _)| k.starts_with("x-")) {
            let mut any = Vec::new();
            pb_string(&mut any, 2, &v.to_string());
            let mut named = Vec::new();
            pb_string(&mut named, 1, k);
            pb_bytes(&mut named, 2, &any);
            pb_bytes(&mut out, 31, &named);
        }
    }
    out
}

/// Unknown fields of `value` against `schema`, as the apiserver words them (`spec.foo`,
/// `spec.containers[0].bar`). Keys starting with `$` (strategic merge directives) are skipped.
pub fn unknown_fields(value: &Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    walk(value, schema, "", &mut out);
    out
}

fn walk(value: &Value, schema: &Value, path: &str, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            let preserve = schema["x-kubernetes-preserve-unknown-fields"] == json!(true);
            let props = schema["properties"].as_object();
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, v) in map {
                if k.starts_with('$') {
                    continue;
                }
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                if let Some(s) = props.and_then(|props| props.get(k)) {
                    walk(v, s, &p, out);
                } else if let Some(s) = additional {
                    walk(v, s, &p, out);
                } else if !preserve && (props.is_some() || schema["type"] == "object") {
                    out.push(p);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, v) in items.iter().enumerate() {
                    walk(v, s, &format!("{path}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kinds_schema_is_built_once_and_kinds_do_not_share_one() {
        let kinds = ResourceType::defaults();
        let of = |kind: &str| kinds.iter().find(|r| r.kind == kind).unwrap();
        let app = cached_schema(of("Application"));
        assert!(std::sync::Arc::ptr_eq(
            &app,
            &cached_schema(of("Application"))
        ));
        assert_eq!(*app, schema(of("Application")));
        let cm = cached_schema(of("ConfigMap"));
        assert_eq!(*cm, schema(of("ConfigMap")));
        assert_ne!(*cm, *app);
    }

    #[test]
    fn unknown_fields_are_named_and_preserved_subtrees_are_not() {
        let r = ResourceType::defaults()
            .into_iter()
            .find(|r| r.kind == "Application")
            .unwrap();
        let s = schema(&r);
        let app = json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "labels": {"x": "y"}, "bogus": 1},
            "spec": {"project": "p", "foo": 1,
                     "source": {"helm": {"valuesObject": {"any": {"thing": 1}}}},
                     "sources": [{"repoURL": "u", "extra": 1}]},
            "status": {"whatever": true},
        });
        assert_eq!(
            unknown_fields(&app, &s),
            vec!["metadata.bogus", "spec.foo"],
            "source is open (Argo CD keeps plugin/ kustomize details we do not model)"
        );
    }
}
