//! What principal and agent share about the conversation between them: the typed event
//! model and its CloudEvents encoding, the per-peer delivery queue, and the resync plan.
#![forbid(unsafe_code)]

pub mod event;
pub mod queue;
pub mod resync;

pub use event::{Event, EventError, EventType, Payload, ResourceKind, ResourceRef};
pub use queue::{QueueError, QueueLimits, SendQueue};
