//! The operator API (`argocdagent.admin.v1.Admin`): list, inspect and disconnect agents,
//! block and unblock identities, issue resource-proxy kubeconfigs, list tenants.
//!
//! It is served in two places:
//!
//! - on the principal's agent listener, where every call is authenticated like an agent
//!   stream (client SVID, JWT-SVID or mesh header) and allowed only when the caller's SPIFFE
//!   ID matches a mapping rule with `role: admin`; agent identities are refused;
//! - on its own plaintext listener (`--admin-address`), on loopback TCP or a Unix socket
//!   only: whoever can connect there (`kubectl exec`, `kubectl port-forward`) is already
//!   trusted with the pod. A non-loopback `--admin-address` is refused at start.
//!
//! **Scopes.** The local listener and `role: admin` rules act on every agent (platform
//! scope). A tenant's operator (an ID in the tenant's `admins`) acts on its tenant's agents
//! only: `ListAgents` and `ListTenants` show only them; `InspectAgent`, `DisconnectAgent`
//! and `AgentKubeconfig` of any other agent are refused with `PERMISSION_DENIED` naming the
//! caller's scope, and with the same answer whether the agent exists or not (a tenant
//! operator cannot probe other tenants' agent names); `BlockIdentity` and `UnblockIdentity`
//! take only exact SPIFFE IDs that the tenant's `agents` patterns match (no prefixes, no
//! fingerprints). Refusals are counted (`argocd_principal_auth_failures_total{reason=
//! "OutsideTenant"}`) and logged. Replicas (`argocd-agentctl replicas`) are read from the
//! hub's Leases with Kubernetes RBAC and are no part of this API: platform only.

use argocd_agent_identity::text;
use argocd_agent_identity::text::quoted;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use argocd_agent_domain::mapping::LiveRules;
use argocd_agent_domain::{AdminScope, AgentName};
use argocd_agent_proto::admin::admin_server::{Admin, AdminServer};
use argocd_agent_proto::admin::{
    AgentInfo, AgentKubeconfigRequest, AgentKubeconfigResponse, BlockRequest, BlockResponse,
    DisconnectAgentRequest, DisconnectAgentResponse, InspectAgentRequest, ListAgentsRequest,
    ListAgentsResponse, ListTenantsRequest, ListTenantsResponse,
};
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::auth::Authenticator;
use crate::config::AdminAddress;
use crate::error::PrincipalError;
use crate::metrics::Metrics;
use crate::sessions::{AgentState, Sessions};

mod scope;

/// Who may call the admin API on a listener.
pub enum AdminAccess {
    /// The local admin listener: callers on loopback or the Unix socket.
    Local,
    /// The agent listener: authenticated callers whose SPIFFE ID has an admin rule.
    Rules {
        /// Identifies the caller as for an agent stream (client SVID, JWT-SVID or header).
        auth: Authenticator,
        /// The mapping rules; the caller's SPIFFE ID must match one with `role: admin`.
        rules: Arc<LiveRules>,
    },
}

/// What the calls beyond the agent registry use, shared by both listeners.
pub struct AdminContext {
    /// The rules in force: the tenants (scopes, `ListTenants`, blockable IDs).
    pub rules: Arc<LiveRules>,
    /// The hub's blocklist ConfigMap (`None`: `BlockIdentity` is unavailable).
    pub blocklist: Option<crate::blocklist::BlocklistStore>,
    /// Issues kubeconfigs once the resource proxy has started (unset: it is off).
    pub kubeconfigs: OnceLock<KubeconfigIssuer>,
}

/// Mints resource-proxy tokens for `AgentKubeconfig`.
pub struct KubeconfigIssuer {
    /// The proxy's keys.
    pub keys: Arc<crate::resourceproxy::credentials::ProxyKeys>,
    /// The proxy's configuration (URL, token lifetime).
    pub config: crate::resourceproxy::ResourceProxyConfig,
    /// The CA clients trust the proxy's certificate with (empty: a public one).
    pub ca_pem: tokio::sync::watch::Receiver<String>,
}

