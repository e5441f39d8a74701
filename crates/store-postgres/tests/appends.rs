//! Run events appended side by side share transactions on PostgreSQL (group commit), and
//! a batch the server refuses costs no append but the one at fault.

use std::sync::Arc;
use std::time::Duration;

use runwarden_runtime::RunState;
use runwarden_runtime::store::{
    EarlierEvent, EventAppend, FenceMark, NewRunStatus, RunCreate, RunEnd, RunStore,
};
use runwarden_store_postgres::PgStore;
use runwarden_testkit::TempCluster;
use serde_json::json;
use tokio_postgres::Client;

use crate::common::{TestDb, now_ms, until};

const OWNER: &str = "worker-a";

/// Every transaction that writes takes a transaction id: on a cluster of its own, the
/// difference between two reads counts them (the second read takes one too).
async fn next_xid(client: &Client) -> i64 {
    let row = client
        .query_one("SELECT pg_current_xact_id()::TEXT::BIGINT", &[])
        .await
        .unwrap();
    row.get(0)
}

/// A database on `cluster`, a store on it, and a plain client beside the store.
async fn fixture(cluster: TempCluster) -> (TestDb, Arc<PgStore>, Client) {
    let db = TestDb::on(cluster).await;
    let store = Arc::new(PgStore::connect(&db.url).await.unwrap());
    let client = admin(&db.url).await;
    (db, store, client)
}

async fn admin(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
}

/// `n` running runs owned by [`OWNER`], and their appends' template.
async fn runs(store: &PgStore, prefix: &str, n: usize) -> Vec<EventAppend> {
    let now = now_ms();
    let mut appends = Vec::new();
    for r in 0..n {
        let id = format!("{prefix}-{r}");
        store
            .run_create(RunCreate {
                id: id.clone(),
                agent: "helpdesk".into(),
                correlation: id.clone(),
                request: None,
                status: NewRunStatus::Running {
                    owner: OWNER.into(),
                    lease_until_ms: now + 60_000,
                },
                now_ms: now,
                origin: Default::default(),
            })
            .await
            .unwrap();
        let epoch = store.run_get(&id).await.unwrap().unwrap().claim_epoch;
        appends.push(EventAppend {
            id,
            owner: OWNER.into(),
            epoch,
            kind: "tool_executed".into(),
            payload: json!({}),
            clear_fence: false,
            round: None,
            end: None,
            now_ms: now,
            before: None,
        });
    }
    appends
}

