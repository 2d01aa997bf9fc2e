//! What principal and agent share about the conversation between them: the typed event
//! model and its CloudEvents encoding, the per-peer delivery queue, and the resync plan.
#![forbid(unsafe_code)]

pub mod event;
pub mod proxy;
pub mod queue;
pub mod redis;
pub mod resync;
pub mod rpc;
pub mod trace;

pub use event::{
    Event, EventError, EventType, JsonObject, LazyObject, Payload, ResourceKind, ResourceRef,
};
pub use queue::{QueueError, QueueLimits, SendQueue};

/// Formats an error with its chain of causes, `outer: inner: root`: the message of the
/// error events peers send each other, and of log lines.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(": ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}
