//! `runwarden audit list|verify`: the hash chain catches edits and truncation, the anchor
//! file catches a wipe or a rollback, and incomplete calls are visible (V7 amended).

use crate::support::Sandbox;

/// An initialised sandbox with three refused calls in its audit log (rows 1, 2, 3).
fn sandbox_with_three_rows() -> Sandbox {
    let sandbox = Sandbox::initialised();
    for target in ["http://10.0.0.1/", "http://10.0.0.2/", "http://10.0.0.3/"] {
        sandbox.run(&["egress", "test", target]).fails();
    }
    sandbox
}

fn tamper(sandbox: &Sandbox, sql: &str) {
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    let changed = db.execute(sql, []).unwrap();
    assert_eq!(changed, 1, "{sql}");
}

#[test]
fn audit_list_shows_newest_first_and_filters_by_action_and_limit() {
    let sandbox = sandbox_with_three_rows();
    let rows = sandbox.run(&["--json", "audit", "list"]).ok().json();
    let ids: Vec<i64> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [3, 2, 1]);

    let one = sandbox
        .run(&["--json", "audit", "list", "--limit", "1"])
        .ok()
        .json();
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(one[0]["host"], "10.0.0.3");

    let none = sandbox
        .run(&["--json", "audit", "list", "--action", "http_call"])
        .ok()
        .json();
    assert_eq!(none, serde_json::json!([]));
    sandbox
        .run(&["audit", "list", "--action", "http_call"])
        .ok()
        .says("no audit rows match");
}

#[test]
fn audit_verify_passes_on_an_untouched_log() {
    let sandbox = sandbox_with_three_rows();
    sandbox
        .run(&["audit", "verify"])
        .ok()
        .says("intact: 3 rows");
    let report = sandbox.run(&["--json", "audit", "verify"]).ok().json();
    assert_eq!(report["intact"], true);
    assert_eq!(report["rows_verified"], 3);
}

#[test]
fn audit_verify_passes_on_an_empty_log() {
    let sandbox = Sandbox::initialised();
    sandbox
        .run(&["audit", "verify"])
        .ok()
        .says("intact: 0 rows");
}

#[test]
fn audit_verify_fails_naming_a_row_whose_status_was_edited() {
    let sandbox = sandbox_with_three_rows();
    tamper(&sandbox, "UPDATE audit_log SET status = 200 WHERE id = 2");
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("row 2")
        .says("altered");
    let report = sandbox.run(&["--json", "audit", "verify"]).fails().json();
    assert_eq!(report["intact"], false);
    assert_eq!(report["first_bad_row"], 2);
}

#[test]
fn audit_verify_fails_when_the_last_row_was_deleted() {
    let sandbox = sandbox_with_three_rows();
    tamper(&sandbox, "DELETE FROM audit_log WHERE id = 3");
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("row 3")
        .says("truncated");
    let report = sandbox.run(&["--json", "audit", "verify"]).fails().json();
    assert_eq!(report["first_bad_row"], 3);
}

#[test]
fn audit_verify_fails_when_a_middle_row_was_deleted() {
    let sandbox = sandbox_with_three_rows();
    tamper(&sandbox, "DELETE FROM audit_log WHERE id = 2");
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("row 2 is missing");
    // The first row that no longer links is the one after the gap.
    let report = sandbox.run(&["--json", "audit", "verify"]).fails().json();
    assert_eq!(report["intact"], false);
    assert_eq!(report["first_bad_row"], 3);
}

fn anchor_file(sandbox: &Sandbox) -> std::path::PathBuf {
    sandbox.data_dir().join("audit.anchor")
}

#[test]
fn init_creates_a_private_anchor_file_and_a_fresh_log_verifies_against_it() {
    use std::os::unix::fs::PermissionsExt;
    let sandbox = Sandbox::empty();
    sandbox.run(&["init"]).ok().says("created audit anchor");
    let mode = std::fs::metadata(anchor_file(&sandbox))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let report = sandbox.run(&["--json", "audit", "verify"]).ok().json();
    assert_eq!(report["intact"], true);
    assert_eq!(report["anchored_rows"], 0);
    assert_eq!(report["incomplete_calls"], 0);
}

