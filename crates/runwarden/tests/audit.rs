//! `runwarden audit list|verify`: the hash chain catches edits and truncation (V7).

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
