//! How the agent reaches the principal: mTLS itself, or plaintext h2c to its local mesh
//! sidecar, which does mTLS (`--creds header:`, as upstream argocd-agent).

use std::fmt;

use crate::MeshError;
use crate::guard::{GuardError, GuardWarning, is_loopback_host};

/// The agent's transport to the principal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentTransport {
    /// The agent does TLS itself with its SVID (`--creds mtls` or `--creds spiffe`).
    Mtls,
    /// The agent speaks plaintext HTTP/2 to its local sidecar, which originates mTLS
    /// (`--creds header:`).
    PlaintextToSidecar,
}

impl AgentTransport {
    /// Parses an agent `--creds` value: `mtls`, `spiffe` (optionally with a suffix after
    /// `:`, e.g. `mtls:any`) or `header:` / `header`. Other methods (such as `jwt-svid`,
    /// handled by the identity crate) are not mesh transports and are refused here.
    pub fn from_creds(value: &str) -> Result<AgentTransport, MeshError> {
        let method = value.split_once(':').map_or(value, |(m, _)| m);
        match method {
            "mtls" | "spiffe" => Ok(AgentTransport::Mtls),
            "header" => Ok(AgentTransport::PlaintextToSidecar),
            "userpass" => Err(MeshError::InvalidCreds {
                value: value.to_owned(),
                reason: "userpass is not supported; use mtls, spiffe or header:".into(),
            }),
            _ => Err(MeshError::InvalidCreds {
                value: value.to_owned(),
                reason: "expected mtls, spiffe or header:".into(),
            }),
        }
    }

    /// Checks the principal address the agent dials. Plaintext goes only to a loopback
    /// host (the sidecar's outbound listener) unless `allow_non_loopback`
    /// ([`crate::guard::AGENT_OVERRIDE_FLAG`]), which yields a warning to log at every
    /// start. mTLS may go anywhere.
    pub fn check_target(
        self,
        host: &str,
        allow_non_loopback: bool,
    ) -> Result<Option<GuardWarning>, GuardError> {
        match self {
            AgentTransport::Mtls => Ok(None),
            AgentTransport::PlaintextToSidecar if is_loopback_host(host) => Ok(None),
            AgentTransport::PlaintextToSidecar if allow_non_loopback => Ok(Some(GuardWarning {
                message: format!(
                    "sending plaintext HTTP/2 to non-loopback host {host} because {} is set: this is only safe if a transparent mesh proxy intercepts and encrypts it",
                    crate::guard::AGENT_OVERRIDE_FLAG
                ),
            })),
            AgentTransport::PlaintextToSidecar => Err(GuardError::NonLoopbackTarget {
                target: host.to_owned(),
            }),
        }
    }
}

impl std::str::FromStr for AgentTransport {
    type Err = MeshError;
    /// Same as [`AgentTransport::from_creds`] (for clap's `value_parser`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        AgentTransport::from_creds(s)
    }
}

impl fmt::Display for AgentTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AgentTransport::Mtls => f.write_str("mtls"),
            AgentTransport::PlaintextToSidecar => f.write_str("header:"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creds_values_choose_transport() {
        assert_eq!(
            AgentTransport::from_creds("mtls").unwrap(),
            AgentTransport::Mtls
        );
        assert_eq!(
            AgentTransport::from_creds("mtls:any").unwrap(),
            AgentTransport::Mtls
        );
        assert_eq!(
            AgentTransport::from_creds("spiffe").unwrap(),
            AgentTransport::Mtls
        );
        assert_eq!(
            AgentTransport::from_creds("header:").unwrap(),
            AgentTransport::PlaintextToSidecar
        );
        for bad in ["", "userpass:/x", "jwt", "headers:"] {
            assert!(AgentTransport::from_creds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn plaintext_goes_only_to_loopback_unless_overridden() {
        let p = AgentTransport::PlaintextToSidecar;
        assert_eq!(p.check_target("127.0.0.1", false), Ok(None));
        assert_eq!(p.check_target("localhost", false), Ok(None));
        let err = p.check_target("principal.hub.example", false).unwrap_err();
        assert!(err.to_string().contains("unencrypted"), "{err}");
        assert!(
            p.check_target("principal.hub.example", true)
                .unwrap()
                .is_some()
        );
        assert_eq!(
            AgentTransport::Mtls.check_target("principal.hub.example", false),
            Ok(None)
        );
    }
}
