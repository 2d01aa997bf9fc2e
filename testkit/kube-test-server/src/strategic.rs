//! Strategic merge patch for the built-in kinds served here, after the apiserver's
//! `strategicpatch`: maps merge recursively, `null` deletes, `$patch: replace|delete` on a
//! map, `$retainKeys`, `$deleteFromPrimitiveList/<f>`, lists merged by their patch merge key
//! (`containers`, `volumes`, `env`... by `name`; `ownerReferences` by `uid`) or, for
//! `finalizers`, as a set; other lists are replaced. `$setElementOrder/<f>` is accepted and
//! ignored (order is not kept).

use serde_json::{Map, Value};

/// How a list field merges.
enum ListMerge {
    Replace,
    /// Primitive list merged as a set (`metadata.finalizers`).
    Set,
    /// Objects merged by this key.
    ByKey(&'static str),
}

fn list_merge(field: &str) -> ListMerge {
    match field {
        "finalizers" => ListMerge::Set,
        "ownerReferences" => ListMerge::ByKey("uid"),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets" => ListMerge::ByKey("name"),
        "volumeMounts" => ListMerge::ByKey("mountPath"),
        "ports" => ListMerge::ByKey("containerPort"),
        _ => ListMerge::Replace,
    }
}

/// A patch value with every directive removed (what is stored where the patch replaces).
fn clean(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .map(|(k, v)| (k.clone(), clean(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(clean).collect()),
        other => other.clone(),
    }
}

/// Applies `patch` to `doc`. Errors name the offending directive.
pub fn apply(doc: &mut Value, patch: &Value) -> Result<(), String> {
    let Value::Object(p) = patch else {
        return Err("a strategic merge patch must be a JSON object".into());
    };
    merge_map(doc, p)
}

fn merge_map(doc: &mut Value, patch: &Map<String, Value>) -> Result<(), String> {
    match patch.get("$patch").and_then(Value::as_str) {
        Some("replace") => {
            *doc = clean(&Value::Object(patch.clone()));
            return Ok(());
        }
        Some("delete") => {
            *doc = Value::Null;
            return Ok(());
        }
        Some("merge") | None => {}
        Some(other) => return Err(format!("unknown patch type: {other:?} in map")),
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
            .ok_or("$retainKeys must be a list")?
            .iter()
            .filter_map(Value::as_str)
            .collect();
        target.retain(|k, _| keys.contains(&k.as_str()));
    }
    for (k, v) in patch {
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let remove = v
                .as_array()
                .ok_or("$deleteFromPrimitiveList must be a list")?;
            if let Some(Value::Array(list)) = target.get_mut(field) {
                list.retain(|x| !remove.contains(x));
            }
            continue;
        }
        if k.starts_with('$') {
            continue;
        }
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(pm) => {
                let entry = target.entry(k.clone()).or_insert(Value::Null);
                merge_map(entry, pm)?;
                if entry.is_null() {
                    target.remove(k);
                }
            }
            Value::Array(pl) => {
                let merged = merge_list(k, target.get(k), pl)?;
                target.insert(k.clone(), merged);
            }
            other => {
                target.insert(k.clone(), other.clone());
            }
        }
    }
    Ok(())
}

fn merge_list(field: &str, current: Option<&Value>, patch: &[Value]) -> Result<Value, String> {
    let current: Vec<Value> = current
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    // `[{"$patch": "replace"}, ...]` replaces the whole list.
    if patch
        .iter()
        .any(|e| e.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        return Ok(Value::Array(
            patch
                .iter()
                .filter(|e| e.get("$patch").is_none())
                .map(clean)
                .collect(),
        ));
    }
    match list_merge(field) {
        ListMerge::Replace => Ok(clean(&Value::Array(patch.to_vec()))),
        ListMerge::Set => {
            let mut out = current;
            for e in patch {
                if !out.contains(e) {
                    out.push(e.clone());
                }
            }
            Ok(Value::Array(out))
        }
        ListMerge::ByKey(key) => {
            let mut out = current;
            for e in patch {
                let Some(id) = e.get(key) else {
                    return Err(format!(
                        "map: {e} does not contain declared merge key: {key}"
                    ));
                };
                let pos = out.iter().position(|x| x.get(key) == Some(id));
                let delete = e.get("$patch").and_then(Value::as_str) == Some("delete");
                match (pos, delete) {
                    (Some(i), true) => {
                        out.remove(i);
                    }
                    (None, true) => {}
                    (Some(i), false) => {
                        if let Value::Object(pm) = e {
                            merge_map(&mut out[i], pm)?;
                        }
                    }
                    (None, false) => out.push(clean(e)),
                }
            }
            Ok(Value::Array(out))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn directives_replace_delete_and_merge_by_key() {
        let mut doc = json!({"data": {"a": "1", "b": "2"}, "metadata": {"finalizers": ["x"]},
            "spec": {"containers": [{"name": "c", "image": "old", "env": [{"name": "A", "value": "1"}]}]}});
        apply(
            &mut doc,
            &json!({"data": {"$patch": "replace", "c": "3"},
            "metadata": {"finalizers": ["y"]},
            "spec": {"containers": [{"name": "c", "image": "new"}, {"name": "d", "image": "i"}]}}),
        )
        .unwrap();
        assert_eq!(doc["data"], json!({"c": "3"}));
        assert_eq!(doc["metadata"]["finalizers"], json!(["x", "y"]));
        assert_eq!(doc["spec"]["containers"][0]["image"], "new");
        assert_eq!(doc["spec"]["containers"][0]["env"][0]["value"], "1");
        assert_eq!(doc["spec"]["containers"][1]["name"], "d");
        apply(&mut doc, &json!({"spec": {"containers": [{"name": "d", "$patch": "delete"}]},
            "$deleteFromPrimitiveList/metadata": [], "metadata": {"$deleteFromPrimitiveList/finalizers": ["x"]}}))
        .unwrap();
        assert_eq!(doc["spec"]["containers"].as_array().unwrap().len(), 1);
        assert_eq!(doc["metadata"]["finalizers"], json!(["y"]));
        apply(&mut doc, &json!({"data": {"$patch": "delete"}})).unwrap();
        assert!(doc.get("data").is_none());
    }
}
