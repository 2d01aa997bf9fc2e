//! Argo CD cluster secrets for agents (`--enable-self-cluster-registration`): the hub's
//! argocd-server reaches each spoke through the resource proxy, as the cluster its secret
//! describes. The principal creates `cluster-<agent>` in the Argo CD namespace when the
//! agent first connects, and keeps it current: the per-agent bearer token is renewed at two
//! thirds of its life, and the CA data follows the proxy's serving certificate.
//!
//! An agent of a tenant (see [`crate::tenancy`]) gets its secret labelled
//! [`TENANT_LABEL`]`: <tenant>`, so an ApplicationSet cluster generator can select one
//! tenant's clusters; the label follows the agent's tenant (a session under a new tenant
//! relabels it; the periodic pass relabels the agents this replica has seen).
//!
//! Only secrets the principal made (annotation `argocd-agent.argoproj-labs.io/managed-by:
//! principal`) are touched. A cluster secret for the agent made by anyone else — found by
//! its name or by the agent-name label — wins and is left alone.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use argocd_agent_domain::{AgentName, TenantName};
use argocd_agent_kubernetes::{Error, Kind, ObjectStore, Scope};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{DynamicObject, ObjectMeta};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::resourceproxy::ResourceProxyConfig;
use crate::resourceproxy::credentials::ProxyKeys;
pub use crate::tenancy::TENANT_LABEL;

/// The tenant of an agent as its sessions know it: `None` when unknown (never seen by this
/// replica: its secret's tenant label is left as it is), `Some(None)` for no tenant.
pub type TenantOf = Arc<dyn Fn(&AgentName) -> Option<Option<TenantName>> + Send + Sync>;

pub use argocd_agent_kubernetes::{AGENT_NAME_LABEL, SECRET_TYPE_LABEL};
/// Marks secrets the principal manages.
pub const MANAGED_BY_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/managed-by";
/// Argo CD's annotation that makes its application controller skip every Application
/// targeting a cluster (Argo CD "Cluster Management: Skipping cluster reconciliation"): a
/// hub that also runs its own Argo CD must never reconcile an agent's cluster itself.
pub const SKIP_RECONCILE_ANNOTATION: &str = "argocd.argoproj.io/skip-reconcile";
/// When the token inside expires (RFC 3339).
pub const TOKEN_EXPIRES_ANNOTATION: &str = "argocd-agent.argoproj-labs.io/token-expires";
const MANAGED_BY: &str = "principal";
/// How often secrets are checked for renewal and CA changes (more often for short tokens).
const REFRESH: Duration = Duration::from_secs(60);

fn refresh_interval(token_ttl: Duration) -> Duration {
    (token_ttl / 6).clamp(Duration::from_millis(100), REFRESH)
}

/// Name of an agent's cluster secret.
pub fn secret_name(agent: &AgentName) -> String {
    format!("cluster-{}", agent.as_str())
}

/// What [`ClusterSecrets::ensure`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// There was no secret for the agent; ours was created.
    Created,
    /// Our secret was rewritten: fresh token, current CA data and server URL.
    Renewed,
    /// Our secret needed nothing (or another replica created it meanwhile).
    Current,
    /// Someone else's secret for this agent exists.
    LeftAlone,
}

/// Keeps agents' cluster secrets.
pub struct ClusterSecrets {
    /// The hub's Secrets (kube-rs in the binary, memory in tests).
    store: Arc<dyn ObjectStore>,
    /// The Argo CD namespace the secrets live in.
    namespace: String,
    keys: Arc<ProxyKeys>,
    config: ResourceProxyConfig,
    ca_pem: watch::Receiver<String>,
    /// The principal's partition: its labels go on every secret it writes, and only
    /// secrets carrying them are renewed by the periodic pass.
    partition: Arc<crate::partition::Partition>,
    /// Agents whose cluster secret is known to exist (ours or someone else's), with the
    /// tenant its label names: their connects cost no API call while the tenant is the
    /// same; the periodic pass keeps ours current.
    known: std::sync::Mutex<std::collections::HashMap<AgentName, Option<String>>>,
    /// Each agent's tenant (see [`ClusterSecrets::follow_tenants`]); without it, no agent
    /// has one.
    tenant_of: std::sync::OnceLock<TenantOf>,
}

fn tenant_label(s: &Secret) -> Option<String> {
    s.metadata.labels.as_ref()?.get(TENANT_LABEL).cloned()
}

fn is_ours(s: &Secret) -> bool {
    s.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(MANAGED_BY_ANNOTATION))
        .is_some_and(|v| v == MANAGED_BY)
}

fn expires(s: &Secret) -> Option<SystemTime> {
    let at = s
        .metadata
        .annotations
        .as_ref()?
        .get(TOKEN_EXPIRES_ANNOTATION)?;
    let ts: jiff::Timestamp = at.parse().ok()?;
    Some(SystemTime::from(ts))
}

