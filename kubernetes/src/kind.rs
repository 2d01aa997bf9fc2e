//! The kinds of Kubernetes objects argocd-agent reads and writes.

use std::fmt;

use argocd_agent_domain::ResourceKind;
use kube::discovery::ApiResource;

/// A kind of object the principal or the agent works with.
///
/// Every kind maps to exactly one API group/version/resource, so callers never build
/// paths by hand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// Argo CD `Application` (`argoproj.io/v1alpha1`, namespaced).
    Application,
    /// Argo CD `AppProject` (`argoproj.io/v1alpha1`, namespaced).
    AppProject,
    /// Core `Secret` (`v1`, namespaced).
    Secret,
    /// Core `ConfigMap` (`v1`, namespaced).
    ConfigMap,
    /// Core `Namespace` (`v1`, cluster-scoped).
    Namespace,
    /// `Lease` (`coordination.k8s.io/v1`, namespaced): principal replicas' sessions.
    Lease,
}

/// API group of the Argo CD custom resources.
pub const ARGOPROJ_GROUP: &str = "argoproj.io";
/// API version of the Argo CD custom resources.
pub const ARGOPROJ_VERSION: &str = "v1alpha1";

impl Kind {
    /// Every kind, in a stable order (useful for tests and RBAC listings).
    pub const ALL: [Kind; 6] = [
        Kind::Application,
        Kind::AppProject,
        Kind::Secret,
        Kind::ConfigMap,
        Kind::Namespace,
        Kind::Lease,
    ];

    /// The API resource (group, version, kind, plural) used to build request paths.
    pub fn api_resource(&self) -> ApiResource {
        let (group, version, kind, plural) = match self {
            Kind::Application => (
                ARGOPROJ_GROUP,
                ARGOPROJ_VERSION,
                "Application",
                "applications",
            ),
            Kind::AppProject => (
                ARGOPROJ_GROUP,
                ARGOPROJ_VERSION,
                "AppProject",
                "appprojects",
            ),
            Kind::Secret => ("", "v1", "Secret", "secrets"),
            Kind::ConfigMap => ("", "v1", "ConfigMap", "configmaps"),
            Kind::Namespace => ("", "v1", "Namespace", "namespaces"),
            Kind::Lease => ("coordination.k8s.io", "v1", "Lease", "leases"),
        };
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version,
            kind: kind.to_string(),
            plural: plural.to_string(),
        }
    }

    /// Whether objects of this kind live in a namespace.
    pub fn namespaced(&self) -> bool {
        !matches!(self, Kind::Namespace)
    }

    /// The `kind` field value (`Application`, `AppProject`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Application => "Application",
            Kind::AppProject => "AppProject",
            Kind::Secret => "Secret",
            Kind::ConfigMap => "ConfigMap",
            Kind::Namespace => "Namespace",
            Kind::Lease => "Lease",
        }
    }
}

impl Kind {
    /// The top-level fields that are an object's content, the part one side owns and the
    /// other copies: `spec` for Argo CD objects, `type` and `data` for Secrets, `data` and
    /// `binaryData` for ConfigMaps.
    pub fn content_fields(&self) -> &'static [&'static str] {
        match self {
            Kind::Application | Kind::AppProject | Kind::Lease => &["spec"],
            Kind::Secret => &["type", "data"],
            Kind::ConfigMap => &["data", "binaryData"],
            Kind::Namespace => &[],
        }
    }
}

/// The Kubernetes kind that stores each kind of object that travels between principal and
/// agent (repositories are Secrets, GPG keys a ConfigMap).
impl From<ResourceKind> for Kind {
    fn from(kind: ResourceKind) -> Kind {
        match kind {
            ResourceKind::Application => Kind::Application,
            ResourceKind::AppProject => Kind::AppProject,
            ResourceKind::Repository => Kind::Secret,
            ResourceKind::GpgKeys => Kind::ConfigMap,
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argo_kinds_use_argoproj_group_and_plural() {
        let ar = Kind::Application.api_resource();
        assert_eq!(ar.api_version, "argoproj.io/v1alpha1");
        assert_eq!(ar.plural, "applications");
        let ar = Kind::AppProject.api_resource();
        assert_eq!(ar.plural, "appprojects");
        assert_eq!(ar.kind, "AppProject");
    }

    #[test]
    fn core_kinds_use_legacy_v1_group() {
        for kind in [Kind::Secret, Kind::ConfigMap, Kind::Namespace] {
            let ar = kind.api_resource();
            assert_eq!(ar.group, "");
            assert_eq!(ar.api_version, "v1");
            assert_eq!(ar.kind, kind.to_string());
        }
        assert!(!Kind::Namespace.namespaced());
        assert!(Kind::Secret.namespaced());
    }
}
