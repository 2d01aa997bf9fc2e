//! Each agent's cluster in Argo CD's cluster info: the hub's Argo CD shows a cluster's
//! connection state and cache counts from Redis (`cluster|info|<server>`), which its own
//! controller never writes for agent clusters. The principal writes it: Successful with the
//! agent's latest counts while connected, Failed as soon as the session ends. The agent's
//! version (from its hello) is in the connection state's message, which Argo CD shows next to
//! the status, and in an `agentVersion` field (upstream argocd-agent issue #940; Argo CD's
//! `ClusterInfo` ignores fields it does not know).

use argocd_agent_identity::text;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use argocd_agent_domain::AgentName;
use argocd_agent_proto::eventstream::ClusterCacheInfo;
use argocd_agent_redis::clusterinfo::{self, Compression};
use argocd_agent_redis::{RedisConn, RedisEndpoint};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::sessions::Sessions;

/// How long a written cluster info lives in Redis (Argo CD's own expiration).
const EXPIRATION: Duration = Duration::from_secs(600);
/// How often every agent's cluster info is written again (well within the expiration).
const REFRESH: Duration = Duration::from_secs(60);
/// Placeholder in the server URL template.
pub const AGENT_PLACEHOLDER: &str = "{agent}";
/// Default server URL of an agent's cluster (its cluster Secret's `server`), as upstream.
pub const DEFAULT_SERVER_TEMPLATE: &str =
    "https://argocd-agent-resource-proxy:9090?agentName={agent}";

/// The connection state of an agent's cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// The agent has an open session.
    Successful,
    /// The agent has no session; the message says why (shown by Argo CD).
    Failed(String),
}

/// `successful`, or `failed: "<why>"` (the log line of a write).
impl std::fmt::Display for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Connection::Successful => f.write_str("successful"),
            Connection::Failed(why) => write!(f, "failed: {}", text::quoted(why)),
        }
    }
}

/// The cluster info document (Argo CD's `ClusterInfo` JSON).
pub fn document(
    connection: &Connection,
    counts: Option<&ClusterCacheInfo>,
    agent_version: Option<&str>,
    now: SystemTime,
) -> Value {
    let at = jiff::Timestamp::try_from(now)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let agent_version = agent_version.filter(|v| !v.is_empty());
    let (status, message) = match (connection, agent_version) {
        (Connection::Successful, Some(v)) => ("Successful", format!("argocd-agent {v}")),
        (Connection::Successful, None) => ("Successful", String::new()),
        (Connection::Failed(m), _) => ("Failed", m.clone()),
    };
    let c = counts.cloned().unwrap_or_default();
    let mut cache = json!({});
    if c.resources_count > 0 {
        cache["resourcesCount"] = c.resources_count.into();
    }
    if c.apis_count > 0 {
        cache["apisCount"] = c.apis_count.into();
    }
    if !c.last_cache_sync_time.is_empty() {
        cache["lastCacheSyncTime"] = c.last_cache_sync_time.clone().into();
    }
    let mut doc = json!({
        "connectionState": {"status": status, "message": message, "attemptedAt": at},
        "cacheInfo": cache,
        "applicationsCount": c.applications_count,
    });
    if !c.server_version.is_empty() {
        doc["serverVersion"] = c.server_version.into();
    }
    if let Some(v) = agent_version {
        doc["agentVersion"] = v.into();
    }
    doc
}

/// Writes agents' cluster info into the hub Redis.
pub struct ClusterInfoWriter {
    endpoint: RedisEndpoint,
    compression: Compression,
    server_template: String,
    conn: tokio::sync::Mutex<Option<RedisConn>>,
    counts: Mutex<HashMap<AgentName, ClusterCacheInfo>>,
    /// Where each agent's version (from its hello) is read; weak, as the sessions hold
    /// this writer among their observers.
    sessions: Weak<Sessions>,
    /// Redis failures since the last one logged, so an unreachable hub Redis is one line
    /// a minute with a count, not one per agent and write.
    failures: argocd_agent_runtime::logging::LogLimiter,
}

impl ClusterInfoWriter {
    /// A writer to the Redis at `endpoint`, compressing documents as Argo CD reads them
    /// (`compression`); `server_template` gives each agent's server URL, with
    /// [`AGENT_PLACEHOLDER`] replaced by the agent's name.
    pub fn new(
        endpoint: RedisEndpoint,
        compression: Compression,
        server_template: String,
        sessions: Weak<Sessions>,
    ) -> Arc<Self> {
        Arc::new(ClusterInfoWriter {
            endpoint,
            compression,
            server_template,
            conn: tokio::sync::Mutex::new(None),
            counts: Mutex::new(HashMap::new()),
            sessions,
            failures: argocd_agent_runtime::logging::LogLimiter::new(Duration::from_secs(60)),
        })
    }

    /// The server URL of `agent`'s cluster.
    pub fn server_url(&self, agent: &AgentName) -> String {
        self.server_template
            .replace(AGENT_PLACEHOLDER, agent.as_str())
    }

