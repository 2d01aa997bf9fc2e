//! (being written)
pub struct AgentMode;
pub struct AgentName;
pub struct Namespace;
