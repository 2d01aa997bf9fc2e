//! Helpers over [`DynamicObject`]: deletion state, spec/status access, checksums and the
//! copy of an object that travels between principal and agent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::DynamicObject;
use ring::digest;

use crate::Kind;
use serde_json::Value;

/// True when the API server has set `metadata.deletionTimestamp`: the object is being
/// deleted (finalizers still pending) but is not gone yet.
pub fn is_being_deleted(obj: &DynamicObject) -> bool {
    obj.metadata.deletion_timestamp.is_some()
}

/// The object's `.spec`, if any.
pub fn spec(obj: &DynamicObject) -> Option<&Value> {
    obj.data.get("spec")
}

/// The object's `.status`, if any.
pub fn status(obj: &DynamicObject) -> Option<&Value> {
    obj.data.get("status")
}

/// The object's top-level `.operation` (Argo CD sync request), if any.
pub fn operation(obj: &DynamicObject) -> Option<&Value> {
    obj.data.get("operation")
}

/// Hex SHA-256 of the canonical JSON (keys sorted, no whitespace) of `.spec`.
///
/// An object without a spec hashes as JSON `null`, so "no spec" is a stable value too.
pub fn spec_checksum(obj: &DynamicObject) -> String {
    checksum_of(spec(obj).unwrap_or(&Value::Null))
}

/// Hex SHA-256 of the canonical JSON of a `.status` value, where an absent, `null` or empty
/// status all hash as `{}`: a copy whose status was cleared (written as `{}`) matches a
/// source that has none.
pub fn status_checksum_of(status: Option<&Value>) -> String {
    match status {
        Some(v) if !v.is_null() && v.as_object().is_none_or(|m| !m.is_empty()) => checksum_of(v),
        _ => checksum_of(&Value::Object(serde_json::Map::new())),
    }
}

/// [`status_checksum_of`] of the object's `.status`.
pub fn status_checksum(obj: &DynamicObject) -> String {
    status_checksum_of(status(obj))
}

/// Argo CD's refresh request (`normal` or `hard`), set by the UI's Refresh / Hard refresh
/// and `argocd app get --refresh`, removed by the application controller once it has
/// reconciled the Application (argoproj/argo-cd
/// `pkg/apis/application/v1alpha1/application_annotations.go`, `AnnotationKeyRefresh`).
pub const REFRESH_ANNOTATION: &str = "argocd.argoproj.io/refresh";

/// The notifications controller's record of the notifications it sent for an object
/// (argoproj/argo-cd `notifications_catalog` / notifications-engine `pkg/controller`).
pub const NOTIFIED_ANNOTATION: &str = "notified.notifications.argoproj.io";

/// Prefix of notification subscriptions (`notifications.argoproj.io/subscribe.<trigger>.<service>`).
pub const SUBSCRIBE_PREFIX: &str = "notifications.argoproj.io/subscribe.";

/// What `kubectl apply` writes: the whole applied object, local to the cluster it was
/// applied on.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Managed spokes: the annotations of an Application the spoke owns, which the hub's
/// labels and annotations never overwrite nor remove: the spoke's notification state, what
/// `kubectl apply` recorded there, and a refresh request (the hub's goes down once; the
/// spoke's controller removes it, and that removal is not reverted).
pub fn spoke_owned_key(key: &str) -> bool {
    key == NOTIFIED_ANNOTATION || key == LAST_APPLIED_ANNOTATION || key == REFRESH_ANNOTATION
}

/// Autonomous hub copies: the annotations the hub owns, which no change from the spoke
/// overwrites or removes unless it sets them itself: the hub's notification state and
/// its notification subscriptions.
pub fn hub_owned_key(key: &str) -> bool {
    key == NOTIFIED_ANNOTATION || key.starts_with(SUBSCRIBE_PREFIX)
}

/// Annotation on a managed agent's status report: the spoke's Argo CD has carried out (and
/// removed) the hub's refresh request of this value, so the principal removes it from the
/// hub copy. A principal that does not know it ignores it (the hub then keeps its refresh
/// request, as before).
pub const REFRESHED_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/refreshed";

/// Annotation on a managed agent's spoke-authored Application (a child an app-of-apps
/// parent created on the spoke) and on its read-only hub copy: the parent's name. The
/// agent sends it with every publish and delete of such a child; the principal writes the
/// child only into that agent's hub namespace, never over an Application created on the hub.
pub const PARENT_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/parent-application";

/// Annotation on a cached stand-in ([`oversized_stub`]) of an object too large to cache in
/// full: the object's weight ([`object_weight`]) as listed or watched.
pub const OVERSIZED_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/oversized-bytes";