/// `Admin` implementation over the hub's agent registry.
pub struct AdminService {
    /// The agents the calls list, inspect and disconnect (and the blocklist callers are
    /// checked against).
    pub sessions: Arc<Sessions>,
    /// Where refused calls are counted (`argocd_principal_auth_failures_total`).
    pub metrics: Metrics,
    /// Who may call on this listener.
    pub access: AdminAccess,
    /// Tenants, the blocklist and kubeconfigs.
    pub context: Arc<AdminContext>,
}

/// An admitted caller: who (for the audit log line) and over what.
struct Caller {
    who: String,
    scope: AdminScope,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.who)
    }
}

fn unix_ms(t: Option<SystemTime>) -> i64 {
    t.and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// What the operator API shows about one agent.
pub fn agent_info(state: &AgentState) -> AgentInfo {
    let identity = state.identity();
    let session = state.session_info();
    AgentInfo {
        name: state.name.to_string(),
        mode: state.mode().to_string(),
        client: identity.client.to_string(),
        rule: identity.rule.clone(),
        namespace: identity.namespace.to_string(),
        connected: state.is_connected(),
        connected_since_unix_ms: unix_ms(session.connected_since),
        remote_address: session
            .remote_addr
            .map(|a| a.to_string())
            .unwrap_or_default(),
        agent_version: session.agent_version,
        last_event_unix_ms: unix_ms(state.last_event()),
        queue_depth: state.queue.len() as u64,
        in_flight: state.queue.in_flight() as u64,
        svid_expiry_unix_ms: unix_ms(session.svid_expiry),
        tenant: identity
            .tenant
            .as_ref()
            .map(|t| t.to_string())
            .unwrap_or_default(),
    }
}

/// Refuses callers that are not local (defence in depth: the listener is loopback already;
/// Unix socket callers carry no TCP address and are local by construction).
fn check_local<T>(request: &Request<T>) -> Result<(), Status> {
    match request.remote_addr() {
        Some(addr) if !addr.ip().is_loopback() => Err(Status::permission_denied(
            "the admin API only answers local callers",
        )),
        _ => Ok(()),
    }
}

impl AdminService {
    /// Checks the caller of `request`; returns who it is and its scope.
    fn authorize<T>(&self, request: &Request<T>, call: &'static str) -> Result<Caller, Status> {
        match &self.access {
            AdminAccess::Local => {
                check_local(request)?;
                Ok(Caller {
                    who: "local".into(),
                    scope: AdminScope::Platform,
                })
            }
            AdminAccess::Rules { auth, rules } => {
                let metrics = &self.metrics;
                let caller = auth.identify(request).map_err(|failure| {
                    metrics.auth_failed(failure.reason);
                    tracing::warn!(call, reason = failure.reason, message = failure.status.message(), peer = %text::or_dash(request.remote_addr()), "admin call refused");
                    failure.status
                })?;
                let client = &caller.client;
                if let Some(why) = self
                    .sessions
                    .blocklist
                    .current()
                    .denies(client, caller.fingerprint())
                {
                    metrics.auth_failed("Blocked");
                    tracing::warn!(call, %client, reason = %why, "admin call refused: identity blocked");
                    return Err(Status::permission_denied(format!(
                        "identity blocked: {why}"
                    )));
                }
                match rules.current().authorize_admin(client) {
                    Ok(grant) => Ok(Caller {
                        who: format!("{client} (rule {}, scope {})", grant.rule, grant.scope),
                        scope: grant.scope,
                    }),
                    Err(denied) => {
                        metrics.auth_failed("NotAdmin");
                        tracing::warn!(call, %client, reason = %denied.reason, "admin call refused");
                        Err(Status::permission_denied(denied.to_string()))
                    }
                }
            }
        }
    }
}

fn agent_name(name: &str) -> Result<AgentName, Status> {
    AgentName::new(name).map_err(|e| {
        Status::invalid_argument(format!(
            "{name} is not a valid agent name: {e}",
            name = quoted(&name)
        ))
    })
}

impl AdminService {
    fn find(&self, name: &str) -> Result<Arc<AgentState>, Status> {
        self.sessions.agent(&agent_name(name)?).ok_or_else(|| {
            Status::not_found(format!(
                "agent {name} is unknown to this principal (it has not connected since the principal started)", name = quoted(&name)
            ))
        })
    }

    /// Counts and logs a tenant operator's call outside its tenant; the refusal to answer.
    fn outside(&self, caller: &Caller, call: &'static str, what: String) -> Status {
        self.metrics.auth_failed(crate::metrics::OUTSIDE_TENANT);
        tracing::warn!(call, caller = %caller, scope = %caller.scope, target = %what,
            "admin call refused: outside the caller's tenant");
        Status::permission_denied(format!(
            "{what} is outside the caller's scope ({}): a tenant's operators act on that tenant's agents only",
            caller.scope
        ))
    }

    /// Adds (`add`) or removes the request's entry in the hub's blocklist ConfigMap.
    async fn edit_blocklist(
        &self,
        caller: &Caller,
        call: &'static str,
        request: &BlockRequest,
        add: bool,
    ) -> Result<Response<BlockResponse>, Status> {
        let (key, entry) = scope::entry(request)?;
        if let Some(what) = scope::outside_scope(&self.context.rules, &caller.scope, key, &entry) {
            return Err(self.outside(caller, call, what));
        }
        let api = self.context.blocklist.as_ref().ok_or_else(|| {
            Status::failed_precondition("this principal cannot write the hub's blocklist")
        })?;
        let changed = crate::blocklist::edit(api, key, &entry, add)
            .await
            .map_err(|e| {
                tracing::warn!(call, caller = %caller, error = %e, "admin: blocklist edit failed");
                Status::unavailable(e.to_string())
            })?;
        tracing::info!(call, caller = %caller, key, entry = %entry, changed, "admin: blocklist edited");
        Ok(Response::new(BlockResponse { changed }))
    }

    /// Agent `name`, if the caller's scope covers it. A tenant operator gets the same
    /// refusal for another tenant's agent as for an unknown one.
    fn find_in_scope(
        &self,
        caller: &Caller,
        call: &'static str,
        name: &str,
    ) -> Result<Arc<AgentState>, Status> {
        let found = match &caller.scope {
            AdminScope::Platform => return self.find(name),
            AdminScope::Tenant(_) => self.sessions.agent(&agent_name(name)?),
        };
        match found {
            Some(state) if caller.scope.covers(state.identity().tenant.as_ref()) => Ok(state),
            _ => Err(self.outside(caller, call, format!("agent {name}", name = quoted(&name)))),
        }
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn list_agents(
        &self,
        request: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        let caller = self.authorize(&request, "ListAgents")?;
        tracing::debug!(%caller, "admin: list agents");
        let mut agents: Vec<AgentInfo> = self
            .sessions
            .agents()
            .iter()
            .filter(|s| caller.scope.covers(s.identity().tenant.as_ref()))
            .map(|s| agent_info(s))
            .collect();
        agents.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(ListAgentsResponse { agents }))
    }

    async fn inspect_agent(
        &self,
        request: Request<InspectAgentRequest>,
    ) -> Result<Response<AgentInfo>, Status> {
        let caller = self.authorize(&request, "InspectAgent")?;
        tracing::debug!(%caller, agent = %request.get_ref().name, "admin: inspect agent");
        let state = self.find_in_scope(&caller, "InspectAgent", &request.get_ref().name)?;
        Ok(Response::new(agent_info(&state)))
    }

    async fn disconnect_agent(
        &self,
        request: Request<DisconnectAgentRequest>,
    ) -> Result<Response<DisconnectAgentResponse>, Status> {
        let caller = self.authorize(&request, "DisconnectAgent")?;
        let state = self.find_in_scope(&caller, "DisconnectAgent", &request.get_ref().name)?;
        let was_connected = self.sessions.disconnect(&state.name);
        tracing::info!(agent = %state.name, was_connected, %caller, "session closed by an operator (admin API)");
        Ok(Response::new(DisconnectAgentResponse { was_connected }))
    }

    async fn block_identity(
        &self,
        request: Request<BlockRequest>,
    ) -> Result<Response<BlockResponse>, Status> {
        let caller = self.authorize(&request, "BlockIdentity")?;
        self.edit_blocklist(&caller, "BlockIdentity", request.get_ref(), true)
            .await
    }

    async fn unblock_identity(
        &self,
        request: Request<BlockRequest>,
    ) -> Result<Response<BlockResponse>, Status> {
        let caller = self.authorize(&request, "UnblockIdentity")?;
        self.edit_blocklist(&caller, "UnblockIdentity", request.get_ref(), false)
            .await
    }

    async fn agent_kubeconfig(
        &self,
        request: Request<AgentKubeconfigRequest>,
    ) -> Result<Response<AgentKubeconfigResponse>, Status> {
        let caller = self.authorize(&request, "AgentKubeconfig")?;
        let state = self.find_in_scope(&caller, "AgentKubeconfig", &request.get_ref().name)?;
        let issuer = self.context.kubeconfigs.get().ok_or_else(|| {
            Status::failed_precondition(
                "the resource proxy is off on this principal (--enable-resource-proxy)",
            )
        })?;
        let tenant = state.identity().tenant;
        let token = issuer.keys.mint_for(
            &state.name,
            tenant.as_ref(),
            issuer.config.token_ttl,
            SystemTime::now(),
        );
        tracing::info!(agent = %state.name, %caller, tenant = %text::or_dash(tenant.as_ref()),
            "admin: resource proxy kubeconfig issued");
        Ok(Response::new(AgentKubeconfigResponse {
            server: issuer.config.agent_url(&state.name),
            token: token.value,
            ca_pem: issuer.ca_pem.borrow().clone(),
            expires_unix_ms: unix_ms(Some(token.expires)),
        }))
    }

    async fn list_tenants(
        &self,
        request: Request<ListTenantsRequest>,
    ) -> Result<Response<ListTenantsResponse>, Status> {
        let caller = self.authorize(&request, "ListTenants")?;
        tracing::debug!(%caller, "admin: list tenants");
        let rules = self.context.rules.current();
        let tenants = rules
            .tenants()
            .iter()
            .filter(|t| caller.scope.covers(Some(&t.name)))
            .map(|t| scope::tenant_info(&self.sessions, t))
            .collect();
        Ok(Response::new(ListTenantsResponse { tenants }))
    }
}

/// Connections to the admin API open at once: a few operators' `argocd-agentctl` calls.
pub const ADMIN_MAX_CONNECTIONS: usize = 64;
/// Of [`ADMIN_MAX_CONNECTIONS`], how many one loopback address may hold (a Unix socket's
/// callers count in the total only).
pub const ADMIN_MAX_CONNECTIONS_PER_CLIENT: usize = 16;

/// How long an admin connection may stay open with no call in progress.
pub const ADMIN_MAX_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

/// The admin listener's caps: [`ADMIN_MAX_CONNECTIONS`], [`ADMIN_MAX_CONNECTIONS_PER_CLIENT`]
/// from one address, each waiting at most 10 s for its HTTP/2 preface (all of them may be
/// waiting: none waits in the kernel's backlog behind silent ones), and closed after
/// [`ADMIN_MAX_IDLE`] without a call. Refusals are counted in
/// `argocd_principal_listener_connections_closed_total{listener="admin"}`.
fn admin_limits(metrics: &Metrics) -> argocd_agent_listener::IncomingOptions {
    let metrics = metrics.clone();
    argocd_agent_listener::IncomingOptions {
        max_handshakes: ADMIN_MAX_CONNECTIONS,
        max_handshakes_per_client: ADMIN_MAX_CONNECTIONS_PER_CLIENT,
        max_connections: ADMIN_MAX_CONNECTIONS,
        max_connections_per_client: ADMIN_MAX_CONNECTIONS_PER_CLIENT,
        // No handshake: the preface is what a connection waits for.
        handshake_timeout: argocd_agent_listener::HANDSHAKE_TIMEOUT,
        preface_timeout: argocd_agent_listener::PREFACE_TIMEOUT,
        on_refused: Some(argocd_agent_listener::RefusedHook(Arc::new(
            move |reason| metrics.listener_closed("admin", reason),
        ))),
        // Operators are served while the principal is not ready too.
        ready: None,
        // An operator's call takes a connection for moments: one left without a call is
        // closed.
        h2: argocd_agent_listener::H2Policy {
            min_ping_interval: std::time::Duration::ZERO,
            max_idle: ADMIN_MAX_IDLE,
        },
        max_handshake_wait: None,
    }
}

/// Binds the admin listener and serves the operator API until `shutdown`. Returns the bound
/// address (`host:port` or `unix://path`).
pub async fn serve(
    address: &AdminAddress,
    sessions: Arc<Sessions>,
    context: Arc<AdminContext>,
    metrics: Metrics,
    tasks: &tokio_util::task::TaskTracker,
    shutdown: CancellationToken,
) -> Result<AdminAddress, PrincipalError> {
    let listen_error = |source| PrincipalError::AdminListen {
        addr: address.to_string(),
        source,
    };
    // Local operators only (loopback or an owner-only socket); still, a call is bounded in
    // time, calls per connection are capped, and dead connections are found by keepalive.
    let router = tonic::transport::Server::builder()
        .timeout(std::time::Duration::from_secs(30))
        .concurrency_limit_per_connection(16)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(10)))
        .add_service(AdminServer::new(AdminService {
            sessions,
            metrics: metrics.clone(),
            access: AdminAccess::Local,
            context,
        }));
    match address {
        AdminAddress::Tcp(addr) => {
            if !addr.ip().is_loopback() {
                return Err(PrincipalError::Config(format!(
                    "--admin-address {addr}: the admin API listens on loopback or a Unix socket only"
                )));
            }
            let listener = TcpListener::bind(addr).await.map_err(listen_error)?;
            let bound = listener.local_addr().map_err(listen_error)?;
            let name = format!("admin API {bound}");
            let incoming = argocd_agent_listener::plain_incoming(
                listener,
                &admin_limits(&metrics),
                &name,
                tasks,
                shutdown.clone(),
            );
            tasks.spawn(async move {
                if let Err(e) = router
                    .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                    .await
                {
                    tracing::error!(error = %e, "admin API stopped");
                }
            });
            Ok(AdminAddress::Tcp(bound))
        }
        AdminAddress::Unix(path) => {
            // A socket left by a previous run would make bind fail.
            if std::fs::symlink_metadata(path)
                .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()))
            {
                let _ = std::fs::remove_file(path);
            }
            let listener = UnixListener::bind(path).map_err(listen_error)?;
            // Owner only: the socket is the whole access control.
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(listen_error)?;
            let name = format!("admin API unix://{}", path.display());
            let incoming = argocd_agent_listener::plain_incoming(
                listener,
                &admin_limits(&metrics),
                &name,
                tasks,
                shutdown.clone(),
            );
            let cleanup = path.clone();
            tasks.spawn(async move {
                if let Err(e) = router
                    .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
                    .await
                {
                    tracing::error!(error = %e, "admin API stopped");
                }
                let _ = std::fs::remove_file(cleanup);
            });
            Ok(address.clone())
        }
    }
}
