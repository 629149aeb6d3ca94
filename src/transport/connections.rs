//! Accepted connections and what bounds them: how many are open at once (the rest wait in
//! the kernel's accept queue), the size of a request head, how long a client may take to send
//! one (which is also how long a kept-alive connection may sit idle), how long a connection
//! may wait on its client (a client that stops reading a response, or stalls between
//! requests; never while the server is still answering one), and graceful shutdown. Each
//! connection is served by hyper's HTTP/1.1 server over a [`ZeroCopyStream`] wrapped in
//! [`IdleTimeout`], its requests counted by [`Answering`] while they are being answered.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
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

use super::tls::{ClientIdentity, Tls};
use super::zero_copy::ZeroCopyStream;
use crate::telemetry::names;

/// How connections are served, and their limits, from the config.
#[derive(Debug, Clone)]
pub(crate) struct ConnectionSettings {
    pub max_connections: usize,
    /// Largest request line plus headers; more is answered 431 and the connection closed.
    pub max_header_bytes: usize,
    /// Time to receive a request's whole head, counted from when the server starts waiting
    /// for it: also the longest a kept-alive connection may stay idle between requests.
    pub header_timeout: Duration,
    /// Longest time a connection may wait on its client: for the next request, or for the
    /// client to take more of a response. Time the server spends answering is not counted.
    pub idle_timeout: Duration,
    /// Whether mapped bytes leave with `sendfile` (`server.sendfile`).
    pub sendfile: bool,
    /// Time a client may take to complete its TLS handshake.
    pub handshake_timeout: Duration,
}

impl ConnectionSettings {
    pub(crate) fn from_config(config: &crate::config::Config) -> ConnectionSettings {
        ConnectionSettings {
            max_connections: config.limits.max_connections,
            max_header_bytes: config.limits.max_header_bytes,
            header_timeout: Duration::from_secs(config.limits.header_timeout_secs),
            idle_timeout: Duration::from_secs(config.limits.idle_timeout_secs),
            sendfile: config.server.sendfile,
            handshake_timeout: Duration::from_secs(config.tls.handshake_timeout_secs),
        }
    }
}

/// Serves `router` on `listener` until `shutdown` completes, then stops accepting and gives
/// open connections `drain` to finish their responses before they are dropped. With `tls`,
/// each connection is first a TLS handshake, within `handshake_timeout` (its connection slot
/// held meanwhile, so handshakes count against `max_connections` too).
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    settings: ConnectionSettings,
    tls: Option<Tls>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let slots = Arc::new(Semaphore::new(settings.max_connections));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(settings.header_timeout)
        // Not `max_buf_size`: it bounds the write queue too, and would split responses into
        // more writes; hyper's default (~400 KiB) already bounds what one connection reads.
        .max_header_size(settings.max_header_bytes);
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
        let connection = Connection {
            http: http.clone(),
            router: router.clone(),
            idle_timeout: settings.idle_timeout,
            watcher: graceful.watcher(),
        };
        match &tls {
            None => {
                let stream = ZeroCopyStream::new(stream, settings.sendfile);
                tokio::spawn(connection.serve(stream, None, slot));
            }
            Some(tls) => {
                let (acceptor, timeout) = (tls.acceptor.clone(), settings.handshake_timeout);
                tokio::spawn(async move {
                    if let Err(e) = stream.set_nodelay(true) {
                        tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                    }
                    let Some((stream, identity)) = handshake(acceptor, stream, timeout).await else { return };
                    connection.serve(stream, identity, slot).await;
                });
            }
        }
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

/// The TLS handshake of an accepted connection, within `timeout`, and the identity of its
/// client's certificate (when client certificates are asked for). A failed or timed-out
/// handshake is counted by reason and logged at debug: it is the client's, not the server's.
async fn handshake(
    acceptor: tokio_rustls::TlsAcceptor,
    stream: tokio::net::TcpStream,
    timeout: Duration,
) -> Option<(tokio_rustls::server::TlsStream<tokio::net::TcpStream>, Option<Arc<ClientIdentity>>)> {
    let outcome = match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => {
            let identity = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(ClientIdentity::of);
            metrics::counter!(names::TLS_HANDSHAKES, "outcome" => "ok").increment(1);
            return Some((stream, identity.map(Arc::new)));
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            handshake_failure(&e)
        }
        Err(_) => {
            tracing::debug!(timeout_secs = timeout.as_secs(), "TLS handshake timed out");
            "timeout"
        }
    };
    metrics::counter!(names::TLS_HANDSHAKES, "outcome" => outcome).increment(1);
    None
}