/// Prefix of this project's own labels and annotations.
const OWN_KEY_PREFIX: &str = "argocd-agent.argoproj-labs.io/";

/// Labels a stub keeps in full when they are this small (as JSON); larger label sets keep
/// only this project's own keys.
const STUB_LABELS_MAX: usize = 4096;

/// The size in bytes of `value` written as compact JSON, counted without building the
/// text. A value that cannot be written (never for JSON values and Kubernetes objects)
/// counts as `usize::MAX`.
pub fn json_size<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(buf.len());
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    match serde_json::to_writer(&mut count, value) {
        Ok(()) => count.0,
        Err(_) => usize::MAX,
    }
}

/// What one JSON value (number, string, array, object, boolean, null) costs in memory once
/// decoded, beyond its text: a `serde_json::Value` is 32 bytes, plus its map entry or
/// array slot.
pub const VALUE_WEIGHT: usize = 32;

/// The weight of a JSON value: its compact JSON bytes plus [`VALUE_WEIGHT`] per value in
/// it. Unlike the JSON bytes, it bounds what the value costs in memory once decoded: an
/// array of zeros is 2 bytes of JSON per element but 32 bytes or more of memory.
pub fn value_weight(value: &Value) -> usize {
    json_size(value).saturating_add(VALUE_WEIGHT.saturating_mul(value_count(value)))
}

/// The weight ([`value_weight`]) of an object: its JSON bytes plus [`VALUE_WEIGHT`] per
/// value of its body (metadata is typed, and small).
pub fn object_weight(obj: &DynamicObject) -> usize {
    json_size(obj).saturating_add(VALUE_WEIGHT.saturating_mul(value_count(&obj.data)))
}

/// The number of JSON values in `value`, itself included. Iterative: a value from the
/// wire is as deep as its decoder allowed.
fn value_count(value: &Value) -> usize {
    let mut count = 0usize;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        count += 1;
        match v {
            Value::Array(a) => stack.extend(a.iter()),
            Value::Object(m) => stack.extend(m.values()),
            _ => {}
        }
    }
    count
}

/// A stand-in for an object too large to keep in full (`size`: its weight,
/// [`object_weight`]): its
/// identity (name, namespace, uid, resourceVersion, generation, creation and deletion
/// timestamps, finalizers), its labels (only this project's own when there are many), this
/// project's own annotations, and [`OVERSIZED_ANNOTATION`] with the size. No `spec`,
/// `status` or other field.
pub fn oversized_stub(obj: &DynamicObject, size: usize) -> DynamicObject {
    let meta = &obj.metadata;
    let labels = meta.labels.as_ref().map(|l| {
        if json_size(l) <= STUB_LABELS_MAX {
            l.clone()
        } else {
            own_keys(l)
        }
    });
    let mut annotations = meta.annotations.as_ref().map(own_keys).unwrap_or_default();
    annotations.insert(OVERSIZED_ANNOTATION.to_owned(), size.to_string());
    DynamicObject {
        types: obj.types.clone(),
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            generation: meta.generation,
            creation_timestamp: meta.creation_timestamp.clone(),
            deletion_timestamp: meta.deletion_timestamp.clone(),
            finalizers: meta.finalizers.clone(),
            labels,
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        data: Value::Object(Default::default()),
    }
}

fn own_keys(
    m: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    m.iter()
        .filter(|(k, v)| k.starts_with(OWN_KEY_PREFIX) && v.len() <= 253)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The size recorded on a stub made by [`oversized_stub`]; `None` for a whole object.
pub fn oversized_size(obj: &DynamicObject) -> Option<usize> {
    obj.metadata
        .annotations
        .as_ref()?
        .get(OVERSIZED_ANNOTATION)?
        .parse()
        .ok()
}

/// One annotation of an object given as JSON.
pub fn annotation_of<'a>(obj: &'a serde_json::Value, key: &str) -> Option<&'a str> {
    obj.get("metadata")?.get("annotations")?.get(key)?.as_str()
}

/// Hex SHA-256 of an object's labels and annotations (canonical JSON), what a managed
/// agent receives besides `.spec`; the hub's own notification state and kubectl's
/// last-applied record are not part of it (a managed spoke never takes them).
pub fn metadata_checksum(obj: &DynamicObject) -> String {
    let annotations: Option<std::collections::BTreeMap<&String, &String>> = obj
        .metadata
        .annotations
        .as_ref()
        .map(|a| a.iter().filter(|(k, _)| !side_local_key(k)).collect());
    checksum_of(&serde_json::json!({
        "labels": obj.metadata.labels,
        "annotations": annotations,
    }))
}

