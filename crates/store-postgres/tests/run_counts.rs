//! The runs by state that metrics read: ended runs are counted beside the table, each
//! run that ends writing its own change, which scrapes move into the counts; runs under
//! way are counted live. The counts agree with the rows whoever writes them, on any
//! node, and an upgraded database starts with its runs counted.

use runwarden_runtime::RunState;
use runwarden_runtime::queue::QueueStore;
use runwarden_runtime::store::RunStore;

use crate::common::TestDb;

/// Inserts `$1` runs named `$2-N` in state `$3`, as another writer would (an older node,
/// a hand edit, an import).
const RAW_RUNS: &str = "INSERT INTO runs (id, agent, status, correlation, created_ms, updated_ms)
     SELECT $2 || '-' || i, 'helpdesk', $3, 'c', 1, 1 FROM generate_series(1, $1::INT) AS i";

/// The runs by state as the table holds them, counted row by row.
async fn truth(raw: &tokio_postgres::Client) -> Vec<(RunState, u64)> {
    raw.query(
        "SELECT status, COUNT(*) FROM runs GROUP BY status ORDER BY status",
        &[],
    )
    .await
    .unwrap()
    .iter()
    .map(|row| {
        let status: String = row.get(0);
        (
            RunState::parse(&status).unwrap(),
            row.get::<_, i64>(1) as u64,
        )
    })
    .collect()
}

/// The ended runs in `status` as the counts keep them (changes not moved left out).
async fn kept(raw: &tokio_postgres::Client, status: &str) -> i64 {
    raw.query_one("SELECT n FROM run_counts WHERE status = $1", &[&status])
        .await
        .unwrap()
        .get(0)
}

