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
pub mod h2;
pub mod http_server;
pub mod incoming;
pub mod refusal;
pub mod text;

pub use caps::{Admission, Caps, ClientLimit, ClientSlot};
pub use gate::{
    Accept, DEFAULT_MAX_CONCURRENT_HANDSHAKES, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_CONNECTIONS_PER_CLIENT, DEFAULT_MAX_HANDSHAKES_PER_CLIENT, HANDSHAKE_TIMEOUT,
    IncomingOptions, PREFACE_TIMEOUT, REFUSED_REASONS, ReadyHook, RefusedHook,
};
pub use h2::{H2_PREFACE, H2Connection, H2Policy, read_h2_preface};
pub use http_server::{
    CLOSE_REASONS, Handler, Limits, OnClose, Reserved, ReservedConnection, Tracked, serve,
};
pub use incoming::{Accepted, Bounded, Handshake, NoHandshake, NoPrepare, Refused, plain_incoming};
pub use refusal::RefusalLog;

/// Implements `tokio::io::AsyncWrite` for a wrapper by handing every call to one of its
/// fields (the wrappers of a connection write through untouched):
/// `forward_async_write!([IO: AsyncWrite + Unpin] Wrapper<IO>, inner);`. (A macro: the five
/// methods are the same for every wrapper, and no library has a delegating one.)
#[macro_export]
macro_rules! forward_async_write {
    ([$($generics:tt)*] $ty:ty, $field:ident) => {
        impl<$($generics)*> ::tokio::io::AsyncWrite for $ty {
            fn poll_write(
                mut self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
                buf: &[u8],
            ) -> ::std::task::Poll<::std::io::Result<usize>> {
                ::std::pin::Pin::new(&mut self.$field).poll_write(cx, buf)
            }
            fn poll_flush(
                mut self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
            ) -> ::std::task::Poll<::std::io::Result<()>> {
                ::std::pin::Pin::new(&mut self.$field).poll_flush(cx)
            }
            fn poll_shutdown(
                mut self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
            ) -> ::std::task::Poll<::std::io::Result<()>> {
                ::std::pin::Pin::new(&mut self.$field).poll_shutdown(cx)
            }
            fn poll_write_vectored(
                mut self: ::std::pin::Pin<&mut Self>,
                cx: &mut ::std::task::Context<'_>,
                bufs: &[::std::io::IoSlice<'_>],
            ) -> ::std::task::Poll<::std::io::Result<usize>> {
                ::std::pin::Pin::new(&mut self.$field).poll_write_vectored(cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                self.$field.is_write_vectored()
            }
        }
    };
}
