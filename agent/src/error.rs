//! The agent's errors: why it could not start, why one connection failed, and why an event
//! from the principal could not be applied. Each keeps its cause.

use argocd_agent_identity::text::quoted;
use std::net::SocketAddr;

use argocd_agent_domain::AgentMode;
use argocd_agent_domain::EventType;

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The spoke's Kubernetes API could not be reached or configured.
    #[error("kubernetes")]
    Kube(#[from] argocd_agent_kubernetes::Error),
    /// The agent's SVID could not be loaded.
    #[error("SVID source")]
    Svid(#[source] argocd_agent_identity::source::SourceError),
    /// The TLS client configuration could not be built.
    #[error("TLS configuration")]
    Tls(#[source] argocd_agent_identity::tls::TlsError),
    /// The JWT-SVID fetcher could not start.
    #[error("JWT-SVID")]
    Jwt(#[source] argocd_agent_identity::jwt::JwtError),
    /// The configuration is refused (message says why).
    #[error("configuration: {0}")]
    Config(String),
    /// A listener could not be bound.
    #[error("listener {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

/// One connection attempt's failure.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// Dialing the principal failed.
    #[error("connect")]
    Connect(#[from] argocd_agent_identity::transport::TransportError),
    /// Dialing through the plaintext sidecar endpoint failed.
    #[error("connect")]
    Channel(#[from] tonic::transport::Error),
    /// No JWT-SVID has been fetched yet.
    #[error("no JWT-SVID yet")]
    NoToken,
    /// The JWT-SVID is not a valid header value.
    #[error("JWT-SVID is not a valid authorization header value")]
    BadToken,
    /// The principal refused or ended the stream.
    #[error("principal refused the stream")]
    Status(#[from] tonic::Status),
    /// The principal broke the protocol.
    #[error("protocol: {0}")]
    Protocol(String),
    /// Our outbound stream closed.
    #[error("stream closed")]
    Closed,
}

impl SessionError {
    /// Whether the dial was refused: no principal listens at the address (see
    /// [`crate::redial::Attempt::Refused`]).
    pub fn is_refused(&self) -> bool {
        match self {
            SessionError::Connect(e) => e.is_refused(),
            SessionError::Channel(e) => argocd_agent_identity::transport::is_refused(e),
            _ => false,
        }
    }
}

/// Why an event from the principal could not be applied on the spoke.
#[derive(Debug, thiserror::Error)]
pub enum SpokeError {
    /// The payload is not a Kubernetes object.
    #[error("the payload is not a Kubernetes object")]
    NotAnObject(#[source] serde_json::Error),
    /// The payload has no `metadata.name`.
    #[error("object has no name")]
    NoName,
    /// The event names an object outside this agent's hub namespace.
    #[error("{0} is not in this agent's hub namespace")]
    WrongNamespace(String),
    /// The payload names another object than the event.
    #[error("payload does not name the event's resource {q0}", q0 = quoted(.0))]
    NameMismatch(String),
    /// This mode does not take this event.
    #[error("{ty} is not accepted by a {mode} agent")]
    NotAccepted {
        /// The event type.
        ty: EventType,
        /// Our mode.
        mode: AgentMode,
    },
    /// A local object of that name is not the principal's and may not be adopted.
    #[error("{0}")]
    AdoptionRefused(String),
    /// Destination-based mapping: the event names an Application in a namespace this agent
    /// does not take (not its Argo CD namespace, not matched by `--allowed-namespaces`).
    #[error(
        "namespace {namespace} is not permitted: not the agent's Argo CD namespace and not matched by --allowed-namespaces ({allowed})"
    )]
    NamespaceNotPermitted {
        /// The refused namespace.
        namespace: String,
        /// The agent's `--allowed-namespaces` patterns.
        allowed: String,
    },
    /// Destination-based mapping: the namespace of a new copy does not exist on the spoke.
    #[error(
        "namespace {0} does not exist on this cluster (create it, or start the agent with --create-namespace)"
    )]
    NamespaceMissing(String),
    /// `--create-namespace`: the namespace could not be created.
    #[error("could not create namespace {namespace}")]
    CreateNamespace {
        /// The namespace.
        namespace: String,
        /// The API server's answer.
        #[source]
        source: Box<argocd_agent_kubernetes::Error>,
    },
    /// The spoke's API server refused the write.
    #[error("spoke write failed")]
    Kube(#[from] argocd_agent_kubernetes::Error),
}
