//! Agent names, hub namespaces and agent modes: newtypes that cannot hold invalid values.
//!
//! Agent names and namespaces are both Kubernetes DNS-1123 labels
//! (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters), because each agent owns a hub
//! namespace and upstream argocd-agent names that namespace after the agent.

use argocd_agent_identity::text::quoted;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use argocd_agent_identity::id::{IdError, quote};

/// Longest DNS-1123 label.
pub const MAX_LABEL_LEN: usize = 63;

/// Checks a DNS-1123 label and says which rule failed. Hand-written: it is four rules, and
/// a regex would only say "does not match".
fn check_label(what: &'static str, input: &str) -> Result<(), IdError> {
    let err = |reason: String| IdError::Name {
        what,
        input: quote(input),
        reason,
    };
    if input.is_empty() {
        return Err(err("must not be empty".into()));
    }
    if input.len() > MAX_LABEL_LEN {
        return Err(err(format!(
            "is {} characters long, the maximum is {MAX_LABEL_LEN}",
            input.len()
        )));
    }
    if let Some(c) = input
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-'))
    {
        return Err(err(format!(
            "must be a DNS-1123 label (lowercase a-z, 0-9 and '-'), found '{c}'",
            c = c.escape_debug()
        )));
    }
    if input.starts_with('-') || input.ends_with('-') {
        return Err(err(
            "must start and end with a lowercase letter or digit".into()
        ));
    }
    Ok(())
}

/// Longest DNS-1123 subdomain (the longest Kubernetes object name).
pub const MAX_SUBDOMAIN_LEN: usize = 253;

/// Checks a Kubernetes object name: a DNS-1123 subdomain (lowercase a-z, 0-9, `-` and
/// `.`, starting and ending with a letter or digit, at most 253 bytes) — the rule for the
/// names of Applications, AppProjects, Secrets and ConfigMaps. Such a name is safe in a
/// request path and in a log line.
///
/// ```
/// use crate::names::check_object_name;
/// assert!(check_object_name("guestbook.v2").is_ok());
/// assert!(check_object_name("../status").is_err());
/// ```
pub fn check_object_name(input: &str) -> Result<(), IdError> {
    let err = |reason: String| IdError::Name {
        what: "object name",
        input: quote(input),
        reason,
    };
    if input.is_empty() {
        return Err(err("must not be empty".into()));
    }
    if input.len() > MAX_SUBDOMAIN_LEN {
        return Err(err(format!(
            "is {} bytes long, the maximum is {MAX_SUBDOMAIN_LEN}",
            input.len()
        )));
    }
    if let Some(c) = input
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '.'))
    {
        return Err(err(format!(
            "must be a DNS-1123 subdomain (lowercase a-z, 0-9, '-' and '.'), found '{c}'",
            c = c.escape_debug()
        )));
    }
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !alnum(input.chars().next()) || !alnum(input.chars().last()) {
        return Err(err(
            "must start and end with a lowercase letter or digit".into()
        ));
    }
    Ok(())
}

macro_rules! label_type {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            #[doc = concat!("Validates and wraps a ", $what, " (DNS-1123 label).")]
            pub fn new(input: &str) -> Result<Self, IdError> {
                check_label($what, input)?;
                Ok(Self(input.to_owned()))
            }

            #[doc = concat!("The ", $what, " as a string.")]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = IdError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, Self::Error> {
                check_label($what, &s)?;
                Ok(Self(s))
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

label_type!(
    /// The name of an agent, e.g. `edge-7`: a DNS-1123 label.
    ///
    /// ```
    /// use argocd_agent_domain::AgentName;
    /// assert!(AgentName::new("edge-7").is_ok());
    /// assert!(AgentName::new("Edge_7").is_err());
    /// ```
    AgentName,
    "agent name"
);

label_type!(
    /// A Kubernetes namespace on the hub, e.g. `argocd-edge-7`: a DNS-1123 label.
    Namespace,
    "namespace"
);

label_type!(
    /// The name of a tenant, e.g. `team-a`: a DNS-1123 label.
    TenantName,
    "tenant name"
);

/// Kinds of Argo CD objects that travel between principal and agents, and that the
/// authorization policy reasons about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ResourceKind {
    /// `argoproj.io/v1alpha1` Application.
    Application,
    /// `argoproj.io/v1alpha1` AppProject.
    AppProject,
    /// An Argo CD repository or repository-credential template: a `v1` Secret labelled
    /// `argocd.argoproj.io/secret-type: repository | repo-creds`.
    Repository,
    /// Argo CD's GPG public keys: the `v1` ConfigMap `argocd-gpg-keys-cm`.
    GpgKeys,
}

