//! Idempotent run creation for SQLite: the key row and the run are written in one
//! `BEGIN IMMEDIATE` transaction, and the primary key (scope, key) decides a race.

use runwarden_base::StoreError;
use runwarden_runtime::idempotency::{IDEMPOTENCY_RETENTION_MS, KeyedCreate, RunCreateKeyed};
use rusqlite::{OptionalExtension, TransactionBehavior, params};

use crate::SqliteStore;
use crate::cached::Cached;
use crate::failure::Failure;
use crate::publish::publish_status;
use crate::run_store::{RUN_COLUMNS, insert_run, run_columns, run_row};

const CREATING: &str = "creating a run with an idempotency key";

impl SqliteStore {
    /// See [`RunStore::run_create_keyed`](runwarden_runtime::RunStore::run_create_keyed).
    pub(crate) async fn create_keyed(
        &self,
        params: RunCreateKeyed,
    ) -> Result<KeyedCreate, StoreError> {
        let answer = self
            .run(CREATING, move |conn| {
                let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let now_ms = params.run.now_ms;
                // A key older than the retention is free again: the upsert takes it over.
                let claimed = tx.execute_cached(
                    "INSERT INTO run_idempotency_keys (scope, key, body_hash, run_id, created_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (scope, key) DO UPDATE
                         SET body_hash = excluded.body_hash, run_id = excluded.run_id,
                             created_ms = excluded.created_ms
                         WHERE run_idempotency_keys.created_ms < ?6",
                    params![
                        params.scope,
                        params.key,
                        params.body_hash,
                        params.run.id,
                        now_ms,
                        now_ms - IDEMPOTENCY_RETENTION_MS
                    ],
                )?;
                if claimed == 1 {
                    let run = insert_run(&tx, params.run)?;
                    tx.commit()?;
                    return Ok(KeyedCreate::Created(run));
                }
                let (body_hash, run_id): (String, String) = tx.query_row_cached(
                    "SELECT body_hash, run_id FROM run_idempotency_keys
                     WHERE scope = ?1 AND key = ?2",
                    params![params.scope, params.key],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )?;
                if runwarden_runtime::rules::runs::key_reused(&body_hash, &params.body_hash) {
                    return Ok(KeyedCreate::Reused { run_id });
                }
                let columns = tx
                    .query_row(
                        &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                        [&run_id],
                        run_columns,
                    )
                    .optional()?
                    .ok_or_else(|| {
                        Failure::Corrupt(format!(
                            "idempotency key {:?} names run {run_id}, which does not exist",
                            params.key
                        ))
                    })?;
                Ok(KeyedCreate::Existing(run_row(columns)?))
            })
            .await?;
        if let KeyedCreate::Created(run) = &answer {
            publish_status(self.feed(), &run.id, run.status);
        }
        Ok(answer)
    }
}
