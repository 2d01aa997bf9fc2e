//! Patches applied locally, so that the agent judges the object a patch would make before
//! it sends the patch: JSON merge patch (RFC 7386), JSON patch (RFC 6902, with the
//! `json-patch` crate) and Kubernetes' strategic merge patch.
//!
//! Strategic merge patch is evaluated as the API server's `strategicpatch` package does for
//! the lists these checks read: maps merge recursively and `null` deletes; lists with a
//! patch merge key in the built-in types merge item by item (`containers`,
//! `initContainers`, `ephemeralContainers`, `volumes`, `env`, `imagePullSecrets`,
//! `resourceClaims`, `schedulingGates` by `name`; `volumeMounts` by `mountPath`;
//! `volumeDevices` by `devicePath`; container `ports` by `containerPort` (a Service's by
//! `port`); `hostAliases` by `ip`; `topologySpreadConstraints` by `topologyKey`;
//! `ownerReferences` by `uid`); `finalizers` merge as a set; every other list is replaced
//! (the default of a list without a patch strategy, e.g. `tolerations`, `sysctls`,
//! `capabilities.add`, `envFrom`). The directives `$patch` (`replace`, `delete`, `merge`),
//! `$retainKeys`, `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` (order
//! only, so ignored) are evaluated; any other `$` directive is refused, since the agent
//! could not tell what the API server would make of it. Server-side apply
//! (`application/apply-patch+yaml`) is refused for the same reason: its result depends on
//! the object's managed fields.

use argocd_agent_identity::text::quoted;
use serde_json::{Map, Value, json};

use super::rules;

/// A patch's type, by its Content-Type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/merge-patch+json` (RFC 7386).
    Merge,
    /// `application/json-patch+json` (RFC 6902).
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
}

/// Why a patch is refused or cannot be applied; the Display text reaches kubectl users in a
/// Kubernetes Status message.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// A server-side apply patch.
    #[error(
        "server-side apply patches are not served: their result depends on managed fields the agent cannot judge (use a merge, JSON or strategic merge patch)"
    )]
    ServerSideApply,
    /// A Content-Type that is no patch type served.
    #[error(
        "patch Content-Type {} is not served (merge, JSON or strategic merge patch)",
        quoted(.0)
    )]
    ContentType(String),
    /// The patch body is not read as strict JSON.
    #[error("the patch: {0}")]
    Body(rules::RuleError),
    /// The conditional patch cannot be written back.
    #[error("the patch: {0}")]
    Encode(serde_json::Error),
    /// A merge patch that is not an object.
    #[error("a merge patch must be a JSON object")]
    MergeNotObject,
    /// A strategic merge patch that is not an object.
    #[error("a strategic merge patch must be a JSON object")]
    StrategicNotObject,
    /// A JSON patch that is not a list of operations.
    #[error("invalid JSON patch: {0}")]
    InvalidJsonPatch(serde_json::Error),
    /// A JSON patch whose operations fail on the object.
    #[error("the JSON patch cannot be applied: {0}")]
    NotApplicable(json_patch::PatchError),
    /// The patch body does not have its Content-Type's shape.
    #[error("the patch is not of its Content-Type's shape")]
    WrongShape,
    /// The patch is nested deeper than [`rules::MAX_SCAN_DEPTH`].
    #[error("the patch is nested too deeply to be checked")]
    TooDeep,
    /// A `$` directive the agent does not evaluate.
    #[error(
        "the strategic merge patch directive {} is not evaluated by the agent",
        quoted(.0)
    )]
    UnknownDirective(String),
    /// A `$patch` value that is not `replace`, `delete` or `merge`.
    #[error("unknown strategic merge patch directive $patch: {0}")]
    UnknownPatchValue(Value),
    /// A directive whose value must be a list.
    #[error("{0} must be a list")]
    NotAList(&'static str),
    /// A `$patch` directive in a list without a merge key.
    #[error(
        "a $patch directive in list {}, which has no merge key, is not evaluated by the agent",
        quoted(.0)
    )]
    DirectiveWithoutKey(String),
    /// A list item without the list's merge key.
    #[error("an item of list {} has no merge key {}", quoted(.field), quoted(.key))]
    NoMergeKey {
        /// The list field.
        field: String,
        /// Its merge key.
        key: String,
    },
    /// An unknown `$patch` directive in a list item.
    #[error(
        "unknown strategic merge patch directive $patch: {} in list {}",
        quoted(.directive),
        quoted(.field)
    )]
    UnknownListDirective {
        /// The directive's value.
        directive: String,
        /// The list field.
        field: String,
    },
    /// A list item that is not an object.
    #[error("an item of list {} is not an object", quoted(.0))]
    ItemNotObject(String),
}

