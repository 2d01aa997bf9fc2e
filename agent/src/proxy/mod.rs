//! The agent's side of the resource proxy (capability `resource-proxy.v1`): the principal
//! forwards Kubernetes API requests (`resource-request`), container logs (`log-request`)
//! and exec sessions (`terminal-request`) for this agent's cluster over the event stream;
//! the agent decides with its own [`rules`] what it serves, performs the request with its
//! own Kubernetes client, and answers with a `resource-response` event (requests, refusals)
//! or on a `Tunnel` stream it opens to the principal (logs, exec).

pub mod exec;
pub mod logs;
pub mod patch;
/// API paths, request plans and answer shapes.
pub mod paths;
pub mod pss;
/// Why the rules refuse a request.
pub mod refusal;
pub mod rules;
/// Serving the principal's log and terminal requests.
pub mod streams;
/// What a write must pass before it is sent: creates and patches.
mod writes;

use argocd_agent_identity::text;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::tunnel_client::TunnelClient;
use argocd_agent_proto::eventstream::{ResourceRequest, ResourceResponse};
use bytes::Bytes;
use http_body_util::BodyExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::core::GroupVersion;
use kube::discovery::Scope;
use serde_json::Value;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_util::task::TaskTracker;

use crate::dialer::Dialer;
use crate::error::SessionError;
use crate::managed::lock;
use crate::metrics::Metrics;

pub use rules::Apps;

/// Largest response body the agent passes on by default (`resource_proxy_max_body`).
pub const DEFAULT_MAX_BODY: usize = 8 * 1024 * 1024;
/// Requests served at once by default (`resource_proxy_max_concurrent`).
pub const DEFAULT_MAX_CONCURRENT: usize = 32;
/// How long one request may take by default (`resource_proxy_timeout`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Owner objects fetched while deciding one request (a list's items share them).
const MAX_OWNER_FETCHES: usize = 64;
/// Resources remembered from discovery (each under its kind and its plural).
const MAX_DISCOVERED_KINDS: usize = 1024;

/// Limits of the resource proxy.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    /// Largest response body passed on; larger ones become a 502.
    pub max_body: usize,
    /// Requests served at once (and, separately, log and exec streams open at once);
    /// more are answered 429 at once.
    pub max_concurrent: usize,
    /// How long one request may take (504 after).
    pub timeout: Duration,
    /// Where the spoke's Argo CD runs: its argocd-cm says how objects are tracked.
    pub argocd_namespace: String,
    /// The Pod Security Standards level every created or patched pod spec is held to
    /// (`--resource-proxy-pod-security`, see [`pss`]).
    pub pod_security: pss::Level,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            max_body: DEFAULT_MAX_BODY,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            timeout: DEFAULT_TIMEOUT,
            argocd_namespace: "argocd".into(),
            pod_security: pss::Level::default(),
        }
    }
}

/// How long argocd-cm's tracking settings are used before they are read again.
const TRACKING_REFRESH: Duration = Duration::from_secs(30);

/// One answer: HTTP status, content type, body.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The HTTP status code.
    pub status: u16,
    /// The `Content-Type` of `body`.
    pub content_type: String,
    /// The body (a cluster's answer is read up to [`ProxyConfig::max_body`] bytes).
    pub body: Bytes,
}

impl Answer {
    /// A Kubernetes `Status` failure.
    pub fn status(code: u16, message: &str) -> Answer {
        Answer {
            status: code,
            content_type: "application/json".into(),
            body: rules::status_body(code, rules::reason_for(code), message).into(),
        }
    }

    fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    fn into_response(self) -> ResourceResponse {
        ResourceResponse {
            status: u32::from(self.status),
            content_type: self.content_type,
            body: self.body.to_vec(),
        }
    }
}