fn field(s: &Secret, key: &str) -> Option<String> {
    s.data
        .as_ref()?
        .get(key)
        .and_then(|b| String::from_utf8(b.0.clone()).ok())
}

impl ClusterSecrets {
    /// Keeps cluster secrets in `namespace` (the Argo CD namespace) through `store` (a
    /// store of Secrets), with tokens minted by `keys` for the proxy `config` describes and
    /// the CA data following `ca_pem`.
    pub fn new(
        store: Arc<dyn ObjectStore>,
        namespace: &str,
        keys: Arc<ProxyKeys>,
        config: ResourceProxyConfig,
        ca_pem: watch::Receiver<String>,
        partition: Arc<crate::partition::Partition>,
    ) -> Arc<Self> {
        Arc::new(ClusterSecrets {
            store,
            namespace: namespace.to_owned(),
            keys,
            config,
            ca_pem,
            partition,
            known: Default::default(),
            tenant_of: Default::default(),
        })
    }

    /// Labels each agent's secret with the tenant `tenant_of` gives (set once; later calls
    /// are ignored).
    pub fn follow_tenants(&self, tenant_of: TenantOf) {
        let _ = self.tenant_of.set(tenant_of);
    }

    /// The tenant label `agent`'s secret should carry: `None` when unknown.
    fn tenant(&self, agent: &AgentName) -> Option<Option<String>> {
        match self.tenant_of.get() {
            None => Some(None),
            Some(f) => f(agent).map(|t| t.map(|t| t.to_string())),
        }
    }

    /// The secret for `agent` with a fresh token, labelled for `tenant`.
    fn desired(&self, agent: &AgentName, tenant: Option<&str>, now: SystemTime) -> Secret {
        // Bound to the tenant as well: once the agent belongs to another tenant (or none),
        // the resource proxy refuses the token, and the relabelled Secret carries a new one.
        let bound = tenant.and_then(|t| argocd_agent_domain::TenantName::new(t).ok());
        let token = self
            .keys
            .mint_for(agent, bound.as_ref(), self.config.token_ttl, now);
        let ca = self.ca_pem.borrow().clone();
        let config = serde_json::json!({
            "bearerToken": token.value,
            "tlsClientConfig": {
                "insecure": false,
                "caData": base64::engine::general_purpose::STANDARD.encode(ca.as_bytes()),
            },
        });
        let expires = jiff::Timestamp::try_from(token.expires)
            .map(|t| t.to_string())
            .unwrap_or_default();
        let mut labels = BTreeMap::from([
            (SECRET_TYPE_LABEL.into(), "cluster".into()),
            (AGENT_NAME_LABEL.into(), agent.to_string()),
        ]);
        if let Some(t) = tenant {
            labels.insert(TENANT_LABEL.into(), t.to_owned());
        }
        self.partition.stamp_labels(&mut labels);
        Secret {
            metadata: ObjectMeta {
                name: Some(secret_name(agent)),
                namespace: Some(self.namespace.clone()),
                labels: Some(labels),
                annotations: Some(BTreeMap::from([
                    (MANAGED_BY_ANNOTATION.into(), MANAGED_BY.into()),
                    (TOKEN_EXPIRES_ANNOTATION.into(), expires),
                    (SKIP_RECONCILE_ANNOTATION.into(), "true".into()),
                ])),
                ..ObjectMeta::default()
            },
            string_data: Some(BTreeMap::from([
                ("name".into(), agent.to_string()),
                ("server".into(), self.config.agent_url(agent)),
                ("config".into(), config.to_string()),
            ])),
            type_: Some("Opaque".into()),
            ..Secret::default()
        }
    }

