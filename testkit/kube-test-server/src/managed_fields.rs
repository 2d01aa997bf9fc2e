//! Field ownership (`metadata.managedFields`, FieldsV1) and server-side apply, after the
//! apiserver's structured-merge-diff, simplified: a field set holds leaf paths; maps are
//! merged per key; `metadata.finalizers` is a set (each value owned separately, `v:`); every
//! other list is atomic (owned and replaced whole), as in a CRD without list-type markers.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use super::ResourceType;
use super::status::ApiError;

/// A path to an owned field: `f:<name>` per map key, `v:<json>` for a set element.
type Path = Vec<String>;

/// Metadata the server owns; never tracked.
const SERVER_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

/// Who writes: the `fieldManager` and whether the write is to `/status`.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    /// `fieldManager` query parameter, or the User-Agent's product as the apiserver defaults it.
    pub manager: String,
    /// The write is on the `/status` subresource.
    pub status: bool,
}

fn leaves(v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
    match v {
        Value::Object(m) if !m.is_empty() => {
            for (k, child) in m {
                prefix.push(format!("f:{k}"));
                leaves(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {
            out.insert(prefix.clone());
        }
    }
}

/// The fields an object (or apply configuration) sets, for the part `writer` may write.
fn fields_of(r: &ResourceType, obj: &Value, status: bool) -> BTreeSet<Path> {
    let mut out = BTreeSet::new();
    let Some(top) = obj.as_object() else {
        return out;
    };
    for (k, v) in top {
        let tracked = match k.as_str() {
            "apiVersion" | "kind" => false,
            "status" => !r.status_subresource || status,
            _ => !(r.status_subresource && status),
        };
        if !tracked {
            continue;
        }
        if k == "metadata" {
            let Some(meta) = v.as_object() else { continue };
            for (mk, mv) in meta {
                if SERVER_METADATA.contains(&mk.as_str()) {
                    continue;
                }
                let mut prefix = vec!["f:metadata".to_string(), format!("f:{mk}")];
                match (mk.as_str(), mv) {
                    ("finalizers", Value::Array(items)) => {
                        for i in items {
                            let mut p = prefix.clone();
                            p.push(format!("v:{i}"));
                            out.insert(p);
                        }
                    }
                    _ => leaves(mv, &mut prefix, &mut out),
                }
            }
            continue;
        }
        leaves(v, &mut vec![format!("f:{k}")], &mut out);
    }
    out
}

fn value_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path {
        if let Some(k) = seg.strip_prefix("f:") {
            cur = cur.get(k)?;
        } else if let Some(v) = seg.strip_prefix("v:") {
            let want: Value = serde_json::from_str(v).ok()?;
            return cur.as_array()?.iter().find(|x| **x == want);
        }
    }
    Some(cur)
}

fn remove_at(obj: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut cur = obj;
    for seg in parents {
        let Some(k) = seg.strip_prefix("f:") else {
            return;
        };
        match cur.get_mut(k) {
            Some(next) => cur = next,
            None => return,
        }
    }
    if let Some(k) = last.strip_prefix("f:") {
        if let Some(m) = cur.as_object_mut() {
            m.remove(k);
        }
    } else if let Some(v) = last.strip_prefix("v:")
        && let Ok(want) = serde_json::from_str::<Value>(v)
        && let Some(a) = cur.as_array_mut()
    {
        a.retain(|x| *x != want);
    }
}

/// FieldsV1: nested objects keyed by path segments, `{}` at the leaves.
fn to_fields_v1(set: &BTreeSet<Path>) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            let next = cur.entry(seg.clone()).or_insert_with(|| json!({}));
            let Value::Object(m) = next else { break };
            cur = m;
        }
    }
    Value::Object(root)
}

