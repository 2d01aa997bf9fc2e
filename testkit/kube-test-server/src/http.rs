//! HTTP front end: URL routing, query parameters, discovery documents, tables, watch streams
//! and the `/_test/*` fault-injection endpoints.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::response::Response;
use base64::Engine as _;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::selector::{FieldSelector, LabelSelector};
use super::status::ApiError;
use super::store::{
    DeleteOutcome, Event, EventType, Page, PageQuery, PatchKind, Preconditions, WriteMode,
};
use super::{ColumnValue, ResourceType, Shared, Storage};

/// Request bodies larger than this are refused (the apiserver's own limit is 3 MiB).
const MAX_BODY: usize = 8 << 20;

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new().fallback(handle).with_state(shared)
}

fn json_response(code: u16, body: &Value) -> Response {
    json_bytes_response(code, body.to_string().into_bytes())
}

/// [`json_response`] of a body already encoded.
fn json_bytes_response(code: u16, body: Vec<u8>) -> Response {
    let mut resp = Response::new(Body::from(body));
    *resp.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.to_status());
    if e.code == 429 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp
}

fn not_found_path() -> ApiError {
    ApiError {
        details: Some(json!({})),
        ..ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }
}

fn method_not_allowed(method: &Method) -> ApiError {
    ApiError::new(
        405,
        "MethodNotAllowed",
        format!("the server does not allow this method on the requested resource ({method})"),
    )
}

/// Query parameters, URL-decoded (`+` is a space, `%xx` decoded).
pub(super) struct Query(Vec<(String, String)>);

/// Read access to the query for other modules.
pub(super) type QueryView = Query;

impl Query {
    pub(super) fn get(&self, k: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
    fn rv(&self) -> Result<Option<u64>, ApiError> {
        match self.get("resourceVersion") {
            None | Some("") => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|_| {
                ApiError::bad_request(format!("invalid resourceVersion {s:?}: not an integer"))
            }),
        }
    }
}

/// Where a resource request points.
struct Target {
    res: usize,
    /// `None`: across all namespaces (or a cluster-scoped collection).
    ns: Option<String>,
    name: Option<String>,
    status: bool,
    /// A pod subresource other than status: `log` or `exec`.
    pod_sub: Option<&'static str>,
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_string();
    let query = Query(
        url::form_urlencoded::parse(req.uri().query().unwrap_or("").as_bytes())
            .into_owned()
            .collect(),
    );
    if let Some(admin) = path.strip_prefix("/_test/") {
        return match admin_request(&shared, req.method(), admin, &query) {
            Ok(v) => json_response(200, &v),
            Err(e) => error_response(&e),
        };
    }
    let attrs = super::audit::resource_attributes(req.method(), &path, query.flag("watch"));
    let user = shared.users.authenticate(req.headers());
    let resp = match &user {
        Err(e) => error_response(e),
        Ok(user) => answer(&shared, req, &path, &query, user).await,
    };
    if let Some(mut a) = attrs {
        a.user = user.ok();
        a.code = resp.status().as_u16();
        shared.requests.record(a);
    }
    resp
}