impl ResourceKind {
    /// Upstream's event target name (`application`, `appproject`, `repository`, `gpgkey`): the
    /// `resource_type` label of both binaries' upstream metrics.
    pub fn target_name(self) -> &'static str {
        match self {
            ResourceKind::Application => "application",
            ResourceKind::AppProject => "appproject",
            ResourceKind::Repository => "repository",
            ResourceKind::GpgKeys => "gpgkey",
        }
    }

    /// The Kubernetes kind, e.g. `Application`.
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Application => "Application",
            ResourceKind::AppProject => "AppProject",
            ResourceKind::Repository => "Repository",
            ResourceKind::GpgKeys => "GPGKeys",
        }
    }

    /// The `kind` of the Kubernetes objects that store this kind (repositories are
    /// Secrets, GPG keys a ConfigMap).
    pub fn object_kind(self) -> &'static str {
        match self {
            ResourceKind::Application => "Application",
            ResourceKind::AppProject => "AppProject",
            ResourceKind::Repository => "Secret",
            ResourceKind::GpgKeys => "ConfigMap",
        }
    }

    /// The `apiVersion` of the Kubernetes objects that store this kind.
    pub fn object_api_version(self) -> &'static str {
        match self {
            ResourceKind::Application | ResourceKind::AppProject => "argoproj.io/v1alpha1",
            ResourceKind::Repository | ResourceKind::GpgKeys => "v1",
        }
    }

    /// Every kind, in a stable order.
    pub const ALL: [ResourceKind; 4] = [
        ResourceKind::Application,
        ResourceKind::AppProject,
        ResourceKind::Repository,
        ResourceKind::GpgKeys,
    ];

    /// Parses a Kubernetes kind; `None` for kinds that do not travel on the stream.
    pub fn parse(s: &str) -> Option<ResourceKind> {
        match s {
            "Application" => Some(ResourceKind::Application),
            "AppProject" => Some(ResourceKind::AppProject),
            "Repository" => Some(ResourceKind::Repository),
            "GPGKeys" => Some(ResourceKind::GpgKeys),
            _ => None,
        }
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a mode string was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid agent mode {input}: expected one of {expected}", input = quoted(.input))]
pub struct ModeParseError {
    input: String,
    expected: &'static str,
}

/// How an agent runs: which side is the source of truth for `.spec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentMode {
    /// The hub owns `.spec`; the agent only reports status.
    Managed,
    /// The spoke owns `.spec`; the hub copy is read-only.
    Autonomous,
}

impl AgentMode {
    /// `managed` or `autonomous`.
    pub fn as_str(self) -> &'static str {
        match self {
            AgentMode::Managed => "managed",
            AgentMode::Autonomous => "autonomous",
        }
    }
}

impl fmt::Display for AgentMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AgentMode {
    type Err = ModeParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "managed" => Ok(AgentMode::Managed),
            "autonomous" => Ok(AgentMode::Autonomous),
            _ => Err(ModeParseError {
                input: quote(s),
                expected: "managed, autonomous",
            }),
        }
    }
}

/// Which modes a mapping rule allows an agent to run in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum AllowedModes {
    /// Only [`AgentMode::Managed`] (the default: the hub decides the mode, and the mode
    /// that cannot write the hub is the one granted without being asked for).
    #[default]
    Managed,
    /// Only [`AgentMode::Autonomous`].
    Autonomous,
    /// Either mode: the agent chooses (`--agent-mode`), as upstream's principal lets it.
    Both,
}

impl AllowedModes {
    /// Whether `mode` is allowed.
    pub fn allows(self, mode: AgentMode) -> bool {
        matches!(
            (self, mode),
            (AllowedModes::Both, _)
                | (AllowedModes::Managed, AgentMode::Managed)
                | (AllowedModes::Autonomous, AgentMode::Autonomous)
        )
    }

