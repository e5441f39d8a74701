//! V7 (amended): no egress without a durable audit row, group commit, incomplete calls,
//! the anchor file outside the database, and the audit key that is never recreated.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use runwarden_testkit::{HttpReply, TestServer};
use runwarden_vault::audit::action;
use runwarden_vault::store::{SealedKind, VaultStore};
use runwarden_vault::{
    Credential, EgressError, EgressRequest, Method, Placement, SecretName, VaultError,
};

use crate::support::{SIGIL, anchored_fixture, fixture};

const WAIT: Duration = Duration::from_secs(10);

fn bearer(secret: SecretName) -> Credential {
    Credential {
        secret,
        placement: Placement::Bearer,
    }
}

#[tokio::test]
async fn the_intent_row_is_committed_before_the_server_sees_the_request() {
    let f = fixture().await;
    let db = f.db_path();
    let seen_intent = Arc::new(AtomicBool::new(false));
    let server = TestServer::start({
        let seen_intent = seen_intent.clone();
        move |_| {
            // Another connection, as another process would read it: only committed rows.
            let conn = rusqlite::Connection::open(&db).unwrap();
            let intents: i64 = conn
                .query_row(
                    "SELECT COUNT(*) FROM audit_log WHERE action = 'http_call_started'",
                    [],
                    |row| row.get(0),
                )
                .unwrap();
            seen_intent.store(intents == 1, Ordering::SeqCst);
            HttpReply::text(200, "ok")
        }
    })
    .await;
    let response = f
        .client
        .send(EgressRequest::new(Method::Get, server.url("/")), None)
        .await
        .unwrap();
    assert!(
        seen_intent.load(Ordering::SeqCst),
        "V7: the intent row was durable when the request arrived"
    );
    let completion = f.completion_row().await;
    assert_eq!(completion.event.action, action::HTTP_CALL);
    assert_eq!(response.audit_id, Some(completion.id));
}

#[tokio::test]
async fn an_intent_that_cannot_be_written_sends_nothing_and_refuses_with_audit_unavailable() {
    let f = fixture().await;
    let secret = f.put_sigil("api").await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    // Every audit write fails: the intent, and then the refusal row too.
    f.store.fail_next.store(usize::MAX, Ordering::SeqCst);
    let request = EgressRequest::new(Method::Post, server.url("/mcp")).credential(bearer(secret));
    let error = f.client.send(request, None).await.unwrap_err();
    assert!(
        matches!(error, EgressError::AuditUnavailable { .. }),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with(
            "refused: the audit log could not be written, so nothing was sent (audit_unavailable)"
        ),
        "{text}"
    );
    assert!(!text.contains(SIGIL), "no secret in the error: {text}");
    assert!(!format!("{error:?}").contains(SIGIL));
    assert_eq!(server.connection_count(), 0, "V7: nothing was sent");
    f.store.fail_next.store(0, Ordering::SeqCst);
    assert!(f.audit().await.is_empty(), "every write failed");
}

#[tokio::test]
async fn a_refused_intent_is_recorded_as_a_refusal_when_the_log_recovers() {
    let f = fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    // Only the intent fails (a passing lock); the refusal row that follows is written.
    f.store.fail_next.store(1, Ordering::SeqCst);
    let error = f
        .client
        .send(EgressRequest::new(Method::Get, server.url("/")), None)
        .await
        .unwrap_err();
    assert!(
        matches!(error, EgressError::AuditUnavailable { .. }),
        "{error}"
    );
    assert_eq!(server.connection_count(), 0);
    let row = f.only_audit_row().await;
    assert_eq!(row.event.action, action::HTTP_CALL_REFUSED);
    assert_eq!(row.event.reason.as_deref(), Some("audit_unavailable"));
    assert!(!row.event.success);
    assert_eq!(row.event.status, 0);
}

