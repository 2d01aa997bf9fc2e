//! An Envoy bootstrap for the principal side: Envoy terminates the agents' mTLS, verifies
//! their SPIFFE IDs, replaces any client-sent `x-forwarded-client-cert` with what it
//! verified (`SANITIZE_SET`) and forwards HTTP/2 to the principal's plaintext
//! header-auth listener on loopback (or a Unix socket).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use serde_json::{Value, json};

use super::{AllowedAgents, to_yaml};
use crate::guard::ListenAddr;

/// SDS resource name of the workload's own SVID in SPIRE's SDS implementation (SPIRE agent
/// `default_svid_name`).
pub const SPIRE_DEFAULT_SVID_NAME: &str = "default";
/// SDS resource name of the trust bundle in SPIRE's SDS implementation (SPIRE agent
/// `default_bundle_name`).
pub const SPIRE_DEFAULT_BUNDLE_NAME: &str = "ROOTCA";

/// Cap on concurrent agent connections in the generated bootstrap.
pub const MAX_DOWNSTREAM_CONNECTIONS: u64 = 10_000;

/// Where Envoy's downstream certificate and trust bundle come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvoyTls {
    /// PEM files (local tests, or SVIDs written to disk by spiffe-helper).
    Files {
        /// Certificate chain of the principal's SVID.
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
        /// Trust bundle used to verify agents.
        ca: PathBuf,
    },
    /// SDS from the SPIRE agent's Workload API socket: rotated SVIDs and bundles are pushed
    /// to Envoy without restarts.
    Sds {
        /// The SPIRE agent socket, e.g. `/run/spire/sockets/agent.sock`.
        socket: PathBuf,
    },
}

/// Inputs of [`envoy_principal_config`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvoyOptions {
    /// Where Envoy accepts agents (mTLS), e.g. `0.0.0.0:8443`.
    pub listen: SocketAddr,
    /// The principal's plaintext header-auth listener (loopback or Unix socket).
    pub upstream: ListenAddr,
    /// Certificate source.
    pub tls: EnvoyTls,
    /// Which client SPIFFE IDs are accepted during the handshake.
    pub allowed: AllowedAgents,
    /// Envoy's admin interface, if wanted (keep it on loopback).
    pub admin: Option<SocketAddr>,
}

impl EnvoyOptions {
    /// Defaults: listen on `0.0.0.0:8443`, forward to `127.0.0.1:8404`, no admin.
    pub fn new(tls: EnvoyTls, allowed: AllowedAgents) -> Self {
        EnvoyOptions {
            listen: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8443),
            upstream: ListenAddr::Tcp(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 8404)),
            tls,
            allowed,
            admin: None,
        }
    }
}

fn socket_address(addr: &SocketAddr) -> Value {
    json!({ "socket_address": { "address": addr.ip().to_string(), "port_value": addr.port() } })
}

fn endpoint_address(addr: &ListenAddr) -> Value {
    match addr {
        ListenAddr::Tcp(a) => socket_address(a),
        ListenAddr::Unix(p) => json!({ "pipe": { "path": p.display().to_string() } }),
    }
}

/// A static cluster that speaks HTTP/2 to one address.
fn h2_cluster(name: &str, addr: &ListenAddr, keepalive: bool) -> Value {
    let mut http2 = json!({});
    if keepalive {
        http2 = json!({ "connection_keepalive": { "interval": "30s", "timeout": "10s" } });
    }
    let mut cluster = json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": { "http2_protocol_options": http2 }
            }
        },
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{ "lb_endpoints": [{ "endpoint": { "address": endpoint_address(addr) } }] }]
        }
    });
    if matches!(addr, ListenAddr::Tcp(_)) {
        cluster["upstream_connection_options"] = json!({
            "tcp_keepalive": { "keepalive_time": 60, "keepalive_interval": 20, "keepalive_probes": 3 }
        });
    }
    cluster
}

fn san_matchers(allowed: &AllowedAgents) -> Value {
    let matchers: Vec<Value> = match allowed {
        AllowedAgents::TrustDomain(td) => vec![json!({
            "san_type": "URI",
            "matcher": { "prefix": format!("spiffe://{}/", td.as_str()) }
        })],
        AllowedAgents::Ids(ids) => ids
            .iter()
            .map(|id| json!({ "san_type": "URI", "matcher": { "exact": id.as_str() } }))
            .collect(),
    };
    Value::Array(matchers)
}

fn sds_config() -> Value {
    json!({
        "resource_api_version": "V3",
        "api_config_source": {
            "api_type": "GRPC",
            "transport_api_version": "V3",
            "grpc_services": [{ "envoy_grpc": { "cluster_name": "spire_agent" } }]
        }
    })
}

