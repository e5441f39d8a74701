//! A write is done only when its commit is confirmed. An autocommit statement commits when
//! it is stepped to its end, and SQLite reports a failed commit there, or at the statement's
//! reset; rusqlite's `query_row` reads the first row and drops the statement, so that error
//! is never seen. Writes that return rows go through [`returning_one`], which steps to the
//! end; a commit whose outcome is unknown is re-read before anything acts on it.

use rusqlite::{Connection, OptionalExtension, Params, Row, Statement};

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

/// After a claim's commit reported an error: whether the claim landed anyway (SQLite may
/// report an I/O error for a commit that reached the WAL). Read only on a connection back
/// in autocommit mode, so the answer is what is stored, never this connection's own
/// rolled-back changes; any doubt answers false, and the run's lease then runs out.
pub(crate) fn claim_landed(conn: &Connection, run: &Run) -> Result<bool, Failure> {
    if !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
        if !conn.is_autocommit() {
            return Ok(false);
        }
    }
    let held: Option<(String, Option<String>, i64)> = conn
        .query_row(
            "SELECT status, claimed_by, claim_epoch FROM runs WHERE id = ?1",
            [&run.id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .optional()?;
    Ok(held.is_some_and(|(status, owner, epoch)| {
        status == "running" && owner == run.claimed_by && epoch == run.claim_epoch
    }))
}