/// Why a request failed on the agent's side.
#[derive(Debug)]
enum Failure {
    /// The agent's rules refuse it (403).
    Forbidden(String),
    /// A pod security rule refuses a create or patch (403): the rule (`pod-security`,
    /// `owner-baseline`, `tracking`, `patch`), logged apart, and the message.
    Refused(&'static str, String),
    /// Bad input (400).
    BadRequest(String),
    /// The cluster could not be reached or answered nonsense (502).
    Upstream(String),
}

/// A rule's refusal as a 403 whose Status message is the rule's text.
fn forbidden(e: impl std::fmt::Display) -> Failure {
    Failure::Forbidden(e.to_string())
}

/// The log form: `forbidden: "<why>"` (the message may name what the hub asked for).
impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Forbidden(m) => write!(f, "forbidden: {}", text::quoted(m)),
            Failure::Refused(rule, m) => write!(f, "refused by {rule}: {}", text::quoted(m)),
            Failure::BadRequest(m) => write!(f, "bad request: {}", text::quoted(m)),
            Failure::Upstream(m) => write!(f, "upstream: {}", text::quoted(m)),
        }
    }
}

impl Failure {
    fn answer(&self) -> Answer {
        match self {
            Failure::Forbidden(m) | Failure::Refused(_, m) => Answer::status(403, m),
            Failure::BadRequest(m) => Answer::status(400, m),
            Failure::Upstream(m) => Answer::status(502, m),
        }
    }

    fn outcome(&self) -> &'static str {
        match self {
            Failure::Forbidden(_) | Failure::Refused(..) => "forbidden",
            _ => "error",
        }
    }
}

/// The resource proxy of one agent: its cluster client, limits and discovery cache.
pub struct SpokeProxy {
    client: kube::Client,
    config: ProxyConfig,
    metrics: Metrics,
    requests: Arc<Semaphore>,
    streams: Arc<Semaphore>,
    /// `<apiVersion>/<Kind>` and `<apiVersion> <plural>` -> resource and whether it is
    /// namespaced.
    kinds: Mutex<HashMap<String, (ApiResource, bool)>>,
    /// argocd-cm's tracking settings and when they were read.
    tracking: tokio::sync::Mutex<Option<(std::time::Instant, rules::Tracking)>>,
}

impl SpokeProxy {
    /// A proxy serving through `client` within `config`'s limits, counting into `metrics`.
    pub fn new(client: kube::Client, config: ProxyConfig, metrics: Metrics) -> SpokeProxy {
        let n = config.max_concurrent.max(1);
        SpokeProxy {
            client,
            config,
            metrics,
            requests: Arc::new(Semaphore::new(n)),
            streams: Arc::new(Semaphore::new(n)),
            kinds: Mutex::new(HashMap::new()),
            tracking: tokio::sync::Mutex::new(None),
        }
    }

    /// The agent's client of its own cluster.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// The limits it serves within.
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    fn count(&self, verb: &str, outcome: &str) {
        self.metrics.resource_proxy(verb, outcome);
    }

