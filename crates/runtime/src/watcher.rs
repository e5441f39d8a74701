//! One status watcher per process (R6 amended): every in-flight call registers its run, one
//! task refreshes all of them with one batched [`RunStore::run_statuses`] query per
//! interval, and re-asks at once when the cancel hub or the store's change feed says so.
//! A signal's [`is_cancelled`](runwarden_vault::CancellationSignal::is_cancelled) answers
//! from the watcher's memory and never touches the store.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, broadcast, oneshot};

use crate::feed::Change;
use crate::signal::{CancelHub, RunCell, RunSignal, Watch};
use crate::state::RunState;
use crate::store::RunStore;

/// R6: the default refresh interval. Each registered run is read at most once per interval
/// by the periodic refresh, however many calls are in flight.
pub const DEFAULT_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// How a [`StatusWatcher`] refreshes.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// How often every registered run is re-read (one batched query each time).
    pub interval: Duration,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        Self {
            interval: DEFAULT_WATCH_INTERVAL,
        }
    }
}

/// A registered run: its cell and how many signals hold it.
#[derive(Debug)]
struct Entry {
    cell: Arc<RunCell>,
    signals: usize,
}

/// What the task must read next.
#[derive(Debug, Default)]
struct State {
    runs: HashMap<String, Entry>,
    /// First questions waiting for a read that starts after they asked (R6 amended).
    first: Vec<(String, oneshot::Sender<()>)>,
    /// Runs woken (cancel hub, change feed) since the last query.
    woken: HashSet<String>,
    /// Re-read every registered run at the next query (a resync of the change feed).
    all: bool,
}

/// What the task and the signals share.
struct Shared {
    store: Arc<dyn RunStore>,
    hub: Arc<CancelHub>,
    state: Mutex<State>,
    /// Wakes the task: something is to be read now. A permit is kept when the task is
    /// busy, so a request made during a query is served by the next one.
    kick: Notify,
    /// Set when the last handle dropped; the task ends, even in the middle of a query.
    stop: Notify,
    closed: AtomicBool,
    /// Batched status queries made so far (for diagnostics and benchmarks).
    queries: AtomicU64,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

impl Watch for Shared {
    /// A cancel in this process (or an announcement) for `run_id`: re-read it at once. The
    /// row stays the truth; this only says "ask now" (R6).
    fn wake_run(&self, run_id: &str) {
        let mut state = self.lock();
        if state.runs.contains_key(run_id) {
            state.woken.insert(run_id.to_string());
            drop(state);
            self.kick.notify_one();
        }
    }

