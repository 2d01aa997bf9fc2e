//! `argocd-agentctl` subcommands, one module each.

pub mod demo;
pub mod dev;
pub mod identity;
pub mod mesh;
pub mod spiffe;