/// An authenticated request: injected faults first, then the API.
async fn answer(
    shared: &Arc<Shared>,
    req: Request,
    path: &str,
    query: &Query,
    user: &str,
) -> Response {
    let latency = shared.faults.latency_ms.load(Ordering::SeqCst);
    if latency > 0 {
        tokio::time::sleep(Duration::from_millis(latency)).await;
    }
    let take_failure = shared
        .faults
        .fail_remaining
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok();
    if take_failure {
        let code = shared.faults.fail_status.load(Ordering::SeqCst);
        let reason = match code {
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "Unknown",
        };
        return error_response(&ApiError::new(
            code,
            reason,
            format!("injected failure ({code}) from the kube test server"),
        ));
    }
    match route(shared, req, path, query, user).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

fn admin_request(
    shared: &Shared,
    method: &Method,
    what: &str,
    q: &Query,
) -> Result<Value, ApiError> {
    if method != Method::POST {
        return Err(method_not_allowed(method));
    }
    let num = |k: &str| -> Result<u64, ApiError> {
        q.get(k)
            .ok_or_else(|| ApiError::bad_request(format!("missing query parameter {k}")))?
            .parse()
            .map_err(|_| ApiError::bad_request(format!("query parameter {k} is not a number")))
    };
    match what {
        "drop-watches" => shared.drop_watches(),
        "compact" => shared.store.compact(),
        "latency" => shared.faults.latency_ms.store(num("ms")?, Ordering::SeqCst),
        "fail-next" => {
            let status = u16::try_from(num("status")?)
                .ok()
                .filter(|s| (400..600).contains(s))
                .ok_or_else(|| {
                    ApiError::bad_request("status must be an HTTP error code (400-599)")
                })?;
            shared.faults.fail_status.store(status, Ordering::SeqCst);
            let n = usize::try_from(num("n")?).unwrap_or(usize::MAX);
            shared.faults.fail_remaining.store(n, Ordering::SeqCst);
        }
        _ => return Err(not_found_path()),
    }
    Ok(json!({"ok": true}))
}

async fn route(
    shared: &Arc<Shared>,
    req: Request,
    path: &str,
    q: &Query,
    user: &str,
) -> Result<Response, ApiError> {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let get_only = |v: Value| {
        if req.method() == Method::GET {
            Ok(json_response(200, &v))
        } else {
            Err(method_not_allowed(req.method()))
        }
    };
    let (group, version, rest) = match segs.as_slice() {
        ["version"] => return get_only(version_doc()),
        ["api"] => {
            return get_only(json!({
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}],
            }));
        }
        // Aggregated discovery requests get the plain document with Content-Type
        // application/json, which tells client-go to fall back to legacy discovery.
        ["apis"] => return get_only(group_list(shared)),
        ["apis", g] => {
            return match group_doc(shared, g) {
                Some(mut d) => {
                    d["kind"] = json!("APIGroup");
                    d["apiVersion"] = json!("v1");
                    get_only(d)
                }
                None => Err(not_found_path()),
            };
        }
        ["openapi", "v2"]
            if req.method() == Method::GET
                && req
                    .headers()
                    .get(header::ACCEPT)
                    .and_then(|a| a.to_str().ok())
                    .is_some_and(|a| a.contains("protobuf") && !a.contains("json")) =>
        {
            // client-go asks for protobuf only and parses whatever comes back as protobuf.
            let mut resp = Response::new(Body::from(super::openapi::v2_protobuf(
                &shared.store.resources,
            )));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(
                    "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                ),
            );
            return Ok(resp);
        }
        ["openapi", "v2"] => return get_only(super::openapi::v2(&shared.store.resources)),
        ["openapi", "v3"] => return get_only(openapi_index(shared)),
        ["openapi", "v3", "api", "v1"] => return get_only(openapi_gv(shared, "", "v1")),
        ["openapi", "v3", "apis", g, v] if shared.store.find_gv(g, v) => {
            return get_only(openapi_gv(shared, g, v));
        }
        ["api", "v1", rest @ ..] => ("", "v1", rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(not_found_path()),
    };
    let store = &shared.store;
    if rest.is_empty() {
        if !store
            .resources
            .iter()
            .any(|r| r.group == group && r.version == version)
        {
            return Err(not_found_path());
        }
        return get_only(resource_list(shared, group, version));
    }
    let target = match rest {
        ["namespaces", ns, plural, tail @ ..]
            if store
                .find(group, version, plural)
                .is_some_and(|r| store.resources[r].namespaced) =>
        {
            let res = store
                .find(group, version, plural)
                .ok_or_else(not_found_path)?;
            parse_tail(shared, res, Some(ns.to_string()), tail)?
        }
        [plural, tail @ ..] => {
            let res = store
                .find(group, version, plural)
                .ok_or_else(not_found_path)?;
            if store.resources[res].namespaced {
                if !tail.is_empty() {
                    return Err(not_found_path());
                }
                parse_tail(shared, res, None, tail)?
            } else {
                parse_tail(shared, res, Some(String::new()), tail)?
            }
        }
        [] => return Err(not_found_path()),
    };
    serve_resource(shared, req, target, q, user).await
}

fn parse_tail(
    shared: &Shared,
    res: usize,
    ns: Option<String>,
    tail: &[&str],
) -> Result<Target, ApiError> {
    let r = &shared.store.resources[res];
    let is_pods = r.group.is_empty() && r.plural == "pods";
    let (name, status, pod_sub) = match tail {
        [] => (None, false, None),
        [name] => (Some(name.to_string()), false, None),
        [name, "status"] if r.status_subresource => (Some(name.to_string()), true, None),
        [name, "log"] if is_pods => (Some(name.to_string()), false, Some("log")),
        [name, "exec"] if is_pods => (Some(name.to_string()), false, Some("exec")),
        _ => return Err(not_found_path()),
    };
    Ok(Target {
        res,
        ns,
        pod_sub,
        name,
        status,
    })
}