fn common_tls_context(opts: &EnvoyOptions) -> Value {
    let sans = san_matchers(&opts.allowed);
    let mut ctx = json!({
        "tls_params": { "tls_minimum_protocol_version": "TLSv1_2" },
        "alpn_protocols": ["h2"]
    });
    match &opts.tls {
        EnvoyTls::Files { cert, key, ca } => {
            ctx["tls_certificates"] = json!([{
                "certificate_chain": { "filename": cert.display().to_string() },
                "private_key": { "filename": key.display().to_string() }
            }]);
            ctx["validation_context"] = json!({
                "trusted_ca": { "filename": ca.display().to_string() },
                "match_typed_subject_alt_names": sans
            });
        }
        EnvoyTls::Sds { .. } => {
            ctx["tls_certificate_sds_secret_configs"] =
                json!([{ "name": SPIRE_DEFAULT_SVID_NAME, "sds_config": sds_config() }]);
            // The SAN matcher is static; the bundle comes from SDS and rotates.
            ctx["combined_validation_context"] = json!({
                "default_validation_context": { "match_typed_subject_alt_names": sans },
                "validation_context_sds_secret_config": {
                    "name": SPIRE_DEFAULT_BUNDLE_NAME,
                    "sds_config": sds_config()
                }
            });
        }
    }
    ctx
}

/// The Envoy bootstrap (YAML) for the principal side.
///
/// Choices and why:
/// - `require_client_certificate: true` and a URI SAN matcher: only agents with an SVID
///   from the allowed trust domain (or exactly the listed IDs) get through.
/// - `forward_client_cert_details: SANITIZE_SET`: whatever `x-forwarded-client-cert` the
///   client sent is dropped and replaced by what Envoy verified, so the principal never
///   sees a client-written identity.
/// - Route `timeout: 0s` and `stream_idle_timeout: 0s`: the event stream lives for hours
///   and must not be cut by request or idle timers; dead peers are found by HTTP/2 PINGs
///   (`connection_keepalive`) and TCP keepalive instead.
pub fn envoy_principal_config(opts: EnvoyOptions) -> String {
    to_yaml(&envoy_principal_config_value(&opts))
}

/// [`envoy_principal_config`] as a JSON value (for tests and further editing).
pub fn envoy_principal_config_value(opts: &EnvoyOptions) -> Value {
    let hcm = json!({
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "argocd_agent_principal",
        "codec_type": "HTTP2",
        "http2_protocol_options": {
            "connection_keepalive": { "interval": "30s", "timeout": "10s" }
        },
        "stream_idle_timeout": "0s",
        "forward_client_cert_details": "SANITIZE_SET",
        "set_current_client_cert_details": { "subject": true, "uri": true, "dns": true },
        "route_config": {
            "name": "principal",
            "virtual_hosts": [{
                "name": "principal",
                "domains": ["*"],
                "routes": [{
                    "match": { "prefix": "/" },
                    "route": { "cluster": "principal", "timeout": "0s" }
                }]
            }]
        },
        "http_filters": [{
            "name": "envoy.filters.http.router",
            "typed_config": { "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router" }
        }]
    });
    let listener = json!({
        "name": "principal_mtls",
        "address": socket_address(&opts.listen),
        // SO_KEEPALIVE on accepted connections (SOL_SOCKET = 1, SO_KEEPALIVE = 9 on Linux).
        "socket_options": [{ "level": 1, "name": 9, "int_value": 1, "state": "STATE_PREBIND" }],
        "filter_chains": [{
            "filters": [{ "name": "envoy.filters.network.http_connection_manager", "typed_config": hcm }],
            "transport_socket": {
                "name": "envoy.transport_sockets.tls",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext",
                    "require_client_certificate": true,
                    "common_tls_context": common_tls_context(opts)
                }
            }
        }]
    });
    let mut clusters = vec![h2_cluster("principal", &opts.upstream, true)];
    if let EnvoyTls::Sds { socket } = &opts.tls {
        clusters.push(h2_cluster(
            "spire_agent",
            &ListenAddr::Unix(socket.clone()),
            false,
        ));
    }
    let mut bootstrap = json!({
        // SDS needs a node identity; SPIRE ignores its value.
        "node": { "id": "argocd-agent-principal", "cluster": "argocd-agent" },
        "static_resources": { "listeners": [listener], "clusters": clusters },
        // An explicit cap on open downstream connections (Envoy warns without one): one
        // long-lived connection per agent, so 10 000 leaves plenty of room.
        "overload_manager": {
            "resource_monitors": [{
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": MAX_DOWNSTREAM_CONNECTIONS
                }
            }]
        }
    });
    if let Some(admin) = &opts.admin {
        bootstrap["admin"] = json!({ "address": socket_address(admin) });
    }
    bootstrap
}
