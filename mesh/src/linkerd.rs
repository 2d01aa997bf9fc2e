//! Linkerd's `l5d-client-id` header and its mapping onto SPIFFE IDs.
//!
//! Linkerd's proxy verifies the client's mTLS certificate and tells the application who the
//! client is in `l5d-client-id: <sa>.<ns>.serviceaccount.identity.<linkerd-ns>.<trust-domain>`.
//! Linkerd itself also names every such workload `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`
//! (the URI SAN it puts into its certificates), so converting to that SPIFFE ID lets one
//! mapping rule such as `spiffe://{trust_domain}/ns/{ns}/sa/{sa}` cover Linkerd, Istio and
//! plain SPIRE alike.

use std::fmt;

use argocd_agent_identity::SpiffeId;

use crate::MeshError;

/// Name of Linkerd's identity header.
pub const L5D_CLIENT_ID_HEADER: &str = "l5d-client-id";

/// The fixed labels between the namespace and the control-plane namespace.
const MIDDLE: &str = ".serviceaccount.identity.";

/// A parsed Linkerd workload identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LinkerdId {
    /// Service account name.
    pub sa: String,
    /// Namespace of the workload.
    pub ns: String,
    /// Namespace of the Linkerd control plane (usually `linkerd`).
    pub control_plane_ns: String,
    /// Linkerd's trust domain (usually `cluster.local`).
    pub trust_domain: String,
}

/// Whether `s` is a DNS-1123 label (what Kubernetes allows for namespaces and, in practice,
/// for service accounts that appear in Linkerd identities).
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

impl LinkerdId {
    /// Parses `<sa>.<ns>.serviceaccount.identity.<linkerd-ns>.<trust-domain>`.
    ///
    /// ```
    /// let id = argocd_agent_mesh::linkerd::LinkerdId::parse(
    ///     "agent-1.edge.serviceaccount.identity.linkerd.cluster.local",
    /// ).unwrap();
    /// assert_eq!((id.sa.as_str(), id.ns.as_str()), ("agent-1", "edge"));
    /// assert_eq!(id.spiffe_uri(), "spiffe://cluster.local/ns/edge/sa/agent-1");
    /// ```
    pub fn parse(value: &str) -> Result<LinkerdId, MeshError> {
        let bad = |reason| MeshError::InvalidLinkerdId {
            value: value.to_owned(),
            reason,
        };
        let (workload, rest) = value
            .split_once(MIDDLE)
            .ok_or(bad("missing \".serviceaccount.identity.\""))?;
        let (sa, ns) = workload
            .split_once('.')
            .ok_or(bad("expected <sa>.<ns> before \".serviceaccount\""))?;
        let (control_plane_ns, trust_domain) = rest.split_once('.').ok_or(bad(
            "expected <linkerd-ns>.<trust-domain> after \"identity.\"",
        ))?;
        if !is_dns_label(sa) {
            return Err(bad("service account is not a DNS-1123 label"));
        }
        if !is_dns_label(ns) {
            return Err(bad("namespace is not a DNS-1123 label"));
        }
        if !is_dns_label(control_plane_ns) {
            return Err(bad("control-plane namespace is not a DNS-1123 label"));
        }
        if !trust_domain.split('.').all(is_dns_label) {
            return Err(bad("trust domain is not a DNS name"));
        }
        Ok(LinkerdId {
            sa: sa.to_owned(),
            ns: ns.to_owned(),
            control_plane_ns: control_plane_ns.to_owned(),
            trust_domain: trust_domain.to_owned(),
        })
    }

    /// The SPIFFE ID Linkerd gives this workload: `spiffe://<trust-domain>/ns/<ns>/sa/<sa>`.
    pub fn spiffe_uri(&self) -> String {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.ns, self.sa
        )
    }

    /// [`spiffe_uri`](Self::spiffe_uri) as a parsed [`SpiffeId`].
    pub fn to_spiffe_id(&self) -> Result<SpiffeId, MeshError> {
        let uri = self.spiffe_uri();
        SpiffeId::parse(&uri).map_err(|e| MeshError::InvalidSpiffeId {
            header: L5D_CLIENT_ID_HEADER,
            value: uri,
            reason: e.to_string(),
        })
    }

    /// The Linkerd identity for a SPIFFE ID of the form `spiffe://<td>/ns/<ns>/sa/<sa>`,
    /// for writing `MeshTLSAuthentication` objects; `None` for other paths.
    pub fn from_spiffe_uri(uri: &str, control_plane_ns: &str) -> Option<LinkerdId> {
        let rest = uri.strip_prefix("spiffe://")?;
        let (td, path) = rest.split_once('/')?;
        let mut segs = path.split('/');
        match (
            segs.next(),
            segs.next(),
            segs.next(),
            segs.next(),
            segs.next(),
        ) {
            (Some("ns"), Some(ns), Some("sa"), Some(sa), None) => Some(LinkerdId {
                sa: sa.to_owned(),
                ns: ns.to_owned(),
                control_plane_ns: control_plane_ns.to_owned(),
                trust_domain: td.to_owned(),
            }),
            _ => None,
        }
    }
}

impl fmt::Display for LinkerdId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}{MIDDLE}{}.{}",
            self.sa, self.ns, self.control_plane_ns, self.trust_domain
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linkerd_id_parses_and_maps_to_spiffe_id() {
        let id = LinkerdId::parse("agent-1.edge-7.serviceaccount.identity.linkerd.cluster.local")
            .unwrap();
        assert_eq!(
            id,
            LinkerdId {
                sa: "agent-1".into(),
                ns: "edge-7".into(),
                control_plane_ns: "linkerd".into(),
                trust_domain: "cluster.local".into(),
            }
        );
        assert_eq!(
            id.to_spiffe_id().unwrap().as_str(),
            "spiffe://cluster.local/ns/edge-7/sa/agent-1"
        );
        assert_eq!(
            id.to_string(),
            "agent-1.edge-7.serviceaccount.identity.linkerd.cluster.local"
        );
    }

    #[test]
    fn linkerd_id_rejects_malformed_values() {
        for bad in [
            "",
            "agent.edge",
            "agent.serviceaccount.identity.linkerd.cluster.local",
            "agent.edge.serviceaccount.identity.linkerd",
            "agent.edge.serviceaccount.identity..cluster.local",
            "Agent.edge.serviceaccount.identity.linkerd.cluster.local",
            "a.b.c.serviceaccount.identity.linkerd.cluster.local",
            "agent.edge.serviceaccount.identity.linkerd.cluster..local",
            "agent.edge.serviceaccount.identity.linkerd.cluster.local.",
            "spiffe://cluster.local/ns/edge/sa/agent",
        ] {
            let err = LinkerdId::parse(bad).expect_err(bad);
            assert!(
                matches!(err, MeshError::InvalidLinkerdId { .. }),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn linkerd_id_from_spiffe_uri_needs_ns_sa_path() {
        let l =
            LinkerdId::from_spiffe_uri("spiffe://td.example/ns/edge/sa/agent", "linkerd").unwrap();
        assert_eq!(
            l.to_string(),
            "agent.edge.serviceaccount.identity.linkerd.td.example"
        );
        assert!(LinkerdId::from_spiffe_uri("spiffe://td.example/agent/x", "linkerd").is_none());
        assert!(LinkerdId::from_spiffe_uri("spiffe://td.example/ns/a/sa/b/c", "linkerd").is_none());
    }
}