    /// A signal of `run_id` ended; the run leaves the batch with its last signal.
    fn deregister(&self, run_id: &str) {
        let mut state = self.lock();
        if let Some(entry) = state.runs.get_mut(run_id) {
            entry.signals = entry.signals.saturating_sub(1);
            if entry.signals == 0 {
                state.runs.remove(run_id);
                state.woken.remove(run_id);
            }
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers one signal of `run_id` and hands back the run's cell.
    fn register(&self, run_id: &str) -> Arc<RunCell> {
        let mut state = self.lock();
        let entry = state
            .runs
            .entry(run_id.to_string())
            .or_insert_with(|| Entry {
                cell: Arc::default(),
                signals: 0,
            });
        entry.signals += 1;
        entry.cell.clone()
    }

    /// What the next query reads: every live run (periodic refresh or resync) or only the
    /// runs asked about since the last one; plus the first questions it answers.
    #[allow(clippy::type_complexity)]
    fn take_batch(&self, full: bool) -> (Vec<String>, Vec<oneshot::Sender<()>>, Vec<Arc<RunCell>>) {
        let mut state = self.lock();
        let full = full || std::mem::take(&mut state.all);
        let woken = std::mem::take(&mut state.woken);
        let first = std::mem::take(&mut state.first);
        let mut ids: HashSet<String> = if full {
            state.runs.keys().cloned().collect()
        } else {
            woken.iter().cloned().collect()
        };
        let mut waiters = Vec::with_capacity(first.len());
        for (id, waiter) in first {
            ids.insert(id);
            waiters.push(waiter);
        }
        // Monotonic: a run seen cancelled leaves the batch (no more reads for it).
        ids.retain(|id| state.runs.get(id).is_some_and(|e| !e.cell.cancelled()));
        let woken_cells = woken
            .iter()
            .filter_map(|id| state.runs.get(id).map(|e| e.cell.clone()))
            .collect();
        (ids.into_iter().collect(), waiters, woken_cells)
    }

    /// Applies a query's answer: runs whose row says `cancelled` turn true (R6, the one
    /// definition of cancelled) and their calls are told to ask.
    fn apply(&self, rows: &[(String, RunState)]) {
        let cells: Vec<Arc<RunCell>> = {
            let state = self.lock();
            rows.iter()
                .filter(|(_, status)| *status == RunState::Cancelled)
                .filter_map(|(id, _)| state.runs.get(id).map(|e| e.cell.clone()))
                .collect()
        };
        for cell in cells {
            if cell.mark_cancelled() {
                cell.notify.notify_waiters();
            }
        }
    }
}

/// Ends the watcher's task when the last handle (a [`StatusWatcher`] clone or a live
/// [`RunSignal`]) is dropped.
#[derive(Debug)]
struct Owner(Arc<Shared>);

impl Watch for Owner {
    fn wake_run(&self, run_id: &str) {
        self.0.wake_run(run_id);
    }

    fn deregister(&self, run_id: &str) {
        self.0.deregister(run_id);
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::SeqCst);
        self.0.stop.notify_one();
    }
}

/// The process's status watcher (R6 amended). Cheap to clone; every clone is the same
/// watcher, and its task ends when the last clone and the last signal are gone.
///
/// In-flight calls get their signal from [`StatusWatcher::signal`], which registers the
/// run and answers the call's first question with a fresh read that started after the
/// call asked. From then on one task refreshes every registered run with one batched
/// [`RunStore::run_statuses`] query per [`WatcherConfig::interval`], and re-reads at once
/// the runs the [`CancelHub`] wakes (a cancel issued in this process) or the store's change
/// feed names (`Change::Status { status: Cancelled }`, which on PostgreSQL carries another
/// node's `NOTIFY`), or all of them on `Change::Resync`. A store error reads as not
/// cancelled (fail-soft); a run seen cancelled stays cancelled and is not read again.
#[derive(Debug, Clone)]
pub struct StatusWatcher {
    owner: Arc<Owner>,
}

impl StatusWatcher {
    /// Starts the watcher's task on the current tokio runtime. Call it inside one (every
    /// command of the binary builds it in its async entry): tokio panics otherwise.
    /// `store` is read for statuses and its change feed is followed; `hub` wakes it for
    /// cancels issued in this process.
    pub fn new(store: Arc<dyn RunStore>, hub: Arc<CancelHub>, config: WatcherConfig) -> Self {
        let feed = store.change_feed().subscribe();
        let shared = Arc::new(Shared {
            store,
            hub: hub.clone(),
            state: Mutex::default(),
            kick: Notify::new(),
            stop: Notify::new(),
            closed: AtomicBool::new(false),
            queries: AtomicU64::new(0),
        });
        let woken: Arc<dyn Watch> = shared.clone();
        hub.attach(Arc::downgrade(&woken));
        let interval = config.interval.max(Duration::from_millis(1));
        tokio::spawn(watch(shared.clone(), feed, interval));
        Self {
            owner: Arc::new(Owner(shared)),
        }
    }

    /// The cancel hub this watcher listens to (the executor wakes it after a cancel).
    pub fn hub(&self) -> &Arc<CancelHub> {
        &self.owner.0.hub
    }

