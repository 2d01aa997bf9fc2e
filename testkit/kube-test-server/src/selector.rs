//! Label and field selectors as the apiserver parses them from `labelSelector` / `fieldSelector`.
//!
//! Written by hand: kube-rs only builds selectors (client side), it has no parser.

use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
    /// `k>n`: the label is an integer greater than `n`.
    Gt(String, i64),
    /// `k<n`: the label is an integer less than `n`.
    Lt(String, i64),
}

/// A parsed `labelSelector`: all requirements must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

impl LabelSelector {
    /// No requirement: every object matches.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One `fieldSelector` requirement: the field, the JSON pointer it reads, the value.
#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    pointer: String,
    value: String,
    equal: bool,
}

/// A parsed `fieldSelector`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldReq>);

impl FieldSelector {
    /// No requirement: every object matches.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Splits on commas that are not inside parentheses (`k in (a,b),x=y`).
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err(format!("unbalanced ')' in selector {s:?}"));
                }
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced '(' in selector {s:?}"));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

/// Label keys: optional DNS prefix and `/`, then a name of alphanumerics, `-`, `_`, `.`.
fn valid_key(k: &str) -> bool {
    let name = k.rsplit_once('/').map_or(k, |(_, n)| n);
    !name.is_empty()
        && name.len() <= 63
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The integer operand of `>` / `<`.
fn int_value(v: &str, whole: &str) -> Result<i64, String> {
    v.trim()
        .parse()
        .map_err(|_| format!("for 'Gt', 'Lt' operators, the value must be an integer: {whole:?}"))
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, String> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("expected '(values)' in label selector requirement {whole:?}"))?;
    let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
    if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
        return Err(format!("invalid label value {bad:?} in {whole:?}"));
    }
    Ok(values)
}

impl LabelSelector {
    /// Parses an already URL-decoded selector; an empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top_level(s)? {
            let p = part.trim();
            if p.is_empty() {
                return Err(format!("empty requirement in label selector {s:?}"));
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once('>') {
                LabelReq::Gt(k.trim().to_string(), int_value(v, p)?)
            } else if let Some((k, v)) = p.split_once('<') {
                LabelReq::Lt(k.trim().to_string(), int_value(v, p)?)
            } else if let Some(paren) = p.find('(') {
                // `key in (a,b)` / `key notin(a)`: the operator may touch the parenthesis.
                let (head, set) = p.split_at(paren);
                let head = head.trim_end();
                if let Some(k) = head.strip_suffix(" notin") {
                    LabelReq::NotIn(k.trim().to_string(), parse_set(set, p)?)
                } else if let Some(k) = head.strip_suffix(" in") {
                    LabelReq::In(k.trim().to_string(), parse_set(set, p)?)
                } else {
                    return Err(format!("expected 'in' or 'notin' before '(' in {p:?}"));
                }
            } else {
                LabelReq::Exists(p.to_string())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _)
                | LabelReq::NotIn(k, _)
                | LabelReq::Exists(k)
                | LabelReq::NotExists(k)
                | LabelReq::Gt(k, _)
                | LabelReq::Lt(k, _) => (k, None),
            };
            if !valid_key(key) {
                return Err(format!("invalid label key {key:?} in selector {s:?}"));
            }
            if let Some(v) = value
                && !valid_value(v)
            {
                return Err(format!("invalid label value {v:?} in selector {s:?}"));
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
            LabelReq::Gt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x > *n),
            LabelReq::Lt(k, n) => get(k)
                .and_then(|x| x.parse::<i64>().ok())
                .is_some_and(|x| x < *n),
        })
    }
}

impl FieldSelector {
    /// Parses an already URL-decoded selector that may only use `metadata.name` and
    /// `metadata.namespace`, as for custom resources on a real apiserver.
    pub fn parse(s: &str) -> Result<Self, String> {
        Self::parse_for(s, &[])
    }

    /// Parses a selector for a kind that also supports `fields`: `(field, JSON pointer)`
    /// pairs, e.g. `("type", "/type")` for Secrets. Any other field is an error
    /// (`field label not supported`), as on the apiserver.
    pub fn parse_for(s: &str, fields: &[(String, String)]) -> Result<Self, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in s.split(',') {
            let p = part.trim();
            let (field, value, equal) = if let Some((f, v)) = p.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = p.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = p.split_once('=') {
                (f, v, true)
            } else {
                return Err(format!("invalid field selector requirement {p:?}"));
            };
            let field = field.trim();
            let pointer = match field {
                "metadata.name" => "/metadata/name".to_string(),
                "metadata.namespace" => "/metadata/namespace".to_string(),
                other => fields
                    .iter()
                    .find(|(f, _)| f == other)
                    .map(|(_, p)| p.clone())
                    .ok_or_else(|| format!("field label not supported: {other}"))?,
            };
            reqs.push(FieldReq {
                pointer,
                value: value.trim().to_string(),
                equal,
            });
        }
        Ok(Self(reqs))
    }

    /// Whether the object satisfies every requirement (a missing field is `""`; booleans and
    /// numbers compare by their text).
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let actual = match obj.pointer(&r.pointer) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(v) => v.to_string(),
            };
            (actual == r.value) == r.equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}})
    }

    #[test]
    fn set_based_requirements_with_commas_inside_parentheses() {
        let s = LabelSelector::parse("env in (prod, dev),tier notin(db),app,!legacy").unwrap();
        assert!(s.matches(&obj(json!({"env": "dev", "tier": "web", "app": "x"}))));
        assert!(!s.matches(&obj(json!({"env": "dev", "tier": "db", "app": "x"}))));
        assert!(!s.matches(&obj(json!({"env": "dev", "app": "x", "legacy": "1"}))));
        assert!(!s.matches(&obj(json!({"env": "qa", "app": "x"}))));
    }

    #[test]
    fn equality_requirements() {
        let s = LabelSelector::parse("a=1,b==2,c!=3").unwrap();
        assert!(s.matches(&obj(json!({"a": "1", "b": "2"}))));
        assert!(!s.matches(&obj(json!({"a": "1", "b": "2", "c": "3"}))));
    }

    #[test]
    fn malformed_selectors_are_rejected() {
        assert!(LabelSelector::parse("a in (b").is_err());
        assert!(LabelSelector::parse("a within (b)").is_err());
        assert!(LabelSelector::parse("a=b c").is_err());
        assert!(FieldSelector::parse("spec.x=1").is_err());
    }

    #[test]
    fn greater_and_less_than_compare_integers() {
        let s = LabelSelector::parse("replicas>2,replicas<10").unwrap();
        assert!(s.matches(&obj(json!({"replicas": "5"}))));
        assert!(!s.matches(&obj(json!({"replicas": "2"}))));
        assert!(!s.matches(&obj(json!({"replicas": "10"}))));
        assert!(!s.matches(&obj(json!({"replicas": "x"}))));
        assert!(!s.matches(&obj(json!({}))));
        assert!(LabelSelector::parse("a>b").is_err());
    }

    #[test]
    fn field_selector_on_name_and_namespace() {
        let s = FieldSelector::parse("metadata.name=a,metadata.namespace!=other").unwrap();
        assert!(s.matches(&obj(json!({}))));
        let s = FieldSelector::parse("metadata.name==b").unwrap();
        assert!(!s.matches(&obj(json!({}))));
    }
}
