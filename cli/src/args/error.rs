//! Why flags do not make a configuration ([`ArgError`]), a listen address
//! ([`ListenError`]) or a duration ([`DurationError`]). Messages carry their cause, so no
//! variant has a `source` (a chain would print it twice).

use argocd_agent_identity::text::quoted;

/// A `[host]:port` flag value that is not one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ListenError {
    /// `:port` with a bad port.
    #[error("{}: {cause}", quoted(.addr))]
    Port {
        /// The value.
        addr: String,
        /// Why.
        cause: std::num::ParseIntError,
    },
    /// `host:port` that is not a socket address.
    #[error("{}: {cause}", quoted(.addr))]
    Addr {
        /// The value.
        addr: String,
        /// Why.
        cause: std::net::AddrParseError,
    },
}

/// A duration flag value (`90`, `1m30s`, `500ms`) that is not one.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum DurationError {
    /// A number without a unit after it.
    #[error("invalid duration {}: a unit after every number", quoted(.0))]
    NoUnit(String),
    /// A number that does not parse.
    #[error("invalid duration {}", quoted(.0))]
    Number(String),
    /// A unit other than ms, s, m, h.
    #[error("invalid duration unit in {} (ms, s, m, h)", quoted(.0))]
    Unit(String),
    /// An empty value.
    #[error("invalid duration \"\"")]
    Empty,
}

/// Flags that do not make a configuration.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArgError {
    /// A trust domain in `--root-ca td=path` is invalid.
    #[error("{0}")]
    TrustDomain(argocd_agent_identity::id::IdError),
    /// `--enable-self-cluster-registration` without the resource proxy.
    #[error("--enable-self-cluster-registration needs --enable-resource-proxy")]
    SelfRegistrationNeedsProxy,
    /// A listen address flag is invalid.
    #[error("{flag}: {cause}")]
    Listen {
        /// The flag.
        flag: &'static str,
        /// Why.
        cause: ListenError,
    },
    /// A URL flag that is not `https://`.
    #[error("{flag} {}: must be an https:// URL", quoted(.url))]
    NotHttps {
        /// The flag.
        flag: &'static str,
        /// The value.
        url: String,
    },
    /// The process's TLS profile makes no configuration builder.
    #[error("{0}")]
    TlsProfile(rustls::Error),
    /// A TLS file of the Redis flags is unusable.
    #[error("{0}")]
    RedisTls(argocd_agent_redis::TlsFileError),
    /// The principal refuses its replica configuration.
    #[error(transparent)]
    Ha(#[from] argocd_agent_principal::ha::HaConfigError),
    /// The Redis proxy's pinned replica TLS cannot be built.
    #[error(transparent)]
    PinnedTls(#[from] argocd_agent_principal::redisproxy::PinnedTlsError),
    /// Only one of the Redis proxy's certificate and key.
    #[error("--redis-proxy-tls-cert-path and --redis-proxy-tls-key-path go together")]
    RedisProxyTlsPair,
    /// `--redis-proxy-replica-address` without a port.
    #[error("--redis-proxy-replica-address {}: expected host:port", quoted(.0))]
    ReplicaAddress(String),
    /// `--guard-configmap` names the ConfigMap the hub writes.
    #[error(
        "--guard-configmap {}: the hub writes that ConfigMap; name one it never writes",
        argocd_agent_agent::guard::GPG_KEYS_CONFIGMAP
    )]
    GuardConfigMap,
    /// The guard policy of the flags or the file is invalid.
    #[error("{0}")]
    Guard(argocd_agent_agent::guard::GuardError),
    /// `--guard-file` cannot be read.
    #[error("{origin}: cannot read: {cause}")]
    GuardRead {
        /// `--guard-file <path>`.
        origin: String,
        /// Why.
        cause: std::io::Error,
    },
    /// A `--guard-allowed-destinations` part that is not `field=glob`.
    #[error("--guard-allowed-destinations {}: {} is not field=glob", quoted(.value), quoted(.part))]
    DestinationPart {
        /// The flag value.
        value: String,
        /// The part.
        part: String,
    },
    /// A `--guard-allowed-destinations` field other than server, name, namespace.
    #[error("--guard-allowed-destinations {}: unknown field {} (server, name, namespace)", quoted(.value), quoted(.field))]
    DestinationField {
        /// The flag value.
        value: String,
        /// The field.
        field: String,
    },
    /// `--root-ca` with the Workload API.
    #[error(
        "--root-ca goes with --tls-cert/--tls-key (PEM files): with the Workload API, trust bundles come from SPIRE"
    )]
    RootCaWithoutFiles,
    /// Neither a Workload API socket nor PEM files.
    #[error(
        "no SVID source: set --spiffe-endpoint-socket (or SPIFFE_ENDPOINT_SOCKET) to the Workload API socket, or give PEM files with --tls-cert/--tls-key/--root-ca"
    )]
    NoSvidSource,
}