/// Annotations each side keeps for itself on a managed copy: notification state and
/// kubectl's last-applied record.
pub fn side_local_key(key: &str) -> bool {
    key == NOTIFIED_ANNOTATION || key == LAST_APPLIED_ANNOTATION
}

/// Annotation on a managed copy: the UID of the object it was copied from on the hub, so
/// the spoke can tell an object deleted and recreated on the hub from an update (as
/// upstream argocd-agent).
pub const SOURCE_UID_ANNOTATION: &str = "argocd.argoproj.io/source-uid";

/// [`strip_for_transfer`] plus [`SOURCE_UID_ANNOTATION`] set to the object's UID: the form
/// in which the source of truth sends an object to a managed copy.
pub fn stamped_for_transfer(obj: &DynamicObject) -> DynamicObject {
    DynamicObject {
        types: obj.types.clone(),
        metadata: stamped_meta(&obj.metadata),
        data: obj.data.clone(),
    }
}

/// [`transfer_meta`] plus [`SOURCE_UID_ANNOTATION`] set to the object's UID.
fn stamped_meta(meta: &ObjectMeta) -> ObjectMeta {
    let mut out = transfer_meta(meta);
    if let Some(uid) = &meta.uid {
        out.annotations
            .get_or_insert_with(Default::default)
            .insert(SOURCE_UID_ANNOTATION.to_owned(), uid.clone());
    }
    out
}

/// Hex SHA-256 of an object's content ([`Kind::content_fields`]) given as JSON: for kinds
/// whose content is `spec` it equals [`spec_checksum`]; otherwise it covers the content
/// fields together (absent ones as absent).
pub fn content_checksum(kind: Kind, obj: &Value) -> String {
    match kind.content_fields() {
        ["spec"] => checksum_of(obj.get("spec").unwrap_or(&Value::Null)),
        fields => {
            let content: serde_json::Map<String, Value> = fields
                .iter()
                .filter_map(|f| Some(((*f).to_owned(), obj.get(*f)?.clone())))
                .collect();
            checksum_of(&Value::Object(content))
        }
    }
}

/// Hex SHA-256 of the canonical JSON of `value` (object keys sorted at every level). The
/// canonical form is hashed as it is written, a chunk at a time, never held whole.
pub fn checksum_of(value: &Value) -> String {
    let mut sink = Digesting::new();
    write_canonical(value, &mut sink);
    hex(sink.finish().as_ref())
}

/// Bytes written into it are hashed (SHA-256) in chunks of [`Digesting::CHUNK`].
struct Digesting {
    ctx: digest::Context,
    buf: [u8; Digesting::CHUNK],
    len: usize,
}

impl Digesting {
    const CHUNK: usize = 4096;

    fn new() -> Self {
        Digesting {
            ctx: digest::Context::new(&digest::SHA256),
            buf: [0; Self::CHUNK],
            len: 0,
        }
    }

    fn finish(mut self) -> digest::Digest {
        self.ctx.update(&self.buf[..self.len]);
        self.ctx.finish()
    }
}

