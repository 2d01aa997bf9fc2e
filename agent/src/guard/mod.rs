//! The spoke guard: a policy the spoke's owner writes on the spoke (a file, a ConfigMap in
//! the agent's namespace, flags) that the hub can neither read nor change, enforced on
//! everything the principal sends. See `docs/spoke-guard.md`.
//!
//! [`GuardSpec`] is the policy as written (YAML or flags); [`Guard`] is one compiled
//! source; [`GuardSet`] is every source in force, each of which must allow a write (the
//! sources narrow each other, none widens another). The rules are in [`rules`]; live
//! reloading in [`live`].

pub mod live;
pub mod policy;
pub mod refused;
pub mod rules;

pub use live::{GuardSources, LiveGuard};
pub use policy::*;

#[cfg(test)]
mod tests;
