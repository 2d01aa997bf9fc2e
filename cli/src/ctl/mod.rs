//! `argocd-agentctl` subcommands, one module each.

pub mod agent;
#[cfg(feature = "dev-tools")]
pub mod bench;
pub mod blocklist;
#[cfg(feature = "dev-tools")]
pub mod demo;
#[cfg(feature = "dev-tools")]
pub mod dev;
pub mod identity;
pub mod mesh;
#[cfg(feature = "dev-tools")]
pub mod spiffe;