fn version_doc() -> Value {
    json!({
        "major": "1", "minor": "35", "gitVersion": "v1.35.0",
        "gitCommit": "0000000000000000000000000000000000000000", "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25.0", "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn group_doc(shared: &Shared, group: &str) -> Option<Value> {
    let mut versions: Vec<String> = Vec::new();
    for r in shared.store.resources.iter().filter(|r| r.group == group) {
        if !versions.contains(&r.version) {
            versions.push(r.version.clone());
        }
    }
    let first = versions.first()?.clone();
    let gv = |v: &str| json!({"groupVersion": format!("{group}/{v}"), "version": v});
    Some(json!({
        "name": group,
        "versions": versions.iter().map(|v| gv(v)).collect::<Vec<_>>(),
        "preferredVersion": gv(&first),
    }))
}

fn group_list(shared: &Shared) -> Value {
    let mut groups: Vec<&str> = Vec::new();
    for r in shared
        .store
        .resources
        .iter()
        .filter(|r| !r.group.is_empty())
    {
        if !groups.contains(&r.group.as_str()) {
            groups.push(&r.group);
        }
    }
    json!({
        "kind": "APIGroupList",
        "apiVersion": "v1",
        "groups": groups.iter().filter_map(|g| group_doc(shared, g)).collect::<Vec<_>>(),
    })
}

fn resource_list(shared: &Shared, group: &str, version: &str) -> Value {
    let mut resources = Vec::new();
    for r in shared
        .store
        .resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let verbs = match r.storage {
            Storage::Objects => json!([
                "create",
                "delete",
                "deletecollection",
                "get",
                "list",
                "patch",
                "update",
                "watch"
            ]),
            Storage::Review => json!(["create"]),
        };
        let mut doc = json!({
            "name": r.plural, "singularName": r.singular, "namespaced": r.namespaced, "kind": r.kind,
            "verbs": verbs, "shortNames": r.short_names,
        });
        if !r.categories.is_empty() {
            doc["categories"] = json!(r.categories);
        }
        resources.push(doc);
        if r.group.is_empty() && r.plural == "pods" {
            resources.push(
                json!({"name": "pods/log", "singularName": "", "namespaced": true,
                "kind": "Pod", "verbs": ["get"]}),
            );
            resources.push(
                json!({"name": "pods/exec", "singularName": "", "namespaced": true,
                "kind": "PodExecOptions", "verbs": ["create", "get"]}),
            );
        }
        if r.status_subresource {
            resources.push(json!({
                "name": format!("{}/status", r.plural), "singularName": "", "namespaced": r.namespaced,
                "kind": r.kind, "verbs": ["get", "patch", "update"],
            }));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources})
}

/// `/openapi/v3`: one document per group/version, as the apiserver lists them.
fn openapi_index(shared: &Shared) -> Value {
    let mut paths = serde_json::Map::new();
    for r in &shared.store.resources {
        let p = if r.group.is_empty() {
            format!("api/{}", r.version)
        } else {
            format!("apis/{}/{}", r.group, r.version)
        };
        // The hash is of the document's content (the apiserver uses its SHA-512), so clients
        // that cache per URL (kubectl's disk cache) never reuse a stale document.
        let (g, v) = (r.group.as_str(), r.version.as_str());
        let url = format!(
            "/openapi/v3/{p}?hash={:016X}",
            fnv1a(openapi_gv(shared, g, v).to_string().as_bytes())
        );
        paths.insert(p, json!({"serverRelativeURL": url}));
    }
    json!({"paths": paths})
}

/// 64-bit FNV-1a.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The OpenAPI v3 document of a group/version: each kind's schema in `components.schemas`
/// (what `kubectl explain` reads) and its PATCH operation, tagged with its group/version/kind
/// and declaring the `fieldValidation` parameter (what kubectl's query-parameter check reads
/// to leave field validation to the server). The operations declare no request body, so
/// kubectl picks its patch type by its built-in rule (merge patch for custom resources).
fn openapi_gv(shared: &Shared, group: &str, version: &str) -> Value {
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for r in shared
        .store
        .resources
        .iter()
        .filter(|r| r.group == group && r.version == version)
    {
        let prefix = if group.is_empty() {
            format!("/api/{version}")
        } else {
            format!("/apis/{group}/{version}")
        };
        let path = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.plural)
        } else {
            format!("{prefix}/{}/{{name}}", r.plural)
        };
        let op = json!({
            "operationId": format!("patch{}", r.kind),
            "x-kubernetes-action": "patch",
            "x-kubernetes-group-version-kind": {"group": group, "version": version, "kind": r.kind},
            "parameters": [
                {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
            ],
            "responses": {"200": {"description": "OK"}},
        });
        paths.insert(path, json!({"patch": op}));
        schemas.insert(
            super::openapi::schema_name(r),
            super::openapi::definition(r),
        );
    }
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.35.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    })
}

async fn read_body(req: Request) -> Result<(HeaderMap, Bytes), ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("request body could not be read: {e}"),
        )
    })?;
    Ok((parts.headers, bytes))
}

fn media_type(headers: &HeaderMap) -> String {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// Decodes a create/update body (JSON, or YAML when so declared).
fn decode_object(headers: &HeaderMap, body: &[u8]) -> Result<Value, ApiError> {
    decode_object_as(&media_type(headers), body)
}

/// [`decode_object`] for a media type already taken from the headers (also for `fuzzing`).
pub(crate) fn decode_object_as(media_type: &str, body: &[u8]) -> Result<Value, ApiError> {
    match media_type {
        "" | "application/json" | "*/*" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}"))),
        "application/vnd.kubernetes.protobuf" => super::protobuf::decode(body).map_err(|e| {
            ApiError::new(
                415,
                "UnsupportedMediaType",
                format!("cannot decode the protobuf request body: {e}"),
            )
        }),
        "application/yaml" => std::str::from_utf8(body)
            .map_err(|e| e.to_string())
            .and_then(|s| serde_saphyr::from_str(s).map_err(|e| e.to_string()))
            .map_err(|e| ApiError::bad_request(format!("the request body is not valid YAML: {e}"))),
        other => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format ({other}) - accepted media types include: application/json, application/yaml"
            ),
        )),
    }
}

fn is_apply(headers: &HeaderMap) -> bool {
    media_type(headers) == "application/apply-patch+yaml"
}

/// What `Accept: ...;as=Table` asks for.
#[derive(Clone, Copy)]
enum IncludeObject {
    None,
    Metadata,
    Object,
}

fn wants_table(headers: &HeaderMap, q: &Query) -> Option<IncludeObject> {
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // The first acceptable media type wins; kubectl lists Table first, JSON as fallback.
    let first = accept.split(',').next().unwrap_or("");
    if !first.split(';').any(|p| p.trim() == "as=Table") {
        return None;
    }
    Some(match q.get("includeObject") {
        Some("None") => IncludeObject::None,
        Some("Object") => IncludeObject::Object,
        _ => IncludeObject::Metadata,
    })
}

