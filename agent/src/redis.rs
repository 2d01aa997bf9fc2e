//! Answers the principal's Redis requests from this cluster's Redis (the one the local
//! Argo CD application controller writes): `GET` of an Application's cache key, and
//! subscriptions to the key's channel, on which Argo CD publishes when the value changes.
//!
//! The principal routes a request only to the agent owning the Application; the agent
//! checks again and serves only keys of Applications it holds, rebuilt with the
//! Application's instance name on this cluster (never a key the principal spelled out).
//!
//! A resource tree names the Applications a parent created (app-of-apps) by their namespace
//! here; on the hub they live in the agent's hub namespace (under `<namespace>.<name>` when
//! an autonomous agent's Application is outside the Argo CD namespace). The tree is served
//! with those nodes pointing where the hub has them, so the hub UI's links to a child
//! Application lead to it (upstream argocd-agent PR #1048).

use argocd_agent_identity::text;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::{
    ClusterCacheInfo, RedisCommand, RedisRequest, RedisResponse, redis_response,
};
use argocd_agent_redis::clusterinfo::{self, Compression};
use argocd_agent_redis::{AppKey, AppKeyKind, RedisConn, RedisEndpoint};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use argocd_agent_domain::ResourceRef;
use argocd_agent_domain::{Namespace, ResourceKind};

/// Subscriptions one agent keeps at once.
const MAX_SUBSCRIPTIONS: usize = 1024;
/// Longest key suffix accepted (shard, cache version, `.gz`).
const MAX_SUFFIX: usize = 64;

/// Where Applications of this cluster are on the hub: the agent's hub namespace, for
/// Applications of its Argo CD namespace and (autonomous) of its `--allowed-namespaces`.
#[derive(Debug, Clone)]
pub struct TreeNamespaces {
    /// The agent's hub namespace.
    pub hub: String,
    /// This cluster's Argo CD namespace.
    pub argocd: String,
    /// An autonomous agent's allowed namespaces (published as `<namespace>.<name>`);
    /// `None`: only the Argo CD namespace's Applications are on the hub.
    pub allowed: Option<crate::namespaces::AllowedNamespaces>,
}

impl TreeNamespaces {
    /// The hub `(namespace, name)` of the Application `name` in `namespace` here, if the
    /// hub has it under another namespace or name.
    fn hub_location(&self, namespace: &str, name: &str) -> Option<(String, String)> {
        let taken =
            namespace == self.argocd || self.allowed.as_ref().is_some_and(|a| a.allows(namespace));
        if !taken {
            return None;
        }
        let hub_name = crate::namespaces::hub_name(&self.argocd, namespace, name).ok()?;
        Some((self.hub.clone(), hub_name))
    }

    /// Rewrites the Application nodes and parent references of an Argo CD
    /// `ApplicationTree` (`nodes`, `orphanedNodes`) to their hub location; returns how many
    /// references changed.
    pub fn rewrite(&self, tree: &mut Value) -> usize {
        let mut changed = 0;
        for list in ["nodes", "orphanedNodes"] {
            let Some(nodes) = tree.get_mut(list).and_then(Value::as_array_mut) else {
                continue;
            };
            for node in nodes {
                changed += usize::from(self.rewrite_ref(node));
                if let Some(parents) = node.get_mut("parentRefs").and_then(Value::as_array_mut) {
                    for parent in parents {
                        changed += usize::from(self.rewrite_ref(parent));
                    }
                }
            }
        }
        changed
    }