    /// Writes `agent`'s cluster info in the background, on `tasks`.
    fn write_soon(self: Arc<Self>, agent: &AgentName, connection: Connection, tasks: &TaskTracker) {
        let agent = agent.clone();
        tasks.spawn(async move { self.write(&agent, connection).await });
    }

    /// Records the agent's latest counts.
    pub fn set_counts(&self, agent: &AgentName, counts: ClusterCacheInfo) {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent.clone(), counts);
    }

    /// Writes `agent`'s cluster info with its latest counts.
    pub async fn write(&self, agent: &AgentName, connection: Connection) {
        let counts = self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent)
            .cloned();
        let version = self
            .sessions
            .upgrade()
            .and_then(|s| s.agent(agent))
            .map(|a| a.session_info().agent_version);
        let doc = document(
            &connection,
            counts.as_ref(),
            version.as_deref(),
            SystemTime::now(),
        );
        let key = clusterinfo::key(&self.server_url(agent), self.compression);
        let value = clusterinfo::encode(&doc, self.compression);
        let ttl = EXPIRATION.as_secs().to_string();
        let mut guard = self.conn.lock().await;
        for _ in 0..2 {
            if guard.is_none() {
                match self.endpoint.connect(1 << 20).await {
                    Ok(c) => *guard = Some(c),
                    Err(e) => {
                        if let Some(missed) = self.failures.admit() {
                            tracing::warn!(
                                agent = %agent,
                                redis = %self.endpoint.addr,
                                error = %argocd_agent_domain::error_chain(&e),
                                failures_since_last_logged = missed,
                                "cluster info not written: the hub Redis is unreachable (set its address with --redis-server-address)"
                            );
                        }
                        return;
                    }
                }
            }
            let Some(conn) = guard.as_mut() else { return };
            match conn
                .command(&[b"SET", key.as_bytes(), &value, b"EX", ttl.as_bytes()])
                .await
            {
                Ok(reply) if !reply.is_error() => {
                    tracing::debug!(agent = %agent, state = %connection, "cluster info written");
                    return;
                }
                Ok(reply) => {
                    tracing::warn!(agent = %agent, reply = %text::quoted(&reply.error_text()), "cluster info: hub Redis refused SET");
                    return;
                }
                Err(_) => *guard = None,
            }
        }
    }

    /// Writes every agent's cluster info again, periodically, until `shutdown`.
    pub async fn refresh(self: Arc<Self>, sessions: Arc<Sessions>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(REFRESH);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            for state in sessions.agents() {
                let connection = if state.is_connected() {
                    Connection::Successful
                } else {
                    Connection::Failed(DISCONNECTED.into())
                };
                self.write(&state.name, connection).await;
            }
        }
    }
}

/// The message of a Failed state after a disconnect.
pub const DISCONNECTED: &str = "agent is not connected to the principal";

/// A session's start writes the agent's cluster info as connected, its end as failed
/// (`DISCONNECTED`), and each cache report the new counts, as Argo CD's cluster cache would.
impl crate::hooks::SessionObserver for ClusterInfoWriter {
    fn connected(self: Arc<Self>, agent: &AgentName, tasks: &TaskTracker) {
        self.write_soon(agent, Connection::Successful, tasks);
    }

    fn disconnected(self: Arc<Self>, agent: &AgentName, tasks: &TaskTracker) {
        self.write_soon(agent, Connection::Failed(DISCONNECTED.into()), tasks);
    }

    fn cache_info(
        self: Arc<Self>,
        agent: &AgentName,
        counts: &ClusterCacheInfo,
        tasks: &TaskTracker,
    ) {
        self.set_counts(agent, counts.clone());
        self.write_soon(agent, Connection::Successful, tasks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn document_carries_state_and_counts_as_argo_cd_reads_them() {
        let counts = ClusterCacheInfo {
            applications_count: 3,
            apis_count: 7,
            resources_count: 42,
            last_cache_sync_time: "2026-01-01T00:00:00Z".into(),
            server_version: "1.33".into(),
        };
        let d = document(
            &Connection::Successful,
            Some(&counts),
            None,
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(d["connectionState"]["message"], "");
        assert!(d.get("agentVersion").is_none());
        assert_eq!(d["connectionState"]["status"], "Successful");
        assert_eq!(d["connectionState"]["attemptedAt"], "1970-01-01T00:00:00Z");
        assert_eq!(d["applicationsCount"], 3);
        assert_eq!(d["cacheInfo"]["resourcesCount"], 42);
        assert_eq!(d["cacheInfo"]["apisCount"], 7);
        assert_eq!(d["serverVersion"], "1.33");
        let d = document(
            &Connection::Successful,
            Some(&counts),
            Some("0.4.0+abc123"),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(d["connectionState"]["message"], "argocd-agent 0.4.0+abc123");
        assert_eq!(d["agentVersion"], "0.4.0+abc123");
        let d = document(
            &Connection::Failed("gone".into()),
            None,
            Some("0.4.0"),
            SystemTime::UNIX_EPOCH,
        );
        assert_eq!(d["connectionState"]["status"], "Failed");
        assert_eq!(d["connectionState"]["message"], "gone");
        assert_eq!(d["applicationsCount"], 0);
    }
}