fn human_age(created: Option<&str>) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (jiff::Timestamp::now().as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The value at a simple JSONPath like `.status.sync.status` (what CRD printer columns use).
fn json_path<'a>(o: &'a Value, path: &str) -> Option<&'a Value> {
    path.trim_start_matches('.')
        .split('.')
        .try_fold(o, |v, seg| v.get(seg))
}

fn render_table(r: &ResourceType, objects: &[Value], rv: u64, include: IncludeObject) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let name = o
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            let age = human_age(
                o.pointer("/metadata/creationTimestamp")
                    .and_then(Value::as_str),
            );
            let mut cells = vec![json!(name)];
            cells.extend(r.columns.iter().map(|c| match c.value {
                ColumnValue::Value => json_path(o, &c.json_path).cloned().unwrap_or(Value::Null),
                ColumnValue::KeyCount => json!(
                    c.json_path
                        .split(',')
                        .filter_map(|p| json_path(o, p.trim()).and_then(Value::as_object))
                        .map(|m| m.len())
                        .sum::<usize>()
                ),
            }));
            cells.push(json!(age));
            let mut row = json!({"cells": cells});
            match include {
                IncludeObject::None => {}
                IncludeObject::Object => row["object"] = o.clone(),
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o.get("metadata").cloned().unwrap_or(json!({})),
                    })
                }
            }
            row
        })
        .collect();
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "priority": 0,
                                  "description": "Name must be unique within a namespace."}),
    ];
    for c in &r.columns {
        let ty = match c.value {
            ColumnValue::Value => "string",
            ColumnValue::KeyCount => "integer",
        };
        columns.push(
            json!({"name": c.name, "type": ty, "format": "", "priority": c.priority,
                            "description": format!("{} ({})", c.name, c.json_path)}),
        );
    }
    columns.push(
        json!({"name": "Age", "type": "string", "format": "", "priority": 0,
                        "description": "Time since the object was created."}),
    );
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv.to_string()},
        "columnDefinitions": columns,
        "rows": rows,
    })
}

