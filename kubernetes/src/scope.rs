//! Which objects a watch covers: namespaces plus a label selector, always excluding
//! objects labelled [`IGNORE_SYNC_LABEL`].

use kube::api::DynamicObject;

/// Label that excludes an object from synchronisation (any value), as upstream
/// argocd-agent. An object that gains it looks deleted to the sync engine.
pub const IGNORE_SYNC_LABEL: &str = "argocd-agent.argoproj-labs.io/ignore-sync";

/// The namespaces a watch covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Namespaces {
    /// Every namespace (one cluster-wide watch). Also used for cluster-scoped kinds.
    All,
    /// A single namespace.
    One(String),
    /// Several namespaces (one watch per namespace, merged).
    Set(Vec<String>),
}

/// What a watch covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Namespaces to watch; ignored for cluster-scoped kinds.
    pub namespaces: Namespaces,
    /// Extra label selector in API syntax (`a=b,c in (d),!e`), if any.
    pub label_selector: Option<String>,
}

impl Scope {
    /// Every namespace, no extra selector.
    pub fn all() -> Self {
        Self {
            namespaces: Namespaces::All,
            label_selector: None,
        }
    }

    /// One namespace, no extra selector.
    pub fn namespace(ns: impl Into<String>) -> Self {
        Self {
            namespaces: Namespaces::One(ns.into()),
            label_selector: None,
        }
    }

    /// Adds an extra label selector.
    pub fn with_label_selector(mut self, selector: impl Into<String>) -> Self {
        self.label_selector = Some(selector.into());
        self
    }

    /// The selector sent to the API server: the caller's selector plus
    /// `!argocd-agent.argoproj-labs.io/ignore-sync`.
    pub fn server_label_selector(&self) -> String {
        let exclusion = format!("!{IGNORE_SYNC_LABEL}");
        match self.label_selector.as_deref().map(str::trim) {
            Some(sel) if !sel.is_empty() => format!("{sel},{exclusion}"),
            _ => exclusion,
        }
    }
}

/// True when `obj` carries [`IGNORE_SYNC_LABEL`] (any value) and must look absent to
/// the sync engine.
pub fn is_sync_ignored(obj: &DynamicObject) -> bool {
    obj.metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(IGNORE_SYNC_LABEL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_selector_always_excludes_ignore_sync() {
        assert_eq!(
            Scope::all().server_label_selector(),
            "!argocd-agent.argoproj-labs.io/ignore-sync"
        );
        assert_eq!(
            Scope::namespace("a")
                .with_label_selector("team=x")
                .server_label_selector(),
            "team=x,!argocd-agent.argoproj-labs.io/ignore-sync"
        );
    }
}