/// The patch type of a request's Content-Type; `Err` says why it is refused.
pub fn patch_type(content_type: &str) -> Result<PatchType, PatchError> {
    let media = content_type.split(';').next().unwrap_or_default().trim();
    match media.to_ascii_lowercase().as_str() {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
            Err(PatchError::ServerSideApply)
        }
        _ => Err(PatchError::ContentType(content_type.to_owned())),
    }
}

/// Applies the patch `body` of type `kind` to `current`: the object the API server would
/// store (if `current` is what it holds). Bodies are read strictly (no key twice in an
/// object).
pub fn apply(kind: PatchType, current: &Value, body: &[u8]) -> Result<Value, PatchError> {
    let patch = rules::read_strict_json(body).map_err(PatchError::Body)?;
    let mut doc = current.clone();
    match kind {
        PatchType::Merge => {
            if !patch.is_object() {
                return Err(PatchError::MergeNotObject);
            }
            json_patch::merge(&mut doc, &patch);
        }
        PatchType::Json => {
            let ops: json_patch::Patch =
                serde_json::from_value(patch).map_err(PatchError::InvalidJsonPatch)?;
            json_patch::patch(&mut doc, &ops).map_err(PatchError::NotApplicable)?;
        }
        PatchType::Strategic => {
            let Value::Object(p) = &patch else {
                return Err(PatchError::StrategicNotObject);
            };
            merge_map(&mut doc, p, 0)?;
        }
    }
    Ok(doc)
}

/// The patch `body` made conditional on `resource_version` (the version the agent judged):
/// `metadata.resourceVersion` in a merge or strategic merge patch, a leading `test` in a
/// JSON patch. The API server then refuses it (409, or 422 for a failed `test`) if the
/// object changed in between.
pub fn with_precondition(
    kind: PatchType,
    body: &[u8],
    resource_version: &str,
) -> Result<Vec<u8>, PatchError> {
    let mut patch = rules::read_strict_json(body).map_err(PatchError::Body)?;
    match (&mut patch, kind) {
        (Value::Array(ops), PatchType::Json) => ops.insert(
            0,
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": resource_version}),
        ),
        (Value::Object(map), PatchType::Merge | PatchType::Strategic) => {
            let meta = map.entry("metadata").or_insert_with(|| json!({}));
            if !meta.is_object() {
                *meta = json!({});
            }
            meta["resourceVersion"] = json!(resource_version);
        }
        _ => return Err(PatchError::WrongShape),
    }
    serde_json::to_vec(&patch).map_err(PatchError::Encode)
}

