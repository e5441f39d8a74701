//! The queue (R3, R9) on a real file: the conformance suite, two connections (like
//! two worker processes) racing to claim the same rows, the reaper's guarded update losing
//! to a heartbeat from another connection, and a database from before the queue migration.

use std::collections::BTreeMap;
use std::sync::Arc;

use runwarden_runtime::RunState;
use runwarden_runtime::queue::{Claim, QueueStore};
use runwarden_runtime::store::{Heartbeat, NewRunStatus, RunCreate, RunStore};
use runwarden_runtime::{RetryPolicy, reap_at};
use runwarden_store_sqlite::SqliteStore;
use serde_json::json;

use crate::common::TempDb;

const LEASE: i64 = 30_000;

fn queued(id: &str, created_ms: i64) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "helpdesk".into(),
        correlation: id.into(),
        request: Some(json!({"input": "hello"})),
        status: NewRunStatus::Queued,
        now_ms: created_ms,
        origin: Default::default(),
    }
}

/// Claims until nothing is due, answering the ids this claimant won.
async fn claim_all(store: SqliteStore, owner: String) -> Vec<String> {
    let mut won = Vec::new();
    while let Some(run) = store
        .run_claim(Claim {
            owner: owner.clone(),
            lease_until_ms: 1_000 + LEASE,
            now_ms: 1_000,
            agents: None,
            start: false,
        })
        .await
        .unwrap()
    {
        assert_eq!(run.claimed_by.as_deref(), Some(owner.as_str()));
        won.push(run.id);
    }
    won
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_queue_conformance_suite() {
    let db = TempDb::new();
    runwarden_storetest::exercise_queue_store(Arc::new(db.open())).await;
}

#[tokio::test]
async fn a_starting_claim_records_the_start_in_its_own_transaction() {
    let db = TempDb::new();
    let store = db.open();
    for id in ["a", "b"] {
        let params = RunCreate {
            request: Some(json!({"prompt": "hello"})),
            ..queued(id, 1)
        };
        store.run_create(params).await.unwrap();
    }
    let claim = Claim {
        owner: "w1".into(),
        lease_until_ms: 1_000 + LEASE,
        now_ms: 1_000,
        agents: None,
        start: true,
    };
    let claimed = store.run_claim_many(claim.clone(), 1).await.unwrap();
    let started = claimed[0].started.clone().expect("SQLite starts the run");
    assert_eq!(store.run_events("a", 0, 0).await.unwrap(), [started]);
    // A claim of one answers no event, so it records none.
    let one = store.run_claim(claim).await.unwrap().unwrap();
    assert_eq!(one.id, "b");
    assert!(store.run_events("b", 0, 0).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn two_connections_racing_with_eight_claimants_each_claim_every_run_exactly_once() {
    const RUNS: i64 = 50;
    const CLAIMANTS_PER_HANDLE: usize = 8;
    let db = TempDb::new();
    let handles = [db.open(), db.open()];
    for n in 0..RUNS {
        handles[0]
            .run_create(queued(&format!("race-{n:02}"), n))
            .await
            .unwrap();
    }
    let mut tasks = Vec::new();
    for (h, store) in handles.iter().enumerate() {
        for c in 0..CLAIMANTS_PER_HANDLE {
            let owner = format!("process-{h}-worker-{c}");
            tasks.push(tokio::spawn(claim_all(store.clone(), owner.clone())));
        }
    }
    let mut winners: BTreeMap<String, usize> = BTreeMap::new();
    for task in tasks {
        for id in task.await.unwrap() {
            *winners.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = winners.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "R3: claimed more than once: {twice:?}");
    let expected: Vec<String> = (0..RUNS).map(|n| format!("race-{n:02}")).collect();
    assert_eq!(
        winners.into_keys().collect::<Vec<_>>(),
        expected,
        "R3: every queued run is claimed"
    );
    for id in &expected {
        let run = handles[1].run_get(id).await.unwrap().unwrap();
        assert_eq!(run.status, RunState::Running);
        assert!(run.claimed_by.is_some());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_heartbeat_committed_by_another_connection_wins_over_the_reaper() {
    let db = TempDb::new();
    let (worker, reaper) = (db.open(), db.open());
    worker.run_create(queued("beat-1", 0)).await.unwrap();
    let claimed = worker
        .run_claim(Claim {
            owner: "worker-a".into(),
            lease_until_ms: 100,
            now_ms: 0,
            agents: None,
            start: false,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(claimed.id, "beat-1");
    // The reaper's process reads the run as stale and decides; then the worker's heartbeat
    // lands before the reaper applies its decision.
    let stale = reaper.run_stale(1_000, 10).await.unwrap();
    assert_eq!(stale.len(), 1, "the reaper sees the lease run out");
    let renewed = worker
        .run_heartbeat(Heartbeat {
            id: "beat-1".into(),
            owner: "worker-a".into(),
            epoch: claimed.claim_epoch,
            lease_until_ms: 1_000 + LEASE,
            now_ms: 999,
        })
        .await
        .unwrap();
    assert!(renewed);
    let policy = RetryPolicy::default();
    let decision = policy.decide(
        &stale[0],
        runwarden_runtime::RequeueCause::LeaseExpired,
        1_000,
        0.5,
    );
    let late = runwarden_runtime::queue::RescueApply {
        id: "beat-1".into(),
        owner: stale[0].claimed_by.clone(),
        requeue_count: stale[0].requeue_count,
        pending_effect: stale[0].pending_effect.clone(),
        decision,
        reason: "the lease of worker-a expired".into(),
        now_ms: 1_000,
    };
    assert!(
        !reaper.run_rescue_apply(late).await.unwrap(),
        "R9: staleness is re-checked against the committed row"
    );
    assert!(
        reap_at(&reaper, &policy, 1_000, 10, None)
            .await
            .unwrap()
            .is_empty(),
        "R9: a fresh pass finds nothing stale"
    );
    let run = reaper.run_get("beat-1").await.unwrap().unwrap();
    assert_eq!(run.status, RunState::Running);
    assert_eq!(run.claimed_by.as_deref(), Some("worker-a"));
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_queued_before_the_queue_migration_are_due_at_once() {
    let db = TempDb::new();
    {
        // What a build that knew migrations 1 to 3 left behind: one queued run.
        let conn = db.raw();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_ms INTEGER NOT NULL
             );
             INSERT INTO schema_migrations VALUES
                 (1, '0001_vault', 0), (2, '0002_mcp', 0), (3, '0003_runs', 0);",
        )
        .unwrap();
        for sql in [
            include_str!("../migrations/0001_vault.sql"),
            include_str!("../migrations/0002_mcp.sql"),
            include_str!("../migrations/0003_runs.sql"),
        ] {
            conn.execute_batch(sql).unwrap();
        }
        conn.execute(
            "INSERT INTO runs (id, agent, status, request, correlation, created_ms, updated_ms)
             VALUES ('old-1', 'helpdesk', 'queued', '{\"input\": \"hi\"}', 'old-1', 5, 5)",
            [],
        )
        .unwrap();
    }
    let store = SqliteStore::open_existing(&db.path).unwrap();
    let run = store
        .run_claim(Claim {
            owner: "worker-a".into(),
            lease_until_ms: 10 + LEASE,
            now_ms: 10,
            agents: None,
            start: false,
        })
        .await
        .unwrap()
        .expect("an old queued run is due");
    assert_eq!(run.id, "old-1");
    assert_eq!(run.request, Some(json!({"input": "hi"})));
}

/// SQLite reads a claimed run's events in the claim's trip to the store, so a segment
/// starts with one store call instead of two.
#[tokio::test(flavor = "multi_thread")]
async fn a_claim_reads_the_runs_events_in_the_same_trip() {
    let db = TempDb::new();
    let store = db.open();
    store.run_create(queued("trip-1", 0)).await.unwrap();
    let claimed = store
        .run_claim_many(
            Claim {
                owner: "worker-a".into(),
                lease_until_ms: LEASE,
                now_ms: 0,
                agents: None,
                start: false,
            },
            1,
        )
        .await
        .unwrap()
        .pop()
        .expect("the run is claimed");
    assert_eq!(claimed.run.id, "trip-1");
    assert_eq!(
        claimed.history,
        Some(Vec::new()),
        "SQLite reads the events with the claim; a new run has none"
    );
}