async fn changes_left(raw: &tokio_postgres::Client) -> i64 {
    raw.query_one("SELECT COUNT(*) FROM run_count_changes", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_state_is_counted_as_the_rows_hold_it() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let raw = db.session().await;
    for (i, state) in RunState::ALL.into_iter().enumerate() {
        raw.execute(
            RAW_RUNS,
            &[&(i as i32 + 1), &state.as_str(), &state.as_str()],
        )
        .await
        .unwrap();
    }
    let expected = truth(&raw).await;
    assert_eq!(expected.len(), RunState::ALL.len(), "one row per state");
    assert_eq!(store.run_counts().await.unwrap(), expected);
    assert_eq!(changes_left(&raw).await, 0, "the scrape moved every change");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_counts_follow_runs_changed_removed_or_inserted_by_hand() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let raw = db.session().await;
    for (n, name, state) in [
        (2, "done", "completed"),
        (1, "bad", "failed"),
        (1, "on", "running"),
        (1, "wait", "queued"),
    ] {
        raw.execute(RAW_RUNS, &[&n, &name, &state]).await.unwrap();
    }
    assert_eq!(store.run_counts().await.unwrap(), truth(&raw).await);
    // runwarden never does any of these; the counts follow them anyway, folded or not.
    for edit in [
        "UPDATE runs SET status = 'failed' WHERE id = 'done-1'",
        "UPDATE runs SET status = 'queued' WHERE id = 'bad-1'",
        "UPDATE runs SET status = 'cancelled' WHERE id = 'on-1'",
        "UPDATE runs SET status = status, agent = 'other' WHERE id = 'done-2'",
        "DELETE FROM runs WHERE id IN ('done-2', 'wait-1')",
        "DELETE FROM runs WHERE status = 'failed'",
    ] {
        raw.execute(edit, &[]).await.unwrap();
        let stored = truth(&raw).await;
        assert_eq!(store.run_counts().await.unwrap(), stored, "after {edit}");
    }
    raw.batch_execute("TRUNCATE runs CASCADE").await.unwrap();
    assert_eq!(store.run_counts().await.unwrap(), [], "emptied");
    raw.execute(RAW_RUNS, &[&3, &"again", &"completed"])
        .await
        .unwrap();
    assert_eq!(
        store.run_counts().await.unwrap(),
        [(RunState::Completed, 3)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn scrapes_on_several_nodes_at_once_move_each_change_once() {
    let db = TestDb::new().await;
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(db.node().await);
    }
    let raw = db.session().await;
    // More changes than one fold moves (20,000): a run that ends writes one each.
    raw.execute(RAW_RUNS, &[&45_000, &"r", &"running"])
        .await
        .unwrap();
    raw.execute(
        "UPDATE runs SET status = 'completed' WHERE id NOT LIKE '%7'",
        &[],
    )
    .await
    .unwrap();
    let expected = truth(&raw).await;
    assert_eq!(changes_left(&raw).await, 40_500);
    let scrapes = nodes.iter().map(|node| node.run_counts());
    for counted in futures_util::future::join_all(scrapes).await {
        assert_eq!(counted.unwrap(), expected);
    }
    assert_eq!(
        (kept(&raw, "completed").await, changes_left(&raw).await),
        (40_500, 0),
        "each change moved once"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_reapers_fold_moves_the_changes_with_no_scrape() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let raw = db.session().await;
    // More changes than one step moves (20,000), so the fold takes two.
    raw.execute(RAW_RUNS, &[&25_000, &"f", &"failed"])
        .await
        .unwrap();
    raw.execute(RAW_RUNS, &[&2, &"q", &"queued"]).await.unwrap();
    assert_eq!(changes_left(&raw).await, 25_000);
    assert_eq!(store.run_counts_fold().await.unwrap(), 25_000);
    assert_eq!(changes_left(&raw).await, 0, "every change moved");
    assert_eq!(store.run_counts_fold().await.unwrap(), 0, "none left");
    assert_eq!(kept(&raw, "failed").await, 25_000);
    assert_eq!(store.run_counts().await.unwrap(), truth(&raw).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scrape_that_cannot_fold_still_counts_every_run() {
    let db = TestDb::new().await;
    let store = db.node().await;
    let raw = db.session().await;
    raw.execute(RAW_RUNS, &[&2, &"a", &"completed"])
        .await
        .unwrap();
    assert_eq!(
        store.run_counts().await.unwrap(),
        [(RunState::Completed, 2)]
    );
    raw.execute(RAW_RUNS, &[&3, &"b", &"failed"]).await.unwrap();
    // Another session holds the counts against writes: the fold waits out its lock
    // timeout; reads go on.
    raw.batch_execute("BEGIN; LOCK TABLE run_counts IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let held = truth(&db.session().await).await;
    assert_eq!(store.run_counts().await.unwrap(), held);
    // The reaper's fold meets the same lock and says so; the next pass tries again.
    let error = store.run_counts_fold().await.unwrap_err().to_string();
    assert!(error.contains("moving the ended runs' counts"), "{error}");
    assert_eq!(changes_left(&db.session().await).await, 3, "nothing moved");
    raw.batch_execute("COMMIT").await.unwrap();
    assert_eq!(store.run_counts().await.unwrap(), held);
    assert_eq!(changes_left(&raw).await, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_upgraded_database_starts_with_its_runs_counted() {
    let db = TestDb::new().await;
    drop(db.node().await);
    db.schema_back_to(23).await;
    let raw = db.session().await;
    for (n, name, state) in [
        (2, "a", "completed"),
        (1, "c", "cancelled"),
        (1, "d", "queued"),
    ] {
        raw.execute(RAW_RUNS, &[&n, &name, &state]).await.unwrap();
    }
    let store = db.node().await;
    let seeded: i64 = raw
        .query_one("SELECT SUM(n)::BIGINT FROM run_counts", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(seeded, 3, "the upgrade counted the three ended runs");
    assert_eq!(store.run_counts().await.unwrap(), truth(&raw).await);
    raw.execute("UPDATE runs SET status = 'failed' WHERE id = 'd-1'", &[])
        .await
        .unwrap();
    assert_eq!(store.run_counts().await.unwrap(), truth(&raw).await);
}