fn from_fields_v1(v: &Value) -> BTreeSet<Path> {
    fn walk(v: &Value, prefix: &mut Path, out: &mut BTreeSet<Path>) {
        match v.as_object() {
            Some(m) if !m.is_empty() => {
                for (k, child) in m {
                    if k == "." {
                        out.insert(prefix.clone());
                        continue;
                    }
                    prefix.push(k.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {
                if !prefix.is_empty() {
                    out.insert(prefix.clone());
                }
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// One `managedFields` entry.
#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: String,
    subresource: Option<String>,
    set: BTreeSet<Path>,
}

impl Entry {
    fn same_writer(&self, manager: &str, operation: &str, status: bool) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource.as_deref() == status.then_some("status")
    }
}

fn entries(obj: &Value) -> Vec<Entry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|e| {
                    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                    Entry {
                        manager: s("manager"),
                        operation: s("operation"),
                        api_version: s("apiVersion"),
                        time: s("time"),
                        subresource: e
                            .get("subresource")
                            .and_then(Value::as_str)
                            .map(str::to_string),
                        set: from_fields_v1(e.get("fieldsV1").unwrap_or(&Value::Null)),
                    }
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Writes `entries` into `obj`, keeping an entry's old timestamp when its fields did not
/// change (so a no-op write stays a no-op).
fn store_entries(obj: &mut Value, mut list: Vec<Entry>, before: &[Entry], now: &str) {
    list.retain(|e| !e.set.is_empty());
    let out: Vec<Value> = list
        .iter()
        .map(|e| {
            let unchanged = before.iter().any(|b| {
                b.manager == e.manager
                    && b.operation == e.operation
                    && b.subresource == e.subresource
                    && b.set == e.set
            });
            let time = if unchanged && !e.time.is_empty() {
                e.time.clone()
            } else {
                now.to_string()
            };
            let mut v = json!({
                "manager": e.manager, "operation": e.operation, "apiVersion": e.api_version,
                "time": time, "fieldsType": "FieldsV1", "fieldsV1": to_fields_v1(&e.set),
            });
            if let Some(s) = &e.subresource {
                v["subresource"] = json!(s);
            }
            v
        })
        .collect();
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        if out.is_empty() {
            meta.remove("managedFields");
        } else {
            meta.insert("managedFields".into(), Value::Array(out));
        }
    }
}

/// Records a non-apply write (create, update, patch) by `writer`: the fields it added or
/// changed become its own (operation `Update`) and leave other managers; removed fields
/// leave every manager. Updates never conflict.
pub fn record_update(
    r: &ResourceType,
    old: Option<&Value>,
    new: &mut Value,
    writer: &Writer,
    now: &str,
) {
    let before = old.map(entries).unwrap_or_default();
    let old_fields = old
        .map(|o| fields_of(r, o, writer.status))
        .unwrap_or_default();
    let new_fields = fields_of(r, new, writer.status);
    let changed: BTreeSet<Path> = new_fields
        .iter()
        .filter(|p| old.is_none_or(|o| value_at(o, p) != value_at(new, p)))
        .cloned()
        .collect();
    let removed: BTreeSet<&Path> = old_fields.difference(&new_fields).collect();
    let mut list = before.clone();
    for e in &mut list {
        e.set
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    if !changed.is_empty() {
        match list
            .iter_mut()
            .find(|e| e.same_writer(&writer.manager, "Update", writer.status))
        {
            Some(e) => {
                e.set.extend(changed);
                e.api_version = r.api_version();
            }
            None => list.push(Entry {
                manager: writer.manager.clone(),
                operation: "Update".into(),
                api_version: r.api_version(),
                time: String::new(),
                subresource: writer.status.then(|| "status".to_string()),
                set: changed,
            }),
        }
    }
    store_entries(new, list, &before, now);
}

/// Merges an apply configuration into the object: maps per key, everything else replaced;
/// `metadata.finalizers` as a set.
fn merge_config(target: &mut Value, config: &Value, in_metadata: bool) {
    match (target, config) {
        (Value::Object(t), Value::Object(c)) => {
            for (k, v) in c {
                if v.is_null() {
                    t.remove(k);
                    continue;
                }
                if in_metadata && k == "finalizers" {
                    let list = t.entry(k.clone()).or_insert_with(|| json!([]));
                    if let (Value::Array(have), Value::Array(add)) = (list, v) {
                        for f in add {
                            if !have.contains(f) {
                                have.push(f.clone());
                            }
                        }
                    }
                    continue;
                }
                match t.get_mut(k) {
                    Some(existing) if existing.is_object() && v.is_object() => {
                        merge_config(existing, v, k == "metadata" && !in_metadata);
                    }
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, c) => *t = c.clone(),
    }
}

/// Server-side apply of `config` by `writer` onto `current` (`None`: the object is new).
/// Returns the object to store. Fields another manager owns with a different value are a
/// 409 Conflict unless `force`; fields this manager applied before and no longer applies are
/// removed unless someone else owns them.
pub fn apply(
    r: &ResourceType,
    current: &Value,
    config: &Value,
    writer: &Writer,
    force: bool,
    now: &str,
) -> Result<Value, ApiError> {
    let name = current
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    let before = entries(current);
    let applied = fields_of(r, config, writer.status);
    let mut list = before.clone();
    let mine = |e: &Entry| e.same_writer(&writer.manager, "Apply", writer.status);
    let mut conflicts: BTreeMap<Path, Vec<String>> = BTreeMap::new();
    for e in list.iter_mut().filter(|e| !mine(e)) {
        let contested: Vec<Path> = e
            .set
            .iter()
            .filter(|p| applied.contains(*p) && value_at(current, p) != value_at(config, p))
            .cloned()
            .collect();
        for p in contested {
            if force {
                e.set.remove(&p);
            } else {
                conflicts.entry(p).or_default().push(e.manager.clone());
            }
        }
    }
    if !conflicts.is_empty() {
        return Err(ApiError::apply_conflict(r, name, &conflicts));
    }
    let previously: BTreeSet<Path> = list
        .iter()
        .filter(|e| mine(e))
        .flat_map(|e| e.set.iter().cloned())
        .collect();
    let mut obj = current.clone();
    for p in previously.difference(&applied) {
        let owned_elsewhere = list.iter().any(|e| !mine(e) && e.set.contains(p));
        if !owned_elsewhere {
            remove_at(&mut obj, p);
        }
    }
    let mut cfg = config.clone();
    if let Some(m) = cfg.as_object_mut() {
        // Only the part this endpoint writes is merged.
        if r.status_subresource && writer.status {
            m.retain(|k, _| k == "status");
        } else if r.status_subresource {
            m.remove("status");
        }
        if let Some(meta) = m.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.retain(|k, _| !SERVER_METADATA.contains(&k.as_str()));
        }
    }
    merge_config(&mut obj, &cfg, false);
    // Fields that became equal through this apply are shared; others keep what they own.
    list.retain(|e| !mine(e));
    list.push(Entry {
        manager: writer.manager.clone(),
        operation: "Apply".into(),
        api_version: r.api_version(),
        time: before
            .iter()
            .find(|e| mine(e))
            .map(|e| e.time.clone())
            .unwrap_or_default(),
        subresource: writer.status.then(|| "status".to_string()),
        set: applied,
    });
    store_entries(&mut obj, list, &before, now);
    Ok(obj)
}

/// The `managedFields` a new object created by apply starts with.
pub fn applied_on_create(r: &ResourceType, obj: &mut Value, writer: &Writer, now: &str) {
    let set = fields_of(r, obj, false);
    let e = Entry {
        manager: writer.manager.clone(),
        operation: "Apply".into(),
        api_version: r.api_version(),
        time: String::new(),
        subresource: None,
        set,
    };
    store_entries(obj, vec![e], &[], now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res() -> ResourceType {
        ResourceType::new("", "v1", "configmaps", "ConfigMap", true, false)
    }

    #[test]
    fn fields_v1_round_trips() {
        let obj = json!({"metadata": {"name": "x", "labels": {"a": "1"}, "finalizers": ["f"]},
            "data": {"k": "v", "e": {}}});
        let set = fields_of(&res(), &obj, false);
        let v1 = to_fields_v1(&set);
        assert_eq!(
            v1,
            json!({"f:data": {"f:e": {}, "f:k": {}},
                   "f:metadata": {"f:finalizers": {"v:\"f\"": {}}, "f:labels": {"f:a": {}}}})
        );
        assert_eq!(from_fields_v1(&v1), set);
    }

    #[test]
    fn apply_conflicts_forces_and_prunes() {
        let r = res();
        let a = Writer {
            manager: "a".into(),
            status: false,
        };
        let b = Writer {
            manager: "b".into(),
            status: false,
        };
        let mut obj = json!({"metadata": {"name": "x"}, "data": {"k": "1", "j": "1"}});
        applied_on_create(&r, &mut obj, &a, "t0");
        // b sets the same value: no conflict, shared.
        let obj = apply(&r, &obj, &json!({"data": {"k": "1"}}), &b, false, "t1").unwrap();
        // b sets another value: conflict with a.
        let e = apply(&r, &obj, &json!({"data": {"k": "2"}}), &b, false, "t2").unwrap_err();
        assert_eq!(e.code, 409);
        let forced = apply(&r, &obj, &json!({"data": {"k": "2"}}), &b, true, "t2").unwrap();
        assert_eq!(forced["data"]["k"], "2");
        // a drops j: removed (nobody else owns it); a drops k: b owns it, it stays.
        let pruned = apply(&r, &forced, &json!({"data": {}}), &a, false, "t3").unwrap();
        assert_eq!(pruned["data"], json!({"k": "2"}));
    }
}
