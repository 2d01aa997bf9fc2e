//! What the Redis proxy writes to a client connection: its own answers and the slots' fill.

use std::sync::{Mutex, MutexGuard};

use argocd_agent_redis::Protocol;
use argocd_agent_redis::resp::{self, PubSub};
use bytes::Bytes;

/// An answer the proxy writes itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    Nil,
    Value(Bytes),
    Error(String),
}

/// What fills a reply slot. Local replies are encoded when written, in the protocol the
/// connection speaks by then (a pipelined `HELLO 3` before them has been answered).
#[derive(Debug)]
pub(super) enum Out {
    /// Bytes from the hub Redis, unchanged.
    Raw(Bytes),
    Reply(Reply),
    /// A `subscribe` / `unsubscribe` confirmation with the subscription count.
    PubSub(&'static str, Bytes, i64),
}

impl Out {
    pub(super) fn encode(self, protocol: Protocol) -> Bytes {
        match self {
            Out::Raw(b) => b,
            Out::Reply(r) => r.encode(protocol),
            Out::PubSub(kind, channel, count) => {
                resp::pubsub(protocol, kind, &channel, PubSub::Count(count))
            }
        }
    }
}

impl Reply {
    pub(super) fn encode(&self, protocol: Protocol) -> Bytes {
        match self {
            Reply::Nil => resp::nil(protocol),
            Reply::Value(v) => resp::bulk(protocol, v.clone()),
            Reply::Error(m) => resp::error(m),
        }
    }
}

/// Locks `m`, recovering the data from a poisoned lock.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
