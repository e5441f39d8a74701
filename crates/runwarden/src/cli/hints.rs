//! Hints for people waiting on the queue: whether any worker is there to claim a run.

use std::time::Duration;

use runwarden_runtime::{QueueStore, WORKER_BEAT};

/// A worker not seen for this long is taken to be gone: three missed beats.
pub(crate) const WORKER_GONE_AFTER: Duration = Duration::from_secs(3 * WORKER_BEAT.as_secs());

/// What to tell someone whose run waits in the queue when no worker has been seen for
/// [`WORKER_GONE_AFTER`]; `None` when a worker beat recently (or the store cannot say).
pub(crate) async fn no_worker_hint(queue: &dyn QueueStore) -> Option<String> {
    let last_seen = match queue.worker_last_seen().await {
        Ok(seen) => seen,
        Err(error) => {
            tracing::debug!(%error, "could not read when a worker was last seen");
            return None;
        }
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let gone_ms = i64::try_from(WORKER_GONE_AFTER.as_millis()).unwrap_or(i64::MAX);
    if last_seen.is_some_and(|seen| now_ms - seen <= gone_ms) {
        return None;
    }
    // A worker that runs but cannot write to the store cannot record its presence
    // either: say what is known, not that none runs.
    let known = match last_seen {
        Some(seen) => format!(
            "the last one {} s ago; a worker that runs but cannot write to the store is not seen either, so look at the workers' logs",
            (now_ms - seen) / 1000
        ),
        None => "none ever was".to_string(),
    };
    Some(format!(
        "note: no worker has been seen in the last {} s ({known}), so nothing will claim this run yet: start one with `runwarden worker` or `runwarden serve`",
        WORKER_GONE_AFTER.as_secs()
    ))
}
