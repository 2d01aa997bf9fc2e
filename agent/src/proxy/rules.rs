//! The agent's own rules for the resource proxy, as pure functions: which Kubernetes API
//! paths a request may name, what each method may do, and when an object counts as
//! managed by Argo CD on this spoke.

use std::collections::HashSet;

use serde_json::{Value, json};

/// Label Argo CD's default tracking puts on the objects of an Application.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// Annotation of Argo CD's annotation-based tracking: `<app>:<group>/<kind>:<ns>/<name>`.
pub const TRACKING_ANNOTATION: &str = "argocd.argoproj.io/tracking-id";
/// Owner references followed from an object (Pod -> ReplicaSet -> Deployment).
pub const MAX_OWNER_HOPS: usize = 3;
/// Owner references of one object that are looked at (the controller first).
pub const MAX_OWNERS_PER_OBJECT: usize = 4;

/// The names under which this spoke's Applications mark the objects they manage: the bare
/// name and `<namespace>_<name>` (Argo CD's instance name outside its own namespace).
#[derive(Debug, Default, Clone)]
pub struct Apps {
    names: HashSet<String>,
}

impl Apps {
    /// From the spoke's Applications, as `(namespace, name)`.
    pub fn new<I, N, M>(apps: I) -> Apps
    where
        I: IntoIterator<Item = (N, M)>,
        N: AsRef<str>,
        M: AsRef<str>,
    {
        let mut names = HashSet::new();
        for (ns, name) in apps {
            let (ns, name) = (ns.as_ref(), name.as_ref());
            if name.is_empty() {
                continue;
            }
            names.insert(name.to_string());
            if !ns.is_empty() {
                names.insert(format!("{ns}_{name}"));
            }
        }
        Apps { names }
    }

    /// Whether `name` names one of the Applications.
    pub fn contains(&self, name: &str) -> bool {
        !name.is_empty() && self.names.contains(name)
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

fn string_at<'a>(map: &'a Value, key: &str) -> Option<&'a str> {
    map.get(key)?.as_str()
}

/// Rules (a) and (b): the object's metadata carries the instance label of one of the
/// Applications, or a tracking-id annotation whose app part (before the first `:`) names
/// one.
pub fn marked(metadata: &Value, apps: &Apps) -> bool {
    if let Some(labels) = metadata.get("labels")
        && let Some(instance) = string_at(labels, INSTANCE_LABEL)
        && apps.contains(instance)
    {
        return true;
    }
    if let Some(annotations) = metadata.get("annotations")
        && let Some(tracking) = string_at(annotations, TRACKING_ANNOTATION)
    {
        let app = tracking.split_once(':').map_or(tracking, |(app, _)| app);
        return apps.contains(app);
    }
    false
}

/// One owner reference of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerRef {
    pub api_version: String,
    pub kind: String,
    pub name: String,
    pub uid: Option<String>,
}

/// The owner references of an object (controller first), at most
/// [`MAX_OWNERS_PER_OBJECT`]; malformed entries are skipped.
pub fn owner_refs(metadata: &Value) -> Vec<OwnerRef> {
    let Some(refs) = metadata.get("ownerReferences").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out: Vec<(bool, OwnerRef)> = refs
        .iter()
        .filter_map(|r| {
            let api_version = string_at(r, "apiVersion")?;
            let kind = string_at(r, "kind")?;
            let name = string_at(r, "name")?;
            if api_version.is_empty() || kind.is_empty() || name.is_empty() {
                return None;
            }
            let controller = r.get("controller").and_then(Value::as_bool) == Some(true);
            Some((
                controller,
                OwnerRef {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: name.into(),
                    uid: string_at(r, "uid").map(str::to_owned),
                },
            ))
        })
        .collect();
    out.sort_by_key(|(controller, _)| !controller);
    out.into_iter()
        .take(MAX_OWNERS_PER_OBJECT)
        .map(|(_, r)| r)
        .collect()
}