    /// A slot for one request, if fewer than the limit are being served.
    pub fn try_request_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.requests.clone().try_acquire_owned().ok()
    }

    /// A slot for one log or exec stream.
    pub fn try_stream_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.streams.clone().try_acquire_owned().ok()
    }

    /// The spoke's Argo CD tracking settings (argocd-cm in its namespace), read at most every
    /// [`TRACKING_REFRESH`]; Argo CD's defaults when it cannot be read.
    pub async fn tracking(&self) -> rules::Tracking {
        let mut cached = self.tracking.lock().await;
        if let Some((at, t)) = cached.as_ref()
            && at.elapsed() < TRACKING_REFRESH
        {
            return t.clone();
        }
        let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
            Api::namespaced(self.client.clone(), &self.config.argocd_namespace);
        let read = tokio::time::timeout(
            self.config.timeout.min(Duration::from_secs(5)),
            api.get_opt("argocd-cm"),
        );
        let tracking = match read.await.unwrap_or_else(|_| {
            Err(kube::Error::Service(
                "no answer for argocd-cm in time".into(),
            ))
        }) {
            Ok(cm) => {
                let data = cm
                    .and_then(|cm| cm.data)
                    .map(|d| serde_json::to_value(d).unwrap_or_default())
                    .unwrap_or_default();
                rules::Tracking::from_argocd_cm(&data)
            }
            Err(e) => {
                tracing::warn!(error = %e, "argocd-cm could not be read: Argo CD's default tracking assumed");
                rules::Tracking::default()
            }
        };
        *cached = Some((std::time::Instant::now(), tracking.clone()));
        tracking
    }

    /// `apps` with the spoke's tracking settings.
    async fn tracked(&self, apps: &Apps) -> Apps {
        apps.clone().with_tracking(self.tracking().await)
    }

    /// Serves one `resource-request` against this cluster, within the timeout.
    pub async fn handle_resource(&self, apps: &Apps, req: &ResourceRequest) -> ResourceResponse {
        let serve = async {
            let apps = self.tracked(apps).await;
            self.serve_resource(&apps, req).await
        };
        match tokio::time::timeout(self.config.timeout, serve).await {
            Ok(answer) => answer.into_response(),
            Err(_) => {
                self.count(rules::method_verb(&req.method), "error");
                tracing::warn!(method = %text::quoted(&req.method), path = %text::quoted(&req.path), "resource proxy request timed out");
                Answer::status(504, "the request timed out on the agent").into_response()
            }
        }
    }

    async fn serve_resource(&self, apps: &Apps, req: &ResourceRequest) -> Answer {
        let plan = match rules::plan(&req.method, &req.path, &req.query) {
            Ok(p) => p,
            Err(reason) => {
                let verb = rules::method_verb(&req.method);
                return self.refuse(verb, req, forbidden(reason));
            }
        };
        let verb = plan.verb();
        match self.perform(apps, req, plan).await {
            Ok(answer) => {
                self.count(verb, "allowed");
                answer
            }
            Err(f) => self.refuse(verb, req, f),
        }
    }

    fn refuse(&self, verb: &str, req: &ResourceRequest, failure: Failure) -> Answer {
        self.count(verb, failure.outcome());
        match &failure {
            Failure::Forbidden(reason) => {
                tracing::warn!(method = %text::quoted(&req.method), path = %text::quoted(&req.path), reason = %text::quoted(reason), "resource proxy request refused")
            }
            Failure::Refused(rule, reason) => {
                tracing::warn!(method = %text::quoted(&req.method), path = %text::quoted(&req.path), rule, level = %self.config.pod_security, reason = %text::quoted(reason), "resource proxy request refused")
            }
            Failure::BadRequest(m) | Failure::Upstream(m) => {
                tracing::warn!(method = %text::quoted(&req.method), path = %text::quoted(&req.path), error = %text::quoted(m), "resource proxy request failed")
            }
        }
        failure.answer()
    }

    async fn perform(
        &self,
        apps: &Apps,
        req: &ResourceRequest,
        plan: rules::Plan,
    ) -> Result<Answer, Failure> {
        let original = || {
            self.send(
                &req.method,
                &req.path,
                &req.query,
                Some(&req.content_type),
                &req.accept,
                req.body.clone(),
            )
        };
        match plan {
            rules::Plan::PassThrough => original().await,
            rules::Plan::Get(r) => {
                if r.subresource.is_none() && rules::accepts_plain_json(&req.accept) {
                    // The answer itself can be checked.
                    let answer = original().await?;
                    if !answer.ok() {
                        return Ok(answer);
                    }
                    let obj: Value = serde_json::from_slice(&answer.body)
                        .map_err(|e| Failure::Upstream(format!("unreadable object: {e}")))?;
                    let meta = obj.get("metadata").cloned().unwrap_or(Value::Null);
                    return if self.is_managed(apps, &meta, r.namespace.as_deref()).await {
                        Ok(answer)
                    } else {
                        Err(not_managed(&r))
                    };
                }
                if let Some(refused) = self.check_named(apps, &r).await? {
                    return Ok(refused);
                }
                original().await
            }
            rules::Plan::Patch(r) => match self.check_patch(apps, req, &r).await? {
                Err(answer) => Ok(answer),
                Ok(body) => {
                    let ct = Some(req.content_type.as_str());
                    self.send(&req.method, &req.path, &req.query, ct, &req.accept, body)
                        .await
                }
            },
            rules::Plan::Delete(r) => {
                if let Some(refused) = self.check_named(apps, &r).await? {
                    return Ok(refused);
                }
                original().await
            }
            rules::Plan::List(r) => {
                let accept = rules::json_accept(&req.accept);
                let answer = self
                    .send("GET", &req.path, &req.query, None, &accept, Vec::new())
                    .await?;
                if !answer.ok() {
                    return Ok(answer);
                }
                self.filter_list(apps, &r, answer).await
            }
            rules::Plan::Create(r) => {
                self.check_create(apps, req, &r).await?;
                original().await
            }
        }
    }

    /// Keeps the managed items of a List or rows of a Table; everything else of the list
    /// (resourceVersion, continue, columns) stays.
    async fn filter_list(
        &self,
        apps: &Apps,
        r: &rules::ResourcePath,
        answer: Answer,
    ) -> Result<Answer, Failure> {
        let mut body: Value = serde_json::from_slice(&answer.body)
            .map_err(|e| Failure::Upstream(format!("unreadable list: {e}")))?;
        let Some(entries) = rules::entries_mut(&mut body) else {
            return Err(Failure::Upstream("the answer is not a list".into()));
        };
        let mut walk = OwnerWalk::new(self, apps);
        let mut keep = Vec::with_capacity(entries.len());
        for entry in entries.iter() {
            let managed = match rules::entry_metadata(entry) {
                Some(meta) => {
                    let ns = meta
                        .get("namespace")
                        .and_then(Value::as_str)
                        .or(r.namespace.as_deref());
                    walk.managed(meta, ns).await
                }
                None => false,
            };
            keep.push(managed);
        }
        let mut keep = keep.into_iter();
        entries.retain(|_| keep.next().unwrap_or(false));
        let body =
            serde_json::to_vec(&body).map_err(|e| Failure::Upstream(format!("list: {e}")))?;
        Ok(Answer {
            body: body.into(),
            ..answer
        })
    }

    /// Rules (a), (b) and (c) for one object.
    pub async fn is_managed(&self, apps: &Apps, metadata: &Value, namespace: Option<&str>) -> bool {
        OwnerWalk::new(self, apps)
            .managed(metadata, namespace)
            .await
    }

    /// Performs one request against the cluster, forwarding only Content-Type and Accept;
    /// the body is read up to the limit.
    async fn send(
        &self,
        method: &str,
        path: &str,
        query: &str,
        content_type: Option<&str>,
        accept: &str,
        body: Vec<u8>,
    ) -> Result<Answer, Failure> {
        let request = build_request(method, path, query, content_type, accept, body)?;
        let response = self
            .client
            .send(request)
            .await
            .map_err(|e| Failure::Upstream(format!("kubernetes API: {e}")))?;
        read_answer(response, self.config.max_body).await
    }

    /// The resource of `apiVersion`+`kind`, from discovery (every kind of a group
    /// version is remembered at once).
    async fn resolve(&self, api_version: &str, kind: &str) -> Option<(ApiResource, bool)> {
        self.discover(api_version, &format!("{api_version}/{kind}"))
            .await
    }

    /// The resource of `apiVersion` with plural name `plural`, from discovery.
    async fn resolve_plural(&self, api_version: &str, plural: &str) -> Option<(ApiResource, bool)> {
        self.discover(api_version, &format!("{api_version} {plural}"))
            .await
    }

    /// Looks `key` up among the resources discovered, discovering `api_version` first if
    /// it is not known yet. Each resource is remembered as `<apiVersion>/<Kind>` and as
    /// `<apiVersion> <plural>`.
    async fn discover(&self, api_version: &str, key: &str) -> Option<(ApiResource, bool)> {
        if let Some(found) = lock(&self.kinds).get(key) {
            return Some(found.clone());
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gv = GroupVersion::gv(group, version);
        match kube::discovery::pinned_group(&self.client, &gv).await {
            Ok(g) => {
                let mut kinds = lock(&self.kinds);
                for (ar, caps) in g.versioned_resources(version) {
                    if kinds.len() + 2 > MAX_DISCOVERED_KINDS {
                        break;
                    }
                    let namespaced = caps.scope == Scope::Namespaced;
                    let by_plural = format!("{api_version} {}", ar.plural);
                    kinds.insert(by_plural, (ar.clone(), namespaced));
                    let by_kind = format!("{api_version}/{}", ar.kind);
                    kinds.insert(by_kind, (ar, namespaced));
                }
                kinds.get(key).cloned()
            }
            Err(e) => {
                tracing::debug!(api_version = %text::quoted(api_version), key = %text::quoted(key), error = %e, "resource not resolved");
                None
            }
        }
    }

    /// The metadata of an owner object, if it exists and still has the referenced uid.
    async fn fetch_owner(&self, owner: &rules::OwnerRef, namespace: Option<&str>) -> Option<Value> {
        let (obj, _) = self.fetch_owner_object(owner, namespace).await?;
        obj.get("metadata").cloned()
    }

    /// The whole owner object and whether it is namespaced, if it exists and still has the
    /// referenced uid (an owner reference with a uid matches only an object with that uid).
    async fn fetch_owner_object(
        &self,
        owner: &rules::OwnerRef,
        namespace: Option<&str>,
    ) -> Option<(Value, bool)> {
        let (ar, namespaced) = self.resolve(&owner.api_version, &owner.kind).await?;
        let api: Api<DynamicObject> = match (namespaced, namespace) {
            (true, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, &ar),
            (true, None) => return None,
            (false, _) => Api::all_with(self.client.clone(), &ar),
        };
        let obj = api.get_opt(&owner.name).await.ok()??;
        if let Some(want) = &owner.uid
            && obj.metadata.uid.as_ref() != Some(want)
        {
            return None;
        }
        Some((serde_json::to_value(&obj).ok()?, namespaced))
    }
}

