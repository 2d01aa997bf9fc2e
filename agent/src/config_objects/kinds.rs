//! The spoke's configuration objects (AppProjects, repository Secrets, GPG keys): which
//! kinds a mode keeps in step, their watched caches, and what the agent last sent or
//! received of each object.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use argocd_agent_domain::{AgentMode, ResourceKind};
use argocd_agent_kubernetes::{ObjectStore, ObjectView};
use serde_json::Value;

/// Label selector of the repository Secrets the agent watches.
pub const REPOSITORY_SELECTOR: &str = "argocd.argoproj.io/secret-type in (repository,repo-creds)";

/// One kind of configuration object: how to write it and what a watch has seen of it,
/// through the backend traits (kube-rs's `Resources` and `Cache` in the binary, memory in
/// unit tests).
pub struct ConfigKind {
    /// Which kind (AppProject, Repository, GPG keys).
    pub kind: ResourceKind,
    /// Writes objects of the kind in the spoke's namespace.
    pub resources: Arc<dyn ObjectStore>,
    /// The watched objects of the kind (repositories: only those of
    /// [`REPOSITORY_SELECTOR`]).
    pub cache: Arc<dyn ObjectView>,
}

/// An object by kind and name.
pub(super) type Key = (ResourceKind, String);

/// The spoke's configuration objects and what it knows about them.
#[derive(Default)]
pub struct ConfigKinds {
    pub(super) kinds: Vec<ConfigKind>,
    /// Managed: the last object the principal sent, by kind and name.
    pub(super) desired: Mutex<HashMap<Key, Arc<Value>>>,
    /// Autonomous: checksum of the last object published, by kind and name.
    pub(super) published: Mutex<HashMap<Key, String>>,
}

/// The kinds an agent in `mode` keeps in step with the principal.
pub fn kinds_for(mode: AgentMode) -> &'static [ResourceKind] {
    match mode {
        AgentMode::Managed => &[
            ResourceKind::AppProject,
            ResourceKind::Repository,
            ResourceKind::GpgKeys,
        ],
        AgentMode::Autonomous => &[ResourceKind::AppProject],
    }
}

impl ConfigKinds {
    /// The configuration objects of `kinds`.
    pub fn new(kinds: Vec<ConfigKind>) -> Self {
        ConfigKinds {
            kinds,
            ..Default::default()
        }
    }

    pub(super) fn get(&self, kind: ResourceKind) -> Option<&ConfigKind> {
        self.kinds.iter().find(|k| k.kind == kind)
    }

    /// Waits until every cache has listed once.
    pub async fn wait_synced(&self) {
        for k in &self.kinds {
            k.cache.wait_synced().await;
        }
    }
}
