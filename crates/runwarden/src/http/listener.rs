//! The API's accept loop, hardened against slow and idle clients: at most
//! `max_connections` connections at once (the rest wait in the kernel's backlog, costing
//! this process no descriptor) and at most `max_connections_per_client` from one client
//! address (see `admission`), a request head must arrive within the header-read timeout
//! and its body within the body-read timeout (see `intake`), and a keep-alive connection
//! with no request in flight is closed after the idle timeout. A response in flight (a
//! live event stream included) is never timed out. A connection whose body was refused
//! for its size lingers before it closes, draining what the client still sends (as nginx
//! does), so the client reads the 413 instead of a reset.
//!
//! A graceful stop closes the listener, lets each connection finish the request it is
//! serving (an event stream ends when the server drains) and waits for every connection.
//!
//! With TLS, the handshake happens inside the connection's slot and must end within
//! the header-read timeout, so a client that connects and never says hello is held no
//! longer than one that sends half a request line.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse as _;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use runwarden_runtime::StopLevel;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::{Instant, Sleep};
use tower::ServiceExt as _;

use super::admission::{Shares, turn_away};
use super::intake::read_body;

/// What the server gives one client.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Connections served at once.
    pub(crate) max_connections: usize,
    /// Connections served at once from one client address (an IPv6 client by its /64).
    pub(crate) max_connections_per_client: usize,
    /// From a connection's start, or from the first byte of a request on a kept-alive
    /// connection, to the end of the request's head.
    pub(crate) header_read_timeout: Duration,
    /// From a request's head to the end of its body.
    pub(crate) body_read_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub(crate) idle_timeout: Duration,
}

impl Limits {
    /// The connection cap when the operator set none: half the open-file limit (the
    /// other half is for the store, MCP servers and model providers), at most 4096.
    pub(crate) fn default_max_connections(open_files: Option<u64>) -> usize {
        let half = open_files.map_or(4096, |n| n / 2);
        usize::try_from(half.clamp(16, 4096)).unwrap_or(4096)
    }

    /// One client's share when the operator set none: a quarter of the cap, so it takes
    /// four addresses to fill it.
    pub(crate) fn default_max_connections_per_client(max_connections: usize) -> usize {
        (max_connections / 4).max(1)
    }
}

/// After a body refused for its size: how long, and how many bytes, the connection
/// drains before it closes anyway.
const LINGER_TIME: Duration = Duration::from_secs(10);
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// Serves `app` on `listener` until `stop` reaches [`StopLevel::Drain`], then stops
/// accepting and waits for the open connections to finish.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    stop: watch::Receiver<StopLevel>,
) {
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    let shares = Shares::new(limits.max_connections_per_client.min(max));
    let draining = reached(stop.clone(), StopLevel::Drain);
    tokio::pin!(draining);
    loop {
        // A slot first: beyond the cap a client waits in the backlog, not in our table.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break, // never closed; nothing left to serve if it were
            },
            () = &mut draining => break,
        };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut draining => break,
        };
        match accepted {
            Ok((stream, peer)) => {
                let Some(share) = shares.admit(peer.ip()) else {
                    tracing::debug!(client = %peer.ip(), "a client over its share of connections was turned away");
                    turn_away(stream, tls.is_none());
                    drop(slot);
                    continue;
                };
                let (app, stop, tls) = (app.clone(), stop.clone(), tls.clone());
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    match tls {
                        None => connection(stream, app, limits, stop).await,
                        Some(acceptor) => {
                            let handshake = tokio::time::timeout(
                                limits.header_read_timeout,
                                acceptor.accept(stream),
                            );
                            match handshake.await {
                                Ok(Ok(stream)) => connection(stream, app, limits, stop).await,
                                Ok(Err(error)) => {
                                    tracing::debug!(%error, "a TLS handshake failed");
                                }
                                Err(_) => tracing::debug!(
                                    "a TLS handshake did not end within the header-read timeout"
                                ),
                            }
                        }
                    }
                    drop((share, slot));
                });
            }
            Err(error) => {
                drop(slot);
                // Out of descriptors (EMFILE) or a connection reset before we took it:
                // the listener is fine. A short pause keeps an exhausted process from
                // spinning on a backlog it cannot take.
                tracing::warn!(%error, "could not accept a connection");
                tokio::time::sleep(ACCEPT_PAUSE).await;
            }
        }
    }
    drop(listener);
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await; // every connection has ended
}

