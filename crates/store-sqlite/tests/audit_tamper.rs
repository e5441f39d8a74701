//! SPEC V7: edits, deletions, reordering and truncation done with raw SQL on the real file
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