    /// One `ResourceRef`-shaped object (`group`, `kind`, `namespace`, `name`).
    fn rewrite_ref(&self, r: &mut Value) -> bool {
        let is_app = r.get("group").and_then(Value::as_str) == Some("argoproj.io")
            && r.get("kind").and_then(Value::as_str) == Some("Application");
        if !is_app {
            return false;
        }
        let (Some(ns), Some(name)) = (
            r.get("namespace").and_then(Value::as_str),
            r.get("name").and_then(Value::as_str),
        ) else {
            return false;
        };
        let Some((hub_ns, hub_name)) = self.hub_location(ns, name) else {
            return false;
        };
        if (hub_ns.as_str(), hub_name.as_str()) == (ns, name) {
            return false;
        }
        r["namespace"] = Value::String(hub_ns);
        r["name"] = Value::String(hub_name);
        true
    }

    /// A cached resource tree value (gzip when its key ends in `.gz`, as Argo CD writes it)
    /// with its Application nodes rewritten; `None` when nothing changes or it does not
    /// decode (then it is served as read).
    fn rewrite_value(&self, key: &str, value: &[u8]) -> Option<Vec<u8>> {
        let compression = if key.ends_with(".gz") {
            Compression::Gzip
        } else {
            Compression::None
        };
        let mut tree = clusterinfo::decode(value, compression)?;
        (self.rewrite(&mut tree) > 0).then(|| clusterinfo::encode(&tree, compression))
    }
}

/// This cluster's Redis (`--redis-addr`).
#[derive(Clone, Debug)]
pub struct RedisConfig {
    /// Where it is and how to log in.
    pub endpoint: RedisEndpoint,
    /// Largest value read and sent to the principal.
    pub max_value_size: usize,
}

/// Why a Redis request names no key this agent may serve (the refusal sent back).
#[derive(Debug, thiserror::Error)]
enum KeyRefusal {
    /// The event names no Application.
    #[error("request names no application")]
    NoApplication,
    /// The key kind is not one Argo CD uses (quoted).
    #[error("unknown key kind {0}")]
    UnknownKind(String),
    /// The key suffix is not valid (quoted).
    #[error("invalid key suffix {0}")]
    InvalidSuffix(String),
    /// The Application is not held here.
    #[error("application {namespace}/{name} is not held by this agent")]
    NotHeld {
        /// Its hub namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
}

/// What the Redis proxy asks of the Applications the spoke holds (the spoke implements it).
pub trait HeldApps {
    /// Argo CD's instance name of the local copy of the Application the principal names,
    /// if this agent holds it.
    fn redis_instance(&self, resource: &ResourceRef) -> Option<String>;
    /// Where the Applications a resource tree names are on the hub (`None` when hub and
    /// spoke namespaces are the same, or before the first welcome).
    fn tree_namespaces(&self) -> Option<TreeNamespaces>;
}

/// The Redis side of the agent: a connection for reads, one per subscription.
pub struct SpokeRedis {
    /// Where subscriptions run (drained on shutdown).
    tasks: TaskTracker,
    config: RedisConfig,
    reads: tokio::sync::Mutex<Option<RedisConn>>,
    subscriptions: Mutex<HashMap<String, CancellationToken>>,
}

/// Argo CD's instance name on this cluster of the Application the principal names, if this
/// agent holds it (`locate` gives its local `(namespace, name)` when held): the Application
/// must be in the agent's hub namespace (or, with destination-based mapping, keeps its hub
/// namespace here); its instance name is the bare name in the agent's Argo CD namespace,
/// `<ns>_<name>` elsewhere (an autonomous agent's `<ns>.<name>` on the hub is `<ns>_<name>`
/// here).
pub fn instance_name(
    resource: &ResourceRef,
    across_namespaces: bool,
    hub_namespace: Option<&Namespace>,
    argocd_namespace: &Namespace,
    locate: impl Fn(&ResourceRef) -> Option<(String, String)>,
) -> Option<String> {
    if resource.kind != ResourceKind::Application {
        return None;
    }
    if !across_namespaces && hub_namespace != Some(&resource.namespace) {
        return None;
    }
    let (local_ns, name) = locate(resource)?;
    Some(if local_ns == argocd_namespace.as_str() {
        name
    } else {
        format!("{local_ns}_{name}")
    })
}

/// The suffix the principal sent is one Argo CD writes: empty, `.gz`, or `|...` (shard,
/// cache version); anything else could turn the key into another Application's.
fn valid_suffix(suffix: &str) -> bool {
    suffix.len() <= MAX_SUFFIX
        && (suffix.is_empty() || suffix == ".gz" || suffix.starts_with('|'))
        && suffix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'|' | b'.' | b'-' | b'+' | b'_'))
}

