//! The Kubernetes API paths the resource proxy understands, what each request plans to do,
//! and the shapes of the answers (Status bodies, list entries, `Accept` headers).

use argocd_agent_identity::text::quoted;
use serde_json::{Value, json};

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
    /// The API version, e.g. `v1`.
    pub version: String,
    /// `None`: a cluster-wide path.
    pub namespace: Option<String>,
    /// The resource's plural, e.g. `deployments`.
    pub plural: String,
    /// `None`: the collection.
    pub name: Option<String>,
    /// E.g. `status`, `log`, `exec`; only with a name.
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

/// Why a request's method and path are refused (403); the Display text reaches kubectl
/// users in a Kubernetes Status message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    /// The path is relative.
    #[error("path must start with /")]
    NoLeadingSlash,
    /// A path segment that is not accepted (see `valid_segment`).
    #[error("invalid path segment {}", quoted(.0))]
    BadSegment(String),
    /// Neither discovery nor a resource.
    #[error("not a Kubernetes API resource path")]
    NotResource,
    /// A watch, by path or by query.
    #[error("watch requests are not served")]
    Watch,
    /// A method other than GET, POST, PATCH and DELETE.
    #[error("method {} is not allowed", quoted(.0))]
    Method(String),
    /// A write to a discovery path.
    #[error("{0} of a discovery path")]
    DiscoveryWrite(String),
    /// A write to the status subresource.
    #[error("the status subresource is read-only here")]
    StatusReadOnly,
    /// A subresource other than `status`.
    #[error("subresource {} is not served", quoted(.0))]
    Subresource(String),
    /// A POST to a named object.
    #[error("POST must name a collection")]
    PostNamed,
    /// A PATCH or DELETE of a collection.
    #[error("{0} of a whole collection is not allowed")]
    WholeCollection(String),
}

/// Parses a Kubernetes API path; `Err` says why it is refused.
pub fn parse_path(path: &str) -> Result<ApiPath, PathError> {
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NoLeadingSlash);
    };
    let parts: Vec<&str> = rest.split('/').collect();
    if let Some(bad) = parts.iter().find(|s| !valid_segment(s)) {
        return Err(PathError::BadSegment((*bad).to_owned()));
    }
    match parts.as_slice() {
        ["api"] | ["apis"] | ["version"] | ["openapi", "v2"] | ["openapi", "v3", ..] => {
            Ok(ApiPath::Discovery)
        }
        ["api", _] | ["apis", _] | ["apis", _, _] => Ok(ApiPath::Discovery),
        ["api", version, rest @ ..] => resource_path("", version, rest),
        ["apis", group, version, rest @ ..] => resource_path(group, version, rest),
        _ => Err(PathError::NotResource),
    }
}

/// Subresources of a namespace (`/api/v1/namespaces/<ns>/status`), as the API server
/// reads them.
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

fn resource_path(group: &str, version: &str, rest: &[&str]) -> Result<ApiPath, PathError> {
    if rest.first() == Some(&"watch") {
        return Err(PathError::Watch);
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
        _ => return Err(PathError::NotResource),
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
/// principal's own check: see [`argocd_agent_domain::proxy::is_watch`]).
pub use argocd_agent_domain::proxy::is_watch;

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
    /// POST of a namespaced object owned by an object an Application manages (see
    /// [`check_create`]).
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
pub fn plan(method: &str, path: &str, query: &str) -> Result<Plan, PathError> {
    if !matches!(method, "GET" | "POST" | "PATCH" | "DELETE") {
        return Err(PathError::Method(method.to_owned()));
    }
    if is_watch(query) {
        return Err(PathError::Watch);
    }
    let resource = match parse_path(path)? {
        ApiPath::Discovery if method == "GET" => return Ok(Plan::PassThrough),
        ApiPath::Discovery => return Err(PathError::DiscoveryWrite(method.to_owned())),
        ApiPath::Resource(r) => r,
    };
    match resource.subresource.as_deref() {
        None => {}
        Some("status") if method == "GET" => {}
        Some("status") => return Err(PathError::StatusReadOnly),
        Some(sub) => {
            return Err(PathError::Subresource(sub.to_owned()));
        }
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
        ("POST", true) => Err(PathError::PostNamed),
        _ => Err(PathError::WholeCollection(method.to_owned())),
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
        409 => "Conflict",
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
