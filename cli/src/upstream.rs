//! Upstream argocd-agent's configuration names (flags, environment variables and, through
//! upstream's Deployments, `argocd-agent-params` keys) on our binaries.
//!
//! [`SETTINGS`] lists every flag of upstream's `argocd-agent principal` and `argocd-agent
//! agent` with what it is here: the same flag, an alias of ours, translated into ours, not
//! needed, or refused (a feature we do not have, named with our equivalent). [`command`]
//! adds upstream's names to our clap definitions; [`try_parse_from`] parses and then applies
//! the table's rules, so no upstream setting is silently dropped. docs/migration.md
//! ("Configuration") is the same table for people.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches};

use crate::args::{AgentArgs, Cli, Command, PrincipalArgs, TlsVersionArgs};

/// Which binary role a setting belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `argocd-agent principal`.
    Principal,
    /// `argocd-agent agent`.
    Agent,
}

impl Role {
    /// The subcommand's name.
    pub fn name(self) -> &'static str {
        match self {
            Role::Principal => "principal",
            Role::Agent => "agent",
        }
    }
}

/// What an upstream setting is here.
#[derive(Clone, Copy, Debug)]
pub enum Ours {
    /// Our flag (clap id given) has upstream's flag name and environment variable.
    Same(&'static str),
    /// Our flag (clap id given) under another name or variable: upstream's are aliases.
    Alias(&'static str),
    /// Read under upstream's names and translated into our settings (the text says how).
    Translated(&'static str),
    /// Accepted; no effect here (a warning at start when set to anything but the default).
    NotNeeded(&'static str),
    /// A feature we do not have: refused at start unless empty or upstream's default
    /// (then a warning), with this text naming our equivalent.
    Refused(&'static str),
}

/// One upstream flag.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// Principal or agent.
    pub role: Role,
    /// Upstream's flag, without `--`.
    pub flag: &'static str,
    /// Upstream's environment variable.
    pub env: Option<&'static str>,
    /// The `argocd-agent-params` key upstream's Deployment maps to `env`.
    pub key: Option<&'static str>,
    /// Upstream's default, as text (`true`/`false` for booleans).
    pub default: &'static str,
    /// What it is here.
    pub ours: Ours,
}

impl Setting {
    /// Whether upstream's flag is a boolean.
    pub fn boolean(&self) -> bool {
        matches!(self.default, "true" | "false")
    }
}

const fn s(
    role: Role,
    flag: &'static str,
    env: Option<&'static str>,
    key: Option<&'static str>,
    default: &'static str,
    ours: Ours,
) -> Setting {
    Setting {
        role,
        flag,
        env,
        key,
        default,
        ours,
    }
}

use Ours::{Alias, NotNeeded, Refused, Same, Translated};
use Role::{Agent as A, Principal as P};

const TLS_SVID: &str = "TLS comes from SPIFFE X.509-SVIDs here (the SPIRE Workload API, \
    --spiffe-endpoint-socket, or PEM files: --tls-cert/--tls-key/--root-ca)";
const NO_GENERATE: &str = "no generated certificates: for development, run a Workload API \
    (argocd-agent-dev demo) or give an SVID as PEM files (--tls-cert/--tls-key/--root-ca)";
const JWT: &str = "the principal issues no tokens here: agents authenticate with their \
    X.509-SVID on every connection (or a JWT-SVID from SPIRE: --auth jwt-svid)";
const RP_TLS: &str = "the resource proxy serves the principal's SVID or a certificate the \
    principal issues (--resource-proxy-tls svid|issued|auto) and authenticates argocd-server \
    with per-agent tokens in the cluster Secrets";
const PPROF: &str = "no pprof endpoint: use /metrics, tracing (--otlp-address) and \
    --log-level debug";
const FULL_DETAIL: &str = "no full-detail categories: use --log-level with tracing \
    directives (e.g. argocd_agent_principal=debug) or RUST_LOG";
const HA: &str = "replicas here are active-active in one Deployment, coordinated through \
    Leases (--ha, --replica-id; docs/ha.md): there is no primary/replica pair";
const CREDS_DIR: &str = "give the password with REDIS_PASSWORD (the `auth` key of Argo CD's \
    argocd-redis Secret, as secretKeyRef) instead of a credentials directory";
const REDIS_TLS: &str = "with redis TLS on, give file paths (Secrets are not read): see the \
    redis TLS rows in docs/migration.md";

/// Every flag of upstream's `argocd-agent principal` and `argocd-agent agent`
/// (cmd/argocd-agent/principal.go and agent.go) and what it is here.
#[rustfmt::skip]
pub const SETTINGS: &[Setting] = &[
    // ---- principal ----
    s(P, "listen-host", Some("ARGOCD_PRINCIPAL_LISTEN_HOST"), Some("principal.listen.host"), "", Same("listen_host")),
    s(P, "listen-port", Some("ARGOCD_PRINCIPAL_LISTEN_PORT"), Some("principal.listen.port"), "8443", Same("listen_port")),
    s(P, "log-level", Some("ARGOCD_PRINCIPAL_LOG_LEVEL"), Some("principal.log.level"), "info", Same("log_level")),
    s(P, "log-format", Some("ARGOCD_PRINCIPAL_LOG_FORMAT"), Some("principal.log.format"), "text", Same("log_format")),
    s(P, "full-detail", Some("ARGOCD_PRINCIPAL_FULL_DETAIL"), None, "", Refused(FULL_DETAIL)),
    s(P, "metrics-port", Some("ARGOCD_PRINCIPAL_METRICS_PORT"), Some("principal.metrics.port"), "8000", Same("metrics_port")),
    s(P, "namespace", Some("ARGOCD_PRINCIPAL_NAMESPACE"), Some("principal.namespace"), "", Same("namespace")),
    s(P, "allowed-namespaces", Some("ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES"), Some("principal.allowed-namespaces"), "", Same("allowed_namespaces")),
    s(P, "namespace-create-enable", Some("ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE"), Some("principal.namespace-create.enable"), "false", Same("namespace_create_enable")),
    s(P, "namespace-create-pattern", Some("ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN"), Some("principal.namespace-create.pattern"), "",
        Refused("namespaces are created for mapped agents only; restrict which agents map (and so which namespaces exist) with identity rules (docs/identity.md)")),
    s(P, "namespace-create-labels", Some("ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS"), Some("principal.namespace-create.labels"), "", Alias("namespace_create_label")),
    s(P, "tls-secret-name", Some("ARGOCD_PRINCIPAL_TLS_SECRET_NAME"), Some("principal.tls.secret-name"), "argocd-agent-principal-tls", Refused(TLS_SVID)),
    s(P, "tls-cert", Some("ARGOCD_PRINCIPAL_TLS_SERVER_CERT_PATH"), Some("principal.tls.server.cert-path"), "", Alias("tls_cert")),
    s(P, "tls-key", Some("ARGOCD_PRINCIPAL_TLS_SERVER_KEY_PATH"), Some("principal.tls.server.key-path"), "", Alias("tls_key")),
    s(P, "insecure-tls-generate", Some("ARGOCD_PRINCIPAL_TLS_SERVER_ALLOW_GENERATE"), Some("principal.tls.server.allow-generate"), "false", Refused(NO_GENERATE)),
    s(P, "insecure-plaintext", Some("ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT"), Some("principal.tls.insecure-plaintext"), "false",
        Translated("true only with --auth header:… (header auth is plaintext from the local sidecar); refused otherwise")),
    s(P, "tls-ca-secret-name", Some("ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME"), Some("principal.tls.server.root-ca-secret-name"), "argocd-agent-ca", Refused(TLS_SVID)),
    s(P, "root-ca-path", Some("ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_PATH"), Some("principal.tls.server.root-ca-path"), "", Alias("root_ca")),
    s(P, "require-client-certs", Some("ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_REQUIRE"), Some("principal.tls.client-cert.require"), "false",
        NotNeeded("with SVID mTLS (--auth spiffe or mtls:uri:…) client certificates are always required")),
    s(P, "client-cert-subject-match", Some("ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_MATCH_SUBJECT"), Some("principal.tls.client-cert.match-subject"), "false",
        Refused("agents are identified by the SPIFFE ID in their SVID, mapped to names by identity rules (docs/identity.md), not by certificate subjects")),
    s(P, "tls-min-version", Some("ARGOCD_PRINCIPAL_TLS_MIN_VERSION"), Some("principal.tls.min-version"), "tls1.3", Alias("tls_min_version")),
    s(P, "tls-max-version", Some("ARGOCD_PRINCIPAL_TLS_MAX_VERSION"), Some("principal.tls.max-version"), "", Alias("tls_max_version")),
    s(P, "tls-ciphersuites", Some("ARGOCD_PRINCIPAL_TLS_CIPHERSUITES"), Some("principal.tls.ciphersuites"), "", Alias("tls_ciphersuites")),
    s(P, "resource-proxy-secret-name", Some("ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME"), Some("principal.resource-proxy.secret-name"), "argocd-agent-resource-proxy-tls", Refused(RP_TLS)),
    s(P, "resource-proxy-cert-path", Some("ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT_PATH"), Some("principal.resource-proxy.tls.cert-path"), "", Refused(RP_TLS)),
    s(P, "resource-proxy-key-path", Some("ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_KEY_PATH"), Some("principal.resource-proxy.tls.key-path"), "", Refused(RP_TLS)),
    s(P, "resource-proxy-ca-secret-name", Some("ARGOCD_PRINCIPAL_RESOURCE_PROXY_CA_SECRET_NAME"), Some("principal.resource-proxy.ca.secret-name"), "argocd-agent-ca", Refused(RP_TLS)),
    s(P, "resource-proxy-ca-path", Some("ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CA_PATH"), Some("principal.resource-proxy.ca.path"), "", Refused(RP_TLS)),
    s(P, "jwt-secret-name", Some("ARGOCD_PRINCIPAL_JWT_SECRET_NAME"), Some("principal.jwt.secret-name"), "argocd-agent-jwt", Refused(JWT)),
    s(P, "jwt-key", Some("ARGOCD_PRINCIPAL_JWT_KEY_PATH"), Some("principal.jwt.key-path"), "", Refused(JWT)),
    s(P, "insecure-jwt-generate", Some("ARGOCD_PRINCIPAL_JWT_ALLOW_GENERATE"), Some("principal.jwt.allow-generate"), "false", Refused(JWT)),
    s(P, "auth", Some("ARGOCD_PRINCIPAL_AUTH"), Some("principal.auth"), "", Same("auth")),
    s(P, "enable-websocket", Some("ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET"), Some("principal.websocket.enable"), "false", Same("enable_websocket")),
    s(P, "enable-resource-proxy", Some("ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY"), Some("principal.resource-proxy.enable"), "true", Same("enable_resource_proxy")),
    s(P, "resource-proxy-address", Some("ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS"), None, "argocd-agent-resource-proxy:9090", Same("resource_proxy_address")),
    s(P, "keepalive-min-interval", Some("ARGOCD_PRINCIPAL_KEEP_ALIVE_MIN_INTERVAL"), Some("principal.keep-alive.min-interval"), "0", Same("keepalive_min_interval")),
    s(P, "redis-server-address", Some("ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS"), Some("principal.redis.server.address"), "argocd-redis:6379", Same("redis_server_address")),
    s(P, "redis-password", Some("REDIS_PASSWORD"), None, "", Alias("redis_password")),
    s(P, "redis-creds-dir-path", Some("REDIS_CREDS_DIR_PATH"), None, "", Refused(CREDS_DIR)),
    s(P, "disable-redis-proxy", Some("ARGOCD_PRINCIPAL_DISABLE_REDIS_PROXY"), None, "false", Same("disable_redis_proxy")),
    s(P, "redis-compression-type", Some("ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE"), Some("principal.redis.compression.type"), "gzip", Same("redis_compression_type")),
    s(P, "pprof-port", Some("ARGOCD_PRINCIPAL_PPROF_PORT"), Some("principal.pprof.port"), "0", Refused(PPROF)),
    s(P, "healthz-port", Some("ARGOCD_PRINCIPAL_HEALTH_CHECK_PORT"), Some("principal.healthz.port"), "8003", Same("healthz_port")),
    s(P, "grpc-max-message-size", Some("ARGOCD_PRINCIPAL_GRPC_MAX_MESSAGE_SIZE"), None, "209715200", Alias("max_message_size")),
    s(P, "event-processors", Some("ARGOCD_PRINCIPAL_EVENT_PROCESSORS"), Some("principal.event-processors"), "10",
        NotNeeded("each agent's events are applied in order by its own session; there is no shared pool to size (see --max-in-flight, --agent-event-rate)")),
    s(P, "otlp-address", Some("ARGOCD_PRINCIPAL_OTLP_ADDRESS"), None, "", Same("otlp_address")),
    s(P, "otlp-insecure", Some("ARGOCD_PRINCIPAL_OTLP_INSECURE"), None, "false", Same("otlp_insecure")),
    s(P, "redis-tls-enabled", Some("ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED"), Some("principal.redis.tls.enabled"), "false",
        Translated("true: the paths below become --redis-proxy-tls-cert-path/--redis-proxy-tls-key-path and --redis-server-tls-ca-path; false: they are not read (as upstream)")),
    s(P, "redis-proxy-server-tls-cert", Some("ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT_PATH"), Some("principal.redis.proxy.server.tls.cert-path"), "", Translated("--redis-proxy-tls-cert-path when redis TLS is on")),
    s(P, "redis-proxy-server-tls-key", Some("ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY_PATH"), Some("principal.redis.proxy.server.tls.key-path"), "", Translated("--redis-proxy-tls-key-path when redis TLS is on")),
    s(P, "redis-proxy-server-tls-secret-name", Some("ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_SECRET_NAME"), Some("principal.redis.proxy.server.tls.secret-name"), "argocd-redis-proxy-tls", Translated(REDIS_TLS)),
    s(P, "redis-ca-path", Some("ARGOCD_PRINCIPAL_REDIS_CA_PATH"), Some("principal.redis.ca-path"), "", Translated("--redis-server-tls-ca-path when redis TLS is on")),
    s(P, "redis-ca-secret-name", Some("ARGOCD_PRINCIPAL_REDIS_CA_SECRET_NAME"), Some("principal.redis.ca-secret-name"), "argocd-redis-tls", Translated(REDIS_TLS)),
    s(P, "redis-tls-insecure", Some("ARGOCD_PRINCIPAL_REDIS_TLS_INSECURE"), Some("principal.redis.tls.insecure"), "false",
        Refused("the hub Redis's certificate is always verified: give its CA with --redis-server-tls-ca-path (upstream: --redis-ca-path)")),
    s(P, "destination-based-mapping", Some("ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING"), Some("principal.destination-based-mapping"), "false", Same("destination_based_mapping")),
    s(P, "label-selector", Some("ARGOCD_PRINCIPAL_LABEL_SELECTOR"), Some("principal.label-selector"), "", Same("label_selector")),
    s(P, "kubeconfig", None, None, "", Same("kubeconfig")),
    s(P, "kubecontext", None, None, "", Alias("kube_context")),
    s(P, "enable-self-cluster-registration", Some("ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION"), None, "false", Same("enable_self_cluster_registration")),
    s(P, "self-registration-client-cert-secret", Some("ARGOCD_PRINCIPAL_SELF_REGISTRATION_CLIENT_CERT_SECRET"), None, "",
        Refused("self-registered cluster Secrets carry a per-agent bearer token for the resource proxy, not a shared client certificate")),
    s(P, "ha-enabled", Some("ARGOCD_PRINCIPAL_HA_ENABLED"), None, "false", Refused(HA)),
    s(P, "ha-preferred-role", Some("ARGOCD_PRINCIPAL_HA_PREFERRED_ROLE"), None, "primary", Refused(HA)),
    s(P, "ha-peer-address", Some("ARGOCD_PRINCIPAL_HA_PEER_ADDRESS"), None, "", Refused(HA)),
    s(P, "ha-failover-timeout", Some("ARGOCD_PRINCIPAL_HA_FAILOVER_TIMEOUT"), None, "30s", Refused(HA)),
    s(P, "ha-admin-port", Some("ARGOCD_PRINCIPAL_HA_ADMIN_PORT"), None, "0", Refused(HA)),
    s(P, "ha-allowed-replication-clients", Some("ARGOCD_PRINCIPAL_HA_ALLOWED_REPLICATION_CLIENTS"), None, "", Refused(HA)),
    s(P, "ha-replication-initial-ack-timeout", Some("ARGOCD_PRINCIPAL_HA_REPLICATION_INITIAL_ACK_TIMEOUT"), None, "0", Refused(HA)),
    // ---- agent ----
    s(A, "server-address", Some("ARGOCD_AGENT_REMOTE_SERVER"), Some("agent.server.address"), "", Same("server_address")),
    s(A, "server-port", Some("ARGOCD_AGENT_REMOTE_PORT"), Some("agent.server.port"), "443", Same("server_port")),
    s(A, "log-level", Some("ARGOCD_AGENT_LOG_LEVEL"), Some("agent.log.level"), "info", Same("log_level")),
    s(A, "full-detail", Some("ARGOCD_AGENT_FULL_DETAIL"), None, "", Refused(FULL_DETAIL)),
    s(A, "redis-addr", Some("REDIS_ADDR"), Some("agent.redis.address"), "argocd-redis:6379", Alias("redis_addr")),
    s(A, "redis-creds-dir-path", Some("REDIS_CREDS_DIR_PATH"), None, "", Refused(CREDS_DIR)),
    s(A, "redis-username", Some("REDIS_USERNAME"), None, "", Alias("redis_username")),
    s(A, "redis-password", Some("REDIS_PASSWORD"), None, "", Alias("redis_password")),
    s(A, "redis-tls-enabled", Some("ARGOCD_AGENT_REDIS_TLS_ENABLED"), Some("agent.redis.tls.enabled"), "false",
        Translated("false: --redis-tls-ca-path is not read (as upstream); true: --redis-tls-ca-path is required (Secrets are not read); unset: TLS is on when --redis-tls-ca-path is given")),
    s(A, "redis-tls-ca-path", Some("ARGOCD_AGENT_REDIS_TLS_CA_PATH"), Some("agent.redis.tls.ca-path"), "", Same("redis_tls_ca_path")),
    s(A, "redis-tls-ca-secret-name", Some("ARGOCD_AGENT_REDIS_TLS_CA_SECRET_NAME"), None, "argocd-redis-tls", Translated(REDIS_TLS)),
    s(A, "redis-tls-insecure", Some("ARGOCD_AGENT_REDIS_TLS_INSECURE"), Some("agent.redis.tls.insecure"), "false",
        Refused("the local Redis's certificate is always verified: give its CA with --redis-tls-ca-path")),
    s(A, "log-format", Some("ARGOCD_AGENT_LOG_FORMAT"), Some("agent.log.format"), "text", Same("log_format")),
    s(A, "insecure-tls", Some("ARGOCD_AGENT_TLS_INSECURE"), Some("agent.tls.client.insecure"), "false",
        Refused("the principal's SVID is always verified against the SPIFFE trust bundle; pin it with --principal-spiffe-id or --principal-trust-domain")),
    s(A, "insecure-plaintext", Some("ARGOCD_AGENT_INSECURE_PLAINTEXT"), Some("agent.tls.insecure-plaintext"), "false",
        Translated("true only with --creds header: (plaintext to the local mesh sidecar); refused otherwise")),
    s(A, "namespace", Some("ARGOCD_AGENT_NAMESPACE"), Some("agent.namespace"), "argocd", Same("namespace")),
    s(A, "agent-mode", Some("ARGOCD_AGENT_MODE"), Some("agent.mode"), "autonomous", Same("agent_mode")),
    s(A, "creds", Some("ARGOCD_AGENT_CREDS"), Some("agent.creds"), "", Same("creds")),
    s(A, "root-ca-secret-name", Some("ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME"), Some("agent.tls.root-ca-secret-name"), "argocd-agent-ca", Refused(TLS_SVID)),
    s(A, "root-ca-path", Some("ARGOCD_AGENT_TLS_ROOT_CA_PATH"), Some("agent.tls.root-ca-path"), "", Alias("root_ca")),
    s(A, "tls-secret-name", Some("ARGOCD_AGENT_TLS_SECRET_NAME"), Some("agent.tls.secret-name"), "argocd-agent-client-tls", Refused(TLS_SVID)),
    s(A, "tls-client-cert", Some("ARGOCD_AGENT_TLS_CLIENT_CERT_PATH"), Some("agent.tls.client.cert-path"), "", Alias("tls_cert")),
    s(A, "tls-client-key", Some("ARGOCD_AGENT_TLS_CLIENT_KEY_PATH"), Some("agent.tls.client.key-path"), "", Alias("tls_key")),
    s(A, "tls-min-version", Some("ARGOCD_AGENT_TLS_MIN_VERSION"), Some("agent.tls.min-version"), "", Alias("tls_min_version")),
    s(A, "tls-max-version", Some("ARGOCD_AGENT_TLS_MAX_VERSION"), Some("agent.tls.max-version"), "", Alias("tls_max_version")),
    s(A, "tls-ciphersuites", Some("ARGOCD_AGENT_TLS_CIPHERSUITES"), Some("agent.tls.ciphersuites"), "", Alias("tls_ciphersuites")),
    s(A, "enable-websocket", Some("ARGOCD_AGENT_ENABLE_WEBSOCKET"), Some("agent.websocket.enable"), "false", Same("enable_websocket")),
    s(A, "metrics-port", Some("ARGOCD_AGENT_METRICS_PORT"), Some("agent.metrics.port"), "8181", Same("metrics_port")),
    s(A, "healthz-port", Some("ARGOCD_AGENT_HEALTH_CHECK_PORT"), Some("agent.healthz.port"), "8001", Same("healthz_port")),
    s(A, "keep-alive-ping-interval", Some("ARGOCD_AGENT_KEEP_ALIVE_PING_INTERVAL"), Some("agent.keep-alive.interval"), "0", Same("keep_alive_ping_interval")),
    s(A, "enable-compression", Some("ARGOCD_AGENT_ENABLE_COMPRESSION"), Some("agent.compression.enable"), "false", Same("enable_compression")),
    s(A, "pprof-port", Some("ARGOCD_AGENT_PPROF_PORT"), Some("agent.pprof.port"), "0", Refused(PPROF)),
    s(A, "enable-resource-proxy", Some("ARGOCD_AGENT_ENABLE_RESOURCE_PROXY"), Some("agent.resource-proxy.enable"), "true",
        Translated("false is --disable-resource-proxy")),
    s(A, "cache-refresh-interval", Some("ARGOCD_AGENT_CACHE_REFRESH_INTERVAL"), None, "10s", Same("cache_refresh_interval")),
    s(A, "informer-sync-timeout", Some("ARGOCD_AGENT_INFORMER_SYNC_TIMEOUT"), Some("agent.informer-sync-timeout"), "10s",
        NotNeeded("the agent is not ready until its watches have listed (/readyz); there is no start-up deadline")),
    s(A, "buffer-informer-event-interval", Some("ARGOCD_AGENT_BUFFER_INFORMER_EVENT_INTERVAL"), None, "0",
        Refused("Application updates are sent as they happen; a burst of updates to one Application is coalesced in the agent's send queue")),
    s(A, "heartbeat-interval", Some("ARGOCD_AGENT_HEARTBEAT_INTERVAL"), None, "0", Same("heartbeat_interval")),
    s(A, "grpc-max-message-size", Some("ARGOCD_AGENT_GRPC_MAX_MESSAGE_SIZE"), None, "209715200", Alias("max_message_size")),
    s(A, "otlp-address", Some("ARGOCD_AGENT_OTLP_ADDRESS"), None, "", Same("otlp_address")),
    s(A, "otlp-insecure", Some("ARGOCD_AGENT_OTLP_INSECURE"), None, "false", Same("otlp_insecure")),
    s(A, "destination-based-mapping", Some("ARGOCD_AGENT_DESTINATION_BASED_MAPPING"), Some("agent.destination-based-mapping"), "false", Same("destination_based_mapping")),
    s(A, "create-namespace", Some("ARGOCD_AGENT_CREATE_NAMESPACE"), Some("agent.create-namespace"), "false", Same("create_namespace")),
    s(A, "ignore-unmanaged-apps", Some("ARGOCD_AGENT_IGNORE_UNMANAGED_APPS"), None, "false", Same("ignore_unmanaged_apps")),
    s(A, "source-uid-mismatch-policy", Some("ARGOCD_AGENT_SOURCE_UID_MISMATCH_POLICY"), None, "recreate", Same("source_uid_mismatch_policy")),
    s(A, "on-application-recreate", Some("ARGOCD_AGENT_ON_APPLICATION_RECREATE"), None, "ignore", Same("on_application_recreate")),
    s(A, "allowed-namespaces", Some("ARGOCD_AGENT_ALLOWED_NAMESPACES"), Some("agent.allowed-namespaces"), "", Same("allowed_namespaces")),
    s(A, "label-selector", Some("ARGOCD_AGENT_LABEL_SELECTOR"), Some("agent.label-selector"), "", Same("label_selector")),
    s(A, "adoption-policy", Some("ARGOCD_AGENT_ADOPTION_POLICY"), None, "always", Same("adoption_policy")),
    s(A, "kubeconfig", None, None, "", Same("kubeconfig")),
    s(A, "kubecontext", None, None, "", Alias("kube_context")),
];

/// A lookup of environment variables (the process's, or a Deployment's for `validate`).
pub type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process's environment.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The clap id of a hidden upstream flag: the flag itself (ours are snake_case field names).
fn hidden_id(flag: &'static str) -> &'static str {
    flag
}

/// Our command line plus upstream's names: aliases on our flags, upstream's environment
/// variables where ours are unset, hidden flags for the settings we translate or refuse.
/// Environment variables set to the empty string count as unset (upstream's manifests
/// leave many keys empty).
pub fn command(env: Env<'_>) -> clap::Command {
    let mut cmd = Cli::command();
    for role in [Role::Principal, Role::Agent] {
        cmd = cmd.mut_subcommand(role.name(), |sub| adapt(sub, role, env));
    }
    cmd
}

fn adapt(mut sub: clap::Command, role: Role, env: Env<'_>) -> clap::Command {
    sub = sub.after_help(upstream_help(role));
    for s in SETTINGS.iter().filter(|s| s.role == role) {
        sub = match s.ours {
            Same(id) | Alias(id) => sub.mut_arg(id, |a| upstream_names(a, s, env)),
            Translated(_) | NotNeeded(_) | Refused(_) => sub.arg(hidden_arg(s, env)),
        };
    }
    let empty: Vec<String> = sub
        .get_arguments()
        .filter(|a| {
            a.get_env()
                .and_then(|e| e.to_str())
                .is_some_and(|e| env(e).is_some_and(|v| v.trim().is_empty()))
        })
        .map(|a| a.get_id().to_string())
        .collect();
    for id in empty {
        sub = sub.mut_arg(id, |a| a.env(None::<&str>));
    }
    // Every boolean takes `--flag=false` too (`--flag` alone is still true), ours as upstream's.
    let switches: Vec<String> = sub
        .get_arguments()
        .filter(|a| matches!(a.get_action(), ArgAction::SetTrue))
        .map(|a| a.get_id().to_string())
        .collect();
    for id in switches {
        sub = sub.mut_arg(id, |a| boolean(a.default_value("false")));
    }
    sub
}

/// The help's note on upstream's names, with every upstream variable (those of refused
/// settings included: they are read, to be refused).
fn upstream_help(role: Role) -> String {
    let mut vars: Vec<&str> = SETTINGS
        .iter()
        .filter(|s| s.role == role)
        .filter_map(|s| s.env)
        .collect();
    vars.sort_unstable();
    vars.dedup();
    let list: Vec<String> = vars
        .iter()
        .map(|v| format!("[upstream env: {v}]"))
        .collect();
    format!(
        "Upstream argocd-agent's flags and environment variables are accepted too: the same, \
         an alias of ours, or refused at start with our equivalent (docs/migration.md, \
         \"Configuration\"). Upstream's variables, read when ours are unset: {}",
        list.join(" ")
    )
}

fn upstream_names(mut a: Arg, s: &Setting, env: Env<'_>) -> Arg {
    if a.get_long() != Some(s.flag) && !a.get_all_aliases().unwrap_or_default().contains(&s.flag) {
        a = a.visible_alias(s.flag);
    }
    if s.flag == "namespace" && a.get_short().is_none() {
        a = a.visible_short_alias('n');
    }
    if let Some(up) = s.env {
        let ours = a.get_env().and_then(|e| e.to_str()).map(str::to_owned);
        let ours_set = ours
            .as_deref()
            .and_then(env)
            .is_some_and(|v| !v.trim().is_empty());
        if ours.as_deref() != Some(up) && !ours_set && env(up).is_some() {
            a = a.env(up);
        }
    }
    if matches!(a.get_action(), ArgAction::SetTrue) {
        // Upstream's booleans take `--flag=false` too.
        a = boolean(a.default_value("false"));
    }
    a
}

fn boolean(a: Arg) -> Arg {
    a.action(ArgAction::Set)
        .num_args(0..=1)
        .require_equals(true)
        .default_missing_value("true")
        .ignore_case(true)
        .value_parser(crate::args::boolean_values())
}

fn hidden_arg(s: &Setting, env: Env<'_>) -> Arg {
    let mut a = Arg::new(hidden_id(s.flag)).long(s.flag).hide(true);
    a = if s.boolean() {
        boolean(a)
    } else {
        a.action(ArgAction::Set)
            .num_args(1)
            .value_parser(clap::value_parser!(String))
    };
    if let Some(e) = s.env
        && env(e).is_some_and(|v| !v.trim().is_empty())
    {
        a = a.env(e);
    }
    a
}

/// A command line parsed with upstream's names.
#[derive(Debug)]
pub struct Parsed {
    /// Our command line.
    pub cli: Cli,
    /// Upstream settings accepted with a remark (log them once logging is up).
    pub notices: Vec<String>,
}

/// Why a command line was not accepted.
#[derive(Debug)]
pub enum ParseError {
    /// Not a valid command line (clap's own error: usage, help, version).
    Clap(clap::Error),
    /// Upstream settings whose feature we do not have, one message each.
    Refused(Vec<String>),
}

/// Parses `argv` (with the environment `env`) with upstream's names and applies the
/// table's rules: translations, warnings, refusals.
pub fn try_parse_from<I, T>(argv: I, env: Env<'_>) -> Result<Parsed, ParseError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let matches = command(env)
        .try_get_matches_from(argv)
        .map_err(ParseError::Clap)?;
    let mut cli = Cli::from_arg_matches(&matches).map_err(ParseError::Clap)?;
    let mut rules = Rules::default();
    if let Some((_, sub)) = matches.subcommand() {
        match &mut cli.command {
            Command::Principal(p) => {
                rules.generic(Role::Principal, sub);
                rules.principal(sub, p);
            }
            Command::Agent(a) => {
                rules.generic(Role::Agent, sub);
                rules.agent(sub, a);
            }
        }
    }
    if rules.refused.is_empty() {
        Ok(Parsed {
            cli,
            notices: rules.notices,
        })
    } else {
        Err(ParseError::Refused(rules.refused))
    }
}

/// [`try_parse_from`] on the process's arguments and environment; prints the error and
/// exits on failure.
pub fn parse() -> Parsed {
    match try_parse_from(std::env::args_os(), &process_env) {
        Ok(p) => p,
        Err(ParseError::Clap(e)) => e.exit(),
        Err(ParseError::Refused(list)) => {
            for m in &list {
                eprintln!("error: {m}");
            }
            std::process::exit(1);
        }
    }
}

fn setting(role: Role, flag: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.role == role && s.flag == flag)
        .unwrap_or_else(|| panic!("no upstream setting {flag} for the {}", role.name()))
}

/// A value given for a hidden upstream flag, with where it came from.
struct Given {
    value: String,
    origin: String,
}

fn given(role: Role, sub: &ArgMatches, flag: &str) -> Option<Given> {
    let s = setting(role, flag);
    let id = hidden_id(s.flag);
    let origin = match sub.value_source(id)? {
        ValueSource::CommandLine => format!("--{flag}"),
        ValueSource::EnvVariable => match (s.key, s.env) {
            (Some(k), Some(e)) => format!("{e} (params key {k})"),
            (None, Some(e)) => e.to_string(),
            _ => format!("--{flag}"),
        },
        _ => return None,
    };
    let value = if s.boolean() {
        sub.get_one::<bool>(id)?.to_string()
    } else {
        sub.get_one::<String>(id)?.clone()
    };
    Some(Given { value, origin })
}

fn given_bool(role: Role, sub: &ArgMatches, flag: &str) -> Option<bool> {
    given(role, sub, flag).map(|g| g.value == "true")
}

fn given_path(role: Role, sub: &ArgMatches, flag: &str) -> Option<PathBuf> {
    given(role, sub, flag)
        .map(|g| g.value)
        .filter(|v| !v.trim().is_empty())
        .map(PathBuf::from)
}

/// Whether a value asks for nothing upstream's default does not: empty, the default, or
/// (booleans) false.
fn inert(s: &Setting, value: &str) -> bool {
    let v = value.trim();
    v.is_empty() || v == s.default || (s.boolean() && v == "false")
}

/// A default that names something (a Secret, a version), worth a warning when given.
fn meaningful_default(s: &Setting) -> bool {
    !matches!(s.default, "" | "false" | "0")
}

const SEE: &str = "see docs/migration.md";

#[derive(Default)]
struct Rules {
    notices: Vec<String>,
    refused: Vec<String>,
}

impl Rules {
    fn refuse(&mut self, g: &Given, why: &str) {
        self.refused
            .push(format!("{}={}: {why}; {SEE}", g.origin, g.value));
    }

    /// Refused and not-needed settings.
    fn generic(&mut self, role: Role, sub: &ArgMatches) {
        for s in SETTINGS.iter().filter(|s| s.role == role) {
            let (Refused(why) | NotNeeded(why)) = s.ours else {
                continue;
            };
            let Some(g) = given(role, sub, s.flag) else {
                continue;
            };
            match s.ours {
                Refused(_) if !inert(s, &g.value) => self.refuse(&g, why),
                Refused(_) if g.value.trim() == s.default && meaningful_default(s) => {
                    self.notices.push(format!(
                        "{}={}: upstream's default, not used here: {why}",
                        g.origin, g.value
                    ));
                }
                NotNeeded(_) if !inert(s, &g.value) => self
                    .notices
                    .push(format!("{}={}: no effect here: {why}", g.origin, g.value)),
                _ => {}
            }
        }
    }

    /// TLS versions and suites that cannot be served (`tls1.1`, unknown suites, ...).
    fn tls(&mut self, tls: &TlsVersionArgs) {
        if let Err(e) = tls.profile() {
            self.refused.push(format!("{e}; {SEE}"));
        }
    }

    fn principal(&mut self, sub: &ArgMatches, p: &mut PrincipalArgs) {
        let role = Role::Principal;
        self.tls(&p.tls);
        if let Some(cfg) = p.auth.strip_prefix("userpass:") {
            self.refused.push(format!(
                "--auth userpass:{cfg}: there are no agent passwords here: agents authenticate with their X.509-SVID (--auth spiffe, or mtls:uri:<regex> for upstream's mapping rule), a JWT-SVID (--auth jwt-svid) or through a mesh (--auth header:…); {SEE}"
            ));
        } else if let Some(rest) = p.auth.strip_prefix("mtls:")
            && !rest.starts_with("uri:")
        {
            self.refused.push(format!(
                "--auth mtls:{rest}: agents are identified by the SPIFFE ID (URI SAN) of their SVID, not by certificate subjects: use --auth mtls:uri:<regex> or identity rules (docs/identity.md); {SEE}"
            ));
        }
        if let Some(g) = given(role, sub, "insecure-plaintext")
            && g.value == "true"
            && !p.auth.starts_with("header:")
        {
            self.refuse(&g, "the gRPC listener is plaintext only with header auth behind a mesh sidecar (--auth header:istio|envoy|linkerd|<name>:<regex>), which implies it");
        }
        if given_bool(role, sub, "redis-tls-enabled") != Some(true) {
            return;
        }
        let insecure = given(role, sub, "redis-tls-insecure");
        let cert = given_path(role, sub, "redis-proxy-server-tls-cert");
        let key = given_path(role, sub, "redis-proxy-server-tls-key");
        let ca = given_path(role, sub, "redis-ca-path");
        let r = &mut p.redis;
        match (cert, key) {
            (Some(c), Some(k)) => {
                r.redis_proxy_tls_cert_path.get_or_insert(c);
                r.redis_proxy_tls_key_path.get_or_insert(k);
            }
            _ if r.redis_proxy_tls_cert_path.is_some() => {}
            _ => self.refused.push(format!(
                "redis TLS on (ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED / --redis-tls-enabled) without --redis-proxy-server-tls-cert and --redis-proxy-server-tls-key: the Redis proxy's certificate is not read from a Secret here; mount it and give both paths (ours: --redis-proxy-tls-cert-path, --redis-proxy-tls-key-path); {SEE}"
            )),
        }
        match ca {
            Some(ca) => {
                r.redis_server_tls_ca_path.get_or_insert(ca);
            }
            None if r.redis_server_tls_ca_path.is_some() => {}
            None if insecure.as_ref().is_some_and(|g| g.value == "true") => {}
            None => self.refused.push(format!(
                "redis TLS on without --redis-ca-path: the hub Redis's CA is not read from a Secret here; mount it and give its path (ours: --redis-server-tls-ca-path); {SEE}"
            )),
        }
    }

    fn agent(&mut self, sub: &ArgMatches, a: &mut AgentArgs) {
        let role = Role::Agent;
        self.tls(&a.tls);
        if let Some(path) = a.creds.strip_prefix("userpass:") {
            self.refused.push(format!(
                "--creds userpass:{path}: there are no agent passwords here: the agent authenticates with its X.509-SVID (--creds spiffe, upstream's mtls:…), a JWT-SVID (--creds jwt-svid) or through a mesh (--creds header:); {SEE}"
            ));
        } else if a.creds == "mtls" || a.creds.starts_with("mtls:") {
            // Upstream's client-certificate credentials: our SVID mTLS.
            a.creds = "spiffe".into();
        }
        if let Some(g) = given(role, sub, "insecure-plaintext")
            && g.value == "true"
            && !a.creds.starts_with("header")
        {
            self.refuse(&g, "the agent dials in plaintext only to its local mesh sidecar, with --creds header: (which implies it)");
        }
        if let Some(g) = given(role, sub, "enable-resource-proxy")
            && g.value == "false"
        {
            a.resource_proxy.disable_resource_proxy = true;
        }
        let zero = |d: Duration| d.is_zero();
        if zero(a.keep_alive_ping_interval) {
            a.keep_alive_ping_interval = default_duration(Role::Agent, "keep_alive_ping_interval");
            self.notices.push(format!(
                "--keep-alive-ping-interval 0 (upstream's default, no pings): pings and heartbeats here are always on, every {}s",
                a.keep_alive_ping_interval.as_secs()
            ));
        }
        if a.heartbeat_interval.is_some_and(zero) {
            a.heartbeat_interval = None;
            self.notices.push("--heartbeat-interval 0 (upstream's default, no heartbeats): heartbeats here follow --keep-alive-ping-interval".into());
        }
        match given_bool(role, sub, "redis-tls-enabled") {
            Some(false) => a.redis.redis_tls_ca_path = None,
            Some(true) if a.redis.redis_tls_ca_path.is_none() => self.refused.push(format!(
                "redis TLS on (ARGOCD_AGENT_REDIS_TLS_ENABLED / --redis-tls-enabled) without --redis-tls-ca-path: the local Redis's CA is not read from a Secret here; mount it and give its path; {SEE}"
            )),
            _ => {}
        }
    }
}

/// The default of one of our duration flags (from its clap definition).
fn default_duration(role: Role, id: &str) -> Duration {
    let cmd = Cli::command();
    cmd.find_subcommand(role.name())
        .and_then(|s| s.get_arguments().find(|a| a.get_id() == id))
        .and_then(|a| a.get_default_values().first())
        .and_then(|v| v.to_str())
        .and_then(|v| crate::args::parse_duration(v).ok())
        .unwrap_or(Duration::from_secs(30))
}

#[cfg(test)]
mod tests;
