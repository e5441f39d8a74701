//! `VaultStore` for PostgreSQL: sealed records (V1) and the chained audit log
//! (V7), one chain per database however many nodes append to it.

use std::sync::Arc;

use async_trait::async_trait;
use runwarden_vault::audit::{AuditChain, AuditEvent, AuditRow, AuditTip};
use runwarden_vault::store::{
    AuditFilter, RewrapFn, SealedKind, SealedMeta, SealedRecord, StoreError, VaultStore,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{GenericClient, Row, Statement};

use crate::PgStore;
use crate::audit_counts;
use crate::connection::Conn;
use crate::failure::{Failure, finish, hash32};
use crate::flight::{begin_with, commit_with};

const SEALED_COLUMNS: &str = "kind, name, algorithm, version, master_key_id, key_nonce, wrapped_key, value_nonce, \
                              ciphertext, created_ms, updated_ms";

const AUDIT_COLUMNS: &str = "id, time_ms, action, success, secret, method, host, path, status, duration_ms, error, \
                             reason, actor, correlation, prev_hash, hash, intent_id";

/// V7: the transaction advisory lock every audit append takes before reading the tip
/// ("rwaudit!" in ASCII). It serialises audit appends on every node and nothing else.
const AUDIT_LOCK: i64 = 0x7277_6175_6469_7421;

#[async_trait]
impl VaultStore for PgStore {
    async fn sealed_get(
        &self,
        kind: SealedKind,
        name: &str,
    ) -> Result<Option<SealedRecord>, StoreError> {
        self.with("reading a sealed record", async {
            let client = self.client().await?;
            let sql = format!("SELECT {SEALED_COLUMNS} FROM sealed WHERE kind = $1 AND name = $2");
            let stmt = client.prepare_cached(&sql).await?;
            let row = client.query_opt(&stmt, &[&kind.as_str(), &name]).await?;
            row.map(|row| sealed_record(&row)).transpose()
        })
        .await
    }

    async fn sealed_put(&self, record: SealedRecord) -> Result<(), StoreError> {
        self.with("storing a sealed record", async {
            let client = self.client().await?;
            // The conflict branch leaves created_ms alone: a replaced secret keeps its birth date.
            let sql = format!(
                "INSERT INTO sealed ({SEALED_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (kind, name) DO UPDATE SET
                     algorithm = excluded.algorithm, version = excluded.version,
                     master_key_id = excluded.master_key_id, key_nonce = excluded.key_nonce,
                     wrapped_key = excluded.wrapped_key, value_nonce = excluded.value_nonce,
                     ciphertext = excluded.ciphertext, updated_ms = excluded.updated_ms"
            );
            let stmt = client.prepare_cached(&sql).await?;
            let (kind, version) = (record.kind.as_str(), i64::from(record.version));
            client.execute(&stmt, &sealed_params(&record, &kind, &version)).await?;
            Ok(())
        })
        .await
    }

    async fn sealed_insert_new(&self, record: SealedRecord) -> Result<bool, StoreError> {
        self.with("storing a new sealed record", async {
            let client = self.client().await?;
            let sql = format!(
                "INSERT INTO sealed ({SEALED_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
                 ON CONFLICT (kind, name) DO NOTHING"
            );
            let stmt = client.prepare_cached(&sql).await?;
            let (kind, version) = (record.kind.as_str(), i64::from(record.version));
            Ok(client.execute(&stmt, &sealed_params(&record, &kind, &version)).await? == 1)
        })
        .await
    }

    async fn sealed_delete(&self, kind: SealedKind, name: &str) -> Result<bool, StoreError> {
        self.with("deleting a sealed record", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("DELETE FROM sealed WHERE kind = $1 AND name = $2")
                .await?;
            Ok(client.execute(&stmt, &[&kind.as_str(), &name]).await? == 1)
        })
        .await
    }

    async fn sealed_list(&self, kind: SealedKind) -> Result<Vec<SealedMeta>, StoreError> {
        self.with("listing sealed records", async {
            let client = self.client().await?;
            // V2: the listing never selects nonces, keys or ciphertext.
            let stmt = client
                .prepare_cached(
                    "SELECT name, algorithm, created_ms, updated_ms FROM sealed WHERE kind = $1 ORDER BY name",
                )
                .await?;
            let rows = client.query(&stmt, &[&kind.as_str()]).await?;
            rows.iter()
                .map(|row| {
                    Ok(SealedMeta {
                        name: row.try_get(0)?,
                        algorithm: row.try_get(1)?,
                        created_ms: row.try_get(2)?,
                        updated_ms: row.try_get(3)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn sealed_secrets_version(&self) -> Result<u64, StoreError> {
        self.with("reading the secrets' version", async {
            let client = self.client().await?;
            // A plain read takes no lock: it never waits for a transaction changing secrets,
            // and its snapshot holds every transaction committed before it began.
            let stmt = client
                .prepare_cached("SELECT version FROM secrets_version WHERE id = 1")
                .await?;
            let version: i64 = client.query_one(&stmt, &[]).await?.try_get(0)?;
            Ok(version.cast_unsigned())
        })
        .await
    }

    async fn sealed_rewrap_all(&self, mut rewrap: RewrapFn) -> Result<usize, StoreError> {
        const OPERATION: &str = "rewrapping sealed records";
        self.with(OPERATION, async {
            let mut client = self.client().await?;
            // V1: rotation is atomic. Dropping the transaction on any early return rolls
            // back every record already rewritten; FOR UPDATE keeps another node from
            // changing a record between its read and its rewrite.
            let tx = client.transaction().await?;
            let result = async {
                let rows = tx
                    .query(
                        &format!("SELECT {SEALED_COLUMNS} FROM sealed ORDER BY kind, name FOR UPDATE"),
                        &[],
                    )
                    .await?;
                let records = rows
                    .iter()
                    .map(sealed_record)
                    .collect::<Result<Vec<_>, _>>()?;
                let update = tx
                    .prepare(
                        "UPDATE sealed SET algorithm = $3, version = $4, master_key_id = $5, key_nonce = $6,
                             wrapped_key = $7, value_nonce = $8, ciphertext = $9, updated_ms = $10
                         WHERE kind = $1 AND name = $2",
                    )
                    .await?;
                for record in &records {
                    let rewrapped = rewrap(record.clone())?;
                    if rewrapped.kind != record.kind || rewrapped.name != record.name {
                        return Err(StoreError::new(
                            OPERATION,
                            format!(
                                "rewrapping {} returned another record's kind or name",
                                record.name
                            ),
                        )
                        .into());
                    }
                    let r = &rewrapped;
                    let version = i64::from(r.version);
                    tx.execute(
                        &update,
                        &[
                            &r.kind.as_str(),
                            &r.name,
                            &r.algorithm,
                            &version,
                            &r.master_key_id,
                            &r.key_nonce,
                            &r.wrapped_key,
                            &r.value_nonce,
                            &r.ciphertext,
                            &r.updated_ms,
                        ],
                    )
                    .await?;
                }
                Ok(records.len())
            }
            .await;
            finish(tx, result).await
        })
        .await
    }

    async fn audit_append(
        &self,
        event: AuditEvent,
        chain: Arc<AuditChain>,
    ) -> Result<AuditRow, StoreError> {
        const OPERATION: &str = "appending an audit row";
        let result = self
            .with(
                OPERATION,
                append_rows(self, vec![event.clone()], &chain, true),
            )
            .await;
        // An append whose answer was lost may be stored (the call it announces may then
        // go): the newest row equal to this event is that append.
        let mut rows = self
            .confirm(result, OPERATION, || async {
                let client = self.client().await?;
                let row = client
                    .query_opt(
                        &format!(
                            "SELECT {AUDIT_COLUMNS} FROM audit_log
                             WHERE time_ms = $1 AND action = $2 AND host = $3 AND path = $4
                                 AND actor = $5
                             ORDER BY id DESC LIMIT 1"
                        ),
                        &[
                            &event.time_ms,
                            &event.action,
                            &event.host,
                            &event.path,
                            &event.actor,
                        ],
                    )
                    .await?;
                let row = row.as_ref().map(audit_row).transpose()?;
                Ok(row.filter(|row| row.event == event).map(|row| vec![row]))
            })
            .await?;
        rows.pop()
            .ok_or_else(|| StoreError::new(OPERATION, "no row was written"))
    }

    async fn audit_append_many(
        &self,
        events: Vec<AuditEvent>,
        chain: Arc<AuditChain>,
    ) -> Result<Vec<AuditRow>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // V7 (amended): a batch of outcome rows only is committed without waiting for the
        // WAL flush (see `must_sync`); it is durable with the next synced commit.
        let durable = events.iter().any(AuditEvent::must_sync);
        self.with(
            "appending audit rows",
            append_rows(self, events, &chain, durable),
        )
        .await
    }

    async fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Result<Vec<i64>, StoreError> {
        if intent_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.with("finding incomplete calls", async {
            let client = self.client().await?;
            // One query for the whole list: the ids no row names in its intent_id.
            let stmt = client
                .prepare_cached(
                    "SELECT DISTINCT wanted.id FROM unnest($1::BIGINT[]) AS wanted (id)
                     WHERE NOT EXISTS (SELECT 1 FROM audit_log WHERE intent_id = wanted.id)
                     ORDER BY wanted.id",
                )
                .await?;
            let rows = client.query(&stmt, &[&intent_ids]).await?;
            rows.iter().map(|row| Ok(row.try_get(0)?)).collect()
        })
        .await
    }

    async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, StoreError> {
        self.with("listing audit rows", async {
            let client = self.client().await?;
            let mut sql = format!("SELECT {AUDIT_COLUMNS} FROM audit_log WHERE TRUE");
            let limit = i64::from(filter.limit);
            let mut args: Vec<&(dyn ToSql + Sync)> = Vec::new();
            if let Some(after_id) = &filter.after_id {
                args.push(after_id);
                sql.push_str(&format!(" AND id > ${}", args.len()));
            }
            if let Some(action) = &filter.action {
                args.push(action);
                sql.push_str(&format!(" AND action = ${}", args.len()));
            }
            if let Some(correlation) = &filter.correlation {
                args.push(correlation);
                sql.push_str(&format!(" AND correlation = ${}", args.len()));
            }
            sql.push_str(if filter.newest_first {
                " ORDER BY id DESC"
            } else {
                " ORDER BY id ASC"
            });
            // A limit of 0 means no limit.
            if filter.limit > 0 {
                args.push(&limit);
                sql.push_str(&format!(" LIMIT ${}", args.len()));
            }
            let stmt = client.prepare_cached(&sql).await?;
            let rows = client.query(&stmt, &args).await?;
            rows.iter().map(audit_row).collect()
        })
        .await
    }

    async fn audit_tip(&self) -> Result<Option<AuditTip>, StoreError> {
        self.with("reading the audit tip", async {
            let client = self.client().await?;
            read_tip(client.plain()).await
        })
        .await
    }

    async fn audit_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        // The counts kept beside the log and the few rows not folded in yet.
        self.with("counting audit rows", async {
            let mut client = self.client().await?;
            let tx = client
                .build_transaction()
                .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .await?;
            let counts = audit_counts::read(&tx).await;
            finish(tx, counts).await
        })
        .await
    }

    async fn audit_counts_fold(&self, most: u64) -> Result<u64, StoreError> {
        self.with("folding audit rows into their counts", async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let folded = audit_counts::fold(&tx, most).await;
            finish(tx, folded).await
        })
        .await
    }

    async fn oauth_lease_acquire(
        &self,
        key: &str,
        holder: &str,
        now_ms: i64,
        expires_ms: i64,
    ) -> Result<bool, StoreError> {
        self.with("taking an OAuth refresh lease", async {
            let client = self.client().await?;
            // One statement: the insert, or the takeover of an expired (or our own) lease;
            // the row lock of ON CONFLICT serialises two nodes racing for it.
            let stmt = client
                .prepare_cached(
                    "INSERT INTO oauth_refresh_lease (key, holder, expires_ms) VALUES ($1, $2, $4)
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_ms = excluded.expires_ms
                 WHERE oauth_refresh_lease.expires_ms <= $3 OR oauth_refresh_lease.holder = $2",
                )
                .await?;
            Ok(client
                .execute(&stmt, &[&key, &holder, &now_ms, &expires_ms])
                .await?
                == 1)
        })
        .await
    }

    async fn oauth_lease_release(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        self.with("releasing an OAuth refresh lease", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("DELETE FROM oauth_refresh_lease WHERE key = $1 AND holder = $2")
                .await?;
            client.execute(&stmt, &[&key, &holder]).await?;
            Ok(())
        })
        .await
    }
}

/// Appends `events` in one transaction. V7: every node extends the same chain, so the
/// tip is read under a transaction advisory lock that only audit appends take (unrelated
/// writes never wait for it), and released at commit. A batch that must be durable
/// commits with the server's synchronous commit; any other batch sets
/// `synchronous_commit = off` for its own transaction only: it is committed (visible, it
/// survives a killed process) and reaches the disk with the next synced commit, which is
/// exactly what the seam promises.
///
/// Every node waits for that lock, so it is held for as few round trips as the chain
/// allows: the statements are prepared once per connection, and they go in two flights.
/// The first opens the transaction, takes the lock and reads the tip; the second, once
/// the rows are linked to the tip, inserts them, moves the tip and commits. A statement
/// that fails aborts the transaction, so the COMMIT behind it rolls back, and the batch
/// answers that statement's error.
async fn append_rows(
    store: &PgStore,
    events: Vec<AuditEvent>,
    chain: &AuditChain,
    durable: bool,
) -> Result<Vec<AuditRow>, Failure> {
    // Refused before the transaction: a value no backend can store fails the whole batch.
    let durations = events
        .iter()
        .map(|event| {
            i64::try_from(event.duration_ms).map_err(|_| {
                Failure::from(StoreError::new(
                    "appending an audit row",
                    "the duration does not fit in 63 bits",
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let client = store.client().await?;
    let prepared = Prepared::on(&client).await?;
    let tip = begin_with(&client, lock_and_read_tip(&client, &prepared, durable)).await?;
    // V7: continue from the anchored tip, not from MAX(id), so a cut tail stays visible to
    // verify instead of being silently overwritten.
    let rows = chain.extend(tip.map(|t| (t.last_id, t.last_hash)), events);
    let rows_and_tip = insert_rows_and_move_tip(&client, &prepared, &rows, &durations, chain);
    commit_with(&client, rows_and_tip).await?;
    Ok(rows)
}

/// The statements of an audit batch, prepared once per connection.
struct Prepared {
    lock: Statement,
    tip: Statement,
    insert: Statement,
    move_tip: Statement,
}

impl Prepared {
    async fn on(client: &Conn) -> Result<Self, Failure> {
        Ok(Self {
            // The lock, and for a batch that need not be durable, `synchronous_commit =
            // off` for this transaction only (CASE evaluates `set_config` only then).
            lock: client
                .prepare_cached(
                    "SELECT pg_advisory_xact_lock($1),
                         CASE WHEN $2 THEN set_config('synchronous_commit', 'off', true) END",
                )
                .await?,
            tip: client.prepare_cached(READ_TIP).await?,
            insert: client
                .prepare_cached(&format!(
                    "INSERT INTO audit_log ({AUDIT_COLUMNS})
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)"
                ))
                .await?,
            move_tip: client
                .prepare_cached(
                    "INSERT INTO audit_tip (id, last_id, last_hash, anchor) VALUES (1, $1, $2, $3)
                     ON CONFLICT (id) DO UPDATE SET
                         last_id = excluded.last_id, last_hash = excluded.last_hash, anchor = excluded.anchor",
                )
                .await?,
        })
    }
}

/// The first flight's statements after BEGIN: the chain's lock (with the commit mode of a
/// batch that need not be durable), and the tip read under it.
async fn lock_and_read_tip(
    client: &Conn,
    prepared: &Prepared,
    durable: bool,
) -> Result<Option<AuditTip>, Failure> {
    let unsynced = !durable;
    let lock_params: [&(dyn ToSql + Sync); 2] = [&AUDIT_LOCK, &unsynced];
    let (locked, row) = tokio::join!(
        biased;
        client.execute(&prepared.lock, &lock_params),
        client.query_opt(&prepared.tip, &[]),
    );
    locked?;
    row?.as_ref().map(tip_row).transpose()
}

/// The second flight's statements before COMMIT, sent in this order: the rows, then the
/// tip moved to the last of them.
async fn insert_rows_and_move_tip(
    client: &Conn,
    prepared: &Prepared,
    rows: &[AuditRow],
    durations: &[i64],
    chain: &AuditChain,
) -> Result<(), Failure> {
    let inserts = rows
        .iter()
        .zip(durations)
        .map(|(row, duration_ms)| async move {
            let event = &row.event;
            let status = i64::from(event.status);
            client
                .execute(
                    &prepared.insert,
                    &[
                        &row.id,
                        &event.time_ms,
                        &event.action,
                        &event.success,
                        &event.secret,
                        &event.method,
                        &event.host,
                        &event.path,
                        &status,
                        duration_ms,
                        &event.error,
                        &event.reason,
                        &event.actor,
                        &event.correlation,
                        &&row.prev_hash[..],
                        &&row.hash[..],
                        &event.intent_id,
                    ],
                )
                .await
        });
    let (inserted, moved) = tokio::join!(
        biased;
        futures_util::future::join_all(inserts),
        async {
            let Some(last) = rows.last() else {
                return Ok(0);
            };
            let anchor = chain.anchor(last.id, &last.hash);
            client
                .execute(&prepared.move_tip, &[&last.id, &&last.hash[..], &&anchor[..]])
                .await
        },
    );
    for result in inserted {
        result?;
    }
    moved?;
    Ok(())
}

const READ_TIP: &str = "SELECT last_id, last_hash, anchor FROM audit_tip WHERE id = 1";

fn tip_row(row: &Row) -> Result<AuditTip, Failure> {
    Ok(AuditTip {
        last_id: row.try_get(0)?,
        last_hash: hash32(row.try_get(1)?, "the audit tip's last_hash")?,
        anchor: hash32(row.try_get(2)?, "the audit tip's anchor")?,
    })
}

async fn read_tip(conn: &impl GenericClient) -> Result<Option<AuditTip>, Failure> {
    let row = conn.query_opt(READ_TIP, &[]).await?;
    row.as_ref().map(tip_row).transpose()
}

fn sealed_record(row: &Row) -> Result<SealedRecord, Failure> {
    let name: String = row.try_get(1)?;
    let kind = match row.try_get::<_, &str>(0)? {
        "secret" => SealedKind::Secret,
        "internal" => SealedKind::Internal,
        other => {
            return Err(Failure::Corrupt(format!(
                "sealed record {name} has unknown kind {other:?}"
            )));
        }
    };
    let version: i64 = row.try_get(3)?;
    let version = u32::try_from(version).map_err(|_| {
        Failure::Corrupt(format!(
            "sealed record {name} has impossible version {version}"
        ))
    })?;
    Ok(SealedRecord {
        kind,
        name,
        algorithm: row.try_get(2)?,
        version,
        master_key_id: row.try_get(4)?,
        key_nonce: row.try_get(5)?,
        wrapped_key: row.try_get(6)?,
        value_nonce: row.try_get(7)?,
        ciphertext: row.try_get(8)?,
        created_ms: row.try_get(9)?,
        updated_ms: row.try_get(10)?,
    })
}

fn sealed_params<'a>(
    r: &'a SealedRecord,
    kind: &'a &'static str,
    version: &'a i64,
) -> [&'a (dyn ToSql + Sync); 11] {
    [
        kind,
        &r.name,
        &r.algorithm,
        version,
        &r.master_key_id,
        &r.key_nonce,
        &r.wrapped_key,
        &r.value_nonce,
        &r.ciphertext,
        &r.created_ms,
        &r.updated_ms,
    ]
}

fn audit_row(row: &Row) -> Result<AuditRow, Failure> {
    let id: i64 = row.try_get(0)?;
    let corrupt = |column: &str, value: i64| {
        Failure::Corrupt(format!("audit row {id} has impossible {column} {value}"))
    };
    let status: i64 = row.try_get(8)?;
    let duration_ms: i64 = row.try_get(9)?;
    Ok(AuditRow {
        id,
        event: AuditEvent {
            time_ms: row.try_get(1)?,
            action: row.try_get(2)?,
            success: row.try_get(3)?,
            secret: row.try_get(4)?,
            method: row.try_get(5)?,
            host: row.try_get(6)?,
            path: row.try_get(7)?,
            status: u16::try_from(status).map_err(|_| corrupt("status", status))?,
            duration_ms: u64::try_from(duration_ms)
                .map_err(|_| corrupt("duration_ms", duration_ms))?,
            error: row.try_get(10)?,
            reason: row.try_get(11)?,
            actor: row.try_get(12)?,
            correlation: row.try_get(13)?,
            intent_id: row.try_get(16)?,
        },
        prev_hash: hash32(row.try_get(14)?, &format!("audit row {id}'s prev_hash"))?,
        hash: hash32(row.try_get(15)?, &format!("audit row {id}'s hash"))?,
    })
}
