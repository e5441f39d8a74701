//! Throttled progress events (L6, M15): while a call runs, the latest report is written
//! to the run's log at most once per interval, never once per token or per notification.
//!
//! A call reports as often as it likes ([`ProgressEvents::report`] only replaces the
//! latest value, so it never blocks the transfer). A task writes what is latest when the
//! interval allows. [`ProgressEvents::finish`] stops it and waits for a write in flight,
//! so no progress event can land after the step that ends the call.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::events::EventBody;
use crate::observer::Observer;
use crate::store::{EventAppend, RunEvent, RunStore};
use crate::time::now_ms;

/// At most two progress events a second per call: "a few per second at most".
pub(crate) const PROGRESS_INTERVAL: Duration = Duration::from_millis(500);

/// Where the events go: the run, the segment that holds its lease, and the live observer.
#[derive(Clone)]
pub(crate) struct ProgressTarget {
    pub store: Arc<dyn RunStore>,
    pub run_id: String,
    pub owner: String,
    pub epoch: i64,
    pub observer: Option<Observer>,
}

/// The writer of one call's progress events.
pub(crate) struct ProgressEvents {
    latest: watch::Sender<Option<EventBody>>,
    stop: Arc<Notify>,
    task: JoinHandle<()>,
}

impl ProgressEvents {
    /// Starts the writer. The first event is written one interval after the start at the
    /// earliest, so a call that ends sooner writes none.
    pub(crate) fn start(target: ProgressTarget, every: Duration) -> Self {
        let (latest, mut reports) = watch::channel::<Option<EventBody>>(None);
        let stop = Arc::new(Notify::new());
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut next = Instant::now() + every;
            loop {
                tokio::select! {
                    biased;
                    () = stopped.notified() => return,
                    changed = reports.changed() => if changed.is_err() { return },
                }
                // Throttle: hold the report until the interval allows; a stop wins.
                tokio::select! {
                    biased;
                    () = stopped.notified() => return,
                    () = tokio::time::sleep_until(next) => {}
                }
                let body = reports.borrow_and_update().clone();
                if let Some(body) = body {
                    // Never cancelled half-way: `finish` waits for this write to end.
                    append(&target, body).await;
                }
                next = Instant::now() + every;
            }
        });
        Self { latest, stop, task }
    }

    /// A reporter that can be moved into a callback.
    pub(crate) fn reporter(&self) -> watch::Sender<Option<EventBody>> {
        self.latest.clone()
    }

    /// Stops the writer and waits for a write in flight; a report not yet written is
    /// dropped (the step that ends the call says more than it would).
    pub(crate) async fn finish(self) {
        self.stop.notify_one();
        let _ = self.task.await;
    }
}

/// One progress event, written like any step but without raising the round or touching
/// the fence. A failure only costs the report: it is logged and forgotten.
pub(crate) async fn append(target: &ProgressTarget, body: EventBody) {
    let (kind, payload) = (body.kind(), body.to_payload());
    let time_ms = now_ms();
    let append = EventAppend {
        id: target.run_id.clone(),
        owner: target.owner.clone(),
        epoch: target.epoch,
        kind: kind.to_string(),
        payload: payload.clone(),
        clear_fence: false,
        round: None,
        end: None,
        now_ms: time_ms,
        before: None,
    };
    match target.store.run_event_append(append).await {
        Ok(Some(seq)) => {
            if let Some(observer) = &target.observer {
                observer(&RunEvent {
                    run_id: target.run_id.clone(),
                    seq,
                    kind: kind.to_string(),
                    payload,
                    time_ms,
                });
            }
        }
        Ok(None) => {}
        Err(error) => {
            tracing::debug!(run = %target.run_id, kind, %error, "could not record a progress event; going on");
        }
    }
}