/// The reason a handshake failed, as counted: a client that spoke plain HTTP (or anything
/// else but TLS), one whose certificate was refused or missing, or any other failure.
fn handshake_failure(error: &io::Error) -> &'static str {
    use rustls::Error as E;
    match error.get_ref().and_then(|e| e.downcast_ref::<E>()) {
        Some(E::InvalidMessage(_)) => "not_tls",
        Some(E::InvalidCertificate(_) | E::NoCertificatesPresented) => "client_certificate",
        Some(_) => "refused",
        None => "io",
    }
}

/// What serving one accepted connection needs.
struct Connection {
    http: hyper::server::conn::http1::Builder,
    router: Router,
    idle_timeout: Duration,
    watcher: hyper_util::server::graceful::Watcher,
}

impl Connection {
    /// Serves the connection's requests until it ends, holding its slot.
    async fn serve<S>(self, stream: S, identity: Option<Arc<ClientIdentity>>, slot: tokio::sync::OwnedSemaphorePermit)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let answering = Arc::new(AtomicUsize::new(0));
        let io = TokioIo::new(IdleTimeout::new(stream, self.idle_timeout, Arc::clone(&answering)));
        let service = TowerToHyperService::new(Answering { inner: self.router, answering, identity });
        let connection = self.watcher.watch(self.http.serve_connection(io, service));
        let open = metrics::gauge!(names::HTTP_CONNECTIONS);
        open.increment(1.0);
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        open.decrement(1.0);
        drop(slot);
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

/// The requests of one connection being answered, counted from the call of the router until
/// the response body has ended or been dropped: while one is, the connection is not idle,
/// however long the answer takes to start (a digest being computed, a store slow to answer);
/// `request_timeout_secs` bounds that wait instead.
#[derive(Clone)]
struct Answering {
    inner: Router,
    answering: Arc<AtomicUsize>,
    /// The client certificate's identity, handed to every request of the connection.
    identity: Option<Arc<ClientIdentity>>,
}

/// One request counted in [`Answering`] until dropped.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(answering: &Arc<AtomicUsize>) -> Counted {
        answering.fetch_add(1, Ordering::AcqRel);
        Counted(Arc::clone(answering))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl tower::Service<axum::extract::Request<hyper::body::Incoming>> for Answering {
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower::Service::<axum::extract::Request>::poll_ready(&mut self.inner, cx)
    }

    fn call(&mut self, request: axum::extract::Request<hyper::body::Incoming>) -> Self::Future {
        let counted = Counted::new(&self.answering);
        let mut request = request.map(axum::body::Body::new);
        if let Some(identity) = &self.identity {
            request.extensions_mut().insert(Arc::clone(identity));
        }
        let answer = tower::Service::call(&mut self.inner, request);
        Box::pin(async move {
            let response = answer.await?;
            Ok(response.map(|body| axum::body::Body::new(CountedBody { body, _counted: counted })))
        })
    }
}

/// A response body that keeps its request counted as being answered until it ends.
struct CountedBody {
    body: axum::body::Body,
    _counted: Counted,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A stream that fails with `TimedOut` once it has waited `timeout` on its client with nothing
/// moving: a client that stops reading a response, or stalls mid-request or between requests,
/// loses its connection instead of holding it (and its buffers and connection slot) forever.
/// A read that waits while one of the connection's requests is being answered is not waiting
/// on the client (hyper polls for the next request, or for the connection's end, meanwhile).
pub(super) struct IdleTimeout<S> {
    inner: S,
    timeout: Duration,
    /// The wait for the client to send (a request, the rest of one).
    reading: Wait,
    /// The wait for the client to take more of a response.
    writing: Wait,
    /// Set when a wait ran out. From then on every read and write fails: hyper may set a
    /// read error aside while it writes a response, and the client must not win its
    /// connection back by reading again.
    expired: bool,
    /// The connection's requests being answered ([`Answering`]).
    answering: Arc<AtomicUsize>,
}

/// One direction's wait on the client, measured from its own start.
struct Wait {
    deadline: Pin<Box<Sleep>>,
    /// Whether a wait is being measured: set by the first pending poll after progress.
    armed: bool,
}

impl Wait {
    fn new(timeout: Duration) -> Wait {
        Wait { deadline: Box::pin(tokio::time::sleep(timeout)), armed: false }
    }