/// A Kubernetes API path the proxy understands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiPath {
    /// Discovery and metadata: `/api`, `/apis`, `/api/v1`, `/apis/<g>`, `/apis/<g>/<v>`,
    /// `/version`, `/openapi/v2`, `/openapi/v3[/...]`.
    Discovery,
    /// A resource, a collection or a subresource.
    Resource(ResourcePath),
}

/// `/api/<v>[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]` or
/// `/apis/<g>/<v>[/namespaces/<ns>]/<plural>[/<name>[/<sub>]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub plural: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl ResourcePath {
    /// `/api/<v>` or `/apis/<g>/<v>`.
    fn prefix(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", self.version)
        } else {
            format!("/apis/{}/{}", self.group, self.version)
        }
    }

    /// The path of the collection (namespaced when the path names a namespace).
    pub fn collection_path(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/namespaces/{ns}/{}", self.prefix(), self.plural),
            None => format!("{}/{}", self.prefix(), self.plural),
        }
    }

    /// The path of the named object itself (without a subresource).
    pub fn object_path(&self) -> Option<String> {
        let name = self.name.as_ref()?;
        Some(format!("{}/{name}", self.collection_path()))
    }

    /// Core `v1` or `events.k8s.io` Events.
    pub fn is_events(&self) -> bool {
        self.plural == "events" && (self.group.is_empty() || self.group == "events.k8s.io")
    }
}

/// Whether one path segment is acceptable: no empty, `.` or `..` segments, no percent
/// encoding (so no encoded slash), no control characters, spaces or backslashes.
fn valid_segment(s: &str) -> bool {
    !s.is_empty()
        && s != "."
        && s != ".."
        && s.len() <= 253
        && s.bytes()
            .all(|b| b > b' ' && b != 0x7f && !matches!(b, b'%' | b'\\' | b'?' | b'#'))
}

/// Parses a Kubernetes API path; `Err` says why it is refused.
pub fn parse_path(path: &str) -> Result<ApiPath, String> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err("path must start with /".into());
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if let Some(bad) = parts.iter().find(|s| !valid_segment(s)) {
        return Err(format!("invalid path segment {bad:?}"));
    }
    match parts.as_slice() {
        ["api"] | ["apis"] | ["version"] | ["openapi", "v2"] | ["openapi", "v3", ..] => {
            Ok(ApiPath::Discovery)
        }
        ["api", _] | ["apis", _] | ["apis", _, _] => Ok(ApiPath::Discovery),
        ["api", version, rest @ ..] => resource_path("", version, rest),
        ["apis", group, version, rest @ ..] => resource_path(group, version, rest),
        _ => Err("not a Kubernetes API resource path".into()),
    }
}

/// Subresources of a namespace (`/api/v1/namespaces/<ns>/status`), as the API server
/// reads them.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

fn resource_path(group: &str, version: &str, rest: &[&str]) -> Result<ApiPath, String> {
    if rest.first() == Some(&"watch") {
        return Err("watch requests are not served".into());
    }
    let (namespace, rest) = match rest {
        ["namespaces", ns, next, ..] if !NAMESPACE_SUBRESOURCES.contains(next) => {
            (Some(ns.to_string()), &rest[2..])
        }
        _ => (None, rest),
    };
    let (plural, name, subresource) = match rest {
        [plural] => (plural, None, None),
        [plural, name] => (plural, Some(name), None),
        [plural, name, sub] => (plural, Some(name), Some(sub)),
        _ => return Err("not a Kubernetes API resource path".into()),
    };
    Ok(ApiPath::Resource(ResourcePath {
        group: group.into(),
        version: version.into(),
        namespace,
        plural: plural.to_string(),
        name: name.map(|s| s.to_string()),
        subresource: subresource.map(|s| s.to_string()),
    }))
}

