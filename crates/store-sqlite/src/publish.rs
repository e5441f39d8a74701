//! What a committed run change tells the change feed, for every writer of a run's status.

use runwarden_runtime::{Change, ChangeFeed, RunState};

/// O6: a new status, and for a queued run the news that a worker may claim it.
pub(crate) fn publish_status(feed: &ChangeFeed, run_id: &str, status: RunState) {
    feed.publish(Change::Status {
        run_id: run_id.to_string(),
        status,
    });
    if status == RunState::Queued {
        feed.publish(Change::Ready);
    }
}
