//! Runs and their events (R1-R7) on a real file: the conformance suite, the status
//! probe answering while writers hold the file (R6), several connections appending at once
//! (R1), and rows damaged through raw SQL.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runwarden_base::StoreError;
use runwarden_runtime::RunState;
use runwarden_runtime::store::{CancelAnswer, EventAppend, NewRunStatus, RunCreate, RunStore};
use runwarden_store_sqlite::SqliteStore;
use serde_json::json;

use crate::common::TempDb;

const OWNER: &str = "segment-a";

/// Generous: the probe answers in well under a millisecond; a probe stuck behind a writer
/// would wait for the five-second busy timeout.
const PROBE_BOUND: Duration = Duration::from_secs(1);

fn running(id: &str) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "helpdesk".into(),
        correlation: id.into(),
        request: Some(json!({"input": "hello"})),
        status: NewRunStatus::Running {
            owner: OWNER.into(),
            lease_until_ms: 30_000,
        },
        now_ms: 0,
        origin: Default::default(),
    }
}

fn event(id: &str) -> EventAppend {
    EventAppend {
        id: id.into(),
        owner: OWNER.into(),
        epoch: 1,
        kind: "tool_executed".into(),
        payload: json!({}),
        clear_fence: false,
        round: None,
        end: None,
        now_ms: 1,
        before: None,
    }
}

/// One run's status through the batched read.
async fn status_of(store: &SqliteStore, id: &str) -> Result<Option<RunState>, StoreError> {
    let rows = store.run_statuses(&[id.to_string()]).await?;
    Ok(rows.into_iter().find(|(r, _)| r == id).map(|(_, s)| s))
}

