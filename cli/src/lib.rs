//! Command-line front ends: `argocd-agent` (principal, agent) and `argocd-agentctl`.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod args;
pub mod ctl;
pub mod upstream;
pub mod version;

/// Error type for command handlers: every failure is printed as one clear line.
pub type CmdResult = Result<(), BoxError>;

/// Any error, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub use argocd_agent_runtime::{logging, telemetry};