    /// Whether our secret must be rewritten: the token is in the last third of its life,
    /// the CA data or server URL changed, it lacks the skip-reconcile annotation (a
    /// secret an earlier version wrote), or it lacks this principal's partition labels (the
    /// agent moved here from another principal's partition: its secret moves with it).
    fn stale(&self, s: &Secret, agent: &AgentName, now: SystemTime) -> bool {
        if !self.partition.owns(s.metadata.labels.as_ref()) {
            return true;
        }
        if self.tenant(agent).is_some_and(|t| t != tenant_label(s)) {
            return true;
        }
        let renew_at = expires(s).map(|e| e.checked_sub(self.config.token_ttl / 3).unwrap_or(e));
        if renew_at.is_none_or(|r| now >= r) {
            return true;
        }
        if field(s, "server").as_deref() != Some(self.config.agent_url(agent).as_str()) {
            return true;
        }
        let skipped = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SKIP_RECONCILE_ANNOTATION));
        if skipped.map(String::as_str) != Some("true") {
            return true;
        }
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca_pem.borrow().as_bytes());
        let current_ca = field(s, "config")
            .and_then(|c| serde_json::from_str::<serde_json::Value>(&c).ok())
            .and_then(|c| {
                c.pointer("/tlsClientConfig/caData")?
                    .as_str()
                    .map(str::to_owned)
            });
        current_ca.as_deref() != Some(ca.as_str())
    }

    /// Creates or renews `agent`'s cluster secret; leaves someone else's alone.
    pub async fn ensure(&self, agent: &AgentName) -> Result<Ensured, Error> {
        let now = SystemTime::now();
        let labelled = self
            .list(&format!("{AGENT_NAME_LABEL}={}", agent.as_str()))
            .await?;
        if labelled.iter().any(|s| !is_ours(s)) {
            return Ok(Ensured::LeftAlone);
        }
        let name = secret_name(agent);
        let found = self.store.get(Some(&self.namespace), &name).await?;
        match found.map(secret_of).transpose()? {
            None => {
                let desired = self.desired(agent, self.tenant(agent).flatten().as_deref(), now);
                match self.store.create(&object_of(&desired)?).await {
                    Ok(_) => Ok(Ensured::Created),
                    Err(Error::AlreadyExists { .. }) => Ok(Ensured::Current),
                    Err(e) => Err(e),
                }
            }
            Some(s) if !is_ours(&s) => Ok(Ensured::LeftAlone),
            Some(s) => self.renew_if_stale(&s, agent, now).await,
        }
    }

    /// Rewrites our secret `s` for `agent` when it is stale.
    async fn renew_if_stale(
        &self,
        s: &Secret,
        agent: &AgentName,
        now: SystemTime,
    ) -> Result<Ensured, Error> {
        if !self.stale(s, agent, now) {
            return Ok(Ensured::Current);
        }
        // An agent of unknown tenant keeps the label its secret has.
        let tenant = self.tenant(agent).unwrap_or_else(|| tenant_label(s));
        let mut next = self.desired(agent, tenant.as_deref(), now);
        next.metadata.resource_version = s.metadata.resource_version.clone();
        // stringData replaces the three keys; anything else stored stays.
        next.data = s.data.clone();
        self.store.replace(&object_of(&next)?).await?;
        Ok(Ensured::Renewed)
    }

    /// Our namespace's Secrets matching the label `selector`.
    async fn list(&self, selector: &str) -> Result<Vec<Secret>, Error> {
        let scope = Scope::namespace(self.namespace.clone()).with_label_selector(selector);
        self.store
            .list(Some(&self.namespace), &scope)
            .await?
            .into_iter()
            .map(secret_of)
            .collect()
    }

    fn known(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<AgentName, Option<String>>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// On connect: creates the agent's secret unless one is known to exist (a reconnect
    /// storm of registered agents then costs no API call), logging the outcome.
    pub async fn ensure_logged(&self, agent: &AgentName) {
        let tenant = self.tenant(agent).flatten();
        if self.known().get(agent) == Some(&tenant) {
            return;
        }
        let outcome = self.ensure(agent).await;
        if outcome.is_ok() {
            self.known().insert(agent.clone(), tenant);
        }
        log_outcome(agent, outcome);
    }

    /// Renews the principal's cluster secrets until `shutdown`: at once, then every minute
    /// (more often for short tokens) and when the CA data changes. One list per pass; only
    /// stale secrets are written.
    pub async fn refresh(self: Arc<Self>, shutdown: CancellationToken) {
        let mut ca = self.ca_pem.clone();
        loop {
            self.pass().await;
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(refresh_interval(self.config.token_ttl)) => {}
                changed = ca.changed() => if changed.is_err() { return },
            }
        }
    }

    /// One renewal pass over every cluster secret labelled for an agent.
    pub async fn pass(&self) {
        // Only this partition's secrets: another principal's agents are its to renew.
        let ours = format!("{SECRET_TYPE_LABEL}=cluster,{AGENT_NAME_LABEL}");
        let selector = self.partition.selector_with(Some(&ours)).unwrap_or(ours);
        let secrets = match self.list(&selector).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "cluster secrets: list failed");
                return;
            }
        };
        let now = SystemTime::now();
        let mut known = std::collections::HashMap::new();
        for s in &secrets {
            let Some(agent) = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(AGENT_NAME_LABEL))
                .and_then(|a| AgentName::new(a).ok())
            else {
                continue;
            };
            known.insert(agent.clone(), tenant_label(s));
            if is_ours(s) && s.metadata.name.as_deref() == Some(secret_name(&agent).as_str()) {
                log_outcome(&agent, self.renew_if_stale(s, &agent, now).await);
            }
        }
        // Deleted secrets are forgotten: the agent's next connect creates one again.
        *self.known() = known;
    }
}

