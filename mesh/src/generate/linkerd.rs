//! Linkerd policy objects for a principal behind a Linkerd proxy.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::{AllowedAgents, to_multi_doc_yaml};
use crate::linkerd::LinkerdId;

/// Inputs of [`linkerd_objects`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkerdOptions {
    /// Namespace of the principal.
    pub namespace: String,
    /// Name given to every generated object.
    pub name: String,
    /// Pod labels that select the principal.
    pub selector: BTreeMap<String, String>,
    /// The principal's header-auth port.
    pub port: u16,
    /// Namespace of the Linkerd control plane (the `<linkerd-ns>` in identities).
    pub control_plane_ns: String,
    /// Which agents may connect.
    pub allowed: AllowedAgents,
}

impl LinkerdOptions {
    /// Defaults: namespace `argocd`, label `app.kubernetes.io/name=argocd-agent-principal`,
    /// port 8443, control plane in `linkerd`.
    pub fn new(allowed: AllowedAgents) -> Self {
        LinkerdOptions {
            namespace: "argocd".into(),
            name: "argocd-agent-principal".into(),
            selector: BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "argocd-agent-principal".to_owned(),
            )]),
            port: 8443,
            control_plane_ns: "linkerd".into(),
            allowed,
        }
    }
}

/// Linkerd identities for the allowed agents. SPIFFE IDs of the form
/// `spiffe://<td>/ns/<ns>/sa/<sa>` become `<sa>.<ns>.serviceaccount.identity.<cp>.<td>`;
/// other SPIFFE IDs are passed as URIs (Linkerd's mesh-expansion form). A trust domain
/// becomes a suffix wildcard over all its service accounts.
fn linkerd_identities(allowed: &AllowedAgents, control_plane_ns: &str) -> Vec<String> {
    match allowed {
        AllowedAgents::TrustDomain(td) => vec![format!(
            "*.serviceaccount.identity.{control_plane_ns}.{}",
            td.as_str()
        )],
        AllowedAgents::Ids(ids) => ids
            .iter()
            .map(|id| {
                LinkerdId::from_spiffe_uri(id.as_str(), control_plane_ns)
                    .map_or_else(|| id.to_string(), |l| l.to_string())
            })
            .collect(),
    }
}

/// The Linkerd objects (multi-document YAML), preceded by comments with the pod
/// annotations and listener settings the principal needs:
/// - `Server` (`policy.linkerd.io/v1beta3`) for the port, `proxyProtocol: gRPC`;
/// - `MeshTLSAuthentication` (`policy.linkerd.io/v1alpha1`) listing the agent identities;
/// - `AuthorizationPolicy` (`policy.linkerd.io/v1alpha1`) tying the two together, so that
///   only those meshed identities reach the port.
pub fn linkerd_objects(opts: LinkerdOptions) -> String {
    let header = format!(
        "# Principal pod template (Linkerd):\n\
         #   metadata.annotations:\n\
         #     linkerd.io/inject: enabled\n\
         # Linkerd >= 2.11 forwards inbound traffic to the pod IP, not to 127.0.0.1, so the\n\
         # principal's header-auth listener binds the pod IP on port {port} with\n\
         #   --auth header:linkerd --insecure-header-auth-any-address\n\
         #   --header-auth-trusted-proxy $(POD_IP)   (POD_IP from the downward API)\n\
         # and the port must not be listed in config.linkerd.io/skip-inbound-ports.\n",
        port = opts.port
    );
    header + &to_multi_doc_yaml(&linkerd_objects_values(&opts))
}

/// [`linkerd_objects`] as JSON values (without the comment header).
pub fn linkerd_objects_values(opts: &LinkerdOptions) -> Vec<Value> {
    let meta = json!({ "name": opts.name, "namespace": opts.namespace });
    vec![
        json!({
            "apiVersion": "policy.linkerd.io/v1beta3",
            "kind": "Server",
            "metadata": meta,
            "spec": {
                "podSelector": { "matchLabels": opts.selector },
                "port": opts.port,
                "proxyProtocol": "gRPC"
            }
        }),
        json!({
            "apiVersion": "policy.linkerd.io/v1alpha1",
            "kind": "MeshTLSAuthentication",
            "metadata": meta,
            "spec": { "identities": linkerd_identities(&opts.allowed, &opts.control_plane_ns) }
        }),
        json!({
            "apiVersion": "policy.linkerd.io/v1alpha1",
            "kind": "AuthorizationPolicy",
            "metadata": meta,
            "spec": {
                "targetRef": { "group": "policy.linkerd.io", "kind": "Server", "name": opts.name },
                "requiredAuthenticationRefs": [{
                    "group": "policy.linkerd.io",
                    "kind": "MeshTLSAuthentication",
                    "name": opts.name
                }]
            }
        }),
    ]
}