struct Filter {
    ns: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl Filter {
    fn from_query(r: &ResourceType, target: &Target, q: &Query) -> Result<Self, ApiError> {
        Ok(Self {
            ns: target.ns.clone().filter(|n| !n.is_empty()),
            labels: LabelSelector::parse(q.get("labelSelector").unwrap_or(""))
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
            fields: FieldSelector::parse_for(
                q.get("fieldSelector").unwrap_or(""),
                &r.field_selectors,
            )
            .map_err(ApiError::bad_request)?,
        })
    }
    fn has_selector(&self) -> bool {
        !self.labels.is_empty() || !self.fields.is_empty()
    }
    fn matches(&self, obj: &Value) -> bool {
        let ns_ok = self.ns.as_deref().is_none_or(|ns| {
            obj.pointer("/metadata/namespace").and_then(Value::as_str) == Some(ns)
        });
        ns_ok && self.labels.matches(obj) && self.fields.matches(obj)
    }
}

async fn serve_resource(
    shared: &Arc<Shared>,
    req: Request,
    t: Target,
    q: &Query,
    user: &str,
) -> Result<Response, ApiError> {
    let store = &shared.store;
    let r = store.resources[t.res].clone();
    let method = req.method().clone();
    if r.storage == Storage::Review {
        return match (&method, &t.name) {
            (&Method::POST, None) => {
                let (headers, body) = read_body(req).await?;
                let review = decode_object(&headers, &body)?;
                Ok(json_response(
                    201,
                    &super::review::answer(&r, review, user)?,
                ))
            }
            _ => Err(method_not_allowed(&method)),
        };
    }
    match t.pod_sub {
        Some("log") if method == Method::GET => {
            let name = t.name.clone().unwrap_or_default();
            let pod = store.get(t.res, t.ns.as_deref().unwrap_or(""), &name)?;
            let body = match super::pods::log(shared, &pod, q)? {
                super::pods::LogBody::Text(text) => Body::from(text),
                super::pods::LogBody::Follow(mut rx) => {
                    Body::from_stream(futures::stream::poll_fn(move |cx| {
                        rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>))
                    }))
                }
            };
            let mut resp = Response::new(body);
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
            return Ok(resp);
        }
        Some("exec") if method == Method::GET || method == Method::POST => {
            let name = t.name.clone().unwrap_or_default();
            let pod = store.get(t.res, t.ns.as_deref().unwrap_or(""), &name)?;
            let command: Vec<String> =
                q.0.iter()
                    .filter(|(k, _)| k == "command")
                    .map(|(_, v)| v.clone())
                    .collect();
            let exec = super::exec::exec_request(shared, &pod, q, command)?;
            return upgrade_exec(req, exec);
        }
        Some(_) => return Err(method_not_allowed(&method)),
        None => {}
    }
    let table = wants_table(req.headers(), q);
    let ns = t.ns.clone().unwrap_or_default();
    let dry_run = match q.get("dryRun") {
        None | Some("") => false,
        Some("All") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "unsupported dryRun value {other:?} (only All)"
            )));
        }
    };
    // The apiserver defaults the field manager to the User-Agent's product.
    let manager = match q.get("fieldManager").filter(|m| !m.is_empty()) {
        Some(m) if m.len() > 128 => {
            return Err(ApiError::new(
                422,
                "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Too long: may not be more than 128 bytes",
            ));
        }
        Some(m) => m.to_string(),
        None if method == Method::PATCH && is_apply(req.headers()) => {
            return Err(ApiError::new(
                422,
                "Invalid",
                "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
            ));
        }
        None => req
            .headers()
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .filter(|p| !p.is_empty())
            .unwrap_or("unknown")
            .to_string(),
    };
    let mode = WriteMode {
        status_only: t.status,
        dry_run,
        writer: super::managed_fields::Writer {
            manager,
            status: t.status,
        },
        force: q.flag("force"),
    };
    let Some(name) = t.name.clone() else {
        // Collection.
        let filter = Filter::from_query(&r, &t, q)?;
        return match method {
            Method::GET if q.flag("watch") => {
                if let Some(rv) = q.rv()? {
                    wait_for_rv(shared, rv).await?;
                }
                Ok(watch(shared.clone(), t.res, filter, q, table)?)
            }
            Method::GET => {
                let list_ns = t.ns.as_deref().filter(|n| !n.is_empty());
                let limit = match q.get("limit") {
                    Some(l) => l
                        .parse::<usize>()
                        .map_err(|_| ApiError::bad_request(format!("invalid limit {l:?}")))?,
                    None => 0,
                };
                if q.get("continue").is_none()
                    && q.get("resourceVersionMatch") != Some("Exact")
                    && let Some(rv) = q.rv()?
                {
                    wait_for_rv(shared, rv).await?;
                }
                let mut page = PageQuery {
                    limit,
                    ..PageQuery::default()
                };
                let continued = q.get("continue").filter(|c| !c.is_empty());
                match continued {
                    // A continued list is served from the snapshot of its first page.
                    Some(token) => {
                        let (rv, after) = decode_continue(token)?;
                        page.at = Some(rv);
                        page.after = Some(after);
                    }
                    None => match (q.rv()?, q.get("resourceVersionMatch")) {
                        (Some(at), Some("Exact")) => page.at = Some(at),
                        (_, Some(m)) if m != "NotOlderThan" && m != "Exact" => {
                            return Err(ApiError::bad_request(format!(
                                "unsupported resourceVersionMatch {m:?}"
                            )));
                        }
                        _ => {}
                    },
                }
                let matches = |o: &Value| filter.matches(o);
                let keep: Option<&dyn Fn(&Value) -> bool> =
                    filter.has_selector().then_some(&matches);
                let listed = store.list_page(t.res, list_ns, &page, keep);
                let Page {
                    items,
                    rv,
                    more,
                    remaining,
                } = listed.map_err(|e| match continued {
                    Some(_) if e.code == 410 => ApiError::new(410, "Expired", "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."),
                    _ => e,
                })?;
                let mut meta = json!({"resourceVersion": rv.to_string()});
                if more && let Some(last) = items.last() {
                    meta["continue"] = json!(encode_continue(rv, &object_key(last)));
                    // As the API server's etcd store: no count when a selector filters the list
                    // (k8s.io/apiserver storage/etcd3/store.go, GetList).
                    if let Some(n) = remaining {
                        meta["remainingItemCount"] = json!(n);
                    }
                }
                if let Some(include) = table {
                    let items: Vec<Value> = items.iter().map(|v| Value::clone(v)).collect();
                    let mut t = render_table(&r, &items, rv, include);
                    t["metadata"] = meta;
                    return Ok(json_response(200, &t));
                }
                let head = json!({
                    "kind": format!("{}List", r.kind),
                    "apiVersion": r.api_version(),
                    "metadata": meta,
                });
                let body = list_body(&head, &items).map_err(|e| {
                    ApiError::new(500, "InternalError", format!("encoding the list: {e}"))
                })?;
                Ok(json_bytes_response(200, body))
            }
            Method::POST if t.ns.is_some() => {
                let (headers, body) = read_body(req).await?;
                let obj = decode_object(&headers, &body)?;
                let warnings = field_validation(&r, q, Some(&obj), "CreateOptions")?;
                Ok(with_warnings(
                    json_response(201, &store.create(t.res, &ns, obj, dry_run, &mode.writer)?),
                    &warnings,
                ))
            }
            Method::DELETE => {
                let (_, body) = read_body(req).await?;
                let dry_run = dry_run || body_dry_run(&delete_options(&body)?)?;
                let (items, _) = store.list(t.res, t.ns.as_deref().filter(|n| !n.is_empty()));
                let mut deleted = Vec::new();
                for o in items.iter().filter(|o| filter.matches(o)) {
                    let ons = o
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    let oname = o
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    match store.delete(t.res, ons, oname, &Preconditions::default(), dry_run) {
                        Ok(DeleteOutcome::Deleted(v) | DeleteOutcome::Pending(v)) => {
                            deleted.push(v)
                        }
                        // Deleted concurrently: nothing left to do for it.
                        Err(e) if e.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
                Ok(json_response(
                    200,
                    &json!({
                        "kind": format!("{}List", r.kind), "apiVersion": r.api_version(),
                        "metadata": {"resourceVersion": store.current_rv().to_string()}, "items": deleted,
                    }),
                ))
            }
            m => Err(method_not_allowed(&m)),
        };
    };
    match method {
        Method::GET => {
            let obj = store.get(t.res, &ns, &name)?;
            match table {
                Some(include) => {
                    let rv = obj
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0);
                    Ok(json_response(200, &render_table(&r, &[obj], rv, include)))
                }
                None => Ok(json_response(200, &obj)),
            }
        }
        Method::PUT => {
            let (headers, body) = read_body(req).await?;
            let obj = decode_object(&headers, &body)?;
            let warnings = field_validation(&r, q, Some(&obj), "UpdateOptions")?;
            Ok(with_warnings(
                json_response(200, &store.update(t.res, &ns, &name, obj, mode)?),
                &warnings,
            ))
        }
        Method::PATCH => {
            let (headers, body) = read_body(req).await?;
            let kind = match media_type(&headers).as_str() {
                "application/merge-patch+json" => PatchKind::Merge,
                "application/json-patch+json" => PatchKind::Json,
                // CRDs have no strategic merge metadata: the apiserver refuses the type.
                "application/strategic-merge-patch+json" if r.custom => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                "application/apply-patch+yaml" => PatchKind::Apply,
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!(
                            "the body of the request was in an unknown format ({other}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json"
                        ),
                    ));
                }
            };
            // The patch's own fields are checked (a JSON patch names paths, not fields).
            let patch_fields = match kind {
                PatchKind::Json => None,
                PatchKind::Apply => std::str::from_utf8(&body)
                    .ok()
                    .and_then(|s| serde_saphyr::from_str::<Value>(s).ok()),
                _ => serde_json::from_slice::<Value>(&body).ok(),
            };
            let warnings = field_validation(&r, q, patch_fields.as_ref(), "PatchOptions")?;
            let existed = store.get(t.res, &ns, &name).is_ok();
            let obj = store.patch(t.res, &ns, &name, kind, &body, mode)?;
            Ok(with_warnings(
                json_response(if existed { 200 } else { 201 }, &obj),
                &warnings,
            ))
        }
        Method::DELETE if !t.status => {
            let (_, body) = read_body(req).await?;
            let opts = delete_options(&body)?;
            let mut pre = Preconditions::default();
            let s = |p: &str| opts.pointer(p).and_then(Value::as_str).map(str::to_string);
            pre.uid = s("/preconditions/uid");
            pre.resource_version = s("/preconditions/resourceVersion");
            let dry_run = dry_run || body_dry_run(&opts)?;
            match store.delete(t.res, &ns, &name, &pre, dry_run)? {
                // The apiserver answers a Status for core resources that do not return the
                // deleted object (secrets, configmaps) and the object for the others.
                DeleteOutcome::Deleted(obj) if r.group.is_empty() && r.plural != "namespaces" => {
                    Ok(json_response(
                        200,
                        &json!({
                            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                            "details": {"name": name, "group": r.group, "kind": r.plural,
                                        "uid": obj.pointer("/metadata/uid").cloned().unwrap_or(Value::Null)},
                        }),
                    ))
                }
                DeleteOutcome::Deleted(obj) | DeleteOutcome::Pending(obj) => {
                    Ok(json_response(200, &obj))
                }
            }
        }
        m => Err(method_not_allowed(&m)),
    }
}