/// Asks the batched read and returns its answer with how long it took.
async fn timed_status(store: &SqliteStore, id: &str) -> (Option<RunState>, Duration) {
    let started = Instant::now();
    let status = status_of(store, id).await.unwrap();
    (status, started.elapsed())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_run_conformance_suite() {
    let db = TempDb::new();
    runwarden_storetest::exercise_run_store(Arc::new(db.open())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_decision_conformance_suite() {
    let db = TempDb::new();
    runwarden_storetest::exercise_decision_store(Arc::new(db.open())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_read_answers_while_another_connection_holds_a_write_transaction() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(running("probe-1")).await.unwrap();
    let writer = db.raw();
    writer.execute_batch("BEGIN IMMEDIATE").unwrap();
    writer
        .execute(
            "UPDATE runs SET status = 'cancelled' WHERE id = 'probe-1'",
            [],
        )
        .unwrap();
    let (status, took) = timed_status(&store, "probe-1").await;
    assert!(
        took < PROBE_BOUND,
        "R6: the probe waited {took:?} behind a writer"
    );
    assert_eq!(
        status,
        Some(RunState::Running),
        "the probe reads the last committed status, not another transaction's"
    );
    writer.execute_batch("COMMIT").unwrap();
    assert_eq!(
        status_of(&store, "probe-1").await.unwrap(),
        Some(RunState::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_status_read_does_not_wait_behind_the_stores_own_writer() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(running("probe-2")).await.unwrap();
    let blocker = db.raw();
    blocker.execute_batch("BEGIN IMMEDIATE").unwrap();
    // The store's cancel takes its write connection and waits (busy timeout) for the
    // blocker's write lock, holding the write connection's mutex all along.
    let cancelling = tokio::spawn({
        let store = store.clone();
        async move { store.run_cancel("probe-2", 5).await }
    });
    // Wait until the cancel holds the write connection: a read through it no longer answers.
    let deadline = Instant::now() + Duration::from_secs(4);
    loop {
        let read = tokio::time::timeout(Duration::from_millis(50), store.run_get("probe-2"));
        if read.await.is_err() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cancel never took the write connection"
        );
    }
    let (status, took) = timed_status(&store, "probe-2").await;
    assert!(
        took < PROBE_BOUND,
        "R6: the probe waited {took:?} behind the store's writer"
    );
    assert_eq!(status, Some(RunState::Running));
    blocker.execute_batch("ROLLBACK").unwrap();
    assert_eq!(
        cancelling.await.unwrap().unwrap(),
        CancelAnswer::Cancelled {
            previous: RunState::Running
        }
    );
    assert_eq!(
        status_of(&store, "probe-2").await.unwrap(),
        Some(RunState::Cancelled)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cancel_from_another_process_is_seen_by_the_probe_at_once() {
    let db = TempDb::new();
    let worker = db.open();
    let operator = db.open();
    worker.run_create(running("cross-1")).await.unwrap();
    assert_eq!(
        operator.run_cancel("cross-1", 2).await.unwrap(),
        CancelAnswer::Cancelled {
            previous: RunState::Running
        }
    );
    assert_eq!(
        status_of(&worker, "cross-1").await.unwrap(),
        Some(RunState::Cancelled),
        "R6: the row is the only source of truth, whoever wrote it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_connections_appending_at_once_never_share_a_sequence() {
    const TASKS_PER_HANDLE: usize = 4;
    const APPENDS_PER_TASK: usize = 20;
    let db = TempDb::new();
    let handles = [db.open(), db.open()];
    handles[0].run_create(running("shared-1")).await.unwrap();
    let mut tasks = Vec::new();
    for store in &handles {
        for _ in 0..TASKS_PER_HANDLE {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..APPENDS_PER_TASK {
                    store
                        .run_event_append(event("shared-1"))
                        .await
                        .unwrap()
                        .unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total = i64::try_from(2 * TASKS_PER_HANDLE * APPENDS_PER_TASK).unwrap();
    let seqs: Vec<i64> = handles[1]
        .run_events("shared-1", 0, 0)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, (1..=total).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_stored_status_is_a_corrupt_error_not_a_panic() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(running("damaged-1")).await.unwrap();
    db.raw()
        .execute("UPDATE runs SET status = 'paused'", [])
        .unwrap();
    let errors = [
        status_of(&store, "damaged-1").await.unwrap_err(),
        store.run_get("damaged-1").await.unwrap_err(),
        store.run_cancel("damaged-1", 1).await.unwrap_err(),
    ];
    for error in errors {
        let text = error.to_string();
        assert!(text.contains("run damaged-1"), "{text}");
        assert!(text.contains("unknown status \"paused\""), "{text}");
        assert!(text.contains("the database is corrupt"), "{text}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_request_or_payload_that_is_not_json_is_a_corrupt_error() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(running("damaged-2")).await.unwrap();
    store.run_event_append(event("damaged-2")).await.unwrap();
    let raw = db.raw();
    raw.execute("UPDATE runs SET request = '{\"input\": '", [])
        .unwrap();
    raw.execute("UPDATE run_events SET payload = 'not json'", [])
        .unwrap();
    let text = store.run_get("damaged-2").await.unwrap_err().to_string();
    assert!(text.contains("run damaged-2"), "{text}");
    assert!(text.contains("request that is not JSON"), "{text}");
    assert!(text.contains("the database is corrupt"), "{text}");
    let text = store
        .run_events("damaged-2", 0, 0)
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("event 1 of run damaged-2"), "{text}");
    assert!(text.contains("the database is corrupt"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_duplicate_run_id_is_refused_with_a_hint() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(running("twice")).await.unwrap();
    let text = store
        .run_create(running("twice"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        text.contains("a run with id twice already exists"),
        "{text}"
    );
    assert!(text.contains("fresh UUIDv7"), "{text}");
}

/// The database file itself deleted under an open store (an operator's `rm`): its data
/// went with it, so the next write is refused, named as the deleted file with what to do,
/// and nothing claims to have saved it; every later write is refused too.
#[tokio::test]
async fn a_database_file_deleted_under_the_store_refuses_every_write_and_says_to_restore() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(running("before")).await.unwrap();
    std::fs::remove_file(&db.path).unwrap();
    let error = store.run_create(running("after")).await.unwrap_err();
    assert_eq!(error.fault, runwarden_base::StoreFault::Corrupt, "{error}");
    let text = error.to_string();
    assert!(
        text.contains(&db.path.display().to_string())
            && text.contains("restore it from a backup")
            && !text.contains("copied into the database file"),
        "{text}"
    );
    let again = store.run_create(running("later")).await.unwrap_err();
    assert!(again.to_string().contains("writes nothing more"), "{again}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_committed_together_keep_each_guard_and_each_answer() {
    // Appends sent at once share transactions (group commit); each keeps its own guard:
    // a stale claim is refused alone, a final event ends its run alone, and every stored
    // event is announced on the change feed once.
    const RUNS: usize = 8;
    const APPENDS: usize = 12;
    let db = TempDb::new();
    let store = db.open();
    for r in 0..RUNS {
        store
            .run_create(running(&format!("batch-{r}")))
            .await
            .unwrap();
    }
    let mut feed = store.change_feed().subscribe();
    let mut tasks = Vec::new();
    for r in 0..RUNS {
        for a in 0..APPENDS {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let mut append = event(&format!("batch-{r}"));
                append.payload = json!({"n": a});
                // Every third append of run 0 carries a stale claim epoch.
                if r == 0 && a % 3 == 0 {
                    append.epoch = 7;
                }
                (r, a, store.run_event_append(append).await.unwrap())
            }));
        }
    }
    let mut stored = 0;
    for task in tasks {
        let (r, a, answer) = task.await.unwrap();
        if r == 0 && a % 3 == 0 {
            assert_eq!(answer, None, "a stale claim is refused, alone");
        } else {
            assert!(answer.is_some(), "run {r} append {a} was stored");
            stored += 1;
        }
    }
    for r in 0..RUNS {
        let events = store.run_events(&format!("batch-{r}"), 0, 0).await.unwrap();
        let expected = if r == 0 {
            APPENDS - APPENDS.div_ceil(3)
        } else {
            APPENDS
        };
        let seqs: Vec<i64> = events.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (1..=expected as i64).collect::<Vec<_>>(), "run {r}");
    }
    // A final event ends its own run and no other.
    let mut last = event("batch-1");
    last.kind = "run_completed".into();
    last.end = Some(runwarden_runtime::store::RunEnd {
        status: RunState::Completed,
        reason: "done".into(),
    });
    let (ended, other) = tokio::join!(
        store.run_event_append(last),
        store.run_event_append(event("batch-2"))
    );
    assert!(ended.unwrap().is_some() && other.unwrap().is_some());
    assert_eq!(
        status_of(&store, "batch-1").await.unwrap(),
        Some(RunState::Completed)
    );
    assert_eq!(
        status_of(&store, "batch-2").await.unwrap(),
        Some(RunState::Running)
    );
    let mut announced = 0;
    while let Ok(change) = feed.try_recv() {
        announced += usize::from(matches!(change, runwarden_runtime::Change::Appended { .. }));
    }
    assert_eq!(announced, stored + 2, "each stored event announced once");
}
