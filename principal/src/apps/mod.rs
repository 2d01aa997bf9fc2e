//! Applications on the hub and the agents that serve them.

pub mod owners;

pub use owners::AppOwners;