fn not_managed(r: &rules::ResourcePath) -> Failure {
    Failure::Forbidden(format!(
        "{} {} is not managed by an Argo CD Application on this cluster",
        r.plural,
        text::quoted(r.name.as_deref().unwrap_or_default())
    ))
}

/// Follows owner references (at most [`rules::MAX_OWNER_HOPS`]) to decide rule (c);
/// owners fetched once serve every item of a list.
struct OwnerWalk<'a> {
    proxy: &'a SpokeProxy,
    apps: &'a Apps,
    /// Owners fetched: `(namespace, apiVersion, kind, name)` -> metadata.
    fetched: HashMap<(Option<String>, String, String, String), Option<Value>>,
}

impl<'a> OwnerWalk<'a> {
    fn new(proxy: &'a SpokeProxy, apps: &'a Apps) -> Self {
        OwnerWalk {
            proxy,
            apps,
            fetched: HashMap::new(),
        }
    }

    async fn managed(&mut self, metadata: &Value, namespace: Option<&str>) -> bool {
        !self.walk(metadata, namespace, true).await.is_empty()
    }

    /// Every Application that marks the object or an owner reached from it.
    async fn managing_apps(
        &mut self,
        metadata: &Value,
        namespace: Option<&str>,
    ) -> std::collections::BTreeSet<usize> {
        self.walk(metadata, namespace, false).await
    }