/// How long the accept loop waits after a failed accept.
const ACCEPT_PAUSE: Duration = Duration::from_millis(50);

/// Resolves once the stop level reaches `level`; never when no one can raise it any more.
pub(crate) async fn reached(mut stop: watch::Receiver<StopLevel>, level: StopLevel) {
    if stop.wait_for(|l| *l >= level).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// One connection: HTTP/1.1 with keep-alive, our timeouts on its reads, and a graceful
/// close when the server drains.
async fn connection<S>(stream: S, app: Router, limits: Limits, stop: watch::Receiver<StopLevel>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::default());
    let io = TimedIo::new(stream, activity.clone(), limits);
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        let in_flight = InFlight::begin(&activity);
        let (app, activity) = (app.clone(), activity.clone());
        async move {
            let response = match read_body(request, limits.body_read_timeout).await {
                Ok(request) => app.oneshot(request).await?,
                Err(refusal) => {
                    if refusal.lingers() {
                        activity.lingering.store(true, Ordering::SeqCst);
                    }
                    refusal.into_response()
                }
            };
            Ok::<_, std::convert::Infallible>(response.map(|body| {
                Body::new(Guarded {
                    body,
                    _in_flight: in_flight,
                })
            }))
        }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Our reads time out (see `TimedIo`); hyper's own header timer would also close a
    // kept-alive connection after the header-read timeout, so it is off.
    builder.keep_alive(true).header_read_timeout(None);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    tokio::select! {
        served = conn.as_mut() => {
            if let Err(error) = served {
                tracing::debug!(%error, "a connection ended with an error");
            }
        }
        () = reached(stop, StopLevel::Drain) => {
            conn.as_mut().graceful_shutdown();
            if let Err(error) = conn.await {
                tracing::debug!(%error, "a connection ended with an error while draining");
            }
        }
    }
}

/// Requests of one connection whose responses have not ended, and the reader to wake
/// when the last one ends (its idle clock starts then).
#[derive(Default)]
struct Activity {
    in_flight: AtomicUsize,
    reader: Mutex<Option<Waker>>,
    /// A body was refused for its size: drain the rest before closing.
    lingering: AtomicBool,
}

impl Activity {
    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) > 0
    }

    fn park(&self, waker: &Waker) {
        if let Ok(mut slot) = self.reader.lock() {
            match slot.as_ref() {
                Some(parked) if parked.will_wake(waker) => {}
                _ => *slot = Some(waker.clone()),
            }
        }
    }

    fn wake(&self) {
        let waker = self.reader.lock().ok().and_then(|mut slot| slot.take());
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// One request in flight, from the service call to the end of its response body.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn begin(activity: &Arc<Activity>) -> Self {
        activity.in_flight.fetch_add(1, Ordering::SeqCst);
        Self(activity.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.wake();
        }
    }
}

/// A response body that keeps its request counted as in flight until it is dropped.
struct Guarded {
    body: Body,
    _in_flight: InFlight,
}

impl hyper::body::Body for Guarded {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading a request's head: the header-read deadline runs.
    Head,
    /// A request is being served: no deadline.
    Busy,
    /// Kept alive, waiting for the next request: the idle deadline runs.
    Idle,
}

