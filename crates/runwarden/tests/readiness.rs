//! `/readyz` is a real write: a ready answer leaves a committed change in the database
//! file, and a store that cannot take a write (here: another process holds its write
//! lock) answers 503 `not_ready` naming the kind of fault, and ready again once it can.

use crate::support::Sandbox;
use crate::support::serve::{Api, Serve};

/// The database header's `user_version`, read by another process.
fn user_version(sandbox: &Sandbox) -> i64 {
    let db = rusqlite::Connection::open(sandbox.database()).unwrap();
    db.query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_writes_and_fails_naming_the_fault_while_writes_cannot_land() {
    let sandbox = Sandbox::initialised();
    sandbox.append_config("[metrics]\nrequire_token = false\n");
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

    // Probed again in the same state: one change, counted once.
    assert_eq!(api.call("GET", "/readyz", None, None).await.0, 503);

    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(api.call("GET", "/readyz", None, None).await.0, 200);
    let metrics = reqwest::get(format!("{}/metrics", serve.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for (state, times) in [("busy", 1), ("ready", 1)] {
        let series = format!("runwarden_store_state_changes_total{{kind=\"{state}\"}} {times}");
        assert!(metrics.contains(&series), "{series} in:\n{metrics}");
    }
}

/// The API never answers a damaged database as an authentication failure: a live token
/// whose index entry was damaged (the bytes of its hash in the index page changed, the
/// table intact) is a 503 `store_unavailable`, not a 401 "not a live token".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_token_index_is_store_unavailable_never_unauthorized() {
    let sandbox = std::sync::Arc::new(Sandbox::initialised());
    let operator = crate::support::serve::token(&sandbox, "operator").await;
    damage_the_token_index(&sandbox);
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);
    let (status, body) = api.call("GET", "/v1/runs", Some(&operator), None).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
}

/// Changes one byte of the only token's hash inside the page of the index on
/// `api_tokens.hash`, leaving the table's copy as it was.
fn damage_the_token_index(sandbox: &Sandbox) {
    let (pages, page_size, hash) = {
        let db = rusqlite::Connection::open(sandbox.database()).unwrap();
        db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .unwrap();
        let mut pages = db
            .prepare("SELECT rootpage FROM sqlite_master WHERE type = 'index' AND tbl_name = 'api_tokens'")
            .unwrap();
        let pages: Vec<i64> = pages
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let size: i64 = db
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .unwrap();
        let hash: Vec<u8> = db
            .query_row("SELECT hash FROM api_tokens", [], |row| row.get(0))
            .unwrap();
        (pages, size as usize, hash)
    };
    let mut bytes = std::fs::read(sandbox.database()).unwrap();
    let at = pages
        .iter()
        .find_map(|page| {
            let start = (*page as usize - 1) * page_size;
            bytes[start..start + page_size]
                .windows(hash.len())
                .position(|w| w == hash.as_slice())
                .map(|at| start + at)
        })
        .expect("an index page holds the token's hash");
    bytes[at + 5] ^= 0xFF;
    std::fs::write(sandbox.database(), bytes).unwrap();
}
