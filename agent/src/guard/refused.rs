//! What the spoke guard refused and has not seen replaced since (kept by the spoke, read
//! and written by [`crate::guarded`]).

use std::collections::{HashMap, HashSet};

use argocd_agent_domain::ResourceKind;

use super::policy::Refusal;

/// An Application the guard refused, until the hub sends one the guard takes.
#[derive(Debug, Clone)]
pub(crate) struct AppRefusal {
    pub(crate) refusal: Refusal,
    /// When this refusal (rule and message) was first made, RFC 3339.
    pub(crate) since: String,
    /// The hub UID of the refused object.
    pub(crate) source_uid: Option<String>,
}

/// What the guard refused and has not seen replaced since.
#[derive(Default)]
pub(crate) struct GuardState {
    /// Applications, by the spoke's key (the spoke's key of an Application).
    pub(crate) apps: HashMap<String, AppRefusal>,
    /// Configuration objects, by kind and name.
    pub(crate) config: HashSet<(ResourceKind, String)>,
}