/// The connection's socket, whose reads fail with `TimedOut` once the deadline of the
/// current phase passes (hyper then closes the connection).
struct TimedIo<S> {
    stream: S,
    activity: Arc<Activity>,
    limits: Limits,
    phase: Phase,
    deadline: Pin<Box<Sleep>>,
    /// While lingering: whether our side is shut down yet, and what was drained.
    linger: Option<Linger>,
}

/// A lingering close under way.
#[derive(Debug, Clone, Copy)]
struct Linger {
    shut: bool,
    drained: usize,
}

impl<S> TimedIo<S> {
    fn new(stream: S, activity: Arc<Activity>, limits: Limits) -> Self {
        // A fresh connection is in its first request's head: a client that connects and
        // sends nothing is held no longer than one that sends half a request line.
        let deadline = Box::pin(tokio::time::sleep(limits.header_read_timeout));
        Self {
            stream,
            activity,
            limits,
            phase: Phase::Head,
            deadline,
            linger: None,
        }
    }

    fn arm(&mut self, phase: Phase, after: Duration) {
        self.phase = phase;
        self.deadline.as_mut().reset(Instant::now() + after);
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TimedIo<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.activity.busy() {
            this.phase = Phase::Busy;
            this.activity.park(cx.waker()); // woken when the response ends
            return Pin::new(&mut this.stream).poll_read(cx, buf);
        }
        if this.phase == Phase::Busy {
            this.arm(Phase::Idle, this.limits.idle_timeout);
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buf.filled().len() > before {
                    this.arm(Phase::Head, this.limits.header_read_timeout);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let what = match this.phase {
                        Phase::Idle => "the connection was idle for longer than the idle timeout",
                        _ => "the request head did not arrive within the header-read timeout",
                    };
                    Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
                }
                Poll::Pending => Poll::Pending,
            },
            ready => ready,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TimedIo<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.activity.lingering.load(Ordering::SeqCst) {
            return Pin::new(&mut this.stream).poll_shutdown(cx);
        }
        this.poll_linger(cx)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TimedIo<S> {
    /// A lingering close: our side is shut down (the answer is out, then our FIN), then
    /// what the client still sends is read and dropped until it closes its side, or for
    /// [`LINGER_TIME`] or [`LINGER_BYTES`] at most. Closing with unread data would send a
    /// reset, and the client's stack would drop our answer with it.
    fn poll_linger(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut linger = match self.linger {
            Some(linger) => linger,
            None => {
                self.deadline.as_mut().reset(Instant::now() + LINGER_TIME);
                Linger {
                    shut: false,
                    drained: 0,
                }
            }
        };
        let polled = self.linger_steps(cx, &mut linger);
        self.linger = Some(linger);
        polled
    }

    fn linger_steps(&mut self, cx: &mut Context<'_>, linger: &mut Linger) -> Poll<io::Result<()>> {
        if !linger.shut {
            match Pin::new(&mut self.stream).poll_shutdown(cx) {
                Poll::Ready(Ok(())) => linger.shut = true,
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())), // gone: nothing to drain
                Poll::Pending => return self.linger_deadline(cx),
            }
        }
        let mut scratch = [0u8; 8192];
        loop {
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => {
                    linger.drained += buf.filled().len();
                    if linger.drained >= LINGER_BYTES {
                        return Poll::Ready(Ok(()));
                    }
                }
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Pending => return self.linger_deadline(cx),
            }
        }
    }

    fn linger_deadline(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Ok(())),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_is_half_the_open_file_limit_within_bounds() {
        assert_eq!(Limits::default_max_connections(Some(1024)), 512);
        assert_eq!(Limits::default_max_connections(Some(20)), 16);
        assert_eq!(Limits::default_max_connections(Some(1 << 20)), 4096);
        assert_eq!(Limits::default_max_connections(None), 4096);
        assert_eq!(Limits::default_max_connections_per_client(512), 128);
        assert_eq!(Limits::default_max_connections_per_client(2), 1);
    }
}