/// `fieldValidation` (default `Warn`, as on the apiserver) against the kind's OpenAPI schema:
/// `Strict` refuses unknown fields with 400, `Warn` returns them as warnings, `Ignore` skips;
/// another directive is 422 on the write's `options` kind, as upstream's
/// `ValidateFieldValidation` words it. `obj: None` (a JSON patch) checks only the directive.
fn field_validation(
    r: &ResourceType,
    q: &Query,
    obj: Option<&Value>,
    options: &str,
) -> Result<Vec<String>, ApiError> {
    let strict = match q.get("fieldValidation").unwrap_or("") {
        "Ignore" => return Ok(Vec::new()),
        "Warn" | "" => false,
        "Strict" => true,
        other => {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!(
                    "{options}.meta.k8s.io \"\" is invalid: fieldValidation: Unsupported value: {other:?}: supported values: \"\", \"Ignore\", \"Strict\", \"Warn\""
                ),
            ));
        }
    };
    let Some(obj) = obj else {
        return Ok(Vec::new());
    };
    let unknown: Vec<String> =
        super::openapi::unknown_fields(obj, &super::openapi::cached_schema(r))
            .into_iter()
            .map(|f| format!("unknown field {f:?}"))
            .collect();
    if strict && !unknown.is_empty() {
        return Err(ApiError::bad_request(format!(
            "strict decoding error: {}",
            unknown.join(", ")
        )));
    }
    Ok(unknown)
}

/// Adds `Warning: 299 - "..."` headers, as the apiserver does for `fieldValidation=Warn`.
fn with_warnings(mut resp: Response, warnings: &[String]) -> Response {
    for w in warnings {
        let text = format!("299 - \"{}\"", w.replace('\\', "\\\\").replace('"', "\\\""));
        if let Ok(v) = HeaderValue::from_str(&text) {
            resp.headers_mut().append("warning", v);
        }
    }
    resp
}

/// The `DeleteOptions` body (empty: none).
fn delete_options(body: &[u8]) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let opts: Value = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!("the DeleteOptions body is not valid JSON: {e}"))
    })?;
    if !opts.is_object() {
        return Err(ApiError::bad_request(
            "the DeleteOptions body is not an object",
        ));
    }
    Ok(opts)
}

/// `DeleteOptions.dryRun` (`["All"]`), which kubectl, client-go, the Python client and
/// kube-rs send in the body rather than the query.
fn body_dry_run(opts: &Value) -> Result<bool, ApiError> {
    match opts.get("dryRun") {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Array(a)) if a.is_empty() => Ok(false),
        Some(Value::Array(a)) if a.iter().all(|v| v == "All") => Ok(true),
        Some(other) => Err(ApiError::new(
            422,
            "Invalid",
            format!("dryRun: Unsupported value: {other}: supported values: \"All\""),
        )),
    }
}

