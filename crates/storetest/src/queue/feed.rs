//! Every committed run change reaches the store's change feed.

use super::*;

/// How long a published change may take to arrive (PostgreSQL's NOTIFY crosses a
/// connection; SQLite publishes in-process).
const FEED_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits (bounded, never sleeping) until `expected` arrives on the feed, skipping other
/// changes; a receiver that lagged or a timeout fails the check.
async fn heard(feed: &mut broadcast::Receiver<Change>, expected: Change) {
    let wait = async {
        loop {
            match feed.recv().await {
                Ok(change) if change == expected => return,
                Ok(_) => continue,
                Err(error) => panic!("the feed failed while waiting for {expected:?}: {error}"),
            }
        }
    };
    tokio::time::timeout(FEED_WAIT, wait)
        .await
        .unwrap_or_else(|_| panic!("{expected:?} was not published within {FEED_WAIT:?}"));
}

/// O6: every committed run change reaches the store's feed: a new queued run (its status,
/// and that a worker may claim), a claim, an appended event with its sequence number, a
/// cancel.
pub(super) async fn committed_writes_are_published_on_the_feed(store: &dyn QueueStore) {
    let id = "feed-1";
    let status = |status| Change::Status {
        run_id: id.into(),
        status,
    };
    let mut feed = store.change_feed().subscribe();
    create(store, queued(id)).await;
    heard(&mut feed, status(RunState::Queued)).await;
    heard(&mut feed, Change::Ready).await;

    claim_expecting(store, id, T0).await;
    heard(&mut feed, status(RunState::Running)).await;

    let seq = store
        .run_event_append(EventAppend {
            id: id.into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &id).await,
            kind: "model_response".into(),
            payload: json!({"text": "on it"}),
            clear_fence: false,
            round: Some(1),
            end: None,
            now_ms: T0 + 1,
            before: None,
        })
        .await
        .expect("run_event_append")
        .expect("the owner may append");
    heard(
        &mut feed,
        Change::Appended {
            run_id: id.into(),
            seq,
        },
    )
    .await;

    let answer = store.run_cancel(id, T0 + 2).await.expect("run_cancel");
    assert!(matches!(answer, CancelAnswer::Cancelled { .. }));
    heard(&mut feed, status(RunState::Cancelled)).await;
}
