//! Which agent serves an Application: the owner of its hub namespace or, with
//! destination-based mapping, the managed agent it was last placed on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use argocd_agent_domain::{AgentMode, AgentName, Namespace};
use argocd_agent_kubernetes::ObjectView;

use crate::sessions::{AgentState, Sessions, lock};

/// Applications' owners, read by the router and the proxies.
pub struct AppOwners {
    /// The hub's Applications.
    cache: Arc<dyn ObjectView>,
    /// Destination-based mapping: a managed agent's Applications are those whose
    /// `spec.destination.name` names it, in any hub namespace.
    by_destination: bool,
    /// Destination-based mapping: the agent each Application was last routed to, so a
    /// destination change becomes a delete on the old agent and a create on the new one.
    placements: Mutex<HashMap<(String, String), AgentName>>,
    sessions: Arc<Sessions>,
}

impl AppOwners {
    /// Owners of the Applications in `cache`, none placed yet.
    pub fn new(
        cache: Arc<dyn ObjectView>,
        by_destination: bool,
        sessions: Arc<Sessions>,
    ) -> AppOwners {
        AppOwners {
            cache,
            by_destination,
            placements: Mutex::new(HashMap::new()),
            sessions,
        }
    }

    /// The agent that serves Application `ns/name`: with destination-based mapping the
    /// managed agent it was placed on, otherwise the agent owning hub namespace `ns`.
    /// `None` when the Application does not exist or nobody owns it.
    pub fn app_owner(&self, ns: &Namespace, name: &str) -> Option<Arc<AgentState>> {
        self.cache.get(Some(ns.as_str()), name)?;
        let by_namespace = self.sessions.agent_for_namespace(ns);
        if !self.by_destination
            || by_namespace
                .as_ref()
                .is_some_and(|s| s.mode() == AgentMode::Autonomous)
        {
            return by_namespace;
        }
        let placed = self
            .placements()
            .get(&(ns.to_string(), name.to_owned()))
            .cloned()?;
        self.sessions.agent(&placed)
    }

    /// Whether the hub has Application `ns/name`.
    pub fn exists(&self, ns: &Namespace, name: &str) -> bool {
        self.cache.get(Some(ns.as_str()), name).is_some()
    }

    /// Where Applications were placed, by (namespace, name).
    pub(crate) fn placements(&self) -> MutexGuard<'_, HashMap<(String, String), AgentName>> {
        lock(&self.placements)
    }
}
