//! Why a `ctl` command could not reach the principal or the hub, or read what it asked for.
//! Messages carry their cause, so no variant has a `source` (a chain would print it twice).

use argocd_agent_identity::text::quoted;

/// The hub's Kubernetes API cannot be reached.
#[derive(Debug, thiserror::Error)]
#[error("hub Kubernetes API: {0}")]
pub struct HubClientError(pub argocd_agent_kubernetes::Error);

/// The principal's admin API refused a request.
#[derive(Debug, thiserror::Error)]
#[error("{}", refusal(.what, .status))]
pub struct AdminRefusal {
    /// What was asked (`listing agents`).
    pub what: String,
    /// The answer.
    pub status: tonic::Status,
}

/// The refusal as one line: the message alone when it names what is wrong.
fn refusal(what: &str, s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::NotFound | tonic::Code::InvalidArgument => s.message().to_string(),
        code => format!("{what}: {}: {}", super::agent::code_name(code), s.message()),
    }
}

/// The principal's admin API cannot be reached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// `--principal-spiffe-id` is not a SPIFFE ID.
    #[error("--principal-spiffe-id: {0}")]
    SpiffeId(argocd_agent_identity::id::IdError),
    /// `--principal-trust-domain` is not a trust domain.
    #[error("--principal-trust-domain: {0}")]
    TrustDomain(argocd_agent_identity::id::IdError),
    /// `--principal-address` without a pin.
    #[error(
        "--principal-address needs the principal pinned: set --principal-spiffe-id (or --principal-trust-domain)"
    )]
    Unpinned,
    /// This workload has no SVID.
    #[error("no X.509-SVID for this workload: {0}")]
    NoSvid(argocd_agent_identity::source::SourceError),
    /// The TLS configuration cannot be built.
    #[error("TLS configuration: {0}")]
    Tls(argocd_agent_identity::tls::TlsError),
    /// The principal's agent listener does not answer.
    #[error("cannot reach the principal at {address}: {chain}")]
    Unreachable {
        /// Where.
        address: String,
        /// Why, as the cause's chain.
        chain: String,
    },
    /// The local admin listener does not answer.
    #[error(
        "cannot reach the principal's admin API at {address}: {chain} (is the principal running with --admin-address {address}? from outside the pod use kubectl port-forward)"
    )]
    AdminUnreachable {
        /// Where.
        address: String,
        /// Why, as the cause's chain.
        chain: String,
    },
    /// `--principal-admin-address` with a scheme other than `unix://`.
    #[error("--principal-admin-address {}: expected host:port or unix:///path", quoted(.0))]
    AdminScheme(String),
    /// `--principal-admin-address` is not an address.
    #[error("--principal-admin-address {}: {cause}", quoted(.address))]
    AdminAddress {
        /// The value.
        address: String,
        /// Why.
        cause: tonic::transport::Error,
    },
}

/// An agent's kubeconfig cannot be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KubeconfigError {
    /// The principal's admin API cannot be reached.
    #[error("{0}")]
    Connect(ConnectError),
    /// The principal refused.
    #[error("{0}")]
    Refused(AdminRefusal),
    /// The hub cannot be reached.
    #[error("{0}")]
    Hub(HubClientError),
    /// The cluster secrets cannot be listed.
    #[error("listing cluster secrets in {namespace}: {cause}")]
    List {
        /// The hub namespace.
        namespace: String,
        /// Why.
        cause: kube::Error,
    },
    /// No cluster secret for the agent.
    #[error(
        "no cluster secret for agent {} in namespace {namespace} (is --enable-self-cluster-registration on, and has the agent connected?)",
        quoted(.agent)
    )]
    NoSecret {
        /// The agent.
        agent: String,
        /// The hub namespace.
        namespace: String,
    },
    /// More than one cluster secret for the agent.
    #[error("{count} cluster secrets are labelled for agent {}; expected one", quoted(.agent))]
    ManySecrets {
        /// How many.
        count: usize,
        /// The agent.
        agent: String,
    },
    /// The cluster secret lacks a field.
    #[error("the cluster secret has no {}", quoted(.0))]
    NoField(String),
    /// The cluster secret's `config` is not JSON.
    #[error("the cluster secret's config is not JSON: {0}")]
    ConfigNotJson(serde_json::Error),
    /// The cluster secret's `config` has no token.
    #[error("the cluster secret's config has no bearerToken")]
    NoToken,
    /// The kubeconfig cannot be written as JSON.
    #[error("{0}")]
    Render(serde_json::Error),
}
