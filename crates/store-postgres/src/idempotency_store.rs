//! Idempotent run creation for PostgreSQL: the key row and the run are written in one
//! transaction. The primary key (scope, key) decides a race: a second request with the
//! same key waits on the first one's uncommitted row, then finds it.

use runwarden_base::StoreError;
use runwarden_runtime::idempotency::{IDEMPOTENCY_RETENTION_MS, KeyedCreate, RunCreateKeyed};

use crate::PgStore;
use crate::failure::{Failure, finish};
use crate::run_store::{insert_run, read_run};

const CREATING: &str = "creating a run with an idempotency key";

impl PgStore {
    /// See [`RunStore::run_create_keyed`](runwarden_runtime::RunStore::run_create_keyed).
    pub(crate) async fn create_keyed(
        &self,
        params: RunCreateKeyed,
    ) -> Result<KeyedCreate, StoreError> {
        self.with(CREATING, async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = async {
                let now_ms = params.run.now_ms;
                let expired_before = now_ms - IDEMPOTENCY_RETENTION_MS;
                // A key older than the retention is free again: the upsert takes it over.
                let claimed = tx
                    .execute(
                        "INSERT INTO run_idempotency_keys (scope, key, body_hash, run_id, created_ms)
                         VALUES ($1, $2, $3, $4, $5)
                         ON CONFLICT (scope, key) DO UPDATE
                             SET body_hash = EXCLUDED.body_hash, run_id = EXCLUDED.run_id,
                                 created_ms = EXCLUDED.created_ms
                             WHERE run_idempotency_keys.created_ms < $6",
                        &[
                            &params.scope,
                            &params.key,
                            &params.body_hash,
                            &params.run.id,
                            &now_ms,
                            &expired_before,
                        ],
                    )
                    .await?;
                if claimed == 1 {
                    // The key's reference to its run is checked at commit (deferred).
                    let run = insert_run(&*tx, &params.run).await?;
                    return Ok(KeyedCreate::Created(run));
                }
                let row = tx
                    .query_one(
                        "SELECT body_hash, run_id FROM run_idempotency_keys
                         WHERE scope = $1 AND key = $2",
                        &[&params.scope, &params.key],
                    )
                    .await?;
                let (body_hash, run_id): (String, String) = (row.try_get(0)?, row.try_get(1)?);
                if runwarden_runtime::rules::runs::key_reused(&body_hash, &params.body_hash) {
                    return Ok(KeyedCreate::Reused { run_id });
                }
                let run = read_run(&*tx, &run_id, false).await?.ok_or_else(|| {
                    Failure::Corrupt(format!(
                        "idempotency key {:?} names run {run_id}, which does not exist",
                        params.key
                    ))
                })?;
                Ok(KeyedCreate::Existing(run))
            }
            .await;
            finish(tx, result).await
        })
        .await
    }
}