    /// Whether a poll that is still pending has waited `timeout` since the wait began.
    fn ran_out(&mut self, cx: &mut Context<'_>, timeout: Duration) -> bool {
        if !self.armed {
            self.deadline.as_mut().reset(Instant::now() + timeout);
            self.armed = true;
        }
        self.deadline.as_mut().poll(cx).is_ready()
    }
}

impl<S> IdleTimeout<S> {
    fn new(inner: S, timeout: Duration, answering: Arc<AtomicUsize>) -> IdleTimeout<S> {
        IdleTimeout {
            inner,
            timeout,
            reading: Wait::new(timeout),
            writing: Wait::new(timeout),
            expired: false,
            answering,
        }
    }

    /// Ends `wait` after progress; fails a wait on the client that has lasted too long.
    fn after<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
        progressed: impl FnOnce(&T) -> bool,
        direction: fn(&mut Self) -> &mut Wait,
    ) -> Poll<io::Result<T>> {
        let timeout = self.timeout;
        let wait = direction(self);
        match &polled {
            Poll::Ready(Ok(value)) if progressed(value) => wait.armed = false,
            Poll::Pending if wait.ran_out(cx, timeout) => {
                metrics::counter!(names::HTTP_IDLE_TIMEOUTS).increment(1);
                self.expired = true;
                return Poll::Ready(Err(Self::timed_out()));
            }
            _ => {}
        }
        polled
    }

    fn timed_out() -> io::Error {
        io::Error::new(io::ErrorKind::TimedOut, "the connection waited on its client for idle_timeout_secs")
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
        if this.answering.load(Ordering::Acquire) > 0 {
            // Not a wait on the client: its request is being answered.
            this.reading.armed = false;
            return polled;
        }
        this.after(cx, polled, |()| filled, |this| &mut this.reading)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for IdleTimeout<S> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.expired {
            return Poll::Ready(Err(Self::timed_out()));
        }
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.after(cx, polled, |n| *n > 0, |this| &mut this.writing)
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
        this.after(cx, polled, |n| *n > 0, |this| &mut this.writing)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.after(cx, polled, |()| false, |this| &mut this.writing)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A server whose one route answers after `answer_after`, with connections idle after
    /// `idle`.
    async fn slow_server(
        answer_after: Duration,
        idle: Duration,
    ) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
        let router = Router::new().route(
            "/slow",
            axum::routing::get(move || async move {
                tokio::time::sleep(answer_after).await;
                "answered"
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let limits = ConnectionSettings {
            max_connections: 4,
            max_header_bytes: 16 << 10,
            header_timeout: Duration::from_secs(30),
            idle_timeout: idle,
            sendfile: false,
            handshake_timeout: Duration::from_secs(10),
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async { stopped.await.unwrap_or(()) };
        tokio::spawn(serve(listener, router, limits, None, stopped, Duration::from_secs(1)));
        (address, stop)
    }

    #[tokio::test]
    async fn a_request_answered_after_longer_than_the_idle_timeout_still_gets_its_answer() {
        let (address, stop) = slow_server(Duration::from_millis(2500), Duration::from_secs(1)).await;
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        client.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").await.unwrap();
        let mut reply = String::new();
        client.read_to_string(&mut reply).await.unwrap();
        assert!(reply.starts_with("HTTP/1.1 200 OK"), "{reply}");
        assert!(reply.ends_with("answered"), "{reply}");
        stop.send(()).unwrap();
    }

    #[tokio::test]
    async fn a_connection_that_waits_on_its_client_is_still_closed_after_the_idle_timeout() {
        let (address, stop) = slow_server(Duration::ZERO, Duration::from_secs(1)).await;
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        // Half a request head, then nothing: the server waits on the client, and gives up.
        client.write_all(b"GET /slow HTTP/1.1\r\n").await.unwrap();
        let mut reply = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(20), client.read_to_end(&mut reply)).await;
        assert!(read.is_ok(), "the connection was not closed");
        stop.send(()).unwrap();
    }
}
