//! The runs by state, for metrics, without counting the runs (migration
//! `0024_run_counts`). Each run that ends writes a row of its own to `run_count_changes`,
//! in the transaction that ends it; a fold moves a bounded number of those rows into
//! `run_counts` per transaction, and a read adds the rows not moved yet and counts the
//! runs under way, which are few.

use crate::failure::Failure;

/// Changes moved per transaction: a few milliseconds of work.
const FOLD_STEP: i64 = 20_000;

/// Folds per scrape at most; the read adds whatever is left, so a long backlog costs a
/// scrape a bounded time and the next scrape goes on with it.
const FOLD_STEPS: usize = 50;

/// Moves up to `$1` changes into the counts and answers how many it moved. Rows another
/// node is moving are skipped, never counted twice; the upsert of the counts waits for
/// that node's commit.
const FOLD: &str = "WITH moved AS (
         DELETE FROM run_count_changes WHERE id IN (
             SELECT id FROM run_count_changes ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED)
         RETURNING status, n
     ), added AS (
         INSERT INTO run_counts (status, n) SELECT status, SUM(n) FROM moved GROUP BY status
         ON CONFLICT (status) DO UPDATE SET n = run_counts.n + EXCLUDED.n
     )
     SELECT COUNT(*) FROM moved";

/// The runs by state in one statement (one snapshot): the ended runs counted and the
/// changes not moved yet, and the runs under way from `runs_status_id`. A state with no
/// run is left out.
const READ: &str = "SELECT status, SUM(n)::BIGINT FROM (
         SELECT status, n FROM run_counts
         UNION ALL
         SELECT status, SUM(n) FROM run_count_changes GROUP BY status
         UNION ALL
         SELECT status, COUNT(*) FROM runs
         WHERE status IN ('queued', 'running', 'waiting_for_approval') GROUP BY status
     ) AS counted GROUP BY status HAVING SUM(n) > 0 ORDER BY status";

/// Moves the changes written since the last fold into the counts, in bounded steps, each
/// its own transaction, and answers how many it moved. A step waits at most a second for
/// a lock (another node's fold, a hand edit), then fails and leaves its rows to the read.
pub(crate) async fn fold(client: &mut deadpool_postgres::Client) -> Result<u64, Failure> {
    let mut moved = 0;
    for _ in 0..FOLD_STEPS {
        let tx = client.transaction().await?;
        tx.batch_execute("SET LOCAL lock_timeout = '1s'").await?;
        let stmt = tx.prepare_cached(FOLD).await?;
        let step: i64 = tx.query_one(&stmt, &[&FOLD_STEP]).await?.try_get(0)?;
        tx.commit().await?;
        moved += step.max(0) as u64;
        if step < FOLD_STEP {
            break;
        }
    }
    Ok(moved)
}

/// The runs by state, as stored text and count.
pub(crate) async fn read(
    client: &deadpool_postgres::Client,
) -> Result<Vec<(String, u64)>, Failure> {
    let stmt = client.prepare_cached(READ).await?;
    let rows = client.query(&stmt, &[]).await?;
    rows.iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get::<_, i64>(1)?.max(0) as u64)))
        .collect()
}
