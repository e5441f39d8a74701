//! The audit rows by action, for metrics, without counting the log (migration
//! `0023_audit_counts`). `audit_counts` holds the rows up to `audit_counted.through_id`;
//! a fold adds the rows after it, a bounded number per transaction, and a read adds the
//! few rows not folded yet. Appends do nothing for the counts. Rows commit in id order
//! (each append holds the chain's lock until it commits), so the rows up to any id seen
//! are all there to count.

use deadpool_postgres::GenericClient;

use crate::failure::Failure;

/// The counts kept and the rows after id `$1`, the last one folded, ordered by action.
/// The id comes as a value, not a subquery: not knowing it, the planner would guess a
/// third of the log is newer and start parallel workers (about 40 ms) to read none of it.
const READ: &str = "SELECT action, SUM(n)::BIGINT FROM (
         SELECT action, n FROM audit_counts
         UNION ALL
         SELECT action, COUNT(*) AS n FROM audit_log WHERE id > $1 GROUP BY action
     ) AS rows GROUP BY action ORDER BY action";

/// The audit rows by action: those folded into the counts and those appended since. Call
/// it in a repeatable-read transaction: the last id folded and the counts are read by two
/// statements, which must see one snapshot.
pub(crate) async fn read(tx: &impl GenericClient) -> Result<Vec<(String, u64)>, Failure> {
    let through: i64 = tx
        .query_one("SELECT through_id FROM audit_counted WHERE id = 1", &[])
        .await?
        .try_get(0)?;
    let stmt = tx.prepare_cached(READ).await?;
    let rows = tx.query(&stmt, &[&through]).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get::<_, i64>(1)?.max(0) as u64)))
        .collect()
}

/// Adds up to `most` rows after the last one folded to the counts, inside the caller's
/// transaction, and answers how many it added: 0 once no row is left after the last one
/// folded. A log that no longer holds the last row folded, with its hash, is counted
/// again from its start. The row of `audit_counted` stays locked until the transaction
/// ends, so a removal by hand waits for the fold that may be counting the rows it removes;
/// while another node folds, this one adds nothing (0) and the read counts the rest.
pub(crate) async fn fold(tx: &impl GenericClient, most: u64) -> Result<u64, Failure> {
    let Some(row) = tx
        .query_opt(
            "SELECT through_id, through_hash FROM audit_counted WHERE id = 1
             FOR UPDATE SKIP LOCKED",
            &[],
        )
        .await?
    else {
        return Ok(0);
    };
    let mut through: i64 = row.try_get(0)?;
    if let Some(hash) = row.try_get::<_, Option<Vec<u8>>>(1)? {
        let held = tx
            .query_opt("SELECT hash FROM audit_log WHERE id = $1", &[&through])
            .await?
            .map(|row| row.try_get::<_, Vec<u8>>(0))
            .transpose()?;
        if held.as_ref() != Some(&hash) {
            tx.batch_execute(
                "UPDATE audit_counts SET n = 0;
                 UPDATE audit_counted SET through_id = -9223372036854775808, through_hash = NULL",
            )
            .await?;
            through = i64::MIN;
        }
    }
    // The last id of this fold: `most` ids on from the first row after the last one
    // folded, or the newest row when it comes sooner. Two index seeks, nothing walked (ids
    // are dense but for rows removed by hand, so a fold may take fewer rows than it may).
    let most = i64::try_from(most.max(1)).unwrap_or(i64::MAX);
    let last = tx
        .query_opt(
            "SELECT id, hash FROM audit_log
             WHERE id <= (SELECT MIN(id) FROM audit_log WHERE id > $1) + $2 - 1
             ORDER BY id DESC LIMIT 1",
            &[&through, &most],
        )
        .await?
        .filter(|row| row.try_get::<_, i64>(0).is_ok_and(|id| id > through));
    let Some(last) = last else {
        // Nothing after the last row folded (a reset is kept).
        return Ok(0);
    };
    let (last_id, last_hash): (i64, Vec<u8>) = (last.try_get(0)?, last.try_get(1)?);
    let counted = tx
        .query(
            "WITH counted AS (
                 SELECT action, COUNT(*) AS n FROM audit_log
                 WHERE id > $1 AND id <= $2 GROUP BY action
             ), added AS (
                 INSERT INTO audit_counts (action, n) SELECT action, n FROM counted
                 ON CONFLICT (action) DO UPDATE SET n = audit_counts.n + EXCLUDED.n
             )
             SELECT COALESCE(SUM(n), 0)::BIGINT FROM counted",
            &[&through, &last_id],
        )
        .await?;
    let folded = counted
        .first()
        .map(|row| row.try_get::<_, i64>(0))
        .transpose()?
        .unwrap_or(0);
    tx.execute(
        "UPDATE audit_counted SET through_id = $1, through_hash = $2 WHERE id = 1",
        &[&last_id, &last_hash],
    )
    .await?;
    Ok(folded.max(0) as u64)
}
