//! The audit rows by action, for metrics, without counting the log (migration
//! `0023_audit_counts`). `audit_counts` holds the rows up to `audit_counted.through_id`;
//! a fold adds the rows after it, a bounded number per transaction, and a read adds the
//! few rows not folded yet. Appends do nothing for the counts.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::failure::Failure;

/// The counts kept and the rows after the last one folded, in one statement (one
/// snapshot), ordered by action.
const READ: &str = "SELECT action, SUM(n) FROM (
         SELECT action, n FROM audit_counts
         UNION ALL
         SELECT action, COUNT(*) AS n FROM audit_log
         WHERE id > (SELECT through_id FROM audit_counted WHERE id = 1)
         GROUP BY action
     ) GROUP BY action ORDER BY action";

/// The audit rows by action: those folded into the counts and those appended since.
pub(crate) fn read(conn: &Connection) -> Result<Vec<(String, u64)>, Failure> {
    let counts = conn
        .prepare_cached(READ)?
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?.max(0) as u64,
            ))
        })?
        .collect::<Result<Vec<_>, _>>()?;
    Ok(counts)
}

/// Adds up to `most` rows after the last one folded to the counts, in one transaction, and
/// answers how many it added: fewer than `most` when it reached the newest row. A log that
/// no longer holds the last row folded, with its hash, is counted again from its start.
pub(crate) fn fold(conn: &mut Connection, most: u64) -> Result<u64, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let (mut through, hash): (i64, Option<Vec<u8>>) = tx
        .prepare_cached("SELECT through_id, through_hash FROM audit_counted WHERE id = 1")?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    if let Some(hash) = hash {
        let held: Option<Vec<u8>> = tx
            .prepare_cached("SELECT hash FROM audit_log WHERE id = ?1")?
            .query_row([through], |row| row.get(0))
            .optional()?;
        if held.as_ref() != Some(&hash) {
            tx.execute_batch(
                "UPDATE audit_counts SET n = 0;
                 UPDATE audit_counted SET through_id = -9223372036854775808, through_hash = NULL",
            )?;
            through = i64::MIN;
        }
    }
    let offset = i64::try_from(most.max(1) - 1).unwrap_or(i64::MAX);
    let last = tx
        .prepare_cached(
            "SELECT id, hash FROM audit_log WHERE id > ?1 ORDER BY id LIMIT 1 OFFSET ?2",
        )?
        .query_row(params![through, offset], |row| {
            Ok((row.get::<_, i64>(0)?, row.get::<_, Vec<u8>>(1)?))
        })
        .optional()?;
    let last = match last {
        Some(last) => Some(last),
        None => tx
            .prepare_cached(
                "SELECT id, hash FROM audit_log WHERE id > ?1 ORDER BY id DESC LIMIT 1",
            )?
            .query_row([through], |row| Ok((row.get(0)?, row.get(1)?)))
            .optional()?,
    };
    let Some((last_id, last_hash)) = last else {
        // Nothing after the last row folded (a reset is kept).
        tx.commit()?;
        return Ok(0);
    };
    let mut folded = 0;
    {
        let mut add = tx.prepare_cached(
            "INSERT INTO audit_counts (action, n) VALUES (?1, ?2)
             ON CONFLICT (action) DO UPDATE SET n = n + excluded.n",
        )?;
        let mut count = tx.prepare_cached(
            "SELECT action, COUNT(*) FROM audit_log WHERE id > ?1 AND id <= ?2 GROUP BY action",
        )?;
        let rows = count
            .query_map([through, last_id], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        for (action, n) in rows {
            add.execute(params![action, n])?;
            folded += n.max(0) as u64;
        }
    }
    tx.prepare_cached("UPDATE audit_counted SET through_id = ?1, through_hash = ?2 WHERE id = 1")?
        .execute(params![last_id, last_hash])?;
    tx.commit()?;
    Ok(folded)
}
