//! The principal's errors: why it could not start or stopped, and why an agent's event could
//! not be applied to the hub. Each keeps its cause.

use std::net::SocketAddr;

use argocd_agent_domain::ResourceRef;

/// Why the principal could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum PrincipalError {
    /// The hub's Kubernetes API could not be reached or configured.
    #[error("kubernetes")]
    Kube(#[from] argocd_agent_kubernetes::Error),
    /// The identity mapping rules could not be loaded.
    #[error("identity mapping rules")]
    Rules(#[source] argocd_agent_domain::RuleError),
    /// The principal's own SVID could not be loaded.
    #[error("SVID source")]
    Svid(#[source] argocd_agent_identity::source::SourceError),
    /// The principal has no X.509-SVID to take its JWT audience from.
    #[error("no X.509-SVID to take the JWT-SVID audience from; set --jwt-audience")]
    NoAudience,
    /// The JWT-SVID validator could not start.
    #[error("JWT-SVID validation")]
    Jwt(#[source] argocd_agent_identity::jwt::JwtError),
    /// The rustls server configuration could not be built.
    #[error("TLS configuration")]
    Tls(#[source] argocd_agent_identity::tls::TlsError),
    /// `--auth header:...` does not parse.
    #[error("header authentication")]
    Header(#[source] argocd_agent_mesh::MeshError),
    /// Header authentication refused on this listener (not loopback).
    #[error("header authentication listener")]
    Guard(#[source] argocd_agent_mesh::guard::GuardError),
    /// The configuration is refused (message says why).
    #[error("configuration: {0}")]
    Config(String),
    /// `--allowed-namespaces` or `--label-selector` is refused (printed here, not as a
    /// source).
    #[error("configuration: {0}")]
    Partition(crate::partition::PartitionError),
    /// A listener could not be bound.
    #[error("listener {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The admin listener could not be bound.
    #[error("admin listener {addr}")]
    AdminListen {
        /// The address (`host:port` or `unix://path`).
        addr: String,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("gRPC server")]
    Serve(#[from] tonic::transport::Error),
    /// The server task panicked or was cancelled.
    #[error("server task")]
    Task(#[from] tokio::task::JoinError),
}

/// Why an authorized event from an agent could not be applied to the hub.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The payload is not a Kubernetes object.
    #[error("{resource}: the payload is not a Kubernetes object")]
    NotAnObject {
        /// The object the event names.
        resource: ResourceRef,
        /// Why it does not decode.
        #[source]
        source: serde_json::Error,
    },
    /// A status update for an object the hub does not have.
    #[error("{resource} does not exist on the hub")]
    Missing {
        /// The object.
        resource: ResourceRef,
    },
    /// A command this kind of object does not take (authorization lets none through).
    #[error("{resource}: not something an agent can change on the hub")]
    Unsupported {
        /// The object.
        resource: ResourceRef,
    },
    /// The hub's API server refused the write.
    #[error("hub write failed")]
    Kube(#[from] argocd_agent_kubernetes::Error),
}

impl ApplyError {
    /// Whether the same command may succeed later (the hub's API server failing or
    /// overloaded, a conflicting write): the agent is told to resend it rather than to
    /// drop it.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Kube(e) if e.is_transient())
    }
}

pub use argocd_agent_domain::error_chain as chain;
