//! The HTTP/2 client preface: read before a gRPC connection is handed to the server (a
//! client that never speaks HTTP/2 holds no connection for long), then replayed to it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::caps::Admission;

/// The HTTP/2 client connection preface (RFC 9113, section 3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads the HTTP/2 client preface from `r`: fails on the first byte that differs, or if
/// the connection ends first.
pub async fn read_h2_preface<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<()> {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; H2_PREFACE.len()];
    let mut filled = 0;
    while filled < buf.len() {
        let n = r.read(&mut buf[filled..]).await?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("connection closed after {filled} bytes of the HTTP/2 preface"),
            ));
        }
        if buf[filled..filled + n] != H2_PREFACE[filled..filled + n] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "not an HTTP/2 client preface",
            ));
        }
        filled += n;
    }
    Ok(())
}

/// A connection whose client sent the HTTP/2 client preface in time (which reads replay
/// first), holding its place under the listener's caps until it ends: what the bounded
/// accept streams hand to `Server::serve_with_incoming`. `IO` is what the handshake made of
/// the connection: the TCP or Unix stream itself (plaintext), or a verified TLS stream.
pub struct Prefaced<IO> {
    inner: IO,
    /// Bytes of [`H2_PREFACE`] already returned by reads ([`H2_PREFACE`]'s length: none left).
    replayed: usize,
    _admission: Admission,
}

impl<IO> Prefaced<IO> {
    /// `inner`, whose preface has been read: reads return it first.
    pub(crate) fn new(inner: IO, admission: Admission) -> Self {
        Prefaced {
            inner,
            replayed: 0,
            _admission: admission,
        }
    }

    /// The connection under the replay (e.g. the verified TLS stream and its peer).
    pub fn get_ref(&self) -> &IO {
        &self.inner
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Prefaced<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefaced<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let pending = &H2_PREFACE[this.replayed..];
        if !pending.is_empty() {
            let n = pending.len().min(buf.remaining());
            buf.put_slice(&pending[..n]);
            this.replayed += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

/// Implements `tokio::io::AsyncWrite` for a wrapper by handing every call to one of its
/// fields (the wrappers of a connection write through untouched):
/// `forward_async_write!([IO: AsyncWrite + Unpin] Prefaced<IO>, inner);`. (A macro: the five
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

crate::forward_async_write!([IO: AsyncWrite + Unpin] Prefaced<IO>, inner);
