//! A write is done only when its commit is confirmed. An autocommit statement commits when
//! it is stepped to its end, and SQLite reports a failed commit there, or at the statement's
//! reset; rusqlite's `query_row` reads the first row and drops the statement, so that error
//! is never seen. Writes that return rows go through [`returning_one`], which steps to the
//! end; a commit whose outcome is unknown is re-read before anything acts on it.

use rusqlite::{Connection, OptionalExtension, Params, Row, Statement};

use crate::cached::Cached;
use crate::failure::Failure;
use runwarden_runtime::store::Run;

/// Runs a data-changing statement that returns at most one row, stepped to its end, so an
/// error at the end (a failed autocommit) is an error and never a row.
pub(crate) fn returning_one<T, P: Params>(
    stmt: &mut Statement<'_>,
    params: P,
    read: impl FnOnce(&Row<'_>) -> rusqlite::Result<T>,
) -> Result<Option<T>, Failure> {
    let mut rows = stmt.query(params)?;
    let first = match rows.next()? {
        Some(row) => Some(read(row)?),
        None => return Ok(None), // stepped to its end already
    };
    // The step after the last row ends the statement (and an autocommit transaction):
    // its error is the commit's.
    while rows.next()?.is_some() {}
    Ok(first)
}

/// A write that ended in `result`: when it failed with an unknown outcome (SQLite may
/// report an I/O error for a commit that reached the WAL), `reread` says what is stored,
/// and the runtime's rule (shared with PostgreSQL) decides. Read only on a connection
/// back in autocommit mode, so the answer is what is stored, never this connection's own
/// rolled-back changes; any doubt keeps the error.
pub(crate) fn or_reread<T>(
    conn: &Connection,
    operation: &str,
    result: Result<T, Failure>,
    reread: impl FnOnce(&Connection) -> Result<Option<T>, Failure>,
) -> Result<T, Failure> {
    let error = match result {
        Ok(answer) => return Ok(answer),
        Err(failure) => failure.into_store_error(operation),
    };
    if !runwarden_runtime::outcome_unknown(&error) {
        return Err(error.into());
    }
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
        if !conn.is_autocommit() {
            return Err(error.into());
        }
    }
    runwarden_runtime::after_reread(error, operation, reread(conn)).map_err(Failure::from)
}

/// Whether `run`'s claim is what the row holds.
pub(crate) fn claim_landed(conn: &Connection, run: &Run) -> Result<Option<Run>, Failure> {
    let held: Option<(String, Option<String>, i64)> = conn
        .query_row_cached(
            "SELECT status, claimed_by, claim_epoch FROM runs WHERE id = ?1",
            [&run.id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()?;
    let landed = held.is_some_and(|(status, owner, epoch)| {
        status == "running" && owner == run.claimed_by && epoch == run.claim_epoch
    });
    Ok(landed.then(|| run.clone()))
}
