//! The store's state as this process sees it, from every store call and the readiness
//! probe: ready, or failing with a kind of fault (full, read-only, I/O, damaged, out of
//! files, and for the probe also locked). A change is logged once, at WARN when the store
//! starts failing (or fails another way) and at INFO when it answers again, and counted
//! per state entered (`/metrics`: `runwarden_store_state_changes_total{kind}`), however
//! many calls see the same state.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use runwarden_vault::store::{StoreError, StoreFault};

/// The state last reported: `"ready"` or a fault's kind; and how often each state was
/// entered.
static STATE: Mutex<(&str, Vec<(&'static str, u64)>)> = Mutex::new(("ready", Vec::new()));
/// Whether the state is other than ready: a call that succeeds while the store is ready
/// (nearly all of them) reads this and takes no lock.
static FAILING: AtomicBool = AtomicBool::new(false);

/// Reports the state a store call found: its error, if any. Faults of the data (a
/// constraint, a bad value) and locks held by another writer (ordinary contention) say
/// nothing about the store's state and are not reported. A success shows the store
/// ready only when `proves_ready`: a read answered from a full or read-only disk does
/// not, and counted as recovery it would make the state flap with every read.
pub fn observe_store_call<T>(result: &Result<T, StoreError>, proves_ready: bool) {
    match result {
        Ok(_) if proves_ready => report_store_state("ready", None),
        Ok(_) => {}
        Err(error) if !matches!(error.fault, StoreFault::Other | StoreFault::Busy) => {
            report_store_state(error.fault.as_str(), Some(error));
        }
        Err(_) => {}
    }
}

/// Reports the store's state (`"ready"` or a fault's kind); logs and counts it when it
/// changed.
pub fn report_store_state(state: &'static str, error: Option<&dyn std::fmt::Display>) {
    if state == "ready" && !FAILING.load(Ordering::Relaxed) {
        return;
    }
    let mut guard = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let (last, counts) = &mut *guard;
    if *last == state {
        return;
    }
    match counts.iter_mut().find(|(s, _)| *s == state) {
        Some((_, n)) => *n += 1,
        None => counts.push((state, 1)),
    }
    match error {
        Some(error) => tracing::warn!(
            state,
            previous = *last,
            error = %error,
            "the store is failing: it does not accept writes"
        ),
        None => tracing::info!(previous = *last, "the store accepts writes again"),
    }
    *last = state;
    FAILING.store(state != "ready", Ordering::Relaxed);
}

/// How often each state was entered in this process.
pub fn store_state_changes() -> Vec<(&'static str, u64)> {
    STATE.lock().unwrap_or_else(|p| p.into_inner()).1.clone()
}