    /// `managed`, `autonomous` or `both`.
    pub fn as_str(self) -> &'static str {
        match self {
            AllowedModes::Managed => "managed",
            AllowedModes::Autonomous => "autonomous",
            AllowedModes::Both => "both",
        }
    }
}

impl fmt::Display for AllowedModes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AllowedModes {
    type Err = ModeParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "managed" => Ok(AllowedModes::Managed),
            "autonomous" => Ok(AllowedModes::Autonomous),
            "both" | "any" => Ok(AllowedModes::Both),
            _ => Err(ModeParseError {
                input: quote(s),
                expected: "managed, autonomous, both (or any)",
            }),
        }
    }
}

impl TryFrom<String> for AllowedModes {
    type Error = ModeParseError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<AllowedModes> for String {
    fn from(m: AllowedModes) -> String {
        m.as_str().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_labels_are_accepted() {
        for ok in ["a", "0", "edge-7", "a-b-c", "x".repeat(63).as_str(), "1abc"] {
            assert!(AgentName::new(ok).is_ok(), "{ok}");
            assert!(Namespace::new(ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn invalid_labels_are_rejected_with_reason() {
        for (bad, why) in [
            ("", "empty"),
            ("Edge", "'E'"),
            ("edge_7", "'_'"),
            ("edge.7", "'.'"),
            ("-edge", "start and end"),
            ("edge-", "start and end"),
            (&"x".repeat(64), "maximum is 63"),
        ] {
            let msg = AgentName::new(bad).unwrap_err().to_string();
            assert!(msg.starts_with("invalid agent name"), "{msg}");
            assert!(msg.contains(why), "{bad}: {msg}");
            let msg = Namespace::new(bad).unwrap_err().to_string();
            assert!(msg.starts_with("invalid namespace"), "{msg}");
        }
    }

    #[test]
    fn object_names_are_dns1123_subdomains() {
        let long = "x".repeat(MAX_SUBDOMAIN_LEN);
        for ok in [
            "a",
            "guestbook",
            "my.app-1",
            "0",
            long.as_str(),
            "argocd-gpg-keys-cm",
        ] {
            assert!(check_object_name(ok).is_ok(), "{ok}");
        }
        let too_long = "x".repeat(MAX_SUBDOMAIN_LEN + 1);
        for bad in [
            "",
            "../etc",
            "a/status",
            "app?watch=1",
            "a\nforged log line",
            "a\0b",
            "Guestbook",
            "-a",
            "a.",
            ".a",
            "a b",
            "\u{e9}t\u{e9}",
            too_long.as_str(),
        ] {
            let msg = check_object_name(bad).unwrap_err().to_string();
            assert!(msg.starts_with("invalid object name"), "{bad:?}: {msg}");
            assert!(!msg.contains('\n') && !msg.contains('\0'), "{msg:?}");
        }
    }

    #[test]
    fn names_serde_validate() {
        let n: AgentName = serde_json::from_str("\"edge-7\"").unwrap();
        assert_eq!(n.as_str(), "edge-7");
        assert!(serde_json::from_str::<Namespace>("\"Bad\"").is_err());
    }

    #[test]
    fn modes_parse_and_display() {
        assert_eq!("managed".parse::<AgentMode>().unwrap(), AgentMode::Managed);
        assert_eq!(AgentMode::Autonomous.to_string(), "autonomous");
        assert!("both".parse::<AgentMode>().is_err());
        assert_eq!("any".parse::<AllowedModes>().unwrap(), AllowedModes::Both);
        assert_eq!("both".parse::<AllowedModes>().unwrap(), AllowedModes::Both);
        assert!("Managed".parse::<AllowedModes>().is_err());
    }

    #[test]
    fn allowed_modes_allow_exactly_their_modes() {
        use AgentMode::*;
        assert!(AllowedModes::Both.allows(Managed) && AllowedModes::Both.allows(Autonomous));
        assert!(AllowedModes::Managed.allows(Managed));
        assert!(!AllowedModes::Managed.allows(Autonomous));
        assert!(AllowedModes::Autonomous.allows(Autonomous));
        assert!(!AllowedModes::Autonomous.allows(Managed));
    }
}
