//! Accepted connections and what bounds them: how many are open at once (the rest wait in
//! the kernel's accept queue), the size of a request head, how long a client may take to send
//! one (which is also how long a kept-alive connection may sit idle), how long a connection
//! may make no progress in either direction (a client that stops reading a response), and
//! graceful shutdown. Each connection is served by hyper's HTTP/1.1 server over a
//! [`ZeroCopyStream`] wrapped in [`IdleTimeout`].

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

use super::zero_copy::ZeroCopyStream;
use crate::telemetry::names;

/// The limits on connections, from the config.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionLimits {
    pub max_connections: usize,
    /// Largest request line plus headers; more is answered 431 and the connection closed.
    pub max_header_bytes: usize,
    /// Time to receive a request's whole head, counted from when the server starts waiting
    /// for it: also the longest a kept-alive connection may stay idle between requests.
    pub header_timeout: Duration,
    /// Longest time a connection may move no bytes either way while the server waits on it.
    pub idle_timeout: Duration,
}

impl ConnectionLimits {
    pub(crate) fn from_config(config: &crate::config::Config) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: config.limits.max_connections,
            max_header_bytes: config.limits.max_header_bytes,
            header_timeout: Duration::from_secs(config.limits.header_timeout_secs),
            idle_timeout: Duration::from_secs(config.limits.idle_timeout_secs),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and gives
/// open connections `drain` to finish their responses before they are dropped.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        // Not `max_buf_size`: it bounds the write queue too, and would split responses into
        // more writes; hyper's default (~400 KiB) already bounds what one connection reads.
        .max_header_size(limits.max_header_bytes);
    let service = TowerToHyperService::new(router);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => slot.expect("the connection semaphore is never closed"),
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    accept_failed(&e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let stream = ZeroCopyStream::new(stream);
        let io = TokioIo::new(IdleTimeout::new(stream, limits.idle_timeout));
        let connection = graceful.watch(http.serve_connection(io, service.clone()));
        tokio::spawn(async move {
            let open = metrics::gauge!(names::HTTP_CONNECTIONS);
            open.increment(1.0);
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            open.decrement(1.0);
            drop(slot);
        });
    }
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        drain_secs = drain.as_secs(),
        "shutting down: draining in-flight requests"
    );
    if tokio::time::timeout(drain, graceful.shutdown()).await.is_err() {
        tracing::warn!("drain time ran out; closing remaining connections");
    }
}

/// An accept that failed. Running out of descriptors (or memory) would fail again at once,
/// so the loop pauses rather than spin; a connection reset before it was accepted is nothing.
async fn accept_failed(error: &io::Error) {
    use io::ErrorKind::*;
    if matches!(error.kind(), ConnectionAborted | ConnectionReset | Interrupted) {
        return;
    }
    tracing::error!(error = %error, "cannot accept a connection; pausing 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// A stream that fails with `TimedOut` once nothing has moved in either direction for
/// `timeout` while the server waits on it: a client that stops reading a response, or
/// stalls mid-request, loses its connection instead of holding it (and its buffers and
/// connection slot) forever.
pub(super) struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    deadline: Pin<Box<Sleep>>,
    /// Set when the deadline passed. From then on every read and write fails: hyper may set
    /// a read error aside while it writes a response, and the client must not win its
    /// connection back by reading again.
    expired: bool,
}

impl<S> IdleTimeout<S> {
    pub(super) fn new(inner: S, timeout: Duration) -> IdleTimeout<S> {
        IdleTimeout { inner, timeout, deadline: Box::pin(tokio::time::sleep(timeout)), expired: false }
    }

    /// Pushes the deadline back after progress, or fails a wait that has lasted too long.
    fn after<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
        progressed: impl FnOnce(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        match &polled {
            Poll::Ready(Ok(value)) if progressed(value) => {
                self.deadline.as_mut().reset(Instant::now() + self.timeout);
            }
            Poll::Pending if self.deadline.as_mut().poll(cx).is_ready() => {
                metrics::counter!(names::HTTP_IDLE_TIMEOUTS).increment(1);
                self.expired = true;
                return Poll::Ready(Err(Self::timed_out()));
            }
            _ => {}
        }
        polled
    }

    fn timed_out() -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, "the connection made no progress within idle_timeout_secs")
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for IdleTimeout<S> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(Self::timed_out()));
        }
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        let filled = buf.filled().len() > before;
        this.after(cx, polled, |()| filled)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(Self::timed_out()));
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after(cx, polled, |n| *n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(Self::timed_out()));
        }
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.after(cx, polled, |n| *n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.after(cx, polled, |()| false)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