    /// The Applications found marking the object and its owners, hop by hop; with
    /// `first`, the walk ends at the first hop that finds any.
    async fn walk(
        &mut self,
        metadata: &Value,
        namespace: Option<&str>,
        first: bool,
    ) -> std::collections::BTreeSet<usize> {
        let mut found = std::collections::BTreeSet::new();
        if self.apps.is_empty() {
            return found;
        }
        let mut frontier = vec![metadata.clone()];
        for hop in 0..=rules::MAX_OWNER_HOPS {
            for m in &frontier {
                found.extend(rules::marking_apps(m, self.apps));
            }
            if (first && !found.is_empty()) || hop == rules::MAX_OWNER_HOPS {
                break;
            }
            let mut next = Vec::new();
            for meta in &frontier {
                for owner in rules::owner_refs(meta) {
                    let key = (
                        namespace.map(str::to_owned),
                        owner.api_version.clone(),
                        owner.kind.clone(),
                        owner.name.clone(),
                    );
                    let found = match self.fetched.get(&key) {
                        Some(found) => found.clone(),
                        None if self.fetched.len() >= MAX_OWNER_FETCHES => None,
                        None => {
                            let found = self.proxy.fetch_owner(&owner, namespace).await;
                            self.fetched.insert(key, found.clone());
                            found
                        }
                    };
                    next.extend(found);
                }
            }
            if next.is_empty() {
                break;
            }
            frontier = next;
        }
        found
    }
}

