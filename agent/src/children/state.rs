//! What the agent knows of the children on its spoke (the state the children's flows in
//! the parent module change).

use std::collections::{BTreeSet, HashMap};

use crate::proxy::rules::Tracking;

/// What the agent knows of the children on its spoke.
#[derive(Default)]
pub(crate) struct ChildState {
    /// Children published since the last welcome, by name: their parent and the checksum
    /// of what was sent.
    pub(super) sent: HashMap<String, (String, String)>,
    /// Local Applications tracked by a name that is not a managed copy here (yet), by
    /// that name: looked at again when such a copy arrives.
    pub(super) waiting: HashMap<String, BTreeSet<String>>,
    /// The spoke's tracking settings, as last read.
    pub(super) tracking: Option<Tracking>,
    /// The children the last hello listed, with their parents, until its welcome.
    pub(super) hello: HashMap<String, String>,
}