impl SpokeRedis {
    /// The cluster Redis of `config`; subscriptions run on `tasks`.
    pub fn new(config: RedisConfig, tasks: TaskTracker) -> Arc<SpokeRedis> {
        Arc::new(SpokeRedis {
            config,
            tasks,
            reads: tokio::sync::Mutex::new(None),
            subscriptions: Mutex::new(HashMap::new()),
        })
    }

    /// The local key a request names, if this agent may serve it.
    fn local_key(
        spoke: &impl HeldApps,
        event: &Event,
        req: &RedisRequest,
    ) -> Result<String, KeyRefusal> {
        let resource = event.resource.as_ref().ok_or(KeyRefusal::NoApplication)?;
        let kind = AppKeyKind::parse(&req.key_kind)
            .ok_or_else(|| KeyRefusal::UnknownKind(text::quoted(&req.key_kind).to_string()))?;
        if !valid_suffix(&req.key_suffix) {
            return Err(KeyRefusal::InvalidSuffix(
                text::quoted(&req.key_suffix).to_string(),
            ));
        }
        let instance = spoke
            .redis_instance(resource)
            .ok_or_else(|| KeyRefusal::NotHeld {
                namespace: resource.namespace.to_string(),
                name: resource.name.clone(),
            })?;
        Ok(AppKey::with_instance(kind, &instance, &req.key_suffix))
    }

    /// Decides what a `redis-request` may do, against the spoke's current Applications.
    pub fn prepare(spoke: &impl HeldApps, event: &Event) -> Request {
        let Payload::RedisRequest(req) = &event.payload else {
            return Request::Refused("not a Redis request".into());
        };
        let command = RedisCommand::try_from(req.command).unwrap_or(RedisCommand::Unspecified);
        if command == RedisCommand::Unsubscribe {
            return Request::Unsubscribe(req.subscription_id.clone());
        }
        match (command, Self::local_key(spoke, event, req)) {
            (_, Err(reason)) => Request::Refused(reason.to_string()),
            (RedisCommand::Get, Ok(key)) => {
                let tree = (req.key_kind == AppKeyKind::ResourcesTree.as_str())
                    .then(|| spoke.tree_namespaces())
                    .flatten();
                Request::Get { key, tree }
            }
            (RedisCommand::Subscribe, Ok(key)) => Request::Subscribe(key),
            (_, Ok(_)) => Request::Refused(format!("unsupported Redis command {}", req.command)),
        }
    }

