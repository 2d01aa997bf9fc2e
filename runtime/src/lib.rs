//! What the principal and the agent run the same way, so neither binary carries its own copy:
//! logging and OpenTelemetry setup ([`logging`], [`telemetry`]), the `/healthz`, `/readyz`
//! and `/metrics` endpoint ([`health`], in the text format of [`exposition`]), and the bounded drain of their tasks at shutdown
//! ([`tasks`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod exposition;
pub mod health;
pub mod logging;
pub mod svid;
pub mod tasks;
pub mod telemetry;
