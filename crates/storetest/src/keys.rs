//! Idempotency keys on run creation and worker presence: one run per (scope, key) even
//! when requests race, a key reused with another body refused, keys honoured for the
//! retention and free again after it; the last time any worker was seen.

use std::sync::Arc;

use runwarden_runtime::store::{NewRunStatus, RunCreate, RunFilter};
use runwarden_runtime::{IDEMPOTENCY_RETENTION_MS, KeyedCreate, QueueStore, RunCreateKeyed};
use serde_json::json;

/// Runs every check; the store must hold no run of agent `keyed` and no worker row.
pub(crate) async fn exercise(store: &Arc<dyn QueueStore>) {
    let s = &**store;
    the_same_key_and_body_answer_the_first_run(s).await;
    the_same_key_with_another_body_is_refused_and_creates_nothing(s).await;
    keys_of_different_scopes_never_collide(s).await;
    a_key_past_its_retention_makes_a_new_run(s).await;
    racing_requests_with_one_key_create_one_run(store).await;
    the_last_worker_seen_is_the_latest_beat_of_any_worker(s).await;
}

const AGENT: &str = "keyed";
const T0: i64 = 1_900_000_000_000;

fn keyed(id: &str, scope: &str, key: &str, body_hash: &str, now_ms: i64) -> RunCreateKeyed {
    RunCreateKeyed {
        run: RunCreate {
            id: id.into(),
            agent: AGENT.into(),
            correlation: id.into(),
            request: Some(json!({"input": "file a ticket"})),
            status: NewRunStatus::Queued,
            now_ms,
            origin: Default::default(),
        },
        scope: scope.into(),
        key: key.into(),
        body_hash: body_hash.into(),
    }
}

async fn create(store: &dyn QueueStore, params: RunCreateKeyed) -> KeyedCreate {
    store
        .run_create_keyed(params)
        .await
        .expect("a keyed create succeeds")
}

async fn keyed_runs(store: &dyn QueueStore) -> usize {
    store
        .run_list(RunFilter {
            agent: Some(AGENT.into()),
            limit: 1_000,
            ..RunFilter::default()
        })
        .await
        .expect("runs list")
        .len()
}

async fn the_same_key_and_body_answer_the_first_run(store: &dyn QueueStore) {
    let before = keyed_runs(store).await;
    let KeyedCreate::Created(first) = create(store, keyed("k-1", "t1", "key-a", "h1", T0)).await
    else {
        panic!("a new key creates its run");
    };
    assert_eq!(first.id, "k-1");
    let again = create(store, keyed("k-1-retry", "t1", "key-a", "h1", T0 + 1_000)).await;
    match again {
        KeyedCreate::Existing(run) => assert_eq!(run.id, "k-1", "the retry answers the first run"),
        other => panic!("a retry with the same body answers the first run, not {other:?}"),
    }
    assert!(
        store.run_get("k-1-retry").await.unwrap().is_none(),
        "the retry created no run"
    );
    assert_eq!(keyed_runs(store).await, before + 1);
}

async fn the_same_key_with_another_body_is_refused_and_creates_nothing(store: &dyn QueueStore) {
    create(store, keyed("k-2", "t1", "key-b", "h1", T0)).await;
    let before = keyed_runs(store).await;
    let other = create(store, keyed("k-2-other", "t1", "key-b", "h2", T0 + 1_000)).await;
    assert_eq!(
        other,
        KeyedCreate::Reused {
            run_id: "k-2".into()
        }
    );
    assert!(store.run_get("k-2-other").await.unwrap().is_none());
    assert_eq!(keyed_runs(store).await, before, "nothing was created");
}

async fn keys_of_different_scopes_never_collide(store: &dyn QueueStore) {
    create(store, keyed("k-3", "t1", "key-c", "h1", T0)).await;
    let theirs = create(store, keyed("k-3-t2", "t2", "key-c", "h2", T0)).await;
    assert!(
        matches!(&theirs, KeyedCreate::Created(run) if run.id == "k-3-t2"),
        "another caller's key is another key: {theirs:?}"
    );
}

async fn a_key_past_its_retention_makes_a_new_run(store: &dyn QueueStore) {
    create(store, keyed("k-4", "t1", "key-d", "h1", T0)).await;
    let within = create(
        store,
        keyed(
            "k-4-within",
            "t1",
            "key-d",
            "h2",
            T0 + IDEMPOTENCY_RETENTION_MS - 1,
        ),
    )
    .await;
    assert!(
        matches!(within, KeyedCreate::Reused { .. }),
        "kept for the whole retention: {within:?}"
    );
    let after = create(
        store,
        keyed(
            "k-4-after",
            "t1",
            "key-d",
            "h2",
            T0 + IDEMPOTENCY_RETENTION_MS + 1,
        ),
    )
    .await;
    assert!(
        matches!(&after, KeyedCreate::Created(run) if run.id == "k-4-after"),
        "an expired key is free again: {after:?}"
    );
    let retry = create(
        store,
        keyed(
            "k-4-again",
            "t1",
            "key-d",
            "h2",
            T0 + IDEMPOTENCY_RETENTION_MS + 2,
        ),
    )
    .await;
    assert!(
        matches!(&retry, KeyedCreate::Existing(run) if run.id == "k-4-after"),
        "and then names its new run: {retry:?}"
    );
}

async fn racing_requests_with_one_key_create_one_run(store: &Arc<dyn QueueStore>) {
    let before = keyed_runs(&**store).await;
    let racers: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                create(&*store, keyed(&format!("k-5-{i}"), "t1", "key-e", "h1", T0)).await
            })
        })
        .collect();
    let mut ids = std::collections::BTreeSet::new();
    let mut created = 0;
    for racer in racers {
        match racer.await.expect("the racer finished") {
            KeyedCreate::Created(run) => {
                created += 1;
                ids.insert(run.id);
            }
            KeyedCreate::Existing(run) => {
                ids.insert(run.id);
            }
            other => panic!("same key, same body: {other:?}"),
        }
    }
    assert_eq!(created, 1, "exactly one racer created the run");
    assert_eq!(ids.len(), 1, "every racer got the same run: {ids:?}");
    assert_eq!(keyed_runs(&**store).await, before + 1);
}

async fn the_last_worker_seen_is_the_latest_beat_of_any_worker(store: &dyn QueueStore) {
    assert_eq!(
        store.worker_last_seen().await.unwrap(),
        None,
        "no worker yet"
    );
    store.worker_seen("w-1", T0).await.unwrap();
    store.worker_seen("w-2", T0 + 5_000).await.unwrap();
    store.worker_seen("w-1", T0 + 2_000).await.unwrap();
    assert_eq!(store.worker_last_seen().await.unwrap(), Some(T0 + 5_000));
    // A beat a day later forgets the workers gone since.
    let later = T0 + runwarden_runtime::WORKER_FORGOTTEN_AFTER_MS + 10_000;
    store.worker_seen("w-3", later).await.unwrap();
    assert_eq!(store.worker_last_seen().await.unwrap(), Some(later));
}