/// Whether the query asks for a watch, as the API server reads it (shared with the
/// principal's own check: see [`argocd_agent_sync::proxy::is_watch`]).
pub use argocd_agent_sync::proxy::is_watch;

/// What the agent does with an accepted request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Performed as is: discovery, metadata and Events reads.
    PassThrough,
    /// GET of a named object (or its `status`): performed when the object is managed.
    Get(ResourcePath),
    /// GET of a collection: performed, then filtered to managed items.
    List(ResourcePath),
    /// PATCH of a named object that is managed.
    Patch(ResourcePath),
    /// DELETE of a named object that is managed.
    Delete(ResourcePath),
    /// POST of an object that is itself managed.
    Create(ResourcePath),
}

impl Plan {
    /// The verb the metric counts the request under.
    pub fn verb(&self) -> &'static str {
        match self {
            Plan::PassThrough | Plan::Get(_) => "get",
            Plan::List(_) => "list",
            Plan::Patch(_) => "patch",
            Plan::Delete(_) => "delete",
            Plan::Create(_) => "create",
        }
    }
}

/// The metric verb of a request refused before it had a plan.
pub fn method_verb(method: &str) -> &'static str {
    match method {
        "GET" => "get",
        "POST" => "create",
        "PATCH" => "patch",
        "DELETE" => "delete",
        "PUT" => "update",
        _ => "other",
    }
}

/// Decides what a request may do; `Err` is the reason it is refused (403).
pub fn plan(method: &str, path: &str, query: &str) -> Result<Plan, String> {
    if !matches!(method, "GET" | "POST" | "PATCH" | "DELETE") {
        return Err(format!("method {method:?} is not allowed"));
    }
    if is_watch(query) {
        return Err("watch requests are not served".into());
    }
    let resource = match parse_path(path)? {
        ApiPath::Discovery if method == "GET" => return Ok(Plan::PassThrough),
        ApiPath::Discovery => return Err(format!("{method} of a discovery path")),
        ApiPath::Resource(r) => r,
    };
    match resource.subresource.as_deref() {
        None => {}
        Some("status") if method == "GET" => {}
        Some("status") => return Err("the status subresource is read-only here".into()),
        Some(sub) => return Err(format!("subresource {sub:?} is not served")),
    }
    if method == "GET" && resource.is_events() {
        return Ok(Plan::PassThrough);
    }
    match (method, resource.name.is_some()) {
        ("GET", true) => Ok(Plan::Get(resource)),
        ("GET", false) => Ok(Plan::List(resource)),
        ("PATCH", true) => Ok(Plan::Patch(resource)),
        ("DELETE", true) => Ok(Plan::Delete(resource)),
        ("POST", false) => Ok(Plan::Create(resource)),
        ("POST", true) => Err("POST must name a collection".into()),
        _ => Err(format!("{method} of a whole collection is not allowed")),
    }
}

/// A Kubernetes `Status` failure body.
pub fn status_body(code: u16, reason: &str, message: &str) -> Vec<u8> {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
    .to_string()
    .into_bytes()
}

/// The `Status` reason Kubernetes uses with `code`.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        429 => "TooManyRequests",
        501 => "NotImplemented",
        502 => "BadGateway",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// The entries of a List (`items[]`) or a Table (`rows[]`), to filter.
pub fn entries_mut(body: &mut Value) -> Option<&mut Vec<Value>> {
    if body.get("kind").and_then(Value::as_str) == Some("Table") {
        body.get_mut("rows")?.as_array_mut()
    } else {
        body.get_mut("items")?.as_array_mut()
    }
}

/// The metadata of one List item or Table row (`rows[].object.metadata`).
pub fn entry_metadata(entry: &Value) -> Option<&Value> {
    entry
        .get("metadata")
        .or_else(|| entry.get("object")?.get("metadata"))
}

