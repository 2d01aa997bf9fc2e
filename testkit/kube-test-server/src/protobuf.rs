//! Decoding of the protobuf request bodies kubectl sends for a few built-in kinds.
//!
//! kubectl's typed clients (`kubectl create namespace|configmap|secret`, `kubectl auth
//! can-i|whoami`) send
//! `application/vnd.kubernetes.protobuf` and do not fall back to JSON, so the server decodes
//! those three kinds into JSON. Hand-written because no crate here carries the Kubernetes
//! protobuf schemas; only the fields a create needs are read (others are ignored).
//! Wire format: the `k8s\0` magic, then a `runtime.Unknown` message whose `raw` field holds
//! the object (see the apiserver's "Protobuf encoding" in the API concepts docs).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.buf.split_first().ok_or("truncated varint")?;
            self.buf = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.buf.len() {
            return Err("truncated field".into());
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }

    fn next(&mut self) -> Result<Option<(u64, Field<'a>)>, String> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let tag = self.varint()?;
        let field = match tag & 7 {
            0 => Field::Varint(self.varint()?),
            1 => {
                self.take(8)?;
                Field::Fixed
            }
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| "length too large")?;
                Field::Bytes(self.take(n)?)
            }
            5 => {
                self.take(4)?;
                Field::Fixed
            }
            w => return Err(format!("unsupported wire type {w}")),
        };
        Ok(Some((tag >> 3, field)))
    }
}

fn fields(buf: &[u8]) -> impl Iterator<Item = Result<(u64, Field<'_>), String>> {
    let mut r = Reader { buf };
    std::iter::from_fn(move || r.next().transpose())
}

fn string(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "string field is not UTF-8".to_string())
}

/// A `map<string, string>` (or bytes, base64-encoded as in JSON) entry.
fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), String> {
    let (mut k, mut v) = (String::new(), Vec::new());
    for f in fields(b) {
        match f? {
            (1, Field::Bytes(x)) => k = string(x)?,
            (2, Field::Bytes(x)) => v = x.to_vec(),
            _ => {}
        }
    }
    let value = if bytes_value {
        Value::String(STANDARD.encode(&v))
    } else {
        Value::String(string(&v)?)
    };
    Ok((k, value))
}

fn insert_map(obj: &mut Map<String, Value>, key: &str, entry: (String, Value)) {
    let m = obj.entry(key).or_insert_with(|| json!({}));
    if let Some(m) = m.as_object_mut() {
        m.insert(entry.0, entry.1);
    }
}

fn object_meta(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    for f in fields(b) {
        match f? {
            // gogo-protobuf writes empty strings; JSON (omitempty) would leave them out.
            (1..=3, Field::Bytes([])) => {}
            (1, Field::Bytes(x)) => {
                m.insert("name".into(), Value::String(string(x)?));
            }
            (2, Field::Bytes(x)) => {
                m.insert("generateName".into(), Value::String(string(x)?));
            }
            (3, Field::Bytes(x)) => {
                m.insert("namespace".into(), Value::String(string(x)?));
            }
            (11, Field::Bytes(x)) => insert_map(&mut m, "labels", map_entry(x, false)?),
            (12, Field::Bytes(x)) => insert_map(&mut m, "annotations", map_entry(x, false)?),
            (14, Field::Bytes(x)) => {
                let list = m.entry("finalizers").or_insert_with(|| json!([]));
                if let Some(a) = list.as_array_mut() {
                    a.push(Value::String(string(x)?));
                }
            }
            _ => {}
        }
    }
    Ok(Value::Object(m))
}

/// Strings of a message by field number, e.g. `ResourceAttributes` (1 namespace, 2 verb, 3
/// group, 4 version, 5 resource, 6 subresource, 7 name).
fn string_fields(b: &[u8], names: &[(u64, &str)]) -> Result<Value, String> {
    let mut m = Map::new();
    for f in fields(b) {
        if let (n, Field::Bytes(x)) = f?
            && let Some((_, name)) = names.iter().find(|(k, _)| *k == n)
            && !x.is_empty()
        {
            m.insert((*name).into(), Value::String(string(x)?));
        }
    }
    Ok(Value::Object(m))
}

/// `SelfSubjectAccessReviewSpec`: 1 resourceAttributes, 2 nonResourceAttributes.
fn access_review_spec(b: &[u8]) -> Result<Value, String> {
    let mut spec = Map::new();
    for f in fields(b) {
        match f? {
            (1, Field::Bytes(x)) => {
                let attrs = string_fields(
                    x,
                    &[
                        (1, "namespace"),
                        (2, "verb"),
                        (3, "group"),
                        (4, "version"),
                        (5, "resource"),
                        (6, "subresource"),
                        (7, "name"),
                    ],
                )?;
                spec.insert("resourceAttributes".into(), attrs);
            }
            (2, Field::Bytes(x)) => {
                let attrs = string_fields(x, &[(1, "path"), (2, "verb")])?;
                spec.insert("nonResourceAttributes".into(), attrs);
            }
            _ => {}
        }
    }
    Ok(Value::Object(spec))
}

