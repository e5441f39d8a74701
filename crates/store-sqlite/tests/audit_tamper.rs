//! V7: edits, deletions, reordering and truncation done with raw SQL on the real file
//! are all caught by `AuditChain::verify`.

use runwarden_vault::audit::VerifyReport;
use runwarden_vault::store::{AuditFilter, VaultStore};

use crate::common::{TempDb, chain, event};

/// Appends six rows through the store, runs `tamper` on a second connection, verifies.
async fn verify_after(tamper: &str) -> VerifyReport {
    let db = TempDb::new();
    let store = db.open();
    let chain = chain();
    for n in 1..=6 {
        store.audit_append(event(n), chain.clone()).await.unwrap();
    }
    assert!(
        chain.verify(&store).await.unwrap().intact,
        "the log is intact before tampering"
    );
    db.raw().execute_batch(tamper).unwrap();
    chain.verify(&store).await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_edited_row_is_detected_at_that_row() {
    let report = verify_after("UPDATE audit_log SET host = 'evil.example' WHERE id = 3").await;
    assert!(!report.intact);
    assert_eq!(report.first_bad_row, Some(3), "{report:?}");
    assert_eq!(report.rows_verified, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_row_is_detected_as_a_gap() {
    let report = verify_after("DELETE FROM audit_log WHERE id = 3").await;
    assert!(!report.intact);
    assert!(matches!(report.first_bad_row, Some(3 | 4)), "{report:?}");
    assert!(report.problem.unwrap().contains("row 3 is missing"));
}

#[tokio::test(flavor = "multi_thread")]
async fn swapped_rows_are_detected() {
    // Swap the contents of rows 2 and 3 while keeping their ids.
    let report = verify_after(
        "UPDATE audit_log SET id = -2 WHERE id = 2;
         UPDATE audit_log SET id = 2 WHERE id = 3;
         UPDATE audit_log SET id = 3 WHERE id = -2;",
    )
    .await;
    assert!(!report.intact);
    assert_eq!(report.first_bad_row, Some(2), "{report:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncated_tail_is_detected_by_the_tip_anchor() {
    let report = verify_after("DELETE FROM audit_log WHERE id IN (5, 6)").await;
    assert!(!report.intact);
    assert_eq!(report.first_bad_row, Some(5), "{report:?}");
    assert!(report.problem.unwrap().contains("truncated"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_truncation_that_rewinds_the_tip_is_detected_by_the_anchor_key() {
    let report = verify_after(
        "DELETE FROM audit_log WHERE id IN (5, 6);
         UPDATE audit_tip SET last_id = 4, last_hash = (SELECT hash FROM audit_log WHERE id = 4);",
    )
    .await;
    assert!(!report.intact);
    assert!(report.problem.unwrap().contains("tip anchor was altered"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deleted_tip_is_detected() {
    let report = verify_after("DELETE FROM audit_tip").await;
    assert!(!report.intact);
    assert!(report.problem.unwrap().contains("tip anchor is missing"));
}

#[tokio::test(flavor = "multi_thread")]
async fn appending_after_a_truncation_continues_from_the_tip_not_the_last_row() {
    let db = TempDb::new();
    let store = db.open();
    let chain = chain();
    for n in 1..=4 {
        store.audit_append(event(n), chain.clone()).await.unwrap();
    }
    db.raw()
        .execute("DELETE FROM audit_log WHERE id = 4", [])
        .unwrap();
    let row = store.audit_append(event(5), chain.clone()).await.unwrap();
    assert_eq!(row.id, 5, "V7: the gap stays visible");
    let report = chain.verify(&store).await.unwrap();
    assert!(!report.intact);
    assert!(report.problem.unwrap().contains("row 4 is missing"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hash_of_the_wrong_length_reads_back_as_an_error_not_a_panic() {
    let db = TempDb::new();
    let store = db.open();
    let chain = chain();
    for n in 1..=2 {
        store.audit_append(event(n), chain.clone()).await.unwrap();
    }
    db.raw()
        .execute("UPDATE audit_log SET hash = x'00ff' WHERE id = 2", [])
        .unwrap();
    let error = store.audit_list(AuditFilter::default()).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("audit row 2's hash holds 2 bytes"),
        "{error}"
    );
    assert!(chain.verify(&store).await.is_err());
}

/// V7 (amended): rows written before intents existed (a database at migration 5, rows
/// inserted with the old column set) still verify after the upgrade, and new rows chain
/// onto them.
#[tokio::test(flavor = "multi_thread")]
async fn rows_written_before_intents_existed_still_verify_after_the_upgrade() {
    let db = TempDb::new();
    let chain = chain();
    {
        let conn = db.raw();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_ms INTEGER NOT NULL
             );",
        )
        .unwrap();
        for (version, name, sql) in [
            (
                1,
                "0001_vault",
                include_str!("../migrations/0001_vault.sql"),
            ),
            (2, "0002_mcp", include_str!("../migrations/0002_mcp.sql")),
            (3, "0003_runs", include_str!("../migrations/0003_runs.sql")),
            (
                4,
                "0004_queue",
                include_str!("../migrations/0004_queue.sql"),
            ),
            (
                5,
                "0005_tokens",
                include_str!("../migrations/0005_tokens.sql"),
            ),
        ] {
            conn.execute_batch(sql).unwrap();
            conn.execute(
                "INSERT INTO schema_migrations VALUES (?1, ?2, 0)",
                rusqlite::params![version, name],
            )
            .unwrap();
        }
        // What the old writer stored: sixteen columns, no intent_id.
        let mut prev = [0u8; 32];
        for id in 1..=3i64 {
            let e = event(id);
            assert_eq!(e.intent_id, None);
            let hash = chain.link(id, &e, &prev);
            conn.execute(
                "INSERT INTO audit_log (id, time_ms, action, success, secret, method, host, path, status,
                     duration_ms, error, reason, actor, correlation, prev_hash, hash)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
                rusqlite::params![
                    id, e.time_ms, e.action, e.success, e.secret, e.method, e.host, e.path,
                    e.status, e.duration_ms as i64, e.error, e.reason, e.actor, e.correlation,
                    &prev[..], &hash[..]
                ],
            )
            .unwrap();
            conn.execute(
                "INSERT INTO audit_tip (id, last_id, last_hash, anchor) VALUES (1, ?1, ?2, ?3)
                 ON CONFLICT (id) DO UPDATE SET last_id = excluded.last_id,
                     last_hash = excluded.last_hash, anchor = excluded.anchor",
                rusqlite::params![id, &hash[..], &chain.anchor(id, &hash)[..]],
            )
            .unwrap();
            prev = hash;
        }
    }
    let store = db.open();
    let report = chain.verify(&store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, 3);

    let intent = runwarden_vault::AuditEvent {
        action: runwarden_vault::audit::action::HTTP_CALL_STARTED.into(),
        ..event(4)
    };
    let rows = store
        .audit_append_many(vec![intent], chain.clone())
        .await
        .unwrap();
    let completion = runwarden_vault::AuditEvent {
        intent_id: Some(rows[0].id),
        ..event(5)
    };
    store.audit_append(completion, chain.clone()).await.unwrap();
    let report = chain.verify(&store).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!((report.rows_verified, report.incomplete_calls), (5, 0));
}
