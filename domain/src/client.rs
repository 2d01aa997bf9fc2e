//! Who a connection's peer is, established once at the edge (TLS handshake, JWT-SVID or a
//! trusted mesh header) and carried with the connection to every request on it.

use std::fmt;

use crate::names::AgentName;
use argocd_agent_identity::id::SpiffeId;

/// The authenticated caller of a connection or stream, before mapping to an agent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientIdentity {
    /// A SPIFFE ID: from the verified X.509-SVID, a validated JWT-SVID, or a mesh header
    /// (XFCC URI, Linkerd identity).
    Spiffe(SpiffeId),
    /// An agent name captured by an upstream-style `header:<name>:<regex>` rule. It is the
    /// agent name and hub namespace at once; no SPIFFE mapping rule applies to it.
    AgentName(AgentName),
}

impl ClientIdentity {
    /// The SPIFFE ID, when the caller has one.
    pub fn spiffe_id(&self) -> Option<&SpiffeId> {
        match self {
            ClientIdentity::Spiffe(id) => Some(id),
            ClientIdentity::AgentName(_) => None,
        }
    }
}

impl ClientIdentity {
    /// The identity with what kind it is, for messages: `SPIFFE ID spiffe://...` or
    /// `header agent name "edge-1"`.
    pub fn describe(&self) -> String {
        match self {
            ClientIdentity::Spiffe(id) => format!("SPIFFE ID {id}"),
            ClientIdentity::AgentName(_) => self.to_string(),
        }
    }
}

impl fmt::Display for ClientIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientIdentity::Spiffe(id) => write!(f, "{id}"),
            ClientIdentity::AgentName(name) => write!(f, "header agent name \"{name}\""),
        }
    }
}

impl From<SpiffeId> for ClientIdentity {
    fn from(id: SpiffeId) -> Self {
        ClientIdentity::Spiffe(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_names_the_kind_of_identity() {
        let id = SpiffeId::parse("spiffe://example.org/agent/a").unwrap();
        assert_eq!(
            ClientIdentity::from(id).to_string(),
            "spiffe://example.org/agent/a"
        );
        let name = AgentName::new("edge-1").unwrap();
        assert_eq!(
            ClientIdentity::AgentName(name).to_string(),
            "header agent name \"edge-1\""
        );
    }
}