/// `(namespace, name)`, the order lists are returned in.
fn object_key(o: &Value) -> (String, String) {
    let s = |p: &str| {
        o.pointer(p)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (s("/metadata/namespace"), s("/metadata/name"))
}

/// Continue tokens carry the list's resourceVersion and the last key returned.
fn encode_continue(rv: u64, after: &(String, String)) -> String {
    let raw = json!({"rv": rv, "ns": after.0, "name": after.1}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(token: &str) -> Result<(u64, (String, String)), ApiError> {
    let bad = || ApiError::bad_request(format!("invalid continue token {token:?}"));
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    let ns = v["ns"].as_str().ok_or_else(bad)?.to_string();
    let name = v["name"].as_str().ok_or_else(bad)?.to_string();
    Ok((rv, (ns, name)))
}

/// One watch line.
/// Upgrades `pods/<name>/exec` to a WebSocket (RFC 6455 over hyper's upgrade) speaking
/// the best `channel.k8s.io` protocol the client offers, and runs the session on it.
fn upgrade_exec(mut req: Request, exec: super::exec::ExecRequest) -> Result<Response, ApiError> {
    use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
    use tokio_tungstenite::tungstenite::protocol::Role;
    let headers = req.headers();
    if !headers.contains_key(header::UPGRADE) {
        return Err(ApiError::bad_request("Upgrade request required"));
    }
    let has = |name: header::HeaderName, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    if !has(header::UPGRADE, "websocket") || !has(header::CONNECTION, "upgrade") {
        return Err(ApiError::bad_request(
            "unable to upgrade connection: not a WebSocket upgrade",
        ));
    }
    if headers
        .get(header::SEC_WEBSOCKET_VERSION)
        .is_none_or(|v| v.as_bytes() != b"13")
    {
        return Err(ApiError::bad_request(
            "unable to upgrade connection: Sec-WebSocket-Version must be 13",
        ));
    }
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
        return Err(ApiError::bad_request(
            "unable to upgrade connection: missing Sec-WebSocket-Key",
        ));
    };
    let accept = derive_accept_key(key.as_bytes());
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .collect();
    let Some(protocol) = super::exec::EXEC_PROTOCOLS
        .iter()
        .find(|p| offered.iter().any(|o| o == *p))
    else {
        return Err(ApiError::bad_request(format!(
            "unable to upgrade: no supported subprotocol in {:?} (served: {})",
            offered.join(", "),
            super::exec::EXEC_PROTOCOLS.join(", ")
        )));
    };
    let Some(on_upgrade) = req.extensions_mut().remove::<hyper::upgrade::OnUpgrade>() else {
        return Err(ApiError::bad_request(
            "unable to upgrade connection: the connection cannot be upgraded",
        ));
    };
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let io = hyper_util::rt::TokioIo::new(upgraded);
                let ws =
                    tokio_tungstenite::WebSocketStream::from_raw_socket(io, Role::Server, None)
                        .await;
                super::exec::run_exec(ws, exec).await;
            }
            Err(e) => tracing::debug!(error = %e, "pods/exec upgrade failed"),
        }
    });
    let mut resp = Response::new(Body::empty());
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let h = resp.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    h.insert(
        header::SEC_WEBSOCKET_PROTOCOL,
        HeaderValue::from_static(protocol),
    );
    if let Ok(v) = HeaderValue::from_str(&accept) {
        h.insert(header::SEC_WEBSOCKET_ACCEPT, v);
    }
    Ok(resp)
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    encoded_event_line(kind, &object.to_string())
}

/// A list response: the fields of `head`, then `items` encoded straight from the stored
/// objects (not copied into one list value first).
fn list_body(head: &Value, items: &[std::sync::Arc<Value>]) -> serde_json::Result<Vec<u8>> {
    let mut out = serde_json::to_vec(head)?;
    out.pop(); // the closing brace
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, &**item)?;
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// [`event_line`] of an object already encoded (`kind` is one of the fixed event types).
fn encoded_event_line(kind: &str, object_json: &str) -> Bytes {
    let mut s = String::with_capacity(object_json.len() + kind.len() + 24);
    s.push_str("{\"type\":\"");
    s.push_str(kind);
    s.push_str("\",\"object\":");
    s.push_str(object_json);
    s.push_str("}\n");
    Bytes::from(s)
}

/// A watch from a resourceVersion the server has not reached yet waits briefly, then fails
/// with 504 `Too large resource version`, as the apiserver's watch cache does (this happens
/// when a client keeps its RV across a server restart).
async fn wait_for_rv(shared: &Shared, rv: u64) -> Result<(), ApiError> {
    let mut rx = shared.store.subscribe();
    let reached = tokio::time::timeout(Duration::from_secs(1), rx.wait_for(|cur| *cur >= rv)).await;
    if matches!(reached, Ok(Ok(_))) || shared.store.current_rv() >= rv {
        return Ok(());
    }
    let mut e = ApiError::new(
        504,
        "Timeout",
        format!(
            "Too large resource version: {rv}, current: {}",
            shared.store.current_rv()
        ),
    );
    e.details = Some(
        json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}], "retryAfterSeconds": 1}),
    );
    Err(e)
}

