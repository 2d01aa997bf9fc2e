//! Accepting and bounding connections, for every endpoint of the principal and the agent
//! (docs/reliability.md, "Every listener"): caps on connections and handshakes, in total and
//! per client address ([`Caps`]), refusals counted and logged without a storm
//! ([`RefusalLog`]), handshake, header, preface and idle timeouts; the HTTP/1.1 and HTTP/2
//! serving loop ([`serve`]) and the bounded accept loop gRPC is served from
//! ([`Bounded`], [`plain_incoming`]), each connection a task on the caller's `TaskTracker`.
//! Who the client is (TLS, SPIFFE) is not known here: the identity crate supplies the TLS
//! handshake that reads it ([`Handshake`]).
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// Functions under 80 lines (the threshold is in clippy.toml); unit tests are exempt.
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
#![deny(rust_2018_idioms, unused_must_use)]

pub mod caps;
pub mod gate;
pub mod http_server;
pub mod incoming;
pub mod preface;
pub mod refusal;
pub mod text;

pub use caps::{Admission, Caps, ClientLimit, ClientSlot};
pub use gate::{
    Accept, DEFAULT_MAX_CONCURRENT_HANDSHAKES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT, DEFAULT_MAX_HANDSHAKES_PER_CLIENT, HANDSHAKE_TIMEOUT,
    IncomingOptions, PREFACE_TIMEOUT, REFUSED_REASONS, ReadyHook, RefusedHook,
};
pub use http_server::{
    CLOSE_REASONS, Handler, Limits, OnClose, Reserved, ReservedConnection, Tracked, serve,
};
pub use incoming::{Accepted, Bounded, Handshake, NoHandshake, NoPrepare, Refused, plain_incoming};
pub use preface::{H2_PREFACE, Prefaced, read_h2_preface};
pub use refusal::RefusalLog;