/// Decodes a protobuf-encoded Namespace, ConfigMap, Secret, SelfSubjectAccessReview or
/// SelfSubjectReview into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let envelope = body
        .strip_prefix(b"k8s\0")
        .ok_or("protobuf body does not start with the k8s magic")?;
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    for f in fields(envelope) {
        match f? {
            (1, Field::Bytes(tm)) => {
                for f in fields(tm) {
                    match f? {
                        (1, Field::Bytes(x)) => api_version = string(x)?,
                        (2, Field::Bytes(x)) => kind = string(x)?,
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    let mut obj = Map::new();
    obj.insert("apiVersion".into(), Value::String(api_version));
    obj.insert("kind".into(), Value::String(kind.clone()));
    for f in fields(raw) {
        let (n, f) = f?;
        match (kind.as_str(), n, f) {
            (_, 1, Field::Bytes(x)) => {
                obj.insert("metadata".into(), object_meta(x)?);
            }
            ("Namespace", 2, Field::Bytes(spec)) => {
                let mut finalizers = Vec::new();
                for f in fields(spec) {
                    if let (1, Field::Bytes(x)) = f? {
                        finalizers.push(Value::String(string(x)?));
                    }
                }
                obj.insert("spec".into(), json!({"finalizers": finalizers}));
            }
            ("ConfigMap", 2, Field::Bytes(x)) => insert_map(&mut obj, "data", map_entry(x, false)?),
            ("ConfigMap", 3, Field::Bytes(x)) => {
                insert_map(&mut obj, "binaryData", map_entry(x, true)?)
            }
            ("ConfigMap", 4, Field::Varint(v)) | ("Secret", 5, Field::Varint(v)) => {
                obj.insert("immutable".into(), Value::Bool(v != 0));
            }
            ("Secret", 2, Field::Bytes(x)) => insert_map(&mut obj, "data", map_entry(x, true)?),
            ("Secret", 3, Field::Bytes([])) => {}
            ("Secret", 3, Field::Bytes(x)) => {
                obj.insert("type".into(), Value::String(string(x)?));
            }
            ("Secret", 4, Field::Bytes(x)) => {
                insert_map(&mut obj, "stringData", map_entry(x, false)?)
            }
            ("SelfSubjectAccessReview", 2, Field::Bytes(spec)) => {
                obj.insert("spec".into(), access_review_spec(spec)?);
            }
            ("Namespace" | "ConfigMap" | "Secret" | "SelfSubjectAccessReview", _, _)
            | ("SelfSubjectReview", _, _) => {}
            (other, _, _) => {
                return Err(format!(
                    "protobuf bodies of kind {other:?} are not supported; send JSON"
                ));
            }
        }
    }
    Ok(Value::Object(obj))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn len_field(n: u8, b: &[u8]) -> Vec<u8> {
        let mut v = vec![(n << 3) | 2, u8::try_from(b.len()).unwrap()];
        v.extend_from_slice(b);
        v
    }

    #[test]
    fn decodes_a_configmap_with_labels_and_data() {
        let mut meta = len_field(1, b"cm1");
        meta.extend(len_field(
            11,
            &[len_field(1, b"app"), len_field(2, b"x")].concat(),
        ));
        let mut raw = len_field(1, &meta);
        raw.extend(len_field(
            2,
            &[len_field(1, b"k"), len_field(2, b"v")].concat(),
        ));
        let tm = [len_field(1, b"v1"), len_field(2, b"ConfigMap")].concat();
        let body = [b"k8s\0".to_vec(), len_field(1, &tm), len_field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "cm1", "labels": {"app": "x"}}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn empty_strings_are_left_out_as_json_would() {
        // gogo-protobuf writes name, generateName and namespace even when empty.
        let meta = [len_field(1, b"cm1"), len_field(2, b""), len_field(3, b"")].concat();
        let tm = [len_field(1, b"v1"), len_field(2, b"Secret")].concat();
        let raw = [len_field(1, &meta), len_field(3, b"")].concat();
        let body = [b"k8s\0".to_vec(), len_field(1, &tm), len_field(2, &raw)].concat();
        let v = decode(&body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "cm1"}})
        );
    }

    #[test]
    fn truncated_protobuf_is_an_error() {
        assert!(decode(b"k8s\0\x0a\x09ab").is_err());
        assert!(decode(b"{}").is_err());
    }
}
