//! Revocation by identity: the ConfigMap `argocd-agent-blocklist` in the Argo CD namespace
//! lists SPIFFE IDs, SPIFFE ID prefixes and (as upstream does) SHA-256 fingerprints of
//! client certificates that may not connect. It is watched live: a write closes the open
//! sessions it denies within the watch's latency, and every later stream, tunnel and admin
//! call of a denied identity is refused (`argocd_principal_auth_failures_total{reason="Blocked"}`).
//! The decision lives on the hub, so it survives principal restarts and holds for every
//! replica.
//!
//! ```yaml
//! data:
//!   ids: |            # exact SPIFFE IDs, one per line
//!     spiffe://example.org/ns/agents/sa/edge-7
//!   prefixes: |       # SPIFFE ID prefixes
//!     spiffe://example.org/ns/retired/
//!   fingerprints: |   # SHA-256 of the client certificate (DER), hex, `:` allowed
//!     3f:9a:...
//! ```

use std::collections::HashSet;
use std::sync::{Arc, RwLock};

use argocd_agent_domain::ClientIdentity;
use kube::api::DynamicObject;

/// Name of the ConfigMap.
pub const CONFIGMAP: &str = "argocd-agent-blocklist";
/// Data key of the exact SPIFFE IDs, one per line.
pub const IDS: &str = "ids";
/// Data key of the SPIFFE ID prefixes, one per line (`starts_with`, no wildcards).
pub const PREFIXES: &str = "prefixes";
/// Data key of the client certificates' SHA-256 fingerprints (of the DER), one per line;
/// hex in any case, `:` separators allowed.
pub const FINGERPRINTS: &str = "fingerprints";

/// The parsed list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Blocklist {
    ids: HashSet<String>,
    prefixes: Vec<String>,
    fingerprints: HashSet<String>,
}

/// The entries of one data key: one per line, blank lines and `#` comments ignored.
pub fn entries(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
}

/// A fingerprint in one form: lowercase hex without separators.
pub fn normalize_fingerprint(f: &str) -> String {
    f.chars()
        .filter(|c| *c != ':')
        .flat_map(char::to_lowercase)
        .collect()
}

pub use argocd_agent_identity::transport::fingerprint;

impl Blocklist {
    /// The list a ConfigMap holds (none: empty).
    pub fn from_configmap(cm: Option<&DynamicObject>) -> Blocklist {
        let data = |key: &str| {
            cm.and_then(|c| c.data.pointer(&format!("/data/{key}")))
                .and_then(|v| v.as_str())
                .unwrap_or("")
                .to_owned()
        };
        Blocklist {
            ids: entries(&data(IDS)).map(str::to_owned).collect(),
            prefixes: entries(&data(PREFIXES)).map(str::to_owned).collect(),
            fingerprints: entries(&data(FINGERPRINTS))
                .map(normalize_fingerprint)
                .collect(),
        }
    }

    /// Why `client` (presenting the certificate with `fingerprint`, if any) is denied.
    pub fn denies(&self, client: &ClientIdentity, fingerprint: Option<&str>) -> Option<String> {
        if let Some(id) = client.spiffe_id().map(|id| id.to_string()) {
            if self.ids.contains(&id) {
                return Some(format!("{id} is on the blocklist"));
            }
            if let Some(p) = self.prefixes.iter().find(|p| id.starts_with(p.as_str())) {
                return Some(format!("{id} matches blocklist prefix {p}"));
            }
        }
        match fingerprint {
            Some(f) if self.fingerprints.contains(f) => Some(format!(
                "the client certificate (SHA-256 {f}) is on the blocklist"
            )),
            _ => None,
        }
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty() && self.prefixes.is_empty() && self.fingerprints.is_empty()
    }
}

/// The current list, replaced as the ConfigMap changes.
#[derive(Debug, Default)]
pub struct LiveBlocklist(RwLock<Arc<Blocklist>>);

impl LiveBlocklist {
    /// The list in force now (a snapshot: later changes do not alter it).
    pub fn current(&self) -> Arc<Blocklist> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replaces the list; returns whether it changed.
    pub fn set(&self, list: Blocklist) -> bool {
        let mut cur = self.0.write().unwrap_or_else(|p| p.into_inner());
        if **cur == list {
            return false;
        }
        *cur = Arc::new(list);
        true
    }
}

/// Why the blocklist ConfigMap could not be edited.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    /// Reading or writing it failed.
    #[error("{op} {CONFIGMAP}: {error}")]
    Store {
        /// `reading` or `writing`.
        op: &'static str,
        /// The store's error (printed in the message, so not a `#[source]`).
        error: argocd_agent_kubernetes::Error,
    },
    /// Every attempt met a concurrent write.
    #[error("{CONFIGMAP} kept changing; try again")]
    Conflicts,
}

/// The hub's ConfigMaps where the blocklist lives: the store (kube-rs in the binary, memory
/// in tests) and the Argo CD namespace.
#[derive(Clone)]
pub struct BlocklistStore {
    /// A store of ConfigMaps.
    pub configmaps: std::sync::Arc<dyn argocd_agent_kubernetes::ObjectStore>,
    /// The namespace of [`CONFIGMAP`].
    pub namespace: String,
}

