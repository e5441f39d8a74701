//! Waiting on the store's change feed for news about one run. Live views (the API's
//! event streams, `events --follow`) read the store only when this says something changed
//! for their run, so an idle view costs no reads and no timers.

use runwarden_runtime::Change;
use tokio::sync::broadcast::Receiver;
use tokio::sync::broadcast::error::RecvError;

/// Why a wait on the feed ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum News {
    /// Something about the run may have changed (an event, its status, or a resync that
    /// names nothing): read it.
    Changed,
    /// The feed is gone with its store: nothing will ever say more.
    Closed,
}

/// Waits until a change concerns `run_id`: an event appended to it, its status, a
/// `Resync`, or a lag (the receiver fell behind, so anything may have happened). Changes
/// to other runs and `Ready` are skipped without reading anything.
pub(crate) async fn news_of(feed: &mut Receiver<Change>, run_id: &str) -> News {
    loop {
        match feed.recv().await {
            Ok(Change::Appended { run_id: id, .. } | Change::Status { run_id: id, .. })
                if id == run_id =>
            {
                return News::Changed;
            }
            Ok(Change::Resync) | Err(RecvError::Lagged(_)) => return News::Changed,
            Ok(_) => continue,
            Err(RecvError::Closed) => return News::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runwarden_runtime::{ChangeFeed, RunState};

    #[tokio::test]
    async fn only_changes_of_the_watched_run_or_a_resync_are_news() {
        let feed = ChangeFeed::new();
        let mut rx = feed.subscribe();
        feed.publish(Change::Ready);
        feed.publish(Change::Appended {
            run_id: "other".into(),
            seq: 1,
        });
        feed.publish(Change::Status {
            run_id: "other".into(),
            status: RunState::Running,
        });
        feed.publish(Change::Appended {
            run_id: "mine".into(),
            seq: 4,
        });
        assert_eq!(news_of(&mut rx, "mine").await, News::Changed);
        assert!(rx.is_empty(), "the changes before it were skipped");
        feed.publish(Change::Resync);
        assert_eq!(news_of(&mut rx, "mine").await, News::Changed);
        drop(feed);
        assert_eq!(news_of(&mut rx, "mine").await, News::Closed);
    }
}
