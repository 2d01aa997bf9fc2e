//! Argo CD's per-application cache keys, the only keys the proxy sends to an agent.
//!
//! argocd-server reads `app|managed-resources|<instance>` and `app|resources-tree|<instance>`
//! (with the cache version appended after a `|`, a shard number before it for large trees,
//! and `.gz` when Redis compression is on), and subscribes to the channel of the same name
//! for changes. `<instance>` is `<namespace>_<name>` for Applications outside Argo CD's own
//! namespace, which is where every agent's Applications live on the hub.

use std::fmt;

use argocd_agent_domain::Namespace;

/// Longest key the proxy looks at (longer ones go to the hub Redis unchanged).
const MAX_KEY: usize = 1024;
/// Longest Application name (a Kubernetes object name).
const MAX_NAME: usize = 253;

/// Which per-application value a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AppKeyKind {
    /// `app|managed-resources|...`: the Application's managed resources and their diffs.
    ManagedResources,
    /// `app|resources-tree|...`: the Application's resource tree.
    ResourcesTree,
}

impl AppKeyKind {
    /// The kind as it appears in the key.
    pub fn as_str(self) -> &'static str {
        match self {
            AppKeyKind::ManagedResources => "managed-resources",
            AppKeyKind::ResourcesTree => "resources-tree",
        }
    }

    /// Parses the kind segment of a key.
    pub fn parse(s: &str) -> Option<AppKeyKind> {
        match s {
            "managed-resources" => Some(AppKeyKind::ManagedResources),
            "resources-tree" => Some(AppKeyKind::ResourcesTree),
            _ => None,
        }
    }
}

/// A per-application cache key of an Application in a hub namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppKey {
    /// Which value the key holds.
    pub kind: AppKeyKind,
    /// The Application's hub namespace.
    pub namespace: Namespace,
    /// The Application's name.
    pub name: String,
    /// What follows the instance name (`|<shard>`, `|<cache version>`, `.gz`), verbatim.
    pub suffix: String,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

impl AppKey {
    /// Parses a key; `None` for every key that is not an application key of a namespaced
    /// Application (those go to the hub Redis).
    pub fn parse(key: &[u8]) -> Option<AppKey> {
        if key.len() > MAX_KEY {
            return None;
        }
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix("app|")?;
        let (kind, rest) = rest.split_once('|')?;
        let kind = AppKeyKind::parse(kind)?;
        let (instance, suffix) = match rest.find('|') {
            Some(i) => rest.split_at(i),
            None => match rest.strip_suffix(".gz") {
                Some(inst) => (inst, ".gz"),
                None => (rest, ""),
            },
        };
        // Namespaces and names never contain `_`: the first one separates them.
        let (ns, name) = instance.split_once('_')?;
        let namespace = Namespace::new(ns).ok()?;
        if !valid_name(name) {
            return None;
        }
        Some(AppKey {
            kind,
            namespace,
            name: name.to_owned(),
            suffix: suffix.to_owned(),
        })
    }

    /// The same key for an Application whose instance name is `instance` (on a spoke).
    pub fn with_instance(kind: AppKeyKind, instance: &str, suffix: &str) -> String {
        format!("app|{}|{instance}{suffix}", kind.as_str())
    }
}

impl fmt::Display for AppKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "app|{}|{}_{}{}",
            self.kind.as_str(),
            self.namespace,
            self.name,
            self.suffix
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argo_cd_application_keys_name_their_application() {
        for (key, kind, suffix) in [
            (
                "app|resources-tree|agent-a_guestbook|1.8.3",
                AppKeyKind::ResourcesTree,
                "|1.8.3",
            ),
            (
                "app|resources-tree|agent-a_guestbook|1.8.3.gz",
                AppKeyKind::ResourcesTree,
                "|1.8.3.gz",
            ),
            (
                "app|resources-tree|agent-a_guestbook|2|1.8.3",
                AppKeyKind::ResourcesTree,
                "|2|1.8.3",
            ),
            (
                "app|managed-resources|agent-a_guestbook",
                AppKeyKind::ManagedResources,
                "",
            ),
            (
                "app|managed-resources|agent-a_guestbook.gz",
                AppKeyKind::ManagedResources,
                ".gz",
            ),
        ] {
            let k = AppKey::parse(key.as_bytes()).unwrap_or_else(|| panic!("{key}"));
            assert_eq!(k.kind, kind, "{key}");
            assert_eq!(k.namespace.as_str(), "agent-a");
            assert_eq!(k.name, "guestbook");
            assert_eq!(k.suffix, suffix);
            assert_eq!(k.to_string(), key, "round trip");
        }
    }

    #[test]
    fn other_keys_go_to_the_hub() {
        for key in [
            "app|resources-tree|guestbook|1.8.3", // Argo CD's own namespace: no `_`
            "app|other|agent-a_guestbook",
            "cluster|info|https://kubernetes.default.svc",
            "app|resources-tree|Agent_A|x", // not a namespace
            "app|resources-tree|agent-a_Guest|x",
            "app|resources-tree|agent-a_|x",
            "app|resources-tree|_x|x",
            "",
            "app|",
        ] {
            assert_eq!(AppKey::parse(key.as_bytes()), None, "{key}");
        }
        assert_eq!(AppKey::parse(&[b'a'; 2000]), None);
        assert_eq!(AppKey::parse(b"app|resources-tree|a_\xff"), None);
    }

    #[test]
    fn spoke_key_keeps_kind_and_suffix() {
        let k = AppKey::parse(b"app|resources-tree|agent-a_guestbook|1.8.3.gz").unwrap();
        assert_eq!(
            AppKey::with_instance(k.kind, "guestbook", &k.suffix),
            "app|resources-tree|guestbook|1.8.3.gz"
        );
    }
}