/// How a list field merges in a strategic merge patch.
enum ListMerge {
    Replace,
    /// Primitive list merged as a set (`metadata.finalizers`).
    Set,
    /// Objects merged by this key.
    ByKey(&'static str),
}

fn list_merge(field: &str, patch: &[Value]) -> ListMerge {
    match field {
        "finalizers" => ListMerge::Set,
        "ownerReferences" => ListMerge::ByKey("uid"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates" => ListMerge::ByKey("name"),
        "volumeMounts" => ListMerge::ByKey("mountPath"),
        "volumeDevices" => ListMerge::ByKey("devicePath"),
        "hostAliases" => ListMerge::ByKey("ip"),
        "topologySpreadConstraints" => ListMerge::ByKey("topologyKey"),
        // A container's ports merge by containerPort, a Service's by port.
        "ports" if patch.iter().any(|p| p.get("containerPort").is_some()) => {
            ListMerge::ByKey("containerPort")
        }
        "ports" => ListMerge::ByKey("port"),
        _ => ListMerge::Replace,
    }
}

/// A patch value with its directives removed (what is stored where the patch replaces);
/// a directive that is not understood is refused.
fn clean(v: &Value, depth: usize) -> Result<Value, PatchError> {
    if depth > rules::MAX_SCAN_DEPTH {
        return Err(PatchError::TooDeep);
    }
    Ok(match v {
        Value::Object(m) => {
            let mut out = Map::new();
            for (k, v) in m {
                if k.starts_with('$') {
                    known_directive(k)?;
                    continue;
                }
                out.insert(k.clone(), clean(v, depth + 1)?);
            }
            Value::Object(out)
        }
        Value::Array(a) => Value::Array(
            a.iter()
                .map(|v| clean(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        other => other.clone(),
    })
}

fn known_directive(key: &str) -> Result<(), PatchError> {
    if key == "$patch"
        || key == "$retainKeys"
        || key.starts_with("$deleteFromPrimitiveList/")
        || key.starts_with("$setElementOrder/")
    {
        Ok(())
    } else {
        Err(PatchError::UnknownDirective(key.to_owned()))
    }
}

fn merge_map(doc: &mut Value, patch: &Map<String, Value>, depth: usize) -> Result<(), PatchError> {
    if depth > rules::MAX_SCAN_DEPTH {
        return Err(PatchError::TooDeep);
    }
    match patch.get("$patch") {
        Some(Value::String(s)) if s == "replace" => {
            *doc = clean(&Value::Object(patch.clone()), depth)?;
            return Ok(());
        }
        Some(Value::String(s)) if s == "delete" => {
            *doc = Value::Null;
            return Ok(());
        }
        Some(Value::String(s)) if s == "merge" => {}
        None => {}
        Some(other) => {
            return Err(PatchError::UnknownPatchValue(other.clone()));
        }
    }
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    let Value::Object(target) = doc else {
        return Ok(());
    };
    if let Some(retain) = patch.get("$retainKeys") {
        let keys: Vec<&str> = retain
            .as_array()
            .ok_or(PatchError::NotAList("$retainKeys"))?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        target.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v
                .as_array()
                .ok_or(PatchError::NotAList("$deleteFromPrimitiveList"))?;
            if let Some(Value::Array(list)) = target.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            known_directive(k)?;
            continue;
        }
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(pm) => {
                let entry = target.entry(k.clone()).or_insert(Value::Null);
                merge_map(entry, pm, depth + 1)?;
                if entry.is_null() {
                    target.remove(k);
                }
            }
            Value::Array(pl) => {
                let merged = merge_list(k, target.get(k), pl, depth + 1)?;
                target.insert(k.clone(), merged);
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(
    field: &str,
    current: Option<&Value>,
    patch: &[Value],
    depth: usize,
) -> Result<Value, PatchError> {
    let current: Vec<Value> = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let directive = |e: &Value| e.get("$patch").and_then(Value::as_str).map(str::to_owned);
    // `[{"$patch": "replace"}, ...]` replaces the whole list.
    if patch
        .iter()
        .any(|e| directive(e).as_deref() == Some("replace"))
    {
        let rest: Vec<Value> = patch
            .iter()
            .filter(|e| e.get("$patch").is_none())
            .cloned()
            .collect();
        return clean(&Value::Array(rest), depth);
    }
    match list_merge(field, patch) {
        ListMerge::Replace => {
            if patch.iter().any(|e| e.get("$patch").is_some()) {
                return Err(PatchError::DirectiveWithoutKey(field.to_owned()));
            }
            clean(&Value::Array(patch.to_vec()), depth)
        }
        ListMerge::Set => {
            let mut out = current;
            for e in patch {
                if !out.contains(e) {
                    out.push(clean(e, depth)?);
                }
            }
            Ok(Value::Array(out))
        }
        ListMerge::ByKey(key) => {
            let mut out = current;
            for e in patch {
                let Some(id) = e.get(key) else {
                    return Err(PatchError::NoMergeKey {
                        field: field.to_owned(),
                        key: key.to_owned(),
                    });
                };
                let pos = out.iter().position(|x| x.get(key) == Some(id));
                match (pos, directive(e).as_deref()) {
                    (Some(i), Some("delete")) => {
                        out.remove(i);
                    }
                    (None, Some("delete")) => {}
                    (_, Some(other)) if other != "merge" => {
                        return Err(PatchError::UnknownListDirective {
                            directive: other.to_owned(),
                            field: field.to_owned(),
                        });
                    }
                    (Some(i), _) => {
                        let Value::Object(pm) = e else {
                            return Err(PatchError::ItemNotObject(field.to_owned()));
                        };
                        merge_map(&mut out[i], pm, depth + 1)?;
                    }
                    (None, _) => out.push(clean(e, depth)?),
                }
            }
            Ok(Value::Array(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The errors as the text kubectl users read, so the tests pin the wording.
    fn patch_type(content_type: &str) -> Result<PatchType, String> {
        super::patch_type(content_type).map_err(|e| e.to_string())
    }

    fn smp(current: Value, patch: Value) -> Result<Value, String> {
        apply(PatchType::Strategic, &current, patch.to_string().as_bytes())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn content_types_choose_the_patch() {
        assert_eq!(
            patch_type("application/merge-patch+json"),
            Ok(PatchType::Merge)
        );
        assert_eq!(
            patch_type("application/json-patch+json; charset=utf-8"),
            Ok(PatchType::Json)
        );
        assert_eq!(
            patch_type("application/strategic-merge-patch+json"),
            Ok(PatchType::Strategic)
        );
        assert!(
            patch_type("application/apply-patch+yaml")
                .unwrap_err()
                .contains("server-side apply")
        );
        assert!(patch_type("application/json").is_err());
        assert!(patch_type("").is_err());
    }

    #[test]
    fn merge_and_json_patches_follow_their_rfcs() {
        let pod = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "spec": {"hostPID": false}});
        let merged = apply(
            PatchType::Merge,
            &pod,
            br#"{"metadata":{"labels":{"a":null}},"spec":{"hostPID":true}}"#,
        )
        .unwrap();
        assert_eq!(
            merged,
            json!({"metadata": {"labels": {"b": "2"}}, "spec": {"hostPID": true}})
        );
        let patched = apply(
            PatchType::Json,
            &pod,
            br#"[{"op":"remove","path":"/metadata/labels/a"},{"op":"add","path":"/spec/hostNetwork","value":true}]"#,
        )
        .unwrap();
        assert_eq!(patched["spec"]["hostNetwork"], json!(true));
        assert!(patched["metadata"]["labels"].get("a").is_none());
        assert!(
            apply(
                PatchType::Json,
                &pod,
                br#"[{"op":"remove","path":"/nope"}]"#
            )
            .is_err()
        );
        assert!(apply(PatchType::Merge, &pod, b"[]").is_err());
        assert!(
            apply(
                PatchType::Merge,
                &pod,
                br#"{"spec":{"hostPID":true},"spec":{}}"#
            )
            .is_err()
        );
    }

    #[test]
    fn strategic_lists_merge_by_their_keys() {
        let pod = json!({"spec": {"containers": [{"name": "web", "image": "nginx",
            "securityContext": {"runAsUser": 1000}}],
            "volumes": [{"name": "cfg", "configMap": {"name": "web"}}],
            "tolerations": [{"key": "a", "operator": "Exists"}]}});
        let out = smp(
            pod.clone(),
            json!({"spec": {"hostNetwork": true,
            "containers": [{"name": "web", "securityContext": {"privileged": true}}],
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "tolerations": [{"operator": "Exists"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["hostNetwork"], json!(true));
        assert_eq!(out["spec"]["containers"][0]["image"], json!("nginx"));
        assert_eq!(
            out["spec"]["containers"][0]["securityContext"],
            json!({"runAsUser": 1000, "privileged": true})
        );
        assert_eq!(out["spec"]["volumes"].as_array().unwrap().len(), 2);
        assert_eq!(out["spec"]["tolerations"], json!([{"operator": "Exists"}]));
        // Delete and replace directives.
        let out = smp(
            pod.clone(),
            json!({"spec": {"volumes": [{"name": "cfg", "$patch": "delete"}],
            "containers": [{"$patch": "replace"}, {"name": "other"}]}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["volumes"], json!([]));
        assert_eq!(out["spec"]["containers"], json!([{"name": "other"}]));
        let out = smp(
            pod.clone(),
            json!({"spec": {"$patch": "replace", "containers": []}}),
        )
        .unwrap();
        assert_eq!(out["spec"], json!({"containers": []}));
        // Container ports by containerPort, a Service's by port.
        let svc = json!({"spec": {"ports": [{"port": 80, "name": "http"}]}});
        let out = smp(svc, json!({"spec": {"ports": [{"port": 443}]}})).unwrap();
        assert_eq!(out["spec"]["ports"].as_array().unwrap().len(), 2);
        // Finalizers as a set, owner references by uid.
        let meta = json!({"metadata": {"finalizers": ["a"], "ownerReferences": [{"uid": "1", "kind": "X"}]}});
        let out = smp(
            meta,
            json!({"metadata": {"finalizers": ["a", "b"],
            "ownerReferences": [{"uid": "2", "kind": "Y"}]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            out["metadata"]["ownerReferences"].as_array().unwrap().len(),
            2
        );
    }

    #[test]
    fn strategic_directives_the_agent_cannot_judge_are_refused() {
        let pod = json!({"spec": {"containers": [{"name": "web"}]}});
        for patch in [
            json!({"spec": {"$unknown": true}}),
            json!({"spec": {"$patch": "weird"}}),
            json!({"spec": {"containers": [{"image": "no-name"}]}}),
            json!({"spec": {"tolerations": [{"$patch": "delete", "key": "a"}]}}),
            json!({"spec": {"containers": [{"name": "web", "$patch": "explode"}]}}),
            json!("not an object"),
        ] {
            assert!(smp(pod.clone(), patch.clone()).is_err(), "{patch}");
        }
        // Known directives that only order or prune are evaluated.
        let out = smp(
            pod.clone(),
            json!({"spec": {"$setElementOrder/containers": [{"name": "web"}],
            "$retainKeys": ["containers"], "hostPID": true}}),
        )
        .unwrap();
        assert_eq!(out["spec"]["hostPID"], json!(true));
        let out = smp(
            json!({"metadata": {"finalizers": ["a", "b"]}}),
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["a"]}}),
        )
        .unwrap();
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn preconditions_pin_the_judged_version() {
        let merge =
            with_precondition(PatchType::Merge, br#"{"spec":{"replicas":1}}"#, "42").unwrap();
        let merge: Value = serde_json::from_slice(&merge).unwrap();
        assert_eq!(
            merge,
            json!({"spec": {"replicas": 1}, "metadata": {"resourceVersion": "42"}})
        );
        let jp = with_precondition(
            PatchType::Json,
            br#"[{"op":"add","path":"/spec/replicas","value":1}]"#,
            "42",
        )
        .unwrap();
        let jp: Value = serde_json::from_slice(&jp).unwrap();
        assert_eq!(
            jp[0],
            json!({"op": "test", "path": "/metadata/resourceVersion", "value": "42"})
        );
        assert_eq!(jp.as_array().unwrap().len(), 2);
        assert!(with_precondition(PatchType::Json, b"{}", "42").is_err());
    }
}