impl std::io::Write for Digesting {
    fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<usize> {
        let n = bytes.len();
        while !bytes.is_empty() {
            if self.len == Self::CHUNK {
                self.ctx.update(&self.buf);
                self.len = 0;
            }
            let take = bytes.len().min(Self::CHUNK - self.len);
            self.buf[self.len..self.len + take].copy_from_slice(&bytes[..take]);
            self.len += take;
            bytes = &bytes[take..];
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `namespace/name`, or `name` for cluster-scoped objects.
pub fn object_key(obj: &DynamicObject) -> String {
    let name = obj.metadata.name.as_deref().unwrap_or_default();
    match obj.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// Turns an object received from the other side (JSON, as [`strip_for_transfer`] sent it)
/// into this cluster's copy: placed in `namespace`, server-owned metadata cleared, marked
/// with `label` (key, value). Unknown fields are kept. `.status` and `.operation` are left
/// to the caller, which decides whose they are.
pub fn received_copy(
    incoming: &Value,
    namespace: &str,
    label: (&str, &str),
) -> Result<DynamicObject, serde_json::Error> {
    let mut obj: DynamicObject = serde_json::from_value(incoming.clone())?;
    obj.metadata.namespace = Some(namespace.to_owned());
    obj.metadata.resource_version = None;
    obj.metadata.uid = None;
    obj.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(label.0.to_owned(), label.1.to_owned());
    Ok(obj)
}

/// Drops what ties an object to the cluster it came from: `metadata.finalizers` (they
/// name controllers of that cluster, and one nobody here removes would block deletion for
/// ever) and `metadata.ownerReferences` (owners are objects of that cluster). For copies
/// a side writes on behalf of the other, e.g. the hub copy of an autonomous agent's
/// object.
pub fn drop_foreign_bindings(obj: &mut DynamicObject) {
    obj.metadata.finalizers = None;
    obj.metadata.owner_references = None;
}

/// Removes a top-level field (e.g. `status`) and returns it.
pub fn take_field(obj: &mut DynamicObject, field: &str) -> Option<Value> {
    obj.data.as_object_mut().and_then(|m| m.remove(field))
}

/// A copy of `obj` fit to be sent to the other side and created or updated there.
///
/// Drops the metadata the receiving API server owns (`uid`, `resourceVersion`,
/// `generation`, `creationTimestamp`, `managedFields`, `selfLink`, `deletionTimestamp`,
/// `deletionGracePeriodSeconds`, `ownerReferences`: owners are objects of the sending
/// cluster). Keeps name, namespace, labels, annotations, finalizers, `spec`, `status`,
/// `operation` and every field this crate does not know about.
pub fn strip_for_transfer(obj: &DynamicObject) -> DynamicObject {
    DynamicObject {
        types: obj.types.clone(),
        metadata: transfer_meta(&obj.metadata),
        data: obj.data.clone(),
    }
}

/// The metadata [`strip_for_transfer`] keeps: built from the kept fields alone, so the
/// fields it drops (`managedFields` above all) are never copied.
fn transfer_meta(meta: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: meta.name.clone(),
        generate_name: meta.generate_name.clone(),
        namespace: meta.namespace.clone(),
        labels: meta.labels.clone(),
        annotations: meta.annotations.clone(),
        finalizers: meta.finalizers.clone(),
        ..ObjectMeta::default()
    }
}

/// The JSON of [`stamped_for_transfer`]`(obj)`, written straight from `obj`: only the
/// metadata is copied, never the object's content. What a queued event of the source of
/// truth sends (see `argocd_agent_domain::LazyObject`).
pub fn write_stamped_for_transfer(obj: &DynamicObject, out: &mut Vec<u8>) {
    write_transfer(obj, None, out);
}

/// [`write_stamped_for_transfer`] without `.status`: what a managed agent takes of a hub
/// Application. Its copy's status is the spoke's own (written by the spoke's Argo CD), the
/// agent takes only `.spec` of an update, and the API server ignores `.status` in writes to
/// a kind with a status subresource; so the hub's status, often the largest part of an
/// Application, is never sent to it.
pub fn write_stamped_without_status(obj: &DynamicObject, out: &mut Vec<u8>) {
    write_transfer(obj, Some("status"), out);
}

/// Whether [`write_stamped_without_status`] writes the same JSON for `a` and `b`: they
/// differ at most in `.status` and in metadata the transfer drops (`resourceVersion`,
/// `managedFields`, `generation`, ...). A status write on the hub makes such a version.
pub fn same_without_status(a: &DynamicObject, b: &DynamicObject) -> bool {
    let (ma, mb) = (&a.metadata, &b.metadata);
    let meta = ma.name == mb.name
        && ma.generate_name == mb.generate_name
        && ma.namespace == mb.namespace
        && ma.labels == mb.labels
        && ma.annotations == mb.annotations
        && ma.finalizers == mb.finalizers
        && ma.uid == mb.uid;
    let data = match (&a.data, &b.data) {
        (Value::Object(x), Value::Object(y)) => {
            let fields = |m: &serde_json::Map<String, Value>| {
                m.len() - usize::from(m.contains_key("status"))
            };
            fields(x) == fields(y)
                && x.iter()
                    .filter(|(k, _)| *k != "status")
                    .all(|(k, v)| y.get(k) == Some(v))
        }
        (x, y) => x == y,
    };
    a.types == b.types && meta && data
}

fn write_transfer(obj: &DynamicObject, skip: Option<&str>, out: &mut Vec<u8>) {
    /// Serializes as [`DynamicObject`] does (the same flattened fields), by reference.
    #[derive(serde::Serialize)]
    struct Transfer<'a> {
        #[serde(flatten)]
        types: &'a Option<kube::api::TypeMeta>,
        metadata: ObjectMeta,
        #[serde(flatten)]
        data: Skipping<'a>,
    }
    /// The object's top-level fields but `skip`.
    struct Skipping<'a> {
        data: &'a Value,
        skip: Option<&'a str>,
    }
    impl serde::Serialize for Skipping<'_> {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            use serde::ser::SerializeMap;
            match self.data {
                Value::Object(fields) => {
                    let mut map = s.serialize_map(None)?;
                    for (k, v) in fields.iter().filter(|(k, _)| Some(k.as_str()) != self.skip) {
                        map.serialize_entry(k, v)?;
                    }
                    map.end()
                }
                other => serde::Serialize::serialize(other, s),
            }
        }
    }
    let transfer = Transfer {
        types: &obj.types,
        metadata: stamped_meta(&obj.metadata),
        data: Skipping {
            data: &obj.data,
            skip,
        },
    };
    // Writing JSON into a Vec fails only for a map with non-string keys, which a
    // `DynamicObject` cannot hold.
    if serde_json::to_writer(&mut *out, &transfer).is_err() {
        out.clear();
        out.extend_from_slice(b"null");
    }
}

