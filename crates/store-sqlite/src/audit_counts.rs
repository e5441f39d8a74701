//! The audit rows by action, for metrics, without counting the log (migration
//! `0023_audit_counts`). `audit_counts` holds the rows up to `audit_counted.through_id`;
//! a fold adds the rows after it, a bounded number per transaction, and a read adds the
//! few rows not folded yet. Appends do nothing for the counts.

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::failure::Failure;

/// The counts kept and the rows after the last one folded, in one statement (one
/// snapshot), ordered by action. `NOT INDEXED`: grouped by action, SQLite otherwise walks
/// the whole action index to skip the sort, reading every row of the log.
const READ: &str = "SELECT action, SUM(n) FROM (
         SELECT action, n FROM audit_counts
         UNION ALL
         SELECT action, COUNT(*) AS n FROM audit_log NOT INDEXED
         WHERE id > (SELECT through_id FROM audit_counted WHERE id = 1)
         GROUP BY action
     ) GROUP BY action ORDER BY action";

/// The last id of the next fold: `?2` ids on from the first row after id `?1`, or the
/// newest row when it comes sooner; its hash, to keep. Two seeks, nothing walked (ids are
/// dense but for rows removed by hand, so a fold may take fewer rows than it may).
const FOLD_END: &str = "SELECT id, hash FROM audit_log
     WHERE id <= (SELECT MIN(id) FROM audit_log WHERE id > ?1) + ?2 - 1
     ORDER BY id DESC LIMIT 1";

/// The first action in the action index, and the next one after `?1`.
const FIRST_ACTION: &str = "SELECT MIN(action) FROM audit_log";
const NEXT_ACTION: &str = "SELECT MIN(action) FROM audit_log WHERE action > ?1";

/// The rows with action `?1` after id `?2` up to id `?3`: entries of the action index
/// alone, about a twentieth of the bytes of the rows themselves.
const COUNT_ACTION: &str = "SELECT COUNT(*) FROM audit_log INDEXED BY audit_log_action
     WHERE action = ?1 AND id > ?2 AND id <= ?3";

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

/// Adds up to `most` rows after the last one folded to the counts, in one transaction,
/// and answers how many it added: 0 once no row is left after the last one folded. A log
/// that no longer holds the last row folded, with its hash, is counted again from its
/// start. It holds the write lock: about 2 ms for 20,000 rows.
pub(crate) fn fold(conn: &mut Connection, most: u64) -> Result<u64, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let through = folded_through(&tx)?;
    let most = i64::try_from(most.max(1)).unwrap_or(i64::MAX);
    let end: Option<(i64, Vec<u8>)> = tx
        .prepare_cached(FOLD_END)?
        .query_row(params![through, most], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let Some((end, end_hash)) = end.filter(|(end, _)| *end > through) else {
        // Nothing after the last row folded (a reset is kept).
        tx.commit()?;
        return Ok(0);
    };
    let mut folded = 0;
    {
        let mut first = tx.prepare_cached(FIRST_ACTION)?;
        let mut next = tx.prepare_cached(NEXT_ACTION)?;
        let mut count = tx.prepare_cached(COUNT_ACTION)?;
        let mut add = tx.prepare_cached(
            "INSERT INTO audit_counts (action, n) VALUES (?1, ?2)
             ON CONFLICT (action) DO UPDATE SET n = n + excluded.n",
        )?;
        let mut action: Option<String> = first.query_row([], |row| row.get(0))?;
        while let Some(this) = action {
            let n: i64 = count.query_row(params![this, through, end], |row| row.get(0))?;
            if n > 0 {
                add.execute(params![this, n])?;
                folded += n as u64;
            }
            action = next.query_row([this], |row| row.get(0))?;
        }
    }
    tx.prepare_cached("UPDATE audit_counted SET through_id = ?1, through_hash = ?2 WHERE id = 1")?
        .execute(params![end, end_hash])?;
    tx.commit()?;
    Ok(folded)
}

/// The id of the last row folded, or `i64::MIN` once the counts are reset because the log
/// no longer holds that row with its hash.
fn folded_through(tx: &Connection) -> Result<i64, Failure> {
    let (through, hash): (i64, Option<Vec<u8>>) = tx
        .prepare_cached("SELECT through_id, through_hash FROM audit_counted WHERE id = 1")?
        .query_row([], |row| Ok((row.get(0)?, row.get(1)?)))?;
    let Some(hash) = hash else {
        return Ok(through);
    };
    let held: Option<Vec<u8>> = tx
        .prepare_cached("SELECT hash FROM audit_log WHERE id = ?1")?
        .query_row([through], |row| row.get(0))
        .optional()?;
    if held.as_ref() == Some(&hash) {
        return Ok(through);
    }
    tx.execute_batch(
        "UPDATE audit_counts SET n = 0;
         UPDATE audit_counted SET through_id = -9223372036854775808, through_hash = NULL",
    )?;
    Ok(i64::MIN)
}

#[cfg(test)]
mod tests {
    use super::{COUNT_ACTION, FIRST_ACTION, FOLD_END, NEXT_ACTION, READ};
    use crate::plan::query_plan;

    #[test]
    fn each_count_reads_a_range_of_ids_not_the_whole_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.db");
        drop(crate::SqliteStore::open(&path).unwrap());
        let conn = rusqlite::Connection::open(&path).unwrap();
        let plans = [
            (READ, query_plan(&conn, READ, [])),
            (FOLD_END, query_plan(&conn, FOLD_END, [1, 2])),
            (NEXT_ACTION, query_plan(&conn, NEXT_ACTION, ["a"])),
            (FIRST_ACTION, query_plan(&conn, FIRST_ACTION, [])),
            (
                COUNT_ACTION,
                query_plan(&conn, COUNT_ACTION, rusqlite::params!["a", 1, 2]),
            ),
        ];
        for (sql, plan) in &plans {
            assert!(
                !plan.contains("SCAN audit_log"),
                "{sql}\nreads the log as {plan}"
            );
        }
        let reads = |i: usize, how: &str| {
            let (sql, plan) = &plans[i];
            assert!(
                plan.contains(how),
                "{sql}\nreads the log as {plan}, not {how}"
            );
        };
        reads(0, "SEARCH audit_log USING INTEGER PRIMARY KEY (rowid>?)");
        reads(1, "SEARCH audit_log USING INTEGER PRIMARY KEY (rowid<?)");
        reads(
            2,
            "SEARCH audit_log USING COVERING INDEX audit_log_action (action>?)",
        );
        reads(
            4,
            "SEARCH audit_log USING COVERING INDEX audit_log_action (action=? AND rowid>? AND rowid<?)",
        );
    }
}