/// Builds the request to the cluster: method, path and query, Content-Type and Accept,
/// nothing else (no impersonation or authorization headers are ever forwarded).
fn build_request(
    method: &str,
    path: &str,
    query: &str,
    content_type: Option<&str>,
    accept: &str,
    body: Vec<u8>,
) -> Result<http::Request<kube::client::Body>, Failure> {
    let uri = if query.is_empty() {
        path.to_string()
    } else {
        format!("{path}?{query}")
    };
    let uri: http::Uri = uri
        .parse()
        .map_err(|_| Failure::BadRequest("invalid path or query".into()))?;
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| Failure::BadRequest("invalid method".into()))?;
    let mut b = http::Request::builder().method(method).uri(uri);
    if let Some(ct) = content_type.filter(|c| !c.is_empty()) {
        let v = http::HeaderValue::from_str(ct)
            .map_err(|_| Failure::BadRequest("invalid Content-Type".into()))?;
        b = b.header(http::header::CONTENT_TYPE, v);
    }
    if !accept.is_empty() {
        let v = http::HeaderValue::from_str(accept)
            .map_err(|_| Failure::BadRequest("invalid Accept".into()))?;
        b = b.header(http::header::ACCEPT, v);
    }
    b.body(kube::client::Body::from(body))
        .map_err(|e| Failure::BadRequest(format!("invalid request: {e}")))
}

/// Reads a response up to `max` bytes of body; a larger body is a 502.
async fn read_answer(
    response: http::Response<kube::client::Body>,
    max: usize,
) -> Result<Answer, Failure> {
    let (parts, body) = response.into_parts();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = read_limited(body, max).await?;
    Ok(Answer {
        status: parts.status.as_u16(),
        content_type,
        body,
    })
}

/// Collects a body of at most `max` bytes.
async fn read_limited(body: kube::client::Body, max: usize) -> Result<Bytes, Failure> {
    match http_body_util::Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(Failure::Upstream("response too large".into()))
        }
        Err(e) => Err(Failure::Upstream(format!("reading the response: {e}"))),
    }
}

/// A `resource-response` event answering the request `id`.
pub fn response_event(source: &str, id: &str, response: ResourceResponse) -> Event {
    let mut e = Event::new(
        source,
        EventType::ResourceResponse,
        Payload::ResourceResponse(response),
    );
    e.ack_id = Some(id.to_string());
    e
}

/// A client for `Tunnel` streams on the connection's channel, with the credentials the
/// event stream is opened with.
#[derive(Clone)]
pub struct Tunnel {
    client: TunnelClient<tonic::transport::Channel>,
    authorization: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl Tunnel {
    /// Captures the dialer's current credentials (a fresh JWT-SVID when that transport is
    /// used) for the streams opened for one request.
    pub fn new(
        channel: tonic::transport::Channel,
        dialer: &Dialer,
        max_message_size: usize,
    ) -> Result<Tunnel, SessionError> {
        let mut probe = tonic::Request::new(());
        dialer.authorize(&mut probe)?;
        Ok(Tunnel {
            client: TunnelClient::new(channel)
                .max_decoding_message_size(max_message_size)
                .max_encoding_message_size(max_message_size),
            authorization: probe.metadata().get("authorization").cloned(),
        })
    }

    /// Sends the tunnel's messages compressed in `compression` (when set); compressed
    /// messages of the principal are accepted either way.
    pub fn compressed(mut self, compression: Option<crate::dialer::Compression>) -> Tunnel {
        self.client = crate::compressed_client!(self.client, compression);
        self
    }

    /// Wraps `message` in a request carrying the credentials.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(message);
        if let Some(a) = &self.authorization {
            r.metadata_mut().insert("authorization", a.clone());
        }
        r
    }

    /// A client for opening `Tunnel` streams (add the credentials with [`Tunnel::request`]).
    pub fn client(&self) -> TunnelClient<tonic::transport::Channel> {
        self.client.clone()
    }
}

/// Admits a log (`what` = "log") or exec ("exec") stream of `pod`: the pod must be managed
/// and the tunnel's credentials ready. `Err` is the refusal to answer with instead.
pub(crate) async fn admit_stream(
    proxy: &SpokeProxy,
    apps: &Apps,
    tunnel: Result<Tunnel, SessionError>,
    what: &'static str,
    namespace: &str,
    pod: &str,
) -> Result<Tunnel, Answer> {
    let apps = &proxy.tracked(apps).await;
    check_pod(proxy, apps, namespace, pod, what).await?;
    let tunnel = tunnel.map_err(|e| {
        proxy.count(what, "error");
        tracing::warn!(error = %e, "no credentials for a {what} stream");
        Answer::status(503, &format!("the agent cannot open a {what} stream"))
    })?;
    proxy.count(what, "allowed");
    Ok(tunnel)
}

