//! Generators for mesh and proxy configuration in front of the principal: an Envoy
//! bootstrap, Istio objects and Linkerd objects. Pure functions that return YAML text
//! (printed by `argocd-agentctl mesh ...`).

pub mod envoy;
pub mod istio;
pub mod linkerd;

use argocd_agent_identity::{SpiffeId, TrustDomain};

/// Which agents the mesh lets through to the principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedAgents {
    /// Every workload of this trust domain; the principal's mapping rules then decide.
    TrustDomain(TrustDomain),
    /// Exactly these agent SPIFFE IDs.
    Ids(Vec<SpiffeId>),
}

/// Serializes a list of objects as multi-document YAML.
fn to_multi_doc_yaml(docs: &[serde_json::Value]) -> String {
    docs.iter().map(to_yaml).collect::<Vec<_>>().join("---\n")
}

/// Serializes one value as YAML. A `serde_json::Value` always serializes (string keys,
/// finite numbers), so a failure here is a bug in this crate, reported inside the output.
fn to_yaml(doc: &serde_json::Value) -> String {
    match serde_saphyr::to_string(doc) {
        Ok(s) if s.ends_with('\n') => s,
        Ok(s) => s + "\n",
        Err(e) => format!("# internal error: cannot serialize generated object: {e}\n"),
    }
}