/// Adds (`add`) or removes `entry` under data key `key` of the blocklist ConfigMap (made
/// when missing); returns whether the list changed. Retries on conflict.
pub async fn edit(
    store: &BlocklistStore,
    key: &str,
    entry: &str,
    add: bool,
) -> Result<bool, EditError> {
    use argocd_agent_kubernetes::Error;
    let ns = Some(store.namespace.as_str());
    for _ in 0..5 {
        let current =
            store
                .configmaps
                .get(ns, CONFIGMAP)
                .await
                .map_err(|error| EditError::Store {
                    op: "reading",
                    error,
                })?;
        let mut cm = current.clone().unwrap_or_else(|| {
            let mut cm = kube::api::DynamicObject::new(
                CONFIGMAP,
                &argocd_agent_kubernetes::Kind::ConfigMap.api_resource(),
            );
            cm.metadata.namespace = Some(store.namespace.clone());
            cm
        });
        if !cm
            .data
            .get("data")
            .is_some_and(serde_json::Value::is_object)
        {
            cm.data["data"] = serde_json::json!({});
        }
        let data = &mut cm.data["data"];
        let mut lines: Vec<String> = entries(data.get(key).and_then(|v| v.as_str()).unwrap_or(""))
            .map(str::to_owned)
            .collect();
        let present = lines.iter().any(|l| l == entry);
        match (add, present) {
            (true, true) | (false, false) => return Ok(false),
            (true, false) => lines.push(entry.to_owned()),
            (false, true) => lines.retain(|l| l != entry),
        }
        data[key] = lines
            .iter()
            .map(|l| format!("{l}\n"))
            .collect::<String>()
            .into();
        let written = match current {
            None => store.configmaps.create(&cm).await,
            Some(_) => store.configmaps.replace(&cm).await,
        };
        match written {
            Ok(_) => return Ok(true),
            Err(Error::Conflict { .. } | Error::AlreadyExists { .. }) => continue,
            Err(error) => {
                return Err(EditError::Store {
                    op: "writing",
                    error,
                });
            }
        }
    }
    Err(EditError::Conflicts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use argocd_agent_identity::SpiffeId;
    use serde_json::json;

    fn cm(data: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIGMAP}, "data": data}))
        .unwrap()
    }

    fn id(s: &str) -> ClientIdentity {
        ClientIdentity::Spiffe(SpiffeId::parse(s).unwrap())
    }

    #[test]
    fn ids_prefixes_and_fingerprints_deny() {
        let list = Blocklist::from_configmap(Some(&cm(json!({
            "ids": "spiffe://example.org/ns/agents/sa/edge-7\n\n# a comment\n",
            "prefixes": "spiffe://example.org/ns/retired/  # all of them",
            "fingerprints": "AB:CD:EF\n",
        }))));
        assert!(
            list.denies(&id("spiffe://example.org/ns/agents/sa/edge-7"), None)
                .is_some()
        );
        assert!(
            list.denies(&id("spiffe://example.org/ns/agents/sa/edge-70"), None)
                .is_none()
        );
        assert!(
            list.denies(&id("spiffe://example.org/ns/retired/sa/x"), None)
                .is_some()
        );
        assert!(
            list.denies(&id("spiffe://example.org/ns/agents/sa/ok"), Some("abcdef"))
                .is_some()
        );
        assert!(
            list.denies(&id("spiffe://example.org/ns/agents/sa/ok"), Some("abcde0"))
                .is_none()
        );
        assert!(!list.is_empty());
    }

    #[test]
    fn no_configmap_denies_nothing_and_unchanged_lists_are_not_news() {
        let empty = Blocklist::from_configmap(None);
        assert!(empty.is_empty());
        assert!(
            empty
                .denies(&id("spiffe://example.org/a"), Some("00"))
                .is_none()
        );
        let live = LiveBlocklist::default();
        assert!(!live.set(Blocklist::default()));
        let one = Blocklist::from_configmap(Some(&cm(json!({"ids": "spiffe://example.org/a"}))));
        assert!(live.set(one.clone()));
        assert!(!live.set(one));
    }

    #[test]
    fn fingerprints_are_sha256_hex() {
        assert_eq!(
            fingerprint(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(normalize_fingerprint("BA:78:16"), "ba7816");
    }
}

#[cfg(test)]
mod edit_tests {
    //! The admin API's edits against the in-memory ConfigMap store.
    use super::*;
    use argocd_agent_identity::SpiffeId;
    use argocd_agent_kubernetes::memory::MemoryStore;
    use argocd_agent_kubernetes::{Kind, Scope};

    #[tokio::test]
    async fn edits_make_the_configmap_add_once_remove_and_the_watch_sees_the_list() {
        let configmaps = MemoryStore::new(Kind::ConfigMap);
        let (cache, _changes) = configmaps.watch(Scope::namespace("argocd"));
        let store = BlocklistStore {
            configmaps: std::sync::Arc::new(configmaps.clone()),
            namespace: "argocd".into(),
        };
        let edge = "spiffe://example.org/ns/agents/sa/edge-7";
        let client = ClientIdentity::Spiffe(SpiffeId::parse(edge).unwrap());
        assert!(
            edit(&store, "ids", edge, true).await.unwrap(),
            "made and added"
        );
        assert!(
            !edit(&store, "ids", edge, true).await.unwrap(),
            "already there"
        );
        assert!(edit(&store, "fingerprints", "abcdef", true).await.unwrap());
        let list = Blocklist::from_configmap(cache.get(Some("argocd"), CONFIGMAP).as_deref());
        assert!(list.denies(&client, None).is_some());
        assert!(
            list.denies(
                &ClientIdentity::Spiffe(SpiffeId::parse("spiffe://example.org/x").unwrap()),
                Some("abcdef")
            )
            .is_some()
        );
        assert!(edit(&store, "ids", edge, false).await.unwrap(), "removed");
        assert!(
            !edit(&store, "ids", edge, false).await.unwrap(),
            "nothing to remove"
        );
        let list = Blocklist::from_configmap(cache.get(Some("argocd"), CONFIGMAP).as_deref());
        assert!(list.denies(&client, None).is_none());
        let stored = configmaps.object(Some("argocd"), CONFIGMAP).unwrap();
        assert_eq!(stored.data["data"]["fingerprints"], "abcdef\n");
    }
}