#[test]
fn a_wipe_of_every_row_and_the_tip_fails_verify_through_the_anchor_file() {
    let sandbox = sandbox_with_three_rows();
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    db.execute_batch("DELETE FROM audit_log; DELETE FROM audit_tip;")
        .unwrap();
    // V7 (amended): no longer "intact: 0 rows".
    let out = sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("the log was wiped or rolled back: the anchor at ")
        .says("records 3 rows ending in ")
        .says("the database has 0");
    assert!(!out.all().contains("intact"), "{out:#?}");
}

#[test]
fn restoring_an_older_copy_of_the_database_fails_verify() {
    let sandbox = sandbox_with_three_rows();
    let copy = sandbox.path().join("older.db");
    std::fs::copy(sandbox.database(), &copy).unwrap();
    sandbox.run(&["egress", "test", "http://10.0.0.4/"]).fails();
    sandbox
        .run(&["audit", "verify"])
        .ok()
        .says("intact: 4 rows");
    std::fs::copy(&copy, sandbox.database()).unwrap();
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("wiped or rolled back")
        .says("records 4 rows")
        .says("the database has 3");
}

#[test]
fn a_missing_anchor_file_fails_verify_until_adopt_anchor_adopts_a_chain_that_verifies() {
    let sandbox = sandbox_with_three_rows();
    std::fs::remove_file(anchor_file(&sandbox)).unwrap();
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("is missing, so a wipe or rollback of the log cannot be ruled out")
        .says("runwarden audit verify --adopt-anchor");
    // Nothing but the explicit flag recreates it.
    assert!(!anchor_file(&sandbox).exists());

    // A chain that does not verify is never adopted.
    tamper(&sandbox, "UPDATE audit_log SET status = 200 WHERE id = 2");
    sandbox
        .run(&["audit", "verify", "--adopt-anchor"])
        .fails()
        .says("does not verify, so its tip was not adopted");
    assert!(!anchor_file(&sandbox).exists());
    tamper(&sandbox, "UPDATE audit_log SET status = 0 WHERE id = 2");

    sandbox
        .run(&["audit", "verify", "--adopt-anchor"])
        .ok()
        .says("intact: 3 rows")
        .says("anchor file created at row 3");
    sandbox
        .run(&["audit", "verify"])
        .ok()
        .says("anchor file at row 3");
}

#[test]
fn a_deleted_audit_key_fails_every_command_and_nothing_recreates_it() {
    let sandbox = sandbox_with_three_rows();
    tamper(
        &sandbox,
        "DELETE FROM sealed WHERE kind = 'internal' AND name = 'audit-chain'",
    );
    for args in [
        &["audit", "verify"][..],
        &["audit", "verify", "--adopt-anchor"],
        &["audit", "list"],
        &["egress", "test", "http://10.0.0.5/"],
    ] {
        sandbox
            .run(args)
            .fails()
            .says("the audit key is missing but the log holds 3 rows")
            .says("runwarden never recreates it");
    }
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    let keys: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM sealed WHERE kind = 'internal' AND name = 'audit-chain'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(keys, 0, "V7: no command recreated the audit key");
}

#[tokio::test]
async fn a_call_killed_mid_flight_leaves_its_intent_listed_as_incomplete_and_counted_by_verify() {
    use runwarden_testkit::{HttpReply, TestServer};
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut server = TestServer::start(|_| HttpReply::Stall).await;
    let mut call = crate::support::Live::start(&sandbox, &["egress", "test", &server.url("/slow")]);
    // The request reached the server: the intent was committed before it left.
    server
        .next_request(std::time::Duration::from_secs(10))
        .await;
    call.signal("KILL");
    let killed = call
        .ended(std::time::Instant::now(), std::time::Duration::from_secs(5))
        .await;
    assert_eq!(killed.code, None, "killed by a signal");

    let sandbox = std::sync::Arc::new(sandbox);
    let rows = crate::support::runwarden(&sandbox, &["--json", "audit", "list"])
        .await
        .ok()
        .json();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 1, "{rows:#?}");
    assert_eq!(rows[0]["action"], "http_call_started");
    assert_eq!(rows[0]["path"], "/slow");
    assert_eq!(rows[0]["incomplete"], true);
    assert_eq!(
        rows[0]["outcome"],
        "no outcome recorded: the process stopped or is still waiting"
    );
    crate::support::runwarden(&sandbox, &["audit", "list"])
        .await
        .ok()
        .says("INCOMPLETE: no outcome recorded");
    let report = crate::support::runwarden(&sandbox, &["--json", "audit", "verify"])
        .await
        .ok()
        .json();
    assert_eq!(report["intact"], true, "{report}");
    assert_eq!(report["incomplete_calls"], 1);
    crate::support::runwarden(&sandbox, &["audit", "verify"])
        .await
        .ok()
        .says("1 call has no recorded outcome");
}