/// A stored object as the Secret it is.
fn secret_of(o: DynamicObject) -> Result<Secret, Error> {
    argocd_agent_kubernetes::object::typed(o, Kind::Secret)
}

/// A Secret as the store writes it.
fn object_of(s: &Secret) -> Result<DynamicObject, Error> {
    argocd_agent_kubernetes::object::dynamic(s, Kind::Secret)
}

fn log_outcome(agent: &AgentName, outcome: Result<Ensured, Error>) {
    match outcome {
        Ok(Ensured::Created) => {
            tracing::info!(agent = %agent, secret = %secret_name(agent), "cluster secret created")
        }
        Ok(Ensured::Renewed) => {
            tracing::info!(agent = %agent, secret = %secret_name(agent), "cluster secret renewed")
        }
        Ok(Ensured::LeftAlone) => tracing::debug!(agent = %agent,
            "a cluster secret for this agent exists and is not the principal's: left alone"),
        Ok(Ensured::Current) => {}
        Err(e) => tracing::warn!(agent = %agent, error = %e, "cluster secret not written"),
    }
}

/// A session's start makes sure the agent's cluster secret exists.
impl crate::hooks::SessionObserver for ClusterSecrets {
    fn connected(self: Arc<Self>, agent: &AgentName, tasks: &tokio_util::task::TaskTracker) {
        let agent = agent.clone();
        tasks.spawn(async move { self.ensure_logged(&agent).await });
    }
}

#[cfg(test)]
mod tests {
    //! The keeper against the in-memory Secret store: no API server.
    use super::*;
    use argocd_agent_kubernetes::memory::MemoryStore;

    fn keeper(store: &MemoryStore) -> (Arc<ClusterSecrets>, watch::Sender<String>, Arc<ProxyKeys>) {
        let (keys, _) = ProxyKeys::generate().unwrap();
        let keys = Arc::new(keys);
        let config = ResourceProxyConfig::new(
            "127.0.0.1:9090".parse().unwrap(),
            "https://proxy.argocd.svc:9090".into(),
        );
        let (ca_tx, ca_rx) = watch::channel("CA one".to_owned());
        let secrets = ClusterSecrets::new(
            Arc::new(store.clone()),
            "argocd",
            keys.clone(),
            config,
            ca_rx,
            Arc::new(crate::partition::Partition::whole_hub()),
        );
        (secrets, ca_tx, keys)
    }

    fn stored(store: &MemoryStore, name: &str) -> Secret {
        secret_of(store.object(Some("argocd"), name).expect("the secret")).unwrap()
    }

    fn config_of(s: &Secret) -> serde_json::Value {
        serde_json::from_slice(&s.data.as_ref().unwrap()["config"].0).unwrap()
    }

    #[tokio::test]
    async fn a_secret_is_created_once_renewed_when_the_ca_changes_and_others_are_left_alone() {
        let store = MemoryStore::new(Kind::Secret);
        let (secrets, ca_tx, keys) = keeper(&store);
        let agent = AgentName::new("edge-1").unwrap();
        assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Created);
        let s = stored(&store, "cluster-edge-1");
        assert_eq!(
            s.metadata.labels.as_ref().unwrap()[AGENT_NAME_LABEL],
            "edge-1"
        );
        let c = config_of(&s);
        let token = c["bearerToken"].as_str().unwrap();
        assert_eq!(keys.verify(token, SystemTime::now()).unwrap(), agent);
        assert_eq!(secrets.ensure(&agent).await.unwrap(), Ensured::Current);

        // Something else stored in the secret stays through a renewal.
        let mut extra = store.object(Some("argocd"), "cluster-edge-1").unwrap();
        extra.data["data"]["note"] = "a2VlcA==".into();
        store.replace(&extra).await.unwrap();
        ca_tx.send_replace("CA two".to_owned());
        secrets.pass().await;
        let s = stored(&store, "cluster-edge-1");
        let ca = base64::engine::general_purpose::STANDARD
            .decode(config_of(&s)["tlsClientConfig"]["caData"].as_str().unwrap())
            .unwrap();
        assert_eq!(ca, b"CA two");
        assert_eq!(s.data.as_ref().unwrap()["note"].0, b"keep");

        // Someone else's cluster secret for an agent, found by its label: left alone.
        let theirs = AgentName::new("edge-2").unwrap();
        let mut other = secrets.desired(&theirs, None, SystemTime::now());
        other.metadata.name = Some("hand-made".into());
        other.metadata.annotations = None;
        store.create(&object_of(&other).unwrap()).await.unwrap();
        assert_eq!(secrets.ensure(&theirs).await.unwrap(), Ensured::LeftAlone);
        assert!(store.object(Some("argocd"), "cluster-edge-2").is_none());
    }
}