// Hand-written because serde_json's key order depends on a crate feature
// (`preserve_order`) that any crate in the build may switch on. Keys and scalars are
// written as serde_json writes them (compact), so the form never changes between versions.
// Writing into a Vec or a `Digesting` cannot fail.
fn write_canonical(value: &Value, out: &mut impl std::io::Write) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            let _ = out.write_all(b"{");
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                write_json(key.as_str(), out);
                let _ = out.write_all(b":");
                write_canonical(value, out);
            }
            let _ = out.write_all(b"}");
        }
        Value::Array(items) => {
            let _ = out.write_all(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    let _ = out.write_all(b",");
                }
                write_canonical(item, out);
            }
            let _ = out.write_all(b"]");
        }
        scalar => write_json(scalar, out),
    }
}

/// Compact JSON of a string or scalar; writing into a Vec or a `Digesting` cannot fail.
fn write_json<T: serde::Serialize + ?Sized>(value: &T, out: &mut impl std::io::Write) {
    let _ = serde_json::to_writer(out, value);
}

fn hex(digest: &[u8]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push(HEX[usize::from(b >> 4)] as char);
        hex.push(HEX[usize::from(b & 0xf)] as char);
    }
    hex
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn app(value: Value) -> DynamicObject {
        match serde_json::from_value(value) {
            Ok(obj) => obj,
            Err(e) => panic!("test object does not parse: {e}"),
        }
    }

    #[test]
    fn json_size_is_the_length_of_the_compact_json() {
        let v = json!({"a": [1, "x\"y", null], "b": {"c": "é"}});
        assert_eq!(json_size(&v), serde_json::to_vec(&v).unwrap().len());
        let obj = app(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                             "metadata": {"name": "a"}, "spec": {"project": "p"}}),
        );
        assert_eq!(json_size(&obj), serde_json::to_vec(&obj).unwrap().len());
    }

    #[test]
    fn weight_charges_each_json_value_beyond_its_text() {
        let zeros = json!({"a": vec![0; 1000]});
        // 1000 zeros: 2,007 bytes of JSON, 1,002 values.
        assert_eq!(json_size(&zeros), 2007);
        assert_eq!(value_weight(&zeros), 2007 + 1002 * VALUE_WEIGHT);
        let text = json!({"a": "x".repeat(1000)});
        assert_eq!(value_weight(&text), json_size(&text) + 2 * VALUE_WEIGHT);
        let obj = app(json!({"metadata": {"name": "a"}, "spec": {"p": [1, 2]}}));
        // The body: itself, spec, the array and its two numbers.
        assert_eq!(object_weight(&obj), json_size(&obj) + 5 * VALUE_WEIGHT);
    }

    #[test]
    fn an_oversized_stub_keeps_identity_and_own_keys_only() {
        let many: serde_json::Map<String, Value> = (0..400)
            .map(|i| (format!("team.example.com/l{i}"), json!("v".repeat(20))))
            .collect();
        let mut labels = many.clone();
        labels.insert(
            "argocd-agent.argoproj-labs.io/agent-name".into(),
            json!("edge-1"),
        );
        let obj = app(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "big", "namespace": "edge-1", "uid": "u-1",
                         "resourceVersion": "7", "finalizers": ["f"],
                         "labels": labels,
                         "annotations": {PARENT_ANNOTATION: "parent", "huge": "x".repeat(1000)}},
            "spec": {"source": {"helm": {"values": "x".repeat(10_000)}}},
            "status": {"sync": {"status": "Synced"}}
        }));
        let stub = oversized_stub(&obj, 12_345);
        assert_eq!(stub.metadata.name.as_deref(), Some("big"));
        assert_eq!(stub.metadata.uid.as_deref(), Some("u-1"));
        assert_eq!(stub.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(stub.metadata.finalizers, Some(vec!["f".to_owned()]));
        assert_eq!(stub.data, json!({}));
        // Many labels: only this project's own.
        let l = stub.metadata.labels.clone().unwrap_or_default();
        assert_eq!(l.len(), 1, "{l:?}");
        let a = stub.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(a.get(PARENT_ANNOTATION).map(String::as_str), Some("parent"));
        assert!(!a.contains_key("huge"));
        assert_eq!(oversized_size(&stub), Some(12_345));
        assert_eq!(oversized_size(&obj), None);
        assert!(json_size(&stub) < 1024, "{}", json_size(&stub));
        // A few labels are kept whole.
        let small = app(json!({"metadata": {"name": "s", "labels": {"team": "a"}}}));
        assert_eq!(
            oversized_stub(&small, 1)
                .metadata
                .labels
                .unwrap_or_default()
                .get("team")
                .map(String::as_str),
            Some("a")
        );
    }

    #[test]
    fn canonical_form_sorts_keys_and_writes_compact_json() {
        // The form is compared across versions (agent and principal checksums), so it is
        // pinned here byte for byte.
        let v =
            json!({"b": [1, "x\"y", null, true, 1.5, -0.25e-3], "a": {"d": {}, "c": "é\n\u{1}"}});
        let mut out = Vec::new();
        write_canonical(&v, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":{"c":"é\n\u0001","d":{}},"b":[1,"x\"y",null,true,1.5,-0.00025]}"#
        );
        assert_eq!(
            checksum_of(&json!({"x": 1})),
            // sha256 of `{"x":1}`
            "5041bf1f713df204784353e82f6a4a535931cb64f1f4b4a5aeaffcb720918b22"
        );
    }

    #[test]
    fn the_checksum_hashes_the_canonical_form_across_chunks() {
        // Hashed as it is written, in chunks: the same as hashing the whole form, for a
        // form shorter than a chunk, exactly one, and several with pieces across the
        // boundaries (one string longer than a chunk).
        for len in [0, 10, Digesting::CHUNK - 9, Digesting::CHUNK * 3 + 17] {
            let v = json!({"spec": {"values": "a\nb".repeat(len / 4), "n": [1, 2.5, null]},
                "z": "x".repeat(len % 97)});
            let mut whole = Vec::new();
            write_canonical(&v, &mut whole);
            assert_eq!(
                checksum_of(&v),
                hex(digest::digest(&digest::SHA256, &whole).as_ref()),
                "{len}"
            );
        }
    }

    #[test]
    fn same_without_status_is_exactly_when_the_managed_form_is_the_same() {
        let base = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n", "uid": "u-1", "resourceVersion": "7",
                "labels": {"l": "v"}, "annotations": {"k": "v"}},
            "spec": {"project": "default"}, "status": {"sync": {"status": "Synced"}}});
        let with = |f: &dyn Fn(&mut Value)| {
            let mut v = base.clone();
            f(&mut v);
            app(v)
        };
        let a = app(base.clone());
        let cases: [(&str, DynamicObject, bool); 8] = [
            (
                "status",
                with(&|v| v["status"] = json!({"sync": {"status": "OutOfSync"}})),
                true,
            ),
            (
                "status gone",
                with(&|v| {
                    v.as_object_mut().unwrap().remove("status");
                }),
                true,
            ),
            (
                "resourceVersion, generation",
                with(&|v| {
                    v["metadata"]["resourceVersion"] = json!("8");
                    v["metadata"]["generation"] = json!(3);
                }),
                true,
            ),
            (
                "spec",
                with(&|v| v["spec"]["project"] = json!("other")),
                false,
            ),
            (
                "label",
                with(&|v| v["metadata"]["labels"]["l"] = json!("w")),
                false,
            ),
            (
                "annotation",
                with(&|v| v["metadata"]["annotations"]["x"] = json!("y")),
                false,
            ),
            (
                "uid (recreated)",
                with(&|v| v["metadata"]["uid"] = json!("u-2")),
                false,
            ),
            (
                "operation",
                with(&|v| v["operation"] = json!({"sync": {}})),
                false,
            ),
        ];
        for (what, b, same) in cases {
            let (mut x, mut y) = (Vec::new(), Vec::new());
            write_stamped_without_status(&a, &mut x);
            write_stamped_without_status(&b, &mut y);
            assert_eq!(x == y, same, "{what}: the written forms");
            assert_eq!(same_without_status(&a, &b), same, "{what}");
            assert_eq!(same_without_status(&b, &a), same, "{what}, the other way");
        }
    }

    #[test]
    fn written_transfer_form_equals_the_stamped_copy() {
        let obj = app(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n", "uid": "u-1", "resourceVersion": "7",
                "generation": 3, "creationTimestamp": "2026-01-01T00:00:00Z",
                "generateName": "a-", "labels": {"l": "v"}, "annotations": {"k": "v"},
                "finalizers": ["f"], "selfLink": "/x",
                "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 5,
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "o-1"}],
                "managedFields": [{"manager": "m", "operation": "Update"}]},
            "spec": {"project": "default"}, "status": {"health": {"status": "Healthy"}},
            "operation": {"sync": {}}, "extra": [1, 2]}),
        );
        let mut out = Vec::new();
        write_stamped_for_transfer(&obj, &mut out);
        let written: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            written,
            serde_json::to_value(stamped_for_transfer(&obj)).unwrap()
        );
        assert_eq!(
            written["metadata"]["annotations"][SOURCE_UID_ANNOTATION],
            "u-1"
        );
        assert_eq!(written["metadata"]["generateName"], "a-");
        let mut managed = Vec::new();
        write_stamped_without_status(&obj, &mut managed);
        let managed: Value = serde_json::from_slice(&managed).unwrap();
        let mut want = written.clone();
        want.as_object_mut().unwrap().remove("status");
        assert_eq!(managed, want, "the same form, without .status");
        assert_eq!(managed["operation"], json!({"sync": {}}));
        assert!(written["metadata"].get("managedFields").is_none());
        assert!(written["metadata"].get("ownerReferences").is_none());
        for dropped in [
            "uid",
            "resourceVersion",
            "generation",
            "creationTimestamp",
            "selfLink",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
        ] {
            assert!(
                written["metadata"].get(dropped).is_none(),
                "{dropped} is dropped"
            );
        }
        assert_eq!(written["metadata"]["finalizers"], json!(["f"]));
        assert_eq!(written["metadata"]["labels"], json!({"l": "v"}));
        assert_eq!(written["metadata"]["annotations"]["k"], "v");
        assert_eq!(written["apiVersion"], "argoproj.io/v1alpha1");
        assert_eq!(written["status"], json!({"health": {"status": "Healthy"}}));
        assert_eq!(written["extra"], json!([1, 2]));
    }

    #[test]
    fn drop_foreign_bindings_removes_finalizers_and_owners_only() {
        let mut obj = app(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n", "labels": {"l": "v"},
                "finalizers": ["x.example.com/f"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u"}]},
            "spec": {"project": "default"}}),
        );
        drop_foreign_bindings(&mut obj);
        assert_eq!(obj.metadata.finalizers, None);
        assert_eq!(obj.metadata.owner_references, None);
        assert_eq!(obj.metadata.name.as_deref(), Some("a"));
        assert!(obj.metadata.labels.is_some());
        assert_eq!(obj.data["spec"]["project"], json!("default"));
    }

    #[test]
    fn spec_checksum_ignores_key_order_but_not_values() {
        let a = app(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n"},
            "spec": {"project": "default", "source": {"repoURL": "r", "path": "p"}}}),
        );
        let b = app(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "b", "namespace": "m"},
            "spec": {"source": {"path": "p", "repoURL": "r"}, "project": "default"}}),
        );
        let c = app(
            json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "a", "namespace": "n"},
            "spec": {"project": "other", "source": {"repoURL": "r", "path": "p"}}}),
        );
        assert_eq!(spec_checksum(&a), spec_checksum(&b));
        assert_ne!(spec_checksum(&a), spec_checksum(&c));
        assert_eq!(spec_checksum(&a).len(), 64);
    }

    #[test]
    fn status_checksum_counts_absent_null_and_empty_alike_and_sees_every_value() {
        let with = |status: Value| {
            let mut o = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {"name": "a", "namespace": "n"}, "spec": {}});
            if !status.is_null() {
                o["status"] = status;
            }
            app(o)
        };
        let none = status_checksum(&with(Value::Null));
        assert_eq!(none, status_checksum(&with(json!({}))));
        assert_eq!(none, status_checksum_of(Some(&Value::Null)));
        let s1 = status_checksum(&with(json!({"sync": {"revision": "s1"}})));
        let s2 = status_checksum(&with(json!({"sync": {"revision": "s2"}})));
        assert_ne!(s1, none);
        assert_ne!(s1, s2);
        assert_eq!(
            s1,
            status_checksum_of(Some(&json!({"sync": {"revision": "s1"}})))
        );
    }

    #[test]
    fn checksum_of_matches_known_sha256() {
        // sha256 of the three bytes `{}`.
        assert_eq!(
            checksum_of(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn strip_for_transfer_drops_server_owned_metadata_only() {
        let obj = app(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {
                "name": "guestbook", "namespace": "agent-a", "uid": "u-1",
                "resourceVersion": "42", "generation": 3,
                "creationTimestamp": "2024-01-01T00:00:00Z",
                "deletionTimestamp": "2024-01-02T00:00:00Z",
                "selfLink": "/x", "managedFields": [{"manager": "kubectl"}],
                "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "o-1"}],
                "labels": {"l": "1"}, "annotations": {"a": "2"},
                "finalizers": ["resources-finalizer.argocd.argoproj.io"]
            },
            "spec": {"project": "default", "futureField": {"x": 1}},
            "status": {"sync": {"status": "Synced"}},
            "operation": {"sync": {"revision": "HEAD"}},
            "unknownTopLevel": true
        }));
        let stripped = strip_for_transfer(&obj);
        let v = match serde_json::to_value(&stripped) {
            Ok(v) => v,
            Err(e) => panic!("serialize: {e}"),
        };
        assert_eq!(
            v,
            json!({
                "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
                "metadata": {
                    "name": "guestbook", "namespace": "agent-a",
                    "labels": {"l": "1"}, "annotations": {"a": "2"},
                    "finalizers": ["resources-finalizer.argocd.argoproj.io"]
                },
                "spec": {"project": "default", "futureField": {"x": 1}},
                "status": {"sync": {"status": "Synced"}},
                "operation": {"sync": {"revision": "HEAD"}},
                "unknownTopLevel": true
            })
        );
        assert!(is_being_deleted(&obj));
        assert!(!is_being_deleted(&stripped));
        assert_eq!(object_key(&obj), "agent-a/guestbook");
    }
}

