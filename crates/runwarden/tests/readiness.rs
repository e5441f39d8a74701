//! `/readyz` is a real write: a ready answer leaves a committed change in the database
//! file, and a store that cannot take a write (here: another process holds its write
//! lock) answers 503 `not_ready` naming the kind of fault, and ready again once it can.

use crate::api::{Api, Serve};
use crate::support::Sandbox;

/// The database header's `user_version`, read by another process.
fn user_version(sandbox: &Sandbox) -> i64 {
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    db.query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_writes_and_fails_naming_the_fault_while_writes_cannot_land() {
    let sandbox = Sandbox::initialised();
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);

    let before = user_version(&sandbox);
    assert_eq!(api.call("GET", "/readyz", None, None).await.0, 200);
    let after = user_version(&sandbox);
    assert!(
        after > before,
        "the probe committed a write: {before} -> {after}"
    );

    let holder = rusqlite::Connection::open(sandbox.database()).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let (status, body) = api.call("GET", "/readyz", None, None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "not_ready", "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("busy"),
        "the answer names the fault: {body}"
    );

    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(api.call("GET", "/readyz", None, None).await.0, 200);
}
