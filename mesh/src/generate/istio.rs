//! Istio objects for a principal behind an Istio sidecar.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{AllowedAgents, to_multi_doc_yaml};

/// Inputs of [`istio_objects`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IstioOptions {
    /// Namespace of the principal.
    pub namespace: String,
    /// Name given to every generated object.
    pub name: String,
    /// Pod labels that select the principal.
    pub selector: BTreeMap<String, String>,
    /// The port agents connect to (container port the sidecar intercepts).
    pub port: u16,
    /// The port of the principal's plaintext header-auth listener on 127.0.0.1.
    pub upstream_port: u16,
    /// The principal's service host, e.g. `argocd-agent-principal.argocd.svc.cluster.local`.
    pub host: String,
    /// Which agents may connect.
    pub allowed: AllowedAgents,
}

impl IstioOptions {
    /// Defaults for the standard install: namespace `argocd`, label
    /// `app.kubernetes.io/name=argocd-agent-principal`, port 8443 forwarded to
    /// `127.0.0.1:8404`.
    pub fn new(allowed: AllowedAgents) -> Self {
        IstioOptions {
            namespace: "argocd".into(),
            name: "argocd-agent-principal".into(),
            selector: BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "argocd-agent-principal".to_owned(),
            )]),
            port: 8443,
            upstream_port: 8404,
            host: "argocd-agent-principal.argocd.svc.cluster.local".into(),
            allowed,
        }
    }
}

/// Istio's principal names are SPIFFE IDs without the `spiffe://` prefix; `*` is a
/// suffix wildcard.
fn istio_principals(allowed: &AllowedAgents) -> Vec<String> {
    match allowed {
        AllowedAgents::TrustDomain(td) => vec![format!("{}/*", td.as_str())],
        AllowedAgents::Ids(ids) => ids
            .iter()
            .map(|id| id.as_str().trim_start_matches("spiffe://").to_owned())
            .collect(),
    }
}

/// The Istio objects (multi-document YAML):
/// - `PeerAuthentication` STRICT: the principal's port accepts only mTLS from the mesh.
/// - `Sidecar` with an ingress `defaultEndpoint` of `127.0.0.1:<upstream_port>`: since
///   Istio 1.10 the sidecar forwards to the pod IP by default, which the principal must not
///   listen on for header auth; this makes it forward to loopback instead.
/// - `DestinationRule`: HTTP/2, a 24 h `idleTimeout` (default 1 h) and TCP keepalive, so
///   quiet event streams are not cut.
/// - `AuthorizationPolicy` ALLOW for the agent principals on the principal's port.
pub fn istio_objects(opts: IstioOptions) -> String {
    to_multi_doc_yaml(&istio_objects_values(&opts))
}

/// [`istio_objects`] as JSON values.
pub fn istio_objects_values(opts: &IstioOptions) -> Vec<Value> {
    let meta = json!({ "name": opts.name, "namespace": opts.namespace });
    vec![
        json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "PeerAuthentication",
            "metadata": meta,
            "spec": {
                "selector": { "matchLabels": opts.selector },
                "mtls": { "mode": "STRICT" }
            }
        }),
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "Sidecar",
            "metadata": meta,
            "spec": {
                "workloadSelector": { "labels": opts.selector },
                "ingress": [{
                    "port": { "number": opts.port, "protocol": "GRPC", "name": "grpc-principal" },
                    "defaultEndpoint": format!("127.0.0.1:{}", opts.upstream_port)
                }]
            }
        }),
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": meta,
            "spec": {
                "host": opts.host,
                "trafficPolicy": {
                    "tls": { "mode": "ISTIO_MUTUAL" },
                    "connectionPool": {
                        "http": { "h2UpgradePolicy": "UPGRADE", "idleTimeout": "24h" },
                        "tcp": { "tcpKeepalive": { "time": "60s", "interval": "20s", "probes": 3 } }
                    }
                }
            }
        }),
        json!({
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": meta,
            "spec": {
                "selector": { "matchLabels": opts.selector },
                "action": "ALLOW",
                "rules": [{
                    "from": [{ "source": { "principals": istio_principals(&opts.allowed) } }],
                    "to": [{ "operation": { "ports": [opts.port.to_string()] } }]
                }]
            }
        }),
    ]
}