#[cfg(test)]
mod content_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn content_checksum_of_argo_kinds_is_the_spec_checksum() {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "AppProject",
            "metadata": {"name": "p", "labels": {"x": "y"}}, "spec": {"sourceRepos": ["*"]}
        }))
        .unwrap();
        let v = serde_json::to_value(&obj).unwrap();
        assert_eq!(content_checksum(Kind::AppProject, &v), spec_checksum(&obj));
    }

    #[test]
    fn content_checksum_of_secrets_covers_type_and_data_only() {
        let a = json!({"metadata": {"name": "r", "labels": {"a": "1"}}, "type": "Opaque", "data": {"url": "eA=="}});
        let b = json!({"metadata": {"name": "r", "labels": {"a": "2"}}, "type": "Opaque", "data": {"url": "eA=="}});
        let c = json!({"metadata": {"name": "r"}, "type": "Opaque", "data": {"url": "eQ=="}});
        assert_eq!(
            content_checksum(Kind::Secret, &a),
            content_checksum(Kind::Secret, &b)
        );
        assert_ne!(
            content_checksum(Kind::Secret, &a),
            content_checksum(Kind::Secret, &c)
        );
        let cm = json!({"data": {"k": "v"}});
        assert_ne!(
            content_checksum(Kind::ConfigMap, &cm),
            content_checksum(Kind::ConfigMap, &json!({"data": {"k": "w"}}))
        );
    }
}