/// Whether a media type list (an Accept header) asks only for plain JSON objects (no
/// Table, no protobuf, no YAML), so a response to it can be checked directly.
pub fn accepts_plain_json(accept: &str) -> bool {
    accept.split(',').all(|m| {
        let mut parts = m.split(';').map(str::trim);
        let ty = parts.next().unwrap_or_default();
        let plain = parts.all(|p| !p.starts_with("as=") && !p.starts_with("as ="));
        plain && matches!(ty, "" | "*/*" | "application/json" | "application/*")
    })
}

/// The JSON media types of an Accept header (Table requests included), so a list comes
/// back in a form the agent can filter; `application/json` when there are none.
pub fn json_accept(accept: &str) -> String {
    let json: Vec<&str> = accept
        .split(',')
        .map(str::trim)
        .filter(|m| m.split(';').next().map(str::trim) == Some("application/json"))
        .collect();
    if json.is_empty() {
        "application/json".into()
    } else {
        json.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apps() -> Apps {
        Apps::new([("argocd", "guestbook"), ("team-a", "web")])
    }

    fn meta(v: Value) -> Value {
        v
    }

    #[test]
    fn marks_by_label_and_tracking_id() {
        let apps = apps();
        let table: Vec<(Value, bool)> = vec![
            (json!({"labels": {INSTANCE_LABEL: "guestbook"}}), true),
            (json!({"labels": {INSTANCE_LABEL: "team-a_web"}}), true),
            (json!({"labels": {INSTANCE_LABEL: "web"}}), true),
            (json!({"labels": {INSTANCE_LABEL: "other"}}), false),
            (json!({"labels": {INSTANCE_LABEL: ""}}), false),
            (json!({"labels": {"app": "guestbook"}}), false),
            (
                json!({"annotations": {TRACKING_ANNOTATION: "guestbook:apps/Deployment:default/web"}}),
                true,
            ),
            (
                json!({"annotations": {TRACKING_ANNOTATION: "team-a_web:/Service:team-a/web"}}),
                true,
            ),
            (
                json!({"annotations": {TRACKING_ANNOTATION: "guestbookx:apps/Deployment:default/web"}}),
                false,
            ),
            (
                json!({"annotations": {TRACKING_ANNOTATION: ":apps/Deployment:default/web"}}),
                false,
            ),
            (
                json!({"annotations": {TRACKING_ANNOTATION: "guestbook"}}),
                true,
            ),
            (json!({"labels": {INSTANCE_LABEL: 5}}), false),
            (json!({}), false),
            (json!(null), false),
        ];
        for (m, want) in table {
            assert_eq!(marked(&meta(m.clone()), &apps), want, "{m}");
        }
        assert!(!marked(
            &json!({"labels": {INSTANCE_LABEL: "guestbook"}}),
            &Apps::default()
        ));
    }

    #[test]
    fn owner_refs_put_the_controller_first_and_skip_malformed() {
        let m = json!({"ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "a"},
            {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-1", "uid": "u1", "controller": true},
            {"kind": "Broken", "name": "x"},
            {"apiVersion": "v1", "kind": "", "name": "x"},
        ]});
        let refs = owner_refs(&m);
        assert_eq!(refs.len(), 2);
        assert_eq!(refs[0].kind, "ReplicaSet");
        assert_eq!(refs[0].uid.as_deref(), Some("u1"));
        assert_eq!(refs[1].kind, "ConfigMap");
        assert!(owner_refs(&json!({"ownerReferences": "nope"})).is_empty());
    }

    fn res(
        group: &str,
        ns: Option<&str>,
        plural: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> ApiPath {
        ApiPath::Resource(ResourcePath {
            group: group.into(),
            version: "v1".into(),
            namespace: ns.map(Into::into),
            plural: plural.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
        })
    }

    #[test]
    fn parses_paths() {
        for p in [
            "/api",
            "/apis",
            "/api/v1",
            "/apis/apps",
            "/apis/apps/v1",
            "/version",
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/apps/v1",
        ] {
            assert_eq!(parse_path(p), Ok(ApiPath::Discovery), "{p}");
        }
        assert_eq!(
            parse_path("/api/v1/pods"),
            Ok(res("", None, "pods", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/pods/web-0"),
            Ok(res("", Some("ns"), "pods", Some("web-0"), None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/pods/web-0/status"),
            Ok(res("", Some("ns"), "pods", Some("web-0"), Some("status")))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns"),
            Ok(res("", None, "namespaces", Some("ns"), None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            Ok(res("", None, "namespaces", None, None))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ns/status"),
            Ok(res("", None, "namespaces", Some("ns"), Some("status")))
        );
        assert_eq!(
            parse_path("/apis/apps/v1/namespaces/ns/deployments"),
            Ok(res("apps", Some("ns"), "deployments", None, None))
        );
        assert_eq!(
            parse_path("/apis/rbac.authorization.k8s.io/v1/clusterroles/system:view"),
            Ok(res(
                "rbac.authorization.k8s.io",
                None,
                "clusterroles",
                Some("system:view"),
                None
            ))
        );
        for bad in [
            "",
            "api",
            "/",
            "//api",
            "/api/",
            "/api/v1//pods",
            "/api/v1/namespaces/../pods",
            "/api/v1/namespaces/./pods",
            "/api/v1/namespaces/ns%2Fx/pods",
            "/api/v1/namespaces/ns/pods/a/b/c",
            "/api/v1/watch/pods",
            "/apis/apps/v1/watch/namespaces/ns/deployments",
            "/healthz",
            "/logs/x",
            "/api/v1/namespaces/ns/pods/a\u{1b}b",
            "/api/v1/namespaces/ns/pods/a b",
        ] {
            assert!(parse_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plans_requests() {
        let ok = |m: &str, p: &str, q: &str| plan(m, p, q);
        assert_eq!(ok("GET", "/apis", ""), Ok(Plan::PassThrough));
        assert_eq!(
            ok("GET", "/openapi/v3/apis/apps/v1", "hash=x"),
            Ok(Plan::PassThrough)
        );
        assert!(ok("POST", "/apis", "").is_err());
        assert!(matches!(
            ok("GET", "/api/v1/namespaces/n/pods", "limit=5"),
            Ok(Plan::List(_))
        ));
        assert!(matches!(
            ok("GET", "/api/v1/namespaces/n/pods/p", ""),
            Ok(Plan::Get(_))
        ));
        assert!(matches!(
            ok("GET", "/api/v1/namespaces/n/pods/p/status", ""),
            Ok(Plan::Get(_))
        ));
        assert_eq!(
            ok("GET", "/api/v1/namespaces/n/events", ""),
            Ok(Plan::PassThrough)
        );
        assert_eq!(ok("GET", "/api/v1/events", ""), Ok(Plan::PassThrough));
        assert_eq!(
            ok("GET", "/apis/events.k8s.io/v1/namespaces/n/events/e1", ""),
            Ok(Plan::PassThrough)
        );
        assert!(matches!(
            ok("DELETE", "/api/v1/namespaces/n/events/e1", ""),
            Ok(Plan::Delete(_))
        ));
        assert!(matches!(
            ok("PATCH", "/apis/apps/v1/namespaces/n/deployments/d", ""),
            Ok(Plan::Patch(_))
        ));
        assert!(matches!(
            ok("DELETE", "/api/v1/namespaces/n/pods/p", ""),
            Ok(Plan::Delete(_))
        ));
        assert!(matches!(
            ok("POST", "/apis/batch/v1/namespaces/n/jobs", ""),
            Ok(Plan::Create(_))
        ));
        for (m, p, q) in [
            ("GET", "/api/v1/namespaces/n/pods", "watch=true"),
            ("GET", "/api/v1/namespaces/n/pods", "watch=1"),
            (
                "GET",
                "/api/v1/namespaces/n/pods/p",
                "labelSelector=a&watch=true",
            ),
            ("GET", "/api/v1/watch/namespaces/n/pods", ""),
            ("PUT", "/api/v1/namespaces/n/pods/p", ""),
            ("OPTIONS", "/api", ""),
            ("get", "/api", ""),
            ("GET", "/api/v1/namespaces/n/pods/p/log", ""),
            ("POST", "/api/v1/namespaces/n/pods/p/exec", ""),
            ("GET", "/api/v1/namespaces/n/secrets/s/proxy", ""),
            ("PATCH", "/api/v1/namespaces/n/pods/p/status", ""),
            ("PATCH", "/api/v1/namespaces/n/pods", ""),
            ("DELETE", "/api/v1/namespaces/n/pods", ""),
            ("POST", "/api/v1/namespaces/n/pods/p", ""),
            ("POST", "/api/v1/namespaces/n/pods/p/eviction", ""),
            ("PUT", "/api/v1/namespaces/n/namespaces/n/finalize", ""),
            ("GET", "/api/v1/namespaces/n/finalize", ""),
        ] {
            assert!(ok(m, p, q).is_err(), "{m} {p}?{q}");
        }
        assert!(ok("GET", "/api/v1/namespaces/n/pods", "watch=false").is_ok());
        assert!(ok("GET", "/api/v1/namespaces/n/pods", "watch=0").is_ok());
    }

    /// The API server reads every present `watch` value but `0` and `false` (any case) as
    /// true; each such request is refused before anything reaches the cluster.
    #[test]
    fn every_value_the_api_server_reads_as_a_watch_is_refused() {
        for q in [
            "watch",
            "watch=",
            "watch=f",
            "watch=F",
            "watch=t",
            "watch=1",
            "w%61tch=1",
            "%77atch",
            "watch=false&watch=1",
            "labelSelector=a&watch=f",
        ] {
            assert_eq!(
                plan("GET", "/api/v1/namespaces/n/pods", q),
                Err("watch requests are not served".into()),
                "{q:?}"
            );
        }
        for q in [
            "watch=0",
            "watch=false",
            "watch=False",
            "watch=FaLsE",
            "watch=FALSE",
        ] {
            assert!(plan("GET", "/api/v1/namespaces/n/pods", q).is_ok(), "{q:?}");
        }
    }

    #[test]
    fn status_bodies_are_kubernetes_status() {
        let v: Value = serde_json::from_slice(&status_body(403, "Forbidden", "no")).unwrap();
        assert_eq!(
            v,
            json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
                   "message":"no","reason":"Forbidden","code":403})
        );
    }

    #[test]
    fn list_and_table_entries() {
        let mut list = json!({"kind": "PodList", "metadata": {"resourceVersion": "5"},
            "items": [{"metadata": {"name": "a"}}]});
        assert_eq!(entries_mut(&mut list).map(|e| e.len()), Some(1));
        let mut table = json!({"kind": "Table", "rows": [
            {"cells": ["a"], "object": {"metadata": {"name": "a"}}},
            {"cells": ["b"]}]});
        let rows = entries_mut(&mut table).unwrap();
        assert!(entry_metadata(&rows[0]).is_some());
        assert!(entry_metadata(&rows[1]).is_none());
        assert!(entries_mut(&mut json!({"kind": "Pod"})).is_none());
    }

    #[test]
    fn accept_headers() {
        assert!(accepts_plain_json(""));
        assert!(accepts_plain_json("application/json"));
        assert!(accepts_plain_json("application/json, */*"));
        assert!(!accepts_plain_json(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!accepts_plain_json(
            "application/vnd.kubernetes.protobuf,application/json"
        ));
        assert_eq!(
            json_accept("application/vnd.kubernetes.protobuf,application/json"),
            "application/json"
        );
        assert_eq!(
            json_accept(
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
            ),
            "application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=Table;v=v1beta1;g=meta.k8s.io, application/json"
        );
        assert_eq!(json_accept(""), "application/json");
    }
}
