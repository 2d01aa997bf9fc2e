//! Object validation as the apiserver's validators do it for the kinds served here: names,
//! labels, annotations, ConfigMap/Secret keys and base64 data, immutability, finalizers.
//! Messages follow the apiserver's field-error wording (`<field>: Invalid value: ...`).

use base64::Engine as _;
use serde_json::Value;

use super::ResourceType;
use super::status::ApiError;

/// Total size of all annotations (keys and values), as the apiserver limits it.
const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

fn is_alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// The longest DNS-1123 label (k8s.io/apimachinery `validation.DNS1123LabelMaxLength`).
pub const DNS1123_LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain (`validation.DNS1123SubdomainMaxLength`).
pub const DNS1123_SUBDOMAIN_MAX: usize = 253;

/// One dot-free part: `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, any length.
fn is_label_shaped(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| is_alnum(c) || c == '-')
        && s.starts_with(is_alnum)
        && s.ends_with(is_alnum)
}

/// RFC 1123 label (apimachinery `validation.IsDNS1123Label`): `[a-z0-9]([-a-z0-9]*[a-z0-9])?`,
/// at most 63 characters.
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX && is_label_shaped(s)
}

/// RFC 1123 subdomain (apimachinery `validation.IsDNS1123Subdomain`): at most 253
/// characters matching `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`.
/// Unlike DNS itself, the parts between dots have no length limit of their own: the API
/// server takes a 253-character name without dots.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX && s.split('.').all(is_label_shaped)
}

const LABEL_FORMAT: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const SUBDOMAIN_FORMAT: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

/// The error for an invalid object name, as `ValidateObjectMeta` words it: `label` for the
/// kinds whose names are DNS-1123 labels (Namespace: `ValidateNamespaceName`), else a
/// DNS-1123 subdomain (`NameIsDNSSubdomain`, most kinds). The length error comes first, as
/// apimachinery lists it.
pub fn name_error(name: &str, label: bool) -> Option<String> {
    if (label && is_dns_label(name)) || (!label && is_dns_subdomain(name)) {
        return None;
    }
    let (max, format) = if label {
        (DNS1123_LABEL_MAX, LABEL_FORMAT)
    } else {
        (DNS1123_SUBDOMAIN_MAX, SUBDOMAIN_FORMAT)
    };
    let what = if name.len() > max {
        format!("must be no more than {max} characters")
    } else if label && is_dns_subdomain(name) {
        "must not contain dots".to_string()
    } else {
        format.to_string()
    };
    Some(format!("metadata.name: Invalid value: \"{name}\": {what}"))
}

/// `(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?`, at most 63 characters.
fn label_value_error(v: &str) -> Option<&'static str> {
    if v.len() > 63 {
        return Some("must be no more than 63 characters");
    }
    let ok = v.is_empty()
        || (v
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric()));
    (!ok).then_some(
        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
    )
}

/// Qualified name (label and annotation keys): optional DNS-subdomain prefix and `/`, then a
/// name of at most 63 characters.
fn qualified_name_error(k: &str) -> Option<&'static str> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if prefix.is_some_and(|p| p.is_empty() || !is_dns_subdomain(p)) {
        return Some(
            "prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
        );
    }
    if name.is_empty() || name.len() > 63 {
        return Some("name part must be non-empty and no more than 63 characters");
    }
    let ok = name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    (!ok).then_some("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")
}

/// ConfigMap and Secret keys: `[-._a-zA-Z0-9]+`, at most 253 characters, not `.` or `..`.
fn config_key_error(k: &str) -> Option<&'static str> {
    if k.is_empty() || k.len() > 253 {
        return Some("must be no more than 253 characters");
    }
    if k == "." || k == ".." {
        return Some("must not be '.' or '..'");
    }
    (!k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))).then_some(
        "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
    )
}

fn invalid(r: &ResourceType, name: &str, field: &str, value: &str, why: &str) -> ApiError {
    ApiError::invalid(
        r,
        name,
        &format!("{field}: Invalid value: \"{value}\": {why}"),
    )
}

/// Checks that a Secret's `data` values are base64, as decoding the body into a typed
/// Secret does (a failure is 400, not 422).
pub fn check_secret_base64(r: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    if !(r.group.is_empty() && r.kind == "Secret") {
        return Ok(());
    }
    if let Some(data) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in data {
            let s = v.as_str().ok_or_else(|| {
                ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: data[{k}] is not a string"
                ))
            })?;
            if let Err(e) = base64::engine::general_purpose::STANDARD.decode(s) {
                return Err(ApiError::bad_request(format!(
                    "Secret in version \"v1\" cannot be handled as a Secret: illegal base64 data at key {k:?}: {e}"
                )));
            }
        }
    }
    Ok(())
}