#[tokio::test]
async fn a_completion_that_cannot_be_written_keeps_the_outcome_and_leaves_the_intent_incomplete() {
    let f = fixture().await;
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    // The intent is written; the completion and everything after it fail.
    *f.store.appends_left.lock().unwrap() = Some(1);
    let response = f
        .client
        .send(EgressRequest::new(Method::Get, server.url("/")), None)
        .await
        .expect("a failed completion write does not turn the outcome into an error");
    assert_eq!(response.status, 200);
    assert_eq!(response.audit_id, None, "no completion row was written");
    server.next_request(WAIT).await;
    *f.store.appends_left.lock().unwrap() = None;

    let rows = f.audit().await;
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0].event.action, action::HTTP_CALL_STARTED);
    assert_eq!(
        f.vault.audit_incomplete(vec![rows[0].id]).await.unwrap(),
        [rows[0].id]
    );
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(
        report.incomplete_calls, 1,
        "V7: the incomplete call is visible"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_concurrent_calls_share_transactions_and_leave_one_contiguous_verified_chain() {
    let f = anchored_fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let calls: Vec<_> = (0..64)
        .map(|_| {
            let (client, url) = (f.client.clone(), server.url("/"));
            tokio::spawn(async move {
                client
                    .send(EgressRequest::new(Method::Get, url), None)
                    .await
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status, 200);
    }
    let rows = f.audit().await;
    let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
    assert_eq!(ids, (1..=128).collect::<Vec<_>>(), "V7: contiguous ids");
    let intents: std::collections::BTreeSet<i64> = rows
        .iter()
        .filter(|r| r.event.action == action::HTTP_CALL_STARTED)
        .map(|r| r.id)
        .collect();
    let completed: std::collections::BTreeSet<i64> =
        rows.iter().filter_map(|r| r.event.intent_id).collect();
    assert_eq!(intents.len(), 64);
    assert_eq!(
        completed, intents,
        "every intent has exactly its completion"
    );
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    // The anchor follows the log to its last synced batch (the one with the last intent;
    // outcome rows after it are not synced, so they are not anchored yet).
    let last_intent = *intents.last().unwrap();
    let anchored = report.anchored_rows.unwrap();
    assert!(
        (last_intent..=128).contains(&anchored),
        "anchored {anchored}, last intent {last_intent}"
    );
    let batches = f.store.audit_batches.load(Ordering::SeqCst);
    assert!(
        batches < 128,
        "group commit: {batches} transactions for 128 rows"
    );
}

#[tokio::test]
async fn a_wipe_of_every_row_and_the_tip_is_detected_through_the_anchor_file() {
    let f = anchored_fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    for _ in 0..3 {
        f.client
            .send(EgressRequest::new(Method::Get, server.url("/")), None)
            .await
            .unwrap();
    }
    let conn = rusqlite::Connection::open(f.db_path()).unwrap();
    conn.execute_batch("DELETE FROM audit_log; DELETE FROM audit_tip;")
        .unwrap();
    let report = f.vault.audit_verify().await.unwrap();
    assert!(!report.intact, "V7: a wipe is not 'intact: 0 rows'");
    let problem = report.problem.unwrap();
    assert!(
        problem.starts_with("the log was wiped or rolled back: the anchor at "),
        "{problem}"
    );
    // The anchor stands at the last synced batch, the third intent (row 5): an outcome
    // row reaches the disk, and the anchor, with the next intent.
    assert!(problem.contains("records 5 rows"), "{problem}");
    assert!(problem.ends_with("the database has 0"), "{problem}");
}

#[tokio::test]
async fn a_rollback_to_an_older_copy_of_the_database_is_detected() {
    let f = anchored_fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let call = |f: &crate::support::Fixture| {
        let (client, url) = (f.client.clone(), server.url("/"));
        async move {
            client
                .send(EgressRequest::new(Method::Get, url), None)
                .await
                .unwrap();
        }
    };
    call(&f).await;
    // A consistent copy of the database file (rows and tip), as a backup would take.
    let snapshot = f.dir.path().join("snapshot.db");
    rusqlite::Connection::open(f.db_path())
        .unwrap()
        .execute("VACUUM INTO ?1", [snapshot.to_str().unwrap()])
        .unwrap();
    call(&f).await;
    call(&f).await;
    let db = f.db_path();
    // Put the copy back while nothing has the database open.
    let f = f
        .reopen_after(|| {
            std::fs::copy(&snapshot, &db).unwrap();
            for suffix in ["-wal", "-shm"] {
                let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
            }
        })
        .await
        .unwrap();
    let report = f.vault.audit_verify().await.unwrap();
    assert!(!report.intact, "{report:?}");
    let problem = report.problem.unwrap();
    assert!(
        problem.contains("wiped or rolled back") && problem.contains("records 5 rows"),
        "{problem}"
    );
    assert!(problem.ends_with("the database has 2"), "{problem}");

    // Calls made after the rollback re-grow the log past the anchored length; the anchor
    // is never moved onto the other history, so verify still sees the fork.
    for _ in 0..3 {
        call(&f).await;
    }
    let report = f.vault.audit_verify().await.unwrap();
    assert!(!report.intact, "{report:?}");
    assert!(
        report.problem.unwrap().contains("wiped or rolled back"),
        "the re-grown log does not hide the rollback"
    );
}

#[tokio::test]
async fn a_deleted_audit_key_with_rows_present_fails_open_and_nothing_recreates_it() {
    let f = anchored_fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    f.client
        .send(EgressRequest::new(Method::Get, server.url("/")), None)
        .await
        .unwrap();
    let db = f.db_path();
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("DELETE FROM sealed WHERE kind = 'internal'", [])
        .unwrap();
    let store = f.store.clone();
    let reopened = f.reopen().await;
    let Err(error) = reopened else {
        panic!("V7: the vault opened without its audit key")
    };
    assert!(
        matches!(error, VaultError::AuditKeyMissing { rows: 2 }),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        "the audit key is missing but the log holds 2 rows: restore the database from a backup; runwarden never recreates it"
    );
    // The failed open wrote nothing: the key is still absent.
    let key = store
        .sealed_get(SealedKind::Internal, "audit-chain")
        .await
        .unwrap();
    assert_eq!(key, None, "nothing recreated the audit key");
}

#[tokio::test]
async fn a_missing_anchor_file_fails_verify_until_the_current_tip_is_adopted() {
    let f = anchored_fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    f.client
        .send(EgressRequest::new(Method::Get, server.url("/")), None)
        .await
        .unwrap();
    std::fs::remove_file(f.anchor_path()).unwrap();
    let report = f.vault.audit_verify().await.unwrap();
    assert!(!report.intact);
    let problem = report.problem.unwrap();
    assert!(
        problem.contains("is missing, so a wipe or rollback of the log cannot be ruled out")
            && problem.contains("runwarden audit verify --adopt-anchor"),
        "{problem}"
    );
    // An edited row makes the chain fail, and then nothing is adopted.
    let conn = rusqlite::Connection::open(f.db_path()).unwrap();
    conn.execute("UPDATE audit_log SET status = 201 WHERE id = 2", [])
        .unwrap();
    let refused = f.vault.audit_adopt_anchor().await.unwrap_err();
    assert!(
        matches!(refused, VaultError::AnchorNotAdopted { .. }),
        "{refused}"
    );
    assert!(!f.anchor_path().exists());
    conn.execute("UPDATE audit_log SET status = 200 WHERE id = 2", [])
        .unwrap();
    let adopted = f.vault.audit_adopt_anchor().await.unwrap();
    assert_eq!(adopted.anchored_rows, Some(2));
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert!(matches!(
        f.vault.audit_adopt_anchor().await,
        Err(VaultError::AnchorExists { .. })
    ));
}

#[tokio::test]
async fn the_first_call_of_a_fresh_anchored_vault_creates_the_anchor_file() {
    let f = anchored_fixture().await;
    assert!(!f.anchor_path().exists());
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    f.client
        .send(EgressRequest::new(Method::Get, server.url("/")), None)
        .await
        .unwrap();
    assert!(f.anchor_path().exists());
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.anchored_rows, Some(1), "the intent, the synced row");
}

#[tokio::test]
async fn an_anchor_file_that_cannot_be_written_refuses_the_next_calls_until_it_can() {
    let f = anchored_fixture().await;
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let call = || {
        let (client, url) = (f.client.clone(), server.url("/"));
        async move {
            client
                .send(EgressRequest::new(Method::Get, url), None)
                .await
        }
    };
    // A directory where the anchor file belongs: every read and write of it fails.
    std::fs::create_dir(f.anchor_path()).unwrap();

    // The first intent is committed; its anchor write fails and is retried before the
    // next batch, which fails too: the completion is not written, the outcome stands.
    assert_eq!(call().await.unwrap().status, 200);
    assert_eq!(server.connection_count(), 1);
    // V7 (amended): the log may not run ahead of its witness, so the next call is refused
    // before anything is sent.
    let error = call().await.unwrap_err();
    assert!(
        matches!(error, EgressError::AuditUnavailable { .. }),
        "{error:?}"
    );
    assert!(error.to_string().contains("audit anchor"), "{error}");
    assert_eq!(server.connection_count(), 1, "nothing was sent");

    std::fs::remove_dir(f.anchor_path()).unwrap();
    assert_eq!(call().await.unwrap().status, 200);
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    // Rows 1 (anchored late) and 2 (the new intent); the outcome row 3 is not synced yet.
    assert_eq!(report.anchored_rows, Some(2), "{report:?}");
    assert_eq!(
        report.incomplete_calls, 1,
        "the first call's completion was refused"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_vaults_sharing_one_database_and_one_anchor_file_keep_both_in_step() {
    use runwarden_store_sqlite::SqliteStore;
    use runwarden_vault::{Algorithm, EgressClient, EgressConfig, EgressPolicy, MasterKey, Vault};

    let f = anchored_fixture().await;
    // As the binary's vault: a new store gets its anchor with its audit key, so whichever
    // process writes the first row, the other finds an anchor to advance.
    f.vault.anchor_new_store().await.unwrap();
    // A second handle on the same files, as a second process would open them.
    let other = Vault::open(
        Arc::new(SqliteStore::open(f.db_path()).unwrap()),
        MasterKey::from_file(&f.dir.path().join("master.key")).unwrap(),
        Algorithm::default(),
    )
    .await
    .unwrap()
    .with_anchor(f.anchor_path());
    let other = Arc::new(EgressClient::new(
        Arc::new(other),
        EgressConfig {
            policy: EgressPolicy::new(&["127.0.0.1"]).unwrap(),
            ..EgressConfig::default()
        },
    ));
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let calls: Vec<_> = (0..32)
        .map(|n| {
            let client = if n % 2 == 0 {
                f.client.clone()
            } else {
                other.clone()
            };
            let url = server.url("/");
            tokio::spawn(async move {
                client
                    .send(EgressRequest::new(Method::Get, url), None)
                    .await
            })
        })
        .collect();
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status, 200);
    }
    let last_intent = f
        .audit()
        .await
        .iter()
        .filter(|r| r.event.action == action::HTTP_CALL_STARTED)
        .map(|r| r.id)
        .max()
        .unwrap();
    for vault in [&f.vault, other.vault()] {
        let report = vault.audit_verify().await.unwrap();
        assert!(report.intact, "{report:?}");
        assert_eq!(report.rows_verified, 64);
        let anchored = report.anchored_rows.unwrap();
        assert!(
            (last_intent..=64).contains(&anchored),
            "the anchor reaches the last synced batch: {anchored}, last intent {last_intent}"
        );
        assert_eq!(report.incomplete_calls, 0);
    }
}

/// Holds the anchor file's lock, as a writer in another process would, until dropped:
/// every anchor write of the vault waits for it.
fn hold_anchor(f: &crate::support::Fixture) -> std::fs::File {
    let file = std::fs::File::open(f.anchor_path()).unwrap();
    file.lock().unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_goes_out_while_its_intent_is_being_anchored() {
    let f = anchored_fixture().await;
    f.vault.anchor_new_store().await.unwrap();
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let held = hold_anchor(&f);
    let call = tokio::spawn({
        let (client, url) = (f.client.clone(), server.url("/"));
        async move {
            client
                .send(EgressRequest::new(Method::Get, url), None)
                .await
        }
    });
    // The intent is committed (synced) and its anchor write waits for the lock; the
    // request leaves meanwhile.
    server.next_request(WAIT).await;
    assert!(!call.is_finished(), "the call waits for its anchor");
    drop(held);
    assert_eq!(call.await.unwrap().unwrap().status, 200);
    // Once the call returns, the anchor records its intent (row 1); the outcome row 2 is
    // not synced, so it is not anchored yet.
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.anchored_rows, Some(1), "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_dropped_before_its_intent_was_anchored_leaves_the_anchor_to_the_next_batch() {
    let f = anchored_fixture().await;
    f.vault.anchor_new_store().await.unwrap();
    let first = Arc::new(AtomicBool::new(true));
    let mut server = TestServer::start(move |_| {
        if first.swap(false, Ordering::SeqCst) {
            HttpReply::Stall
        } else {
            HttpReply::text(200, "ok")
        }
    })
    .await;
    let url = server.url("/");
    let call = || {
        let (client, url) = (f.client.clone(), url.clone());
        async move {
            client
                .send(EgressRequest::new(Method::Get, url), None)
                .await
        }
    };
    let held = hold_anchor(&f);
    let dropped = tokio::spawn(call());
    server.next_request(WAIT).await;
    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    drop(held);

    assert_eq!(call().await.unwrap().status, 200);
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    // Row 1 is the dropped call's intent (it has no outcome); row 2 the second intent,
    // anchored with everything before it; row 3 its unsynced outcome.
    assert_eq!(report.anchored_rows, Some(2), "{report:?}");
    assert_eq!(report.incomplete_calls, 1, "{report:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_made_one_after_another_move_the_anchor_without_reading_the_log_back() {
    let f = anchored_fixture().await;
    f.vault.anchor_new_store().await.unwrap();
    let server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let reads = f.store.audit_reads.load(Ordering::SeqCst);
    for _ in 0..5 {
        let request = EgressRequest::new(Method::Get, server.url("/"));
        assert_eq!(f.client.send(request, None).await.unwrap().status, 200);
    }
    // Each intent follows the outcome row before it, which the anchor does not record;
    // this process wrote both, so it knows the rows link up without asking the log.
    assert_eq!(f.store.audit_reads.load(Ordering::SeqCst), reads);
    let report = f.vault.audit_verify().await.unwrap();
    assert!(report.intact, "{report:?}");
    // Rows 1 to 10: five intents and their outcomes; the last intent is row 9.
    assert_eq!(report.anchored_rows, Some(9), "{report:?}");
}