fn watch(
    shared: Arc<Shared>,
    res: usize,
    filter: Filter,
    q: &Query,
    table: Option<IncludeObject>,
) -> Result<Response, ApiError> {
    let timeout = match q.get("timeoutSeconds") {
        Some(s) => Some(Duration::from_secs(s.parse().map_err(|_| {
            ApiError::bad_request(format!("invalid timeoutSeconds {s:?}"))
        })?)),
        None => None,
    };
    let params = WatchParams {
        start_rv: q.rv()?,
        bookmarks: q.flag("allowWatchBookmarks"),
        initial_events: q.flag("sendInitialEvents"),
        timeout,
        table,
    };
    if params.initial_events
        && (q.get("resourceVersionMatch") != Some("NotOlderThan") || !params.bookmarks)
    {
        return Err(ApiError::new(
            422,
            "Invalid",
            "sendInitialEvents=true requires resourceVersionMatch=NotOlderThan and allowWatchBookmarks=true",
        ));
    }
    let (tx, mut rx) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        run_watch(shared, res, filter, params, tx).await;
    });
    let stream =
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, Infallible>)));
    let mut resp = Response::new(Body::from_stream(stream));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// Watch query parameters.
struct WatchParams {
    start_rv: Option<u64>,
    bookmarks: bool,
    /// `sendInitialEvents=true` (streaming list): synthetic ADDED events, then a BOOKMARK
    /// annotated `k8s.io/initial-events-end`.
    initial_events: bool,
    timeout: Option<Duration>,
    table: Option<IncludeObject>,
}

async fn run_watch(
    shared: Arc<Shared>,
    res: usize,
    filter: Filter,
    params: WatchParams,
    tx: mpsc::Sender<Bytes>,
) {
    let WatchParams {
        start_rv,
        bookmarks,
        initial_events,
        timeout,
        table,
    } = params;
    let store = &shared.store;
    let r = store.resources[res].clone();
    let mut rv_rx = store.subscribe();
    let mut drop_rx = shared.faults.drop_watches.subscribe();
    if *shared.shutdown.borrow() {
        return;
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let render = |o: &Value, rv: u64| match table {
        Some(include) => render_table(&r, std::slice::from_ref(o), rv, include),
        None => o.clone(),
    };
    let mut last = match start_rv {
        Some(rv) if rv > 0 && !initial_events => rv,
        _ => {
            rv_rx.borrow_and_update();
            let (items, rv) = store.list(res, filter.ns.as_deref());
            for o in items.iter().filter(|o| filter.matches(o)) {
                if tx.send(event_line("ADDED", &render(o, rv))).await.is_err() {
                    return;
                }
            }
            if initial_events {
                let end = json!({"kind": r.kind, "apiVersion": r.api_version(), "metadata": {
                    "resourceVersion": rv.to_string(),
                    "annotations": {"k8s.io/initial-events-end": "true"},
                }});
                if tx.send(event_line("BOOKMARK", &end)).await.is_err() {
                    return;
                }
            }
            rv
        }
    };
    let mut last_sent = Instant::now();
    loop {
        rv_rx.borrow_and_update();
        let (events, current) = match store.events_since(res, last) {
            Ok(x) => x,
            Err(e) => {
                let _ = tx.send(event_line("ERROR", &e.to_status())).await;
                return;
            }
        };
        for e in &events {
            // After drop_watches() returns, no open watch sends anything more: tests rely on
            // writes made after the drop reaching clients only through a new watch.
            if drop_rx.has_changed().unwrap_or(true) {
                return;
            }
            if let Some(kind) = filtered_type(&filter, e) {
                let line = match table {
                    Some(_) => event_line(kind, &render(&e.object, e.rv)),
                    None => encoded_event_line(kind, e.object_json()),
                };
                if tx.send(line).await.is_err() {
                    return;
                }
                last_sent = Instant::now();
            }
        }
        last = last.max(current);
        let bookmark_at = last_sent + shared.bookmark_interval;
        let far = Instant::now() + Duration::from_secs(86400);
        tokio::select! {
            changed = rv_rx.changed() => if changed.is_err() { return },
            _ = drop_rx.changed() => return,
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => return,
            _ = tokio::time::sleep_until(bookmark_at), if bookmarks => {
                let obj = json!({"kind": r.kind, "apiVersion": r.api_version(),
                                 "metadata": {"resourceVersion": last.to_string()}});
                if tx.send(event_line("BOOKMARK", &obj)).await.is_err() {
                    return;
                }
                last_sent = Instant::now();
            }
            _ = tx.closed() => return,
        }
    }
}

/// The event type a watcher with this filter sees (objects moving in or out of the selection
/// become ADDED / DELETED), or `None` if it sees nothing.
fn filtered_type(filter: &Filter, e: &Event) -> Option<&'static str> {
    let now = filter.matches(&e.object);
    let before = e.prev.as_deref().is_some_and(|p| filter.matches(p));
    match (e.kind, before, now) {
        (EventType::Added, _, true) => Some("ADDED"),
        (EventType::Modified, true, true) => Some("MODIFIED"),
        (EventType::Modified, false, true) => Some("ADDED"),
        (EventType::Modified, true, false) => Some("DELETED"),
        (EventType::Deleted, b, n) if b || n => Some("DELETED"),
        _ => None,
    }
}