/// A stored object as the typed object `K` it is (a store of one kind gives only that kind).
pub fn typed<K: serde::de::DeserializeOwned>(
    obj: DynamicObject,
    kind: Kind,
) -> Result<K, crate::Error> {
    let at = crate::ObjectRef::new(
        kind,
        obj.metadata.namespace.as_deref(),
        obj.metadata.name.as_deref().unwrap_or_default(),
    );
    serde_json::to_value(obj)
        .and_then(serde_json::from_value)
        .map_err(|e| crate::Error::Invalid {
            object: at,
            message: format!("not a {kind}: {e}"),
        })
}

/// A typed object of `kind` as a store writes it.
pub fn dynamic<K: serde::Serialize>(obj: &K, kind: Kind) -> Result<DynamicObject, crate::Error> {
    let mut v = serde_json::to_value(obj).map_err(|e| crate::Error::InvalidRequest {
        object: crate::ObjectRef::new(kind, None, ""),
        reason: e.to_string(),
    })?;
    let ar = kind.api_resource();
    v["apiVersion"] = ar.api_version.into();
    v["kind"] = ar.kind.into();
    let at = crate::ObjectRef::new(
        kind,
        v["metadata"]["namespace"].as_str(),
        v["metadata"]["name"].as_str().unwrap_or_default(),
    );
    serde_json::from_value(v).map_err(|e| crate::Error::InvalidRequest {
        object: at,
        reason: e.to_string(),
    })
}
