//! "Is this run cancelled?", answered in one place (R5, R6), and the in-flight signal the
//! vault asks while a run's call is on the wire.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use runwarden_mcp::Clock;
use runwarden_vault::{CancellationSignal, WakeFuture};
use tokio::sync::Notify;

use crate::state::RunState;
use crate::store::RunStore;

/// R6: at most one row read per second per signal.
pub const SIGNAL_READ_INTERVAL: Duration = Duration::from_secs(1);

/// The one definition of cancelled: the run row's status is `cancelled`. Fail-soft: a
/// store error reads as "not cancelled", never as a fabricated cancellation (R5, R6).
pub fn is_run_cancelled(store: &dyn RunStore, run_id: &str) -> bool {
    match store.run_status_now(run_id) {
        Ok(status) => status == Some(RunState::Cancelled),
        Err(error) => {
            tracing::warn!(run = run_id, %error, "could not read the run's status; treating it as not cancelled");
            false
        }
    }
}

/// In-process wake-ups: a cancel issued through this process (or announced by the store)
/// wakes the run's signals at once. The row stays the only source of truth; a wake-up
/// only says "ask now" (R6).
#[derive(Debug, Default)]
pub struct CancelHub {
    runs: Mutex<HashMap<String, Weak<RunWake>>>,
}

/// One run's wake-up: a notification for waiters now, and a generation counter so a
/// signal that was not waiting at that instant still reads at its next question.
#[derive(Debug, Default)]
struct RunWake {
    notify: Notify,
    generation: AtomicU64,
    /// When the last wake-up was issued, so the executor can measure how long a woken
    /// call took to come back (the API's cancel-latency histogram).
    woken_at: Mutex<Option<Instant>>,
}

impl CancelHub {
    /// A hub with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    /// The run's wake-up, shared by all its signals while any is alive.
    fn subscribe(&self, run_id: &str) -> Arc<RunWake> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|_, weak| weak.strong_count() > 0);
        if let Some(notify) = runs.get(run_id).and_then(Weak::upgrade) {
            return notify;
        }
        let wake = Arc::new(RunWake::default());
        runs.insert(run_id.to_string(), Arc::downgrade(&wake));
        wake
    }

    /// Wakes every signal of the run (after the cancel's row update committed).
    pub fn wake(&self, run_id: &str) {
        let wake = self
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .and_then(Weak::upgrade);
        if let Some(wake) = wake {
            *wake.woken_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            wake.generation.fetch_add(1, Ordering::SeqCst);
            wake.notify.notify_waiters();
        }
    }

    /// When the run's signals were last woken, while any of them is alive. Only runs with
    /// a call in flight in this process have one: a wake with no subscriber is not kept.
    pub fn woken_at(&self, run_id: &str) -> Option<Instant> {
        let wake = self
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .and_then(Weak::upgrade)?;
        *wake.woken_at.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[derive(Debug, Default)]
struct SignalState {
    last_read: Option<Duration>,
    cancelled: bool,
    /// The wake generation the last read saw; a newer one makes the next question read.
    seen_generation: u64,
}

/// The signal of one outbound call of one run (R6). Reads the row through
/// [`is_run_cancelled`]: the first question always reads; then at most one read per
/// second; fail-soft; monotonic (once true, true forever and no more reads); a wake-up
/// from the [`CancelHub`] makes the next question read at once.
pub struct RunSignal {
    run_id: String,
    store: Arc<dyn RunStore>,
    clock: Arc<dyn Clock>,
    wake: Arc<RunWake>,
    /// Set when the segment lost its lease: the call must stop as if cancelled (R3).
    stop: Option<Arc<AtomicBool>>,
    state: Mutex<SignalState>,
}

impl std::fmt::Debug for RunSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSignal")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl RunSignal {
    /// A signal for one call of `run_id`.
    pub fn new(
        run_id: &str,
        store: Arc<dyn RunStore>,
        clock: Arc<dyn Clock>,
        hub: &CancelHub,
    ) -> Self {
        Self {
            run_id: run_id.to_string(),
            store,
            clock,
            wake: hub.subscribe(run_id),
            stop: None,
            state: Mutex::default(),
        }
    }

    /// Also stops the call when `stop` turns true (a lost lease).
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stop = Some(stop);
        self
    }
}

impl CancellationSignal for RunSignal {
    fn is_cancelled(&self) -> bool {
        if self.stop.as_ref().is_some_and(|s| s.load(Ordering::SeqCst)) {
            return true;
        }
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.cancelled {
            return true; // monotonic: no more reads
        }
        let now = self.clock.now();
        let generation = self.wake.generation.load(Ordering::SeqCst);
        let due = match state.last_read {
            None => true, // the first question always reads
            Some(last) => {
                generation != state.seen_generation
                    || now.saturating_sub(last) >= SIGNAL_READ_INTERVAL
            }
        };
        if !due {
            return false;
        }
        state.last_read = Some(now);
        state.seen_generation = generation;
        state.cancelled = is_run_cancelled(&*self.store, &self.run_id);
        state.cancelled
    }

    fn woken(&self) -> WakeFuture<'_> {
        // The generation, not this future, carries the news; this only says "ask now".
        Box::pin(self.wake.notify.notified())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wake_is_remembered_only_while_the_run_has_a_signal() {
        let hub = CancelHub::new();
        hub.wake("r1");
        assert_eq!(hub.woken_at("r1"), None, "no subscriber: nothing kept");
        let wake = hub.subscribe("r1");
        assert_eq!(hub.woken_at("r1"), None);
        let before = Instant::now();
        hub.wake("r1");
        assert!(hub.woken_at("r1").is_some_and(|at| at >= before));
        assert_eq!(hub.woken_at("r2"), None);
        drop(wake);
        assert_eq!(hub.woken_at("r1"), None, "gone with the run's last signal");
    }
}
