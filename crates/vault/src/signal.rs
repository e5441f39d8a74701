//! The cancellation seam: a caller-owned signal the vault asks while a call is on the wire.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

/// A future that resolves when a signal has news worth asking about.
pub type WakeFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// Answers "has the work this call belongs to been cancelled?" (V6).
///
/// The vault owns no notion of runs: the caller decides what cancelled means and hands a
/// signal in with each request. The vault asks it before it reads a secret, again whenever
/// [`woken`] resolves while the transfer is in flight, and at every tick: 100 ms for a
/// signal that cannot wake, only the slow backstop tick for one whose [`wakes`] is true.
///
/// Implementations must keep `is_cancelled` cheap and must not block for long. A panic
/// inside it is caught by the vault, which ends the call and audits it as a failure.
///
/// [`woken`]: CancellationSignal::woken
/// [`wakes`]: CancellationSignal::wakes
pub trait CancellationSignal: Send + Sync {
    /// True once the call should stop. Expected to be monotonic.
    fn is_cancelled(&self) -> bool;

    /// Resolves when the vault should ask [`is_cancelled`](Self::is_cancelled) now rather
    /// than at the next tick. It is a hint only: the answer still comes from
    /// `is_cancelled`. It must stay pending until there is news, or the vault would spin.
    /// The default never resolves, which leaves the tick as the only poll.
    fn woken(&self) -> WakeFuture<'_> {
        Box::pin(std::future::pending())
    }

    /// True when every change of [`is_cancelled`](Self::is_cancelled) to true is
    /// announced by [`woken`](Self::woken) (a future made before the change resolves after
    /// it). The vault then needs no 100 ms poll and asks such a signal only when woken and
    /// at its slow backstop tick (`EgressConfig::backstop_tick`). The default, false, keeps
    /// the 100 ms tick (V6) for signals that cannot wake.
    fn wakes(&self) -> bool {
        false
    }
}

/// An in-memory flag that cancels every signal cloned from it, and wakes waiters at once.
///
/// This is what a command-line Ctrl-C handler or a test holds. The runtime has its own
/// signal that reads the run row instead.
#[derive(Debug, Clone, Default)]
pub struct CancelFlag {
    inner: Arc<FlagInner>,
}

#[derive(Debug, Default)]
struct FlagInner {
    cancelled: AtomicBool,
    notify: Notify,
}

impl CancelFlag {
    /// A flag that is not cancelled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the flag and wakes every call waiting on it.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Cancels the flag without waking anyone, so calls only see it at their next tick (the
    /// slow backstop tick, since a flag says it wakes): for tests of the backstop.
    pub fn cancel_quietly(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
    }
}

impl CancellationSignal for CancelFlag {
    fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    fn woken(&self) -> WakeFuture<'_> {
        Box::pin(self.inner.notify.notified())
    }

    /// [`cancel`](CancelFlag::cancel) wakes; only [`cancel_quietly`](CancelFlag::cancel_quietly)
    /// (a test of the backstop) does not.
    fn wakes(&self) -> bool {
        true
    }
}
