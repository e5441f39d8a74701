//! The signals a leg is sent under, beyond the caller's own: a deadline that progress
//! stretches, and the end of the call a standalone stream serves.

use runwarden_vault::CancellationSignal;

use crate::deadline::Deadline;

/// M15: the caller's signal, plus the soft end of a deadline that progress stretches. The
/// vault sends a stretchable leg bounded by the hard maximum and stops it through this
/// signal when the (moving) soft end passes.
pub(super) struct Stretch<'a> {
    pub(super) caller: Option<&'a dyn CancellationSignal>,
    pub(super) deadline: &'a Deadline<'a>,
}

impl CancellationSignal for Stretch<'_> {
    fn is_cancelled(&self) -> bool {
        self.caller.is_some_and(|s| s.is_cancelled()) || self.deadline.remaining().is_zero()
    }

    fn woken(&self) -> runwarden_vault::WakeFuture<'_> {
        Box::pin(async move {
            let caller = async {
                match self.caller {
                    Some(signal) => until_cancelled(signal).await,
                    None => std::future::pending().await,
                }
            };
            let end = async {
                // The end moves with progress: sleep to it, look again.
                loop {
                    let left = self.deadline.remaining();
                    if left.is_zero() {
                        return;
                    }
                    tokio::time::sleep(left).await;
                }
            };
            tokio::select! {
                () = caller => {}
                () = end => {}
            }
        })
    }

    fn wakes(&self) -> bool {
        true
    }
}

/// Stops a call's standalone GET stream once the call ended, or when the call's own
/// signal (or its deadline) says stop.
pub(super) struct UntilEnded<'a> {
    pub(super) inner: Option<&'a dyn CancellationSignal>,
    pub(super) ended: tokio::sync::watch::Receiver<bool>,
}

impl CancellationSignal for UntilEnded<'_> {
    fn is_cancelled(&self) -> bool {
        *self.ended.borrow() || self.inner.is_some_and(|s| s.is_cancelled())
    }

    fn woken(&self) -> runwarden_vault::WakeFuture<'_> {
        Box::pin(async move {
            let mut ended = self.ended.clone();
            let inner = async {
                match self.inner {
                    Some(signal) => until_cancelled(signal).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = until_done(&mut ended) => {}
                () = inner => {}
            }
        })
    }

    fn wakes(&self) -> bool {
        true
    }
}

/// Resolves once the flag is true (or its sender is gone). Holds no borrow of the value
/// across an await, so the future stays `Send`.
pub(super) async fn until_done(flag: &mut tokio::sync::watch::Receiver<bool>) {
    loop {
        let done = *flag.borrow_and_update();
        if done || flag.changed().await.is_err() {
            return;
        }
    }
}

/// Resolves once `signal` is cancelled: on its wake-up when it has one, else by asking it
/// every [`runwarden_vault::MAX_TICK`] (V6), as the vault does while a call is in flight.
pub(super) async fn until_cancelled(signal: &dyn CancellationSignal) {
    loop {
        if signal.is_cancelled() {
            return;
        }
        if signal.wakes() {
            signal.woken().await;
        } else {
            tokio::time::sleep(runwarden_vault::MAX_TICK).await;
        }
    }
}