#[test]
fn a_completed_call_lists_its_intent_as_complete_and_its_completion_naming_it() {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let server = crate::support::TestServer::start();
    sandbox.run(&["egress", "test", &server.url("/ok")]).ok();
    let rows = sandbox.run(&["--json", "audit", "list"]).ok().json();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    // Newest first: the completion, then the intent it names.
    assert_eq!(rows[0]["action"], "http_call");
    assert_eq!(rows[0]["intent_id"], rows[1]["id"]);
    assert_eq!(rows[1]["action"], "http_call_started");
    assert_eq!(rows[1]["incomplete"], false);
    assert!(rows[1].get("outcome").is_none());
}

/// Deletes every audit row and the tip, as an administrator covering tracks would.
fn wipe_rows(sandbox: &Sandbox) {
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    db.execute_batch("DELETE FROM audit_log; DELETE FROM audit_tip;")
        .unwrap();
}

#[test]
fn a_wipe_plus_the_anchor_files_deletion_fails_verify_naming_the_missing_file() {
    let sandbox = sandbox_with_three_rows();
    wipe_rows(&sandbox);
    std::fs::remove_file(anchor_file(&sandbox)).unwrap();
    // Once "intact: 0 rows". The audit key predates this process, so its anchor existed.
    let out = sandbox
        .run(&["audit", "verify"])
        .fails()
        .says(&format!(
            "the audit anchor file {} is missing",
            anchor_file(&sandbox).display()
        ))
        .says("restore it from a backup");
    assert!(!out.all().contains("intact"), "{out:#?}");
    // No write recreates it behind verify's back.
    sandbox.run(&["egress", "test", "http://10.0.0.9/"]).fails();
    assert!(!anchor_file(&sandbox).exists());
    sandbox.run(&["audit", "verify"]).fails().says("is missing");
}

#[test]
fn a_wipe_plus_the_audit_keys_deletion_fails_naming_the_lost_key() {
    // The key alone, the anchor kept.
    let sandbox = sandbox_with_three_rows();
    wipe_rows(&sandbox);
    tamper(
        &sandbox,
        "DELETE FROM sealed WHERE kind = 'internal' AND name = 'audit-chain'",
    );
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says(
            "the audit key is missing from the database, although the database recorded making one",
        )
        .says("Restore the database from a backup");

    // Every internal record and the anchor file too: the stored secret still says there
    // was an installation, and with it a key.
    let sandbox = sandbox_with_three_rows();
    sandbox.put("model-key", "sk-test-value").ok();
    wipe_rows(&sandbox);
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    db.execute("DELETE FROM sealed WHERE kind = 'internal'", [])
        .unwrap();
    std::fs::remove_file(anchor_file(&sandbox)).unwrap();
    let out = sandbox.run(&["audit", "verify"]).fails().says(
        "the audit key is missing from the database, although the database holds 1 stored secret",
    );
    assert!(!out.all().contains("intact"), "{out:#?}");
}

/// The anchor file's slot holding the higher sequence (0 or 1).
fn newest_slot(anchor: &[u8]) -> usize {
    let sequence = |slot: usize| {
        u64::from_be_bytes(anchor[slot * 128 + 8..slot * 128 + 16].try_into().unwrap())
    };
    usize::from(sequence(1) > sequence(0))
}

