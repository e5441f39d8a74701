//! "Is this run cancelled?", answered in one place (R5, R6), the in-process cancel hub, and
//! the in-flight signal the vault asks while a run's call is on the wire.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use runwarden_vault::{CancellationSignal, WakeFuture};

use tokio::sync::Notify;

use crate::state::RunState;
use crate::store::RunStore;

/// The one definition of cancelled: the run row's status is `cancelled`. Fail-soft: a
/// store error reads as "not cancelled", never as a fabricated cancellation (R5, R6). The
/// executor's step-boundary probe (R5) asks it; the status watcher applies the same rule to
/// its batched reads.
pub(crate) async fn is_run_cancelled(store: &dyn RunStore, run_id: &str) -> bool {
    match store.run_statuses(&[run_id.to_string()]).await {
        Ok(rows) => rows
            .iter()
            .any(|(id, status)| id == run_id && *status == RunState::Cancelled),
        Err(error) => {
            tracing::warn!(run = run_id, %error, "could not read the run's status; treating it as not cancelled");
            false
        }
    }
}

/// One run's answer in memory, shared by every signal of the run in this process. The
/// status watcher sets it; the signals read it.
#[derive(Debug, Default)]
pub(crate) struct RunCell {
    /// Monotonic: set once a read saw the row `cancelled`, never cleared (R6).
    cancelled: AtomicBool,
    /// Says "ask now" to the calls of the run (the vault's `woken`).
    pub(crate) notify: Notify,
}

impl RunCell {
    pub(crate) fn cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Marks the run cancelled; `true` the first time only.
    pub(crate) fn mark_cancelled(&self) -> bool {
        !self.cancelled.swap(true, Ordering::SeqCst)
    }
}

/// A status watcher as the hub and the signals see it: the hub wakes it for a run, and a
/// signal lets go of its run when dropped.
pub(crate) trait Watch: Send + Sync {
    /// Re-read `run_id` at once: something may have changed.
    fn wake_run(&self, run_id: &str);
    /// One signal of `run_id` ended.
    fn deregister(&self, run_id: &str);
}

/// In-process wake-ups: a cancel issued through this process wakes the status watcher,
/// which re-reads the run at once; the row stays the only source of truth, a wake-up only
/// says "ask now" (R6).
#[derive(Debug, Default)]
pub struct CancelHub {
    runs: Mutex<HashMap<String, Weak<RunWake>>>,
    /// The watchers to wake (one per process in practice).
    watchers: Mutex<Vec<Weak<dyn Watch>>>,
}

/// One run's wake-up record while any of its signals is alive.
#[derive(Debug, Default)]
struct RunWake {
    /// When the last wake-up was issued, so the executor can measure how long a woken
    /// call took to come back (the API's cancel-latency histogram).
    woken_at: Mutex<Option<Instant>>,
}

impl CancelHub {
    /// A hub with no subscribers.
    pub fn new() -> Self {
        Self::default()
    }

    /// A watcher to wake from now on.
    pub(crate) fn attach(&self, watcher: Weak<dyn Watch>) {
        let mut watchers = self.watchers.lock().unwrap_or_else(|p| p.into_inner());
        watchers.retain(|w| w.strong_count() > 0);
        watchers.push(watcher);
    }

    /// The run's wake-up record, shared by all its signals while any is alive.
    fn subscribe(&self, run_id: &str) -> Arc<RunWake> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.retain(|_, weak| weak.strong_count() > 0);
        if let Some(wake) = runs.get(run_id).and_then(Weak::upgrade) {
            return wake;
        }
        let wake = Arc::new(RunWake::default());
        runs.insert(run_id.to_string(), Arc::downgrade(&wake));
        wake
    }

    /// Wakes every signal of the run (after the cancel's row update committed, or when
    /// the segment lost its lease): the watcher re-reads the run at once and its calls ask.
    pub fn wake(&self, run_id: &str) {
        let wake = self
            .runs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .and_then(Weak::upgrade);
        if let Some(wake) = wake {
            *wake.woken_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        }
        let watchers: Vec<Arc<dyn Watch>> = self
            .watchers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        for watcher in watchers {
            watcher.wake_run(run_id);
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

/// The signal of one outbound call of one run (R6 amended), made by
/// `StatusWatcher::signal`. `is_cancelled` answers from the
/// watcher's memory: it never blocks and never touches the store. Its first answer comes
/// from a read made after the call asked; it is fail-soft and monotonic (once true, true
/// forever). `woken` resolves when the watcher has news for the run, so the vault needs no
/// fast poll.
pub struct RunSignal {
    run_id: String,
    cell: Arc<RunCell>,
    /// Keeps the watcher alive while the call is in flight, and deregisters on drop.
    owner: Arc<dyn Watch>,
    _wake: Arc<RunWake>,
    /// Set when the segment lost its lease (R3) or a budget ran out (R13): the call must
    /// stop as if cancelled.
    stops: Vec<Arc<AtomicBool>>,
}

impl std::fmt::Debug for RunSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunSignal")
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl RunSignal {
    pub(crate) fn new(
        run_id: &str,
        cell: Arc<RunCell>,
        owner: Arc<dyn Watch>,
        hub: &CancelHub,
    ) -> Self {
        Self {
            run_id: run_id.to_string(),
            cell,
            owner,
            _wake: hub.subscribe(run_id),
            stops: Vec::new(),
        }
    }

    /// Also stops the call when `stop` turns true (a lost lease, a budget run out); whoever
    /// sets it wakes the run through the [`CancelHub`] so the call asks at once. Several
    /// stops may be added; any one of them stops the call.
    pub fn with_stop(mut self, stop: Arc<AtomicBool>) -> Self {
        self.stops.push(stop);
        self
    }

    /// True when a read of the run's row saw it `cancelled` (R5's probe, answered from the
    /// signal's fresh read); unlike `is_cancelled`, a lost lease or a spent budget does not
    /// count.
    pub(crate) fn row_cancelled(&self) -> bool {
        self.cell.cancelled()
    }
}

impl Drop for RunSignal {
    fn drop(&mut self) {
        self.owner.deregister(&self.run_id);
    }
}

impl CancellationSignal for RunSignal {
    fn is_cancelled(&self) -> bool {
        // R6 (amended): from memory only; the watcher did the reading.
        self.stops.iter().any(|s| s.load(Ordering::SeqCst)) || self.cell.cancelled()
    }

    fn woken(&self) -> WakeFuture<'_> {
        Box::pin(self.cell.notify.notified())
    }

    /// The watcher wakes the call whenever the answer may have changed: a cancel seen in
    /// the row, or a hub wake-up (which also announces a lost lease).
    fn wakes(&self) -> bool {
        true
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