/// Validation of a complete object about to be stored.
pub fn validate(r: &ResourceType, obj: &Value) -> Result<(), ApiError> {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if let Some(labels) = obj.pointer("/metadata/labels") {
        let Some(labels) = labels.as_object() else {
            return Err(ApiError::bad_request(
                "metadata.labels must be a map of strings",
            ));
        };
        for (k, v) in labels {
            if let Some(why) = qualified_name_error(k) {
                return Err(invalid(r, name, "metadata.labels", k, why));
            }
            let Some(v) = v.as_str() else {
                return Err(ApiError::bad_request(format!(
                    "metadata.labels[{k}] must be a string"
                )));
            };
            if let Some(why) = label_value_error(v) {
                return Err(invalid(r, name, "metadata.labels", v, why));
            }
        }
    }
    if let Some(annotations) = obj.pointer("/metadata/annotations") {
        let Some(annotations) = annotations.as_object() else {
            return Err(ApiError::bad_request(
                "metadata.annotations must be a map of strings",
            ));
        };
        let mut total = 0;
        for (k, v) in annotations {
            if let Some(why) = qualified_name_error(&k.to_ascii_lowercase()) {
                return Err(invalid(r, name, "metadata.annotations", k, why));
            }
            total += k.len() + v.as_str().map_or(0, str::len);
        }
        if total > MAX_ANNOTATIONS_BYTES {
            return Err(ApiError::invalid(
                r,
                name,
                &format!(
                    "metadata.annotations: Too long: may not be more than {MAX_ANNOTATIONS_BYTES} bytes"
                ),
            ));
        }
    }
    if r.group.is_empty() && matches!(r.kind.as_str(), "ConfigMap" | "Secret") {
        let mut seen = std::collections::BTreeSet::new();
        for field in ["data", "binaryData"] {
            let Some(map) = obj.get(field).and_then(Value::as_object) else {
                continue;
            };
            for k in map.keys() {
                if let Some(why) = config_key_error(k) {
                    return Err(invalid(r, name, &format!("{field}[{k}]"), k, why));
                }
                if !seen.insert(k.clone()) {
                    return Err(invalid(
                        r,
                        name,
                        &format!("{field}[{k}]"),
                        k,
                        "duplicate of key present in data",
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Update rules that compare the stored object with the new one.
pub fn validate_update(r: &ResourceType, old: &Value, new: &Value) -> Result<(), ApiError> {
    let name = old
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        let finalizers = |o: &Value| -> Vec<String> {
            o.pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default()
        };
        let before = finalizers(old);
        let added: Vec<String> = finalizers(new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            return Err(ApiError::invalid(
                r,
                name,
                &format!(
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
    }
    if r.group.is_empty() && matches!(r.kind.as_str(), "ConfigMap" | "Secret") {
        if old.get("immutable") == Some(&Value::Bool(true)) {
            for field in ["data", "binaryData", "immutable"] {
                if old.get(field) != new.get(field) {
                    return Err(ApiError::invalid(
                        r,
                        name,
                        &format!("{field}: Forbidden: field is immutable when `immutable` is set"),
                    ));
                }
            }
        }
        if r.kind == "Secret" && old.get("type") != new.get("type") {
            let t = new.get("type").and_then(Value::as_str).unwrap_or("");
            return Err(invalid(r, name, "type", t, "field is immutable"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names_follow_rfc_1123() {
        for ok in ["a", "a-b", "a.b", "0a", "a.b-c.d"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "A",
            "-a",
            "a-",
            "a..b",
            "a.-b",
            ".a",
            "a_b",
            &"a".repeat(254),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(!is_dns_label("a.b"));
        assert!(!is_dns_label(&"a".repeat(64)));
        // apimachinery's subdomain rule has no 63-character limit per part.
        assert!(is_dns_subdomain(&"a".repeat(253)));
        assert!(is_dns_subdomain(&format!("{}.b", "a".repeat(100))));
        assert!(is_dns_label(&"a".repeat(63)));
    }

    #[test]
    fn name_errors_word_the_rule_broken() {
        assert_eq!(name_error(&"a".repeat(253), false), None);
        let e = name_error(&"a".repeat(254), false).unwrap();
        assert!(e.ends_with("must be no more than 253 characters"), "{e}");
        let e = name_error(&"a".repeat(64), true).unwrap();
        assert!(e.ends_with("must be no more than 63 characters"), "{e}");
        let e = name_error("a.b", true).unwrap();
        assert!(e.ends_with("must not contain dots"), "{e}");
        let e = name_error("A", false).unwrap();
        assert!(e.contains("a lowercase RFC 1123 subdomain"), "{e}");
        let e = name_error("-a", true).unwrap();
        assert!(e.contains("a lowercase RFC 1123 label"), "{e}");
    }

    #[test]
    fn label_values_and_keys() {
        assert!(label_value_error("").is_none());
        assert!(label_value_error("a_b.c-D").is_none());
        assert!(label_value_error(&"a".repeat(64)).is_some());
        assert!(label_value_error("-a").is_some());
        assert!(qualified_name_error("example.com/x").is_none());
        assert!(qualified_name_error("Example.com/x").is_some());
        assert!(qualified_name_error("/x").is_some());
    }
}