/// Spawns `appends` (on this test's one thread, so each has started or queued once a wait
/// shows) while `client` holds the rows of the first two appends' runs, so the first goes
/// alone and waits while the others queue behind it; then lets them all go. Answers in
/// the appends' order.
async fn release_together(
    store: &Arc<PgStore>,
    client: &Client,
    appends: Vec<EventAppend>,
) -> Vec<Result<Option<i64>, runwarden_base::StoreError>> {
    let first: Vec<&str> = appends.iter().take(2).map(|a| a.id.as_str()).collect();
    client.batch_execute("BEGIN").await.unwrap();
    client
        .execute(
            "SELECT id FROM runs WHERE id = ANY($1) FOR UPDATE",
            &[&first],
        )
        .await
        .unwrap();
    let tasks: Vec<_> = appends
        .into_iter()
        .map(|append| {
            let store = Arc::clone(store);
            tokio::spawn(async move { store.run_event_append(append).await })
        })
        .collect();
    until(client, WAITING, 1..).await;
    client.batch_execute("COMMIT").await.unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Backends of this database waiting for a lock.
const WAITING: &str = "SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event_type = 'Lock'";

#[tokio::test(flavor = "current_thread")]
async fn appends_side_by_side_share_transactions_and_keep_every_sequence() {
    // As a worker's runs append: each run has one append outstanding at a time, and many
    // runs append at once.
    const RUNS: usize = 48;
    const WAVES: usize = 3;
    let (_db, store, client) = fixture(TempCluster::start_owned()).await;
    let templates = runs(&store, "together", RUNS).await;
    let before = next_xid(&client).await;
    for n in 0..WAVES {
        let wave = templates.iter().map(|template| EventAppend {
            payload: json!({"n": n}),
            ..template.clone()
        });
        let answers = release_together(&store, &client, wave.collect()).await;
        for answer in &answers {
            assert_eq!(answer.as_ref().unwrap(), &Some(n as i64 + 1), "wave {n}");
        }
    }
    let after = next_xid(&client).await;
    for template in &templates {
        let events = store.run_events(&template.id, 0, 0).await.unwrap();
        let ns: Vec<i64> = events
            .iter()
            .map(|e| e.payload["n"].as_i64().unwrap())
            .collect();
        assert_eq!(ns, (0..WAVES as i64).collect::<Vec<_>>(), "{}", template.id);
    }
    // The lock holders' transactions and the two reads aside.
    let writes = after - before - 1 - WAVES as i64;
    let appends = (RUNS * WAVES) as i64;
    assert!(
        writes <= appends / 4,
        "{appends} appends took {writes} transactions: they were not grouped"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_the_server_refuses_fails_only_the_append_at_fault() {
    let (_db, store, client) = fixture(TempCluster::start()).await;
    client
        .batch_execute("ALTER TABLE run_events ADD CONSTRAINT no_poison CHECK (kind <> 'poison')")
        .await
        .unwrap();
    let mut wave = runs(&store, "refused", 6).await;
    wave[3].kind = "poison".into();
    let answers = release_together(&store, &client, wave.clone()).await;
    for (append, answer) in wave.iter().zip(&answers) {
        let events = store.run_events(&append.id, 0, 0).await.unwrap();
        if append.kind == "poison" {
            let error = answer.as_ref().expect_err("the server refuses it");
            assert!(!error.is_retryable(), "{error}");
            assert!(error.to_string().contains("no_poison"), "{error}");
            assert!(events.is_empty(), "nothing of it is stored");
        } else {
            assert_eq!(answer.as_ref().unwrap(), &Some(1), "{}", append.id);
            assert_eq!(events.len(), 1, "{}", append.id);
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_run_whose_row_another_session_holds_does_not_hold_up_the_batch() {
    let (db, store, client) = fixture(TempCluster::start()).await;
    let blocker = admin(&db.url).await;
    let wave = runs(&store, "held", 6).await;
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "SELECT id FROM runs WHERE id = $1 FOR UPDATE",
            &[&wave[4].id],
        )
        .await
        .unwrap();
    let held = {
        let store = Arc::clone(&store);
        let append = wave[4].clone();
        // Queued with the others, after the two that go first.
        let mut rest = wave.clone();
        rest.remove(4);
        let (first, others) = rest.split_at(2);
        let mut ordered = first.to_vec();
        ordered.push(append);
        ordered.extend_from_slice(others);
        tokio::spawn(async move {
            let answers = release_together(&store, &client, ordered).await;
            (answers, client)
        })
    };
    // Every append but the held run's is answered while the blocker still holds its row.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    for (i, append) in wave.iter().enumerate().filter(|(i, _)| *i != 4) {
        loop {
            let events = store.run_events(&append.id, 0, 0).await.unwrap();
            if events.len() == 1 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "append {i} waited for another run's row"
            );
            tokio::task::yield_now().await;
        }
    }
    assert!(
        !held.is_finished(),
        "the held run's append waits for its row"
    );
    blocker.batch_execute("COMMIT").await.unwrap();
    let (answers, _client) = held.await.unwrap();
    for answer in answers {
        assert_eq!(answer.unwrap(), Some(1));
    }
    assert_eq!(store.run_events(&wave[4].id, 0, 0).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_whose_connection_dies_stores_nothing_and_answers_each_append_unknown() {
    let (db, store, client) = fixture(TempCluster::start()).await;
    let watcher = admin(&db.url).await;
    let wave = runs(&store, "killed", 5).await;
    // The server stalls while the batch updates the last run's row, as a server that
    // stops answering mid-statement does; then its backend is terminated.
    client
        .batch_execute(
            "CREATE FUNCTION stall() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
                 IF NEW.id = 'killed-4' THEN PERFORM pg_sleep(60); END IF;
                 RETURN NEW;
             END $$;
             CREATE TRIGGER stall BEFORE UPDATE ON runs FOR EACH ROW EXECUTE FUNCTION stall();",
        )
        .await
        .unwrap();
    let killer = tokio::spawn(async move {
        let stalled = "SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event = 'PgSleep'";
        until(&watcher, stalled, 1..).await;
        let killed: bool = watcher
            .query_one(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event = 'PgSleep'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        killed
    });
    let answers = release_together(&store, &client, wave.clone()).await;
    assert!(
        killer.await.unwrap(),
        "the stalled batch's backend was terminated"
    );
    assert_eq!(
        answers[0].as_ref().unwrap(),
        &Some(1),
        "the first went alone"
    );
    for (append, answer) in wave.iter().zip(&answers) {
        let events = store.run_events(&append.id, 0, 0).await.unwrap();
        match answer {
            Ok(seq) => assert_eq!((*seq, events.len()), (Some(1), 1), "{}", append.id),
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                assert!(
                    events.is_empty(),
                    "{}: the re-read found nothing",
                    append.id
                );
            }
        }
    }
    assert!(answers[4].is_err(), "the stalled run was in the batch");
}

#[tokio::test(flavor = "current_thread")]
async fn each_append_in_a_batch_keeps_its_own_guard() {
    let (_db, store, client) = fixture(TempCluster::start()).await;
    let mut wave = runs(&store, "guards", 7).await;
    let (fenced, ending) = (wave[3].clone(), wave[4].clone());
    let mark = FenceMark {
        id: fenced.id.clone(),
        owner: OWNER.into(),
        epoch: fenced.epoch,
        effect: "non_idempotent_write".into(),
        lease_until_ms: fenced.now_ms + 60_000,
        now_ms: fenced.now_ms,
    };
    assert!(store.run_fence_mark(mark).await.unwrap());
    for cancelled in &wave[5..] {
        store.run_cancel(&cancelled.id, now_ms()).await.unwrap();
    }
    // Two plain appends go alone; the batch holds a stale claim, a recorded write, an
    // answer with the run's end, an end refused by a cancel and a cancelled run's
    // boundary step.
    wave[2].epoch += 1;
    wave[3].clear_fence = true;
    wave[3].round = Some(3);
    let end = Some(RunEnd {
        status: RunState::Completed,
        reason: "done".into(),
    });
    let before = Some(EarlierEvent {
        kind: "model_response".into(),
        payload: json!({"text": "done"}),
    });
    wave[4].kind = "run_completed".into();
    (wave[4].end, wave[4].before) = (end.clone(), before.clone());
    wave[5].kind = "run_completed".into();
    (wave[5].end, wave[5].before) = (end, before);
    let answers = release_together(&store, &client, wave.clone()).await;
    let answers: Vec<Option<i64>> = answers.into_iter().map(Result::unwrap).collect();
    assert_eq!(
        answers,
        [Some(1), Some(1), None, Some(1), Some(2), None, Some(1)]
    );

    let fenced = store.run_get(&fenced.id).await.unwrap().unwrap();
    assert_eq!((fenced.pending_effect, fenced.rounds), (None, 3));
    let ended = store.run_get(&ending.id).await.unwrap().unwrap();
    assert_eq!(ended.status, RunState::Completed);
    let events = store.run_events(&ending.id, 0, 0).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["model_response", "run_completed"]);
    for (append, stored) in wave.iter().zip([1, 1, 0, 1, 2, 0, 1]) {
        let events = store.run_events(&append.id, 0, 0).await.unwrap();
        assert_eq!(events.len(), stored, "{}", append.id);
    }
    for cancelled in &wave[5..] {
        let run = store.run_get(&cancelled.id).await.unwrap().unwrap();
        assert_eq!(run.status, RunState::Cancelled, "{}", cancelled.id);
    }
}
