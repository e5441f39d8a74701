//! O6 across processes: a change committed through another connection to the same file
//! reaches this store's feed as `Change::Resync`; its own writes never do.

use std::time::Duration;

use runwarden_runtime::store::{NewRunStatus, RunCreate, RunStore};
use runwarden_runtime::{Change, RunState};
use serde_json::json;
use tokio::sync::broadcast::Receiver;

use crate::common::TempDb;

const EVERY: Duration = Duration::from_millis(50);

fn queued(id: &str) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "helpdesk".into(),
        correlation: id.into(),
        request: Some(json!({"prompt": "hello"})),
        status: NewRunStatus::Queued,
        now_ms: 1_000,
        origin: Default::default(),
    }
}

/// The next change, or `None` when none comes within `bound`.
async fn next(feed: &mut Receiver<Change>, bound: Duration) -> Option<Change> {
    tokio::time::timeout(bound, feed.recv()).await.ok()?.ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_commit_by_another_connection_reaches_the_feed_as_a_resync() {
    let db = TempDb::new();
    let (here, elsewhere) = (db.open(), db.open());
    let mut feed = here.change_feed().subscribe();
    let _watch = here.watch_other_writers(EVERY).await;
    elsewhere.run_create(queued("r1")).await.unwrap();
    let seen = next(&mut feed, Duration::from_secs(5)).await;
    assert_eq!(seen, Some(Change::Resync));
}

#[tokio::test(flavor = "multi_thread")]
async fn this_stores_own_commits_are_published_once_and_never_as_a_resync() {
    let db = TempDb::new();
    let here = db.open();
    let mut feed = here.change_feed().subscribe();
    let _watch = here.watch_other_writers(EVERY).await;
    here.run_create(queued("r1")).await.unwrap();
    let status = Change::Status {
        run_id: "r1".into(),
        status: RunState::Queued,
    };
    assert_eq!(next(&mut feed, Duration::from_secs(5)).await, Some(status));
    assert_eq!(
        next(&mut feed, Duration::from_secs(5)).await,
        Some(Change::Ready)
    );
    // Several looks of the watch: none may report our own write.
    assert_eq!(next(&mut feed, EVERY * 6).await, None);
}