#[test]
fn a_corrupted_newest_slot_with_a_one_batch_rollback_fails_verify_naming_the_damage() {
    let sandbox = sandbox_with_three_rows();
    let older = sandbox.path().join("older.db");
    std::fs::copy(sandbox.database(), &older).unwrap();
    sandbox.run(&["egress", "test", "http://10.0.0.4/"]).fails();
    // Roll the rows and the tip back one batch, and damage the slot that records it: the
    // older slot would vouch for the rolled-back log.
    std::fs::copy(&older, sandbox.database()).unwrap();
    let mut anchor = std::fs::read(anchor_file(&sandbox)).unwrap();
    let slot = newest_slot(&anchor);
    anchor[slot * 128 + 30] ^= 0xff;
    std::fs::write(anchor_file(&sandbox), &anchor).unwrap();
    let out = sandbox
        .run(&["audit", "verify"])
        .fails()
        .says(&format!(
            "the audit anchor file {} is damaged (slot {slot} does not verify)",
            anchor_file(&sandbox).display()
        ))
        .says("keep the file as evidence");
    assert!(!out.all().contains("intact"), "{out:#?}");
}

#[test]
fn with_an_external_witness_a_wipe_of_rows_anchor_and_key_is_detected() {
    let sandbox = Sandbox::empty();
    let elsewhere = sandbox.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let witness = elsewhere.join("audit.witness");
    std::fs::write(
        sandbox.config(),
        format!("[audit]\nwitness = \"{}\"\n", witness.display()),
    )
    .unwrap();
    sandbox.run(&["init"]).ok();
    for target in ["http://10.0.0.1/", "http://10.0.0.2/", "http://10.0.0.3/"] {
        sandbox.run(&["egress", "test", target]).fails();
    }
    sandbox
        .run(&["audit", "verify", "--witness"])
        .ok()
        .says("intact: 3 rows")
        .says("external witness at row 3");

    // Everything local: rows, tip, every internal record (the key), the anchor file.
    wipe_rows(&sandbox);
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    db.execute("DELETE FROM sealed WHERE kind = 'internal'", [])
        .unwrap();
    std::fs::remove_file(anchor_file(&sandbox)).unwrap();
    // Locally nothing is left to tell, and the vault would make a new key and anchor: the
    // witness refuses that anchor, so the first command says what happened...
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("the external witness contradicts this audit log")
        .says("records 3 rows")
        .says("the database has 0");
    // ... and verify with the witness says it every time after.
    for _ in 0..2 {
        let out = sandbox
            .run(&["audit", "verify", "--witness"])
            .fails()
            .says(&format!(
                "the log was wiped or rolled back: the external witness {}",
                witness.display()
            ))
            .says("records 3 rows")
            .says("the database has 0")
            .says("made with another audit key");
        assert!(!out.all().contains("intact"), "{out:#?}");
    }
}

#[test]
fn with_an_external_witness_a_rollback_of_rows_and_anchor_together_is_detected() {
    let sandbox = Sandbox::empty();
    let witness = sandbox.path().join("audit.witness");
    std::fs::write(
        sandbox.config(),
        format!("[audit]\nwitness = \"{}\"\n", witness.display()),
    )
    .unwrap();
    sandbox.run(&["init"]).ok();
    sandbox.run(&["egress", "test", "http://10.0.0.1/"]).fails();
    // An older copy of the database and of the anchor file, restored together.
    let (db, anchor) = (
        sandbox.path().join("older.db"),
        sandbox.path().join("older.anchor"),
    );
    std::fs::copy(sandbox.database(), &db).unwrap();
    std::fs::copy(anchor_file(&sandbox), &anchor).unwrap();
    sandbox.run(&["egress", "test", "http://10.0.0.2/"]).fails();
    std::fs::copy(&db, sandbox.database()).unwrap();
    std::fs::copy(&anchor, anchor_file(&sandbox)).unwrap();
    sandbox.run(&["audit", "verify"]).ok().says("intact: 1 row");
    sandbox
        .run(&["audit", "verify", "--witness"])
        .fails()
        .says("records 2 rows")
        .says("the database has 1");
}
