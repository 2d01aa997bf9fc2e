//! Which caller gets which SPIFFE ID: by the socket it connected to and/or its uid.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::DevServerError;
use argocd_agent_identity::id::{SpiffeId, TrustDomain};

/// One registration entry. At least one of `socket` and `uid` must be set; an entry matches a
/// caller when every field that is set matches.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Registration {
    /// The SPIFFE ID to issue.
    pub spiffe_id: SpiffeId,
    /// Only callers connected to this socket (one socket per identity is the simplest setup).
    #[serde(default)]
    pub socket: Option<PathBuf>,
    /// Only callers with this uid (SO_PEERCRED).
    #[serde(default)]
    pub uid: Option<u32>,
}

impl Registration {
    /// Whether a caller on `socket` with `uid` is entitled to this entry.
    pub fn matches(&self, socket: &Path, uid: Option<u32>) -> bool {
        let socket_ok = self.socket.as_deref().is_none_or(|s| s == socket);
        let uid_ok = match self.uid {
            None => true,
            Some(want) => uid == Some(want),
        };
        socket_ok && uid_ok
    }
}

/// The registration file (YAML):
///
/// ```yaml
/// trustDomain: example.org          # optional when given on the command line
/// defaultSocket: /tmp/spiffe/api.sock  # socket for uid-only entries (optional)
/// federatesWith: [partner.org]      # extra dev CAs whose bundles are served (optional)
/// registrations:
///   - spiffeId: spiffe://example.org/ns/argocd/sa/principal
///     socket: /tmp/spiffe/principal.sock
///   - spiffeId: spiffe://example.org/ns/argocd/sa/agent
///     uid: 1000
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegistrationFile {
    /// The trust domain of the main dev CA.
    #[serde(default)]
    pub trust_domain: Option<TrustDomain>,
    /// Socket served for entries without a `socket`.
    #[serde(default)]
    pub default_socket: Option<PathBuf>,
    /// Federated trust domains (each gets its own dev CA; its bundle is served).
    #[serde(default)]
    pub federates_with: Vec<TrustDomain>,
    /// The entries.
    #[serde(default)]
    pub registrations: Vec<Registration>,
}

impl RegistrationFile {
    /// Parses the YAML text of a registration file.
    pub fn parse(yaml: &str, origin: &str) -> Result<Self, DevServerError> {
        let file: RegistrationFile =
            serde_saphyr::from_str(yaml).map_err(|e| DevServerError::Registration {
                origin: origin.to_string(),
                reason: e.to_string(),
            })?;
        for (i, r) in file.registrations.iter().enumerate() {
            if r.socket.is_none() && r.uid.is_none() {
                return Err(DevServerError::Registration {
                    origin: origin.to_string(),
                    reason: format!(
                        "registration #{i} ({}) has neither socket nor uid",
                        r.spiffe_id.as_str()
                    ),
                });
            }
        }
        Ok(file)
    }

    /// Reads and parses a registration file.
    pub fn load(path: &Path) -> Result<Self, DevServerError> {
        let text = std::fs::read_to_string(path).map_err(|e| DevServerError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text, &path.display().to_string())
    }
}