/// Checks that a pod is managed before a log or exec stream: `Err` is the answer to send
/// instead (403, or the GET's failure such as 404).
async fn check_pod(
    proxy: &SpokeProxy,
    apps: &Apps,
    namespace: &str,
    pod: &str,
    verb: &str,
) -> Result<(), Answer> {
    let path = format!("/api/v1/namespaces/{namespace}/pods/{pod}");
    let refuse = |f: Failure| {
        proxy.count(verb, f.outcome());
        tracing::warn!(verb, namespace = %text::quoted(namespace), pod = %text::quoted(pod), failure = %f, "resource proxy stream refused");
        f.answer()
    };
    let r = match rules::parse_path(&path) {
        Ok(rules::ApiPath::Resource(r))
            if r.namespace.is_some()
                && r.name.is_some()
                && r.subresource.is_none()
                && r.plural == "pods" =>
        {
            r
        }
        _ => {
            return Err(refuse(Failure::Forbidden(
                "invalid namespace or pod name".into(),
            )));
        }
    };
    match proxy.check_named(apps, &r).await {
        Ok(None) => Ok(()),
        Ok(Some(answer)) => {
            proxy.count(verb, "error");
            Err(answer)
        }
        Err(f) => Err(refuse(f)),
    }
}

/// What serving a resource-proxy event asks of the spoke (the spoke implements it).
pub trait Host {
    /// CloudEvents `source` of the answers.
    fn source(&self) -> &str;
    /// Where the request handlers run.
    fn tasks(&self) -> &TaskTracker;
    /// The resource proxy, when the agent serves it.
    fn proxy(&self) -> Option<Arc<SpokeProxy>>;
    /// The Applications this spoke holds, by the names their objects carry, with where each
    /// deploys and what it manages.
    fn apps(&self) -> Apps;
}

/// The proxy's entry for one event from `spoke`: the proxy, the answers' source, the tasks
/// and the event's id; `None` (the event refused with 501) when the agent does not serve it.
pub(super) fn entry(
    spoke: &impl Host,
    event: &Event,
    out: &mpsc::Sender<Event>,
) -> Option<(Arc<SpokeProxy>, String, TaskTracker)> {
    let source = spoke.source().to_owned();
    let tasks = spoke.tasks().clone();
    let Some(proxy) = spoke.proxy() else {
        let why = "this agent does not serve the resource proxy";
        refuse_soon(&tasks, out, &source, &event.id, 501, why);
        return None;
    };
    Some((proxy, source, tasks))
}

/// Starts serving a `resource-request` from the principal (without holding up the stream):
/// a request slot, then the request on its own task; the answer goes to `out`. Log and
/// terminal requests are [`streams::serve`]'s.
pub fn serve(spoke: &impl Host, event: Event, out: &mpsc::Sender<Event>) {
    let Some((proxy, source, tasks)) = entry(spoke, &event, out) else {
        return;
    };
    let id = event.id;
    let Payload::ResourceRequest(req) = event.payload else {
        let why = "not a resource proxy request";
        refuse_soon(&tasks, out, &source, &id, 400, why);
        return;
    };
    let Some(slot) = proxy.try_request_slot() else {
        proxy.count(rules::method_verb(&req.method), "error");
        let why = "too many resource proxy requests at once";
        refuse_soon(&tasks, out, &source, &id, 429, why);
        return;
    };
    let apps = spoke.apps();
    let out = out.clone();
    tasks.spawn(async move {
        let response = proxy.handle_resource(&apps, &req).await;
        drop(slot);
        let _ = out.send(response_event(&source, &id, response)).await;
    });
}

/// Answers the request `id` with the error `status` and `message` through
/// [`answer_soon`].
pub(super) fn refuse_soon(
    tasks: &TaskTracker,
    out: &mpsc::Sender<Event>,
    source: &str,
    id: &str,
    status: u16,
    message: &str,
) {
    let answer = Answer::status(status, message);
    answer_soon(
        tasks,
        out,
        response_event(source, id, answer.into_response()),
    );
}

/// Sends an immediate answer (a refusal) without holding up the stream, even when the
/// outbound channel is momentarily full.
fn answer_soon(tasks: &TaskTracker, out: &mpsc::Sender<Event>, event: Event) {
    if let Err(mpsc::error::TrySendError::Full(event)) = out.try_send(event) {
        let out = out.clone();
        tasks.spawn(async move {
            let _ = out.send(event).await;
        });
    }
}

#[cfg(test)]
mod tests;
