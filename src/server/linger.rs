//! Lingering close for gRPC connections: when a connection ends (the final GOAWAY answered, or
//! any other close), it stops writing (a FIN after everything queued), then reads and discards
//! until the peer closes or the grace ends, and only then closes the socket.
//!
//! Closing a socket whose peer is still sending (WINDOW_UPDATEs from a client that reads slowly)
//! makes the kernel answer with a reset, and a reset throws away what was queued to send: the
//! answers the server had taken in and decided would be lost (RFC 9113 §6.8 asks the sender of
//! a GOAWAY to keep the connection open until the peer has read it).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tonic::transport::server::Connected;

use super::tls::Accept;

/// A connection that lingers on close (see the module docs).
pub(crate) struct Linger<T> {
    io: T,
    grace: Duration,
    /// Set once our side is shut: when to stop waiting for the peer to close.
    until: Option<Pin<Box<Sleep>>>,
}

impl<T> Linger<T> {
    pub(crate) fn new(io: T, grace: Duration) -> Linger<T> {
        Linger {
            io,
            grace,
            until: None,
        }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Linger<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Linger<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    /// Shuts our side (after what is queued), then reads and discards until the peer closes,
    /// fails, or the grace ends.
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.until.is_none() {
            ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
            this.until = Some(Box::pin(tokio::time::sleep(this.grace)));
        }
        let mut sink = [0u8; 4096];
        loop {
            if this
                .until
                .as_mut()
                .expect("set above")
                .as_mut()
                .poll(cx)
                .is_ready()
            {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut sink);
            match Pin::new(&mut this.io).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                // The peer closed (or the connection failed): nothing left to protect.
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {}
            }
        }
    }
}

impl<T: Connected> Connected for Linger<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// A listener whose connections linger on close (the TLS accept loop takes it like any other).
pub(crate) struct LingeringListener<L> {
    pub(crate) inner: L,
    pub(crate) grace: Duration,
}

impl<L: Accept + Sync> Accept for LingeringListener<L> {
    type Io = Linger<L::Io>;

    async fn accept(&self) -> io::Result<Self::Io> {
        let io = self.inner.accept().await?;
        Ok(Linger::new(io, self.grace))
    }
}