    /// Carries out a prepared request; answers go to `out`. Subscriptions end with
    /// `connection` (the stream to the principal). `true` when the answer is an error.
    pub async fn handle(
        self: &Arc<Self>,
        request: Request,
        source: &str,
        event: Event,
        out: mpsc::Sender<Event>,
        connection: &CancellationToken,
    ) -> bool {
        let result = match request {
            Request::Unsubscribe(id) => {
                if let Some(stop) = self
                    .subscriptions
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id)
                {
                    stop.cancel();
                }
                return false;
            }
            Request::Refused(reason) => {
                tracing::warn!(app = %text::or_dash(event.resource.as_ref()), %reason, "Redis request refused");
                error(reason)
            }
            Request::Get { key, tree } => match (self.get(&key).await, tree) {
                (redis_response::Result::Value(v), Some(tree)) => {
                    redis_response::Result::Value(tree.rewrite_value(&key, &v).unwrap_or(v))
                }
                (other, _) => other,
            },
            Request::Subscribe(key) => {
                self.subscribe(source, &event, key, out.clone(), connection)
                    .await
            }
        };
        let failed = matches!(result, redis_response::Result::Error(_));
        let _ = out
            .send(answer(source, &event, EventType::RedisResponse, result))
            .await;
        failed
    }

    async fn get(&self, key: &str) -> redis_response::Result {
        let mut guard = self.reads.lock().await;
        // One retry on a fresh connection: the cached one may have been closed by Redis.
        for attempt in 0..2 {
            if guard.is_none() {
                match self
                    .config
                    .endpoint
                    .connect(self.config.max_value_size)
                    .await
                {
                    Ok(c) => *guard = Some(c),
                    Err(e) => return error(format!("cluster Redis unreachable: {e}")),
                }
            }
            let Some(conn) = guard.as_mut() else { continue };
            match conn.command(&[b"GET", key.as_bytes()]).await {
                Ok(frame) => {
                    return match frame.into_value() {
                        Ok(Some(v)) => redis_response::Result::Value(v.to_vec()),
                        Ok(None) => redis_response::Result::Nil(true),
                        Err(e) => error(format!("cluster Redis: {e}")),
                    };
                }
                Err(e) => {
                    *guard = None;
                    if attempt == 1 {
                        return error(format!("cluster Redis: {e}"));
                    }
                }
            }
        }
        error("cluster Redis unreachable".into())
    }

    /// Subscribes on a connection of its own; the confirmation is the returned result, the
    /// messages follow as `redis-push` events until unsubscribed or disconnected.
    async fn subscribe(
        self: &Arc<Self>,
        source: &str,
        event: &Event,
        key: String,
        out: mpsc::Sender<Event>,
        connection: &CancellationToken,
    ) -> redis_response::Result {
        let stop = connection.child_token();
        {
            let mut subs = self.subscriptions.lock().unwrap_or_else(|p| p.into_inner());
            if subs.len() >= MAX_SUBSCRIPTIONS {
                return error(format!(
                    "too many subscriptions (limit {MAX_SUBSCRIPTIONS})"
                ));
            }
            subs.insert(event.id.clone(), stop.clone());
        }
        let mut conn = match self
            .config
            .endpoint
            .connect(self.config.max_value_size)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                self.forget(&event.id);
                return error(format!("cluster Redis unreachable: {e}"));
            }
        };
        match conn.command(&[b"SUBSCRIBE", key.as_bytes()]).await {
            Ok(f) if !f.is_error() => {}
            Ok(f) => {
                self.forget(&event.id);
                return error(format!(
                    "cluster Redis refused SUBSCRIBE: {}",
                    f.error_text()
                ));
            }
            Err(e) => {
                self.forget(&event.id);
                return error(format!("cluster Redis: {e}"));
            }
        }
        let request = event.clone();
        let source = source.to_owned();
        let this = self.clone();
        self.tasks.spawn(async move {
            loop {
                let frame = tokio::select! {
                    _ = stop.cancelled() => break,
                    f = conn.next() => f,
                };
                let result = match frame {
                    Ok(f) => match f.into_message() {
                        Some(payload) => redis_response::Result::Value(payload.to_vec()),
                        None => continue,
                    },
                    Err(e) => error(format!("cluster Redis subscription lost: {e}")),
                };
                let end = matches!(result, redis_response::Result::Error(_));
                let push = answer(&source, &request, EventType::RedisPush, result);
                if out.send(push).await.is_err() || end {
                    break;
                }
            }
            this.forget(&request.id);
        });
        redis_response::Result::Nil(true)
    }

    /// This cluster's cache counts as its Argo CD recorded them (its cluster info for the
    /// in-cluster server, compressed or not); zeros when unknown.
    pub async fn cluster_counts(&self) -> ClusterCacheInfo {
        let mut info = ClusterCacheInfo::default();
        for compression in [Compression::Gzip, Compression::None] {
            let key = clusterinfo::key(clusterinfo::IN_CLUSTER, compression);
            let redis_response::Result::Value(bytes) = self.get(&key).await else {
                continue;
            };
            let Some(doc) = clusterinfo::decode(&bytes, compression) else {
                continue;
            };
            let int = |p: &str| {
                doc.pointer(p)
                    .and_then(serde_json::Value::as_i64)
                    .unwrap_or(0)
            };
            info.apis_count = int("/cacheInfo/apisCount");
            info.resources_count = int("/cacheInfo/resourcesCount");
            info.last_cache_sync_time = doc
                .pointer("/cacheInfo/lastCacheSyncTime")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned();
            info.server_version = doc
                .pointer("/serverVersion")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
                .to_owned();
            break;
        }
        info
    }

    fn forget(&self, id: &str) {
        self.subscriptions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(id);
    }
}

