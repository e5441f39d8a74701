//! The runs by state that metrics read: ended runs are counted beside the table, by
//! triggers, and runs under way are counted live. The counts agree with the rows whoever
//! writes them, and an upgraded database starts with its runs counted.

use runwarden_runtime::RunState;
use runwarden_runtime::store::RunStore;

use crate::common::TempDb;

/// Inserts a run as another writer would (an older build, a hand edit, an import).
const RAW_RUN: &str = "INSERT INTO runs (id, agent, status, correlation, created_ms, updated_ms)
     VALUES (?1, 'helpdesk', ?2, ?1, 1, 1)";

/// The runs by state as the table holds them, counted row by row.
fn truth(raw: &rusqlite::Connection) -> Vec<(RunState, u64)> {
    raw.prepare("SELECT status, COUNT(*) FROM runs GROUP BY status ORDER BY status")
        .unwrap()
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .unwrap()
        .map(|row| {
            let (status, n) = row.unwrap();
            (RunState::parse(&status).unwrap(), n as u64)
        })
        .collect()
}

async fn counted(store: &impl RunStore) -> Vec<(RunState, u64)> {
    store.run_counts().await.unwrap()
}

#[tokio::test]
async fn every_state_is_counted_as_the_rows_hold_it() {
    let db = TempDb::new();
    let store = db.open();
    let raw = db.raw();
    for (i, state) in RunState::ALL.into_iter().enumerate() {
        for n in 0..=i {
            raw.execute(RAW_RUN, (format!("{}-{n}", state.as_str()), state.as_str()))
                .unwrap();
        }
    }
    let expected = truth(&raw);
    assert_eq!(expected.len(), RunState::ALL.len(), "one row per state");
    assert_eq!(counted(&store).await, expected);
}

#[tokio::test]
async fn the_counts_follow_runs_changed_removed_or_inserted_by_hand() {
    let db = TempDb::new();
    let store = db.open();
    let raw = db.raw();
    for (id, state) in [
        ("a", "completed"),
        ("b", "completed"),
        ("c", "failed"),
        ("d", "running"),
        ("e", "queued"),
    ] {
        raw.execute(RAW_RUN, (id, state)).unwrap();
    }
    assert_eq!(counted(&store).await, truth(&raw));
    // runwarden never does any of these; the counts follow them anyway.
    for edit in [
        "UPDATE runs SET status = 'failed' WHERE id = 'a'",
        "UPDATE runs SET status = 'queued' WHERE id = 'c'",
        "UPDATE runs SET status = 'cancelled' WHERE id = 'd'",
        "UPDATE runs SET status = status, agent = 'other' WHERE id = 'b'",
        "DELETE FROM runs WHERE id IN ('b', 'e')",
        "DELETE FROM runs WHERE status = 'failed'",
    ] {
        raw.execute(edit, []).unwrap();
        assert_eq!(counted(&store).await, truth(&raw), "after {edit}");
    }
    raw.execute("DELETE FROM runs", []).unwrap();
    assert_eq!(
        counted(&store).await,
        [],
        "no state is listed with no run in it"
    );
}

#[tokio::test]
async fn an_upgraded_database_starts_with_its_runs_counted() {
    let db = TempDb::new();
    drop(db.open());
    // The schema as the build before the counts left it, with runs in it.
    db.schema_back_to(23);
    let raw = db.raw();
    for (id, state) in [
        ("a", "completed"),
        ("b", "completed"),
        ("c", "cancelled"),
        ("d", "queued"),
    ] {
        raw.execute(RAW_RUN, (id, state)).unwrap();
    }
    let store = db.open();
    let kept: i64 = raw
        .query_row("SELECT SUM(n) FROM run_counts", [], |row| row.get(0))
        .unwrap();
    assert_eq!(kept, 3, "the upgrade counted the three ended runs");
    assert_eq!(counted(&store).await, truth(&raw));
    raw.execute("UPDATE runs SET status = 'failed' WHERE id = 'd'", [])
        .unwrap();
    assert_eq!(counted(&store).await, truth(&raw));
}