    /// How many batched status queries the watcher has made.
    pub fn queries(&self) -> u64 {
        self.owner.0.queries.load(Ordering::SeqCst)
    }

    /// How many runs are registered (runs with a live signal).
    pub fn watched(&self) -> usize {
        self.owner.0.lock().runs.len()
    }

    /// The signal of one call of `run_id`. R6 (amended): returns once a status read that
    /// started after this call asked has finished (concurrent calls share one batched
    /// query), so the call's first question is answered from a fresh read, made before the
    /// vault touches a secret. If that read fails, the call goes on as not cancelled
    /// (fail-soft). A run already seen cancelled by a live signal answers at once:
    /// cancelled is terminal (R4), so no read could change it.
    pub async fn signal(&self, run_id: &str) -> RunSignal {
        let shared = &self.owner.0;
        let cell = shared.register(run_id);
        let signal = RunSignal::new(
            run_id,
            cell.clone(),
            self.owner.clone(),
            shared.hub.as_ref(),
        );
        if cell.cancelled() {
            return signal;
        }
        let (tx, rx) = oneshot::channel();
        shared.lock().first.push((run_id.to_string(), tx));
        shared.kick.notify_one();
        // A dropped sender means the query was cut short by a shutdown: go on.
        let _ = rx.await;
        signal
    }
}

/// The watcher's task: waits for a reason to read, reads one batch, applies it.
async fn watch(shared: Arc<Shared>, feed: broadcast::Receiver<Change>, interval: Duration) {
    let mut feed = Some(feed);
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        // The periodic refresh comes before the kicks: calls starting all the time must
        // not starve it (it is ready once per interval, so it cannot starve them).
        let full = tokio::select! {
            biased;
            _ = shared.stop.notified() => return,
            _ = tick.tick() => true,
            _ = shared.kick.notified() => false,
            change = recv(&mut feed) => {
                if !on_change(&shared, &mut feed, change) {
                    continue;
                }
                false
            }
        };
        let (ids, waiters, woken) = shared.take_batch(full);
        if !ids.is_empty() {
            shared.queries.fetch_add(1, Ordering::SeqCst);
            let read = tokio::select! {
                biased;
                _ = shared.stop.notified() => return,
                read = shared.store.run_statuses(&ids) => read,
            };
            match read {
                Ok(rows) => shared.apply(&rows),
                // R6: fail-soft: a store error reads as "not cancelled", never as a
                // fabricated cancellation; the next interval (or wake) reads again.
                Err(error) => tracing::warn!(
                    runs = ids.len(),
                    %error,
                    "the status watcher could not read the runs' statuses; treating them as not cancelled"
                ),
            }
        }
        // The woken runs' calls ask now (a lost lease is also announced through the hub,
        // and its answer is the segment's stop flag, not the row).
        for cell in woken {
            cell.notify.notify_waiters();
        }
        for waiter in waiters {
            let _ = waiter.send(());
        }
    }
}

/// The next change, or never once the feed is gone.
async fn recv(feed: &mut Option<broadcast::Receiver<Change>>) -> Result<Change, RecvError> {
    match feed {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Notes what a change asks for; true when a query is due now.
fn on_change(
    shared: &Shared,
    feed: &mut Option<broadcast::Receiver<Change>>,
    change: Result<Change, RecvError>,
) -> bool {
    match change {
        Ok(Change::Status {
            run_id,
            status: RunState::Cancelled,
        }) => {
            let mut state = shared.lock();
            if !state.runs.contains_key(&run_id) {
                return false;
            }
            state.woken.insert(run_id);
            true
        }
        // Another process changed the file, or a notification connection was lost:
        // whatever we watch may have changed.
        Ok(Change::Resync) | Err(RecvError::Lagged(_)) => {
            let mut state = shared.lock();
            if state.runs.is_empty() {
                return false;
            }
            state.all = true;
            true
        }
        Ok(_) => false,
        Err(RecvError::Closed) => {
            *feed = None;
            false
        }
    }
}