fn error(message: String) -> redis_response::Result {
    redis_response::Result::Error(message)
}

/// What a request may do.
#[derive(Debug, Clone)]
pub enum Request {
    /// Read this local key; a resource tree's Application nodes are pointed at their hub
    /// location with `tree`.
    Get {
        /// The local key.
        key: String,
        /// Where this cluster's Applications are on the hub (resource trees only).
        tree: Option<TreeNamespaces>,
    },
    /// Subscribe to this local key's channel; messages are pushed to the principal.
    Subscribe(String),
    /// End the subscription with this id (unknown ids are ignored).
    Unsubscribe(String),
    /// Answered with this error: the key is not the agent's to serve, or the request is
    /// malformed.
    Refused(String),
}

/// The answer (or push) to `request`.
pub fn answer(
    source: &str,
    request: &Event,
    ty: EventType,
    result: redis_response::Result,
) -> Event {
    let mut e = Event::new(
        source,
        ty,
        Payload::RedisResponse(RedisResponse {
            result: Some(result),
        }),
    );
    e.ack_id = Some(request.id.clone());
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> Namespace {
        Namespace::new(s).unwrap()
    }

    fn app(namespace: &str, name: &str) -> ResourceRef {
        ResourceRef::new(ResourceKind::Application, ns(namespace), name)
    }

    #[test]
    fn only_held_applications_of_the_agents_hub_namespace_are_served() {
        let argocd = ns("argocd");
        let mine = ns("agent-a");
        let holds = |r: &ResourceRef| {
            (r.name == "guestbook").then(|| ("argocd".to_owned(), r.name.clone()))
        };
        let name = |r: &ResourceRef| instance_name(r, false, Some(&mine), &argocd, holds);
        assert_eq!(
            name(&app("agent-a", "guestbook")).as_deref(),
            Some("guestbook")
        );
        assert_eq!(
            name(&app("agent-b", "guestbook")),
            None,
            "another agent's namespace"
        );
        assert_eq!(name(&app("agent-a", "other")), None, "not held here");
        let project = ResourceRef::new(ResourceKind::AppProject, mine.clone(), "guestbook");
        assert_eq!(name(&project), None);
        assert_eq!(
            instance_name(&app("agent-a", "guestbook"), false, None, &argocd, holds),
            None,
            "before the first welcome nothing is served"
        );
    }

    #[test]
    fn destination_mapping_keeps_the_hub_namespace_in_the_instance_name() {
        let argocd = ns("argocd");
        let holds = |r: &ResourceRef| {
            (r.namespace.as_str() == "team-x" && r.name == "web")
                .then(|| (r.namespace.as_str().to_owned(), r.name.clone()))
        };
        assert_eq!(
            instance_name(&app("team-x", "web"), true, None, &argocd, holds).as_deref(),
            Some("team-x_web")
        );
        assert_eq!(
            instance_name(&app("team-y", "web"), true, None, &argocd, holds),
            None
        );
    }

    #[test]
    fn an_autonomous_agents_application_of_another_namespace_keeps_its_local_instance_name() {
        let argocd = ns("argocd");
        let mine = ns("agent-a");
        // The hub name `team-x.web` is the local Application web in team-x.
        let locate = |r: &ResourceRef| {
            let (ns, name) = crate::namespaces::split_hub_name(&r.name)?;
            (ns == "team-x").then(|| (ns.to_owned(), name.to_owned()))
        };
        assert_eq!(
            instance_name(
                &app("agent-a", "team-x.web"),
                false,
                Some(&mine),
                &argocd,
                locate
            )
            .as_deref(),
            Some("team-x_web")
        );
        assert_eq!(
            instance_name(
                &app("agent-a", "team-y.web"),
                false,
                Some(&mine),
                &argocd,
                locate
            ),
            None
        );
    }

    #[test]
    fn resource_trees_point_application_nodes_at_the_hub() {
        let allowed =
            crate::namespaces::AllowedNamespaces::new("argocd", &["team-*".to_owned()]).unwrap();
        let autonomous = TreeNamespaces {
            hub: "edge-1".into(),
            argocd: "argocd".into(),
            allowed: Some(allowed),
        };
        let mut tree = serde_json::json!({
            "nodes": [
                {"group": "argoproj.io", "kind": "Application", "namespace": "argocd", "name": "a"},
                {"group": "argoproj.io", "kind": "Application", "namespace": "team-x", "name": "b"},
                {"group": "argoproj.io", "kind": "Application", "namespace": "other", "name": "c"},
                {"group": "", "kind": "Application", "namespace": "argocd", "name": "not-ours"},
                {"group": "apps", "kind": "Deployment", "namespace": "argocd", "name": "d",
                 "parentRefs": [{"group": "argoproj.io", "kind": "Application", "namespace": "team-x", "name": "b"}]},
            ],
            "orphanedNodes": [
                {"group": "argoproj.io", "kind": "Application", "namespace": "argocd", "name": "o"},
            ],
        });
        assert_eq!(autonomous.rewrite(&mut tree), 4);
        let at = |i: usize| {
            (
                tree["nodes"][i]["namespace"].clone(),
                tree["nodes"][i]["name"].clone(),
            )
        };
        assert_eq!(at(0), ("edge-1".into(), "a".into()));
        assert_eq!(at(1), ("edge-1".into(), "team-x.b".into()));
        assert_eq!(
            at(2),
            ("other".into(), "c".into()),
            "not a namespace the agent publishes"
        );
        assert_eq!(
            at(3),
            ("argocd".into(), "not-ours".into()),
            "not Argo CD's kind"
        );
        assert_eq!(at(4), ("argocd".into(), "d".into()));
        assert_eq!(tree["nodes"][4]["parentRefs"][0]["name"], "team-x.b");
        assert_eq!(tree["orphanedNodes"][0]["namespace"], "edge-1");
        // A managed agent's Applications are in its Argo CD namespace only.
        let managed = TreeNamespaces {
            hub: "edge-2".into(),
            argocd: "argocd".into(),
            allowed: None,
        };
        let mut tree = serde_json::json!({"nodes": [
            {"group": "argoproj.io", "kind": "Application", "namespace": "team-x", "name": "b"},
        ]});
        assert_eq!(managed.rewrite(&mut tree), 0);
        // Values that are no tree (or not JSON) are served as read.
        assert_eq!(managed.rewrite_value("k|1.8.3", b"\x1f\x8bnot-json"), None);
    }

    #[test]
    fn only_suffixes_argo_cd_writes_are_accepted() {
        for ok in ["", ".gz", "|1.8.3", "|2|1.8.3.gz", "|v2.14.0+abc"] {
            assert!(valid_suffix(ok), "{ok:?}");
        }
        for bad in ["x", "-other", "_other", "|a b", "\r\n", &"|1".repeat(40)] {
            assert!(!valid_suffix(bad), "{bad:?}");
        }
    }
}
