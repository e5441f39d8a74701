//! `VaultStore` for SQLite: sealed records (V1) and the chained audit log (V7).

use std::sync::Arc;

use async_trait::async_trait;
use runwarden_vault::audit::{AuditChain, AuditEvent, AuditRow, AuditTip};
use runwarden_vault::store::{
    AuditFilter, RewrapFn, SealedKind, SealedMeta, SealedRecord, StoreError, VaultStore,
};
use rusqlite::types::Value;
use rusqlite::{
    Connection, OptionalExtension, Row, Transaction, TransactionBehavior, params, params_from_iter,
};

use crate::SqliteStore;
use crate::audit_counts;
use crate::connection::durably;
use crate::failure::{Failure, hash32};

const SEALED_COLUMNS: &str = "kind, name, algorithm, version, master_key_id, key_nonce, wrapped_key, value_nonce, \
                              ciphertext, created_ms, updated_ms";

const AUDIT_COLUMNS: &str = "id, time_ms, action, success, secret, method, host, path, status, duration_ms, error, \
                             reason, actor, correlation, prev_hash, hash, intent_id";

#[async_trait]
impl VaultStore for SqliteStore {
    async fn sealed_get(
        &self,
        kind: SealedKind,
        name: &str,
    ) -> Result<Option<SealedRecord>, StoreError> {
        let name = name.to_owned();
        self.run("reading a sealed record", move |conn| {
            let sql = format!("SELECT {SEALED_COLUMNS} FROM sealed WHERE kind = ?1 AND name = ?2");
            let row = conn
                .query_row(&sql, (kind.as_str(), &name), sealed_columns)
                .optional()?;
            row.map(sealed_record).transpose()
        })
        .await
    }

    async fn sealed_put(&self, record: SealedRecord) -> Result<(), StoreError> {
        self.run("storing a sealed record", move |conn| {
            // The conflict branch leaves created_ms alone: a replaced secret keeps its birth date.
            let sql = format!(
                "INSERT INTO sealed ({SEALED_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (kind, name) DO UPDATE SET
                     algorithm = excluded.algorithm, version = excluded.version,
                     master_key_id = excluded.master_key_id, key_nonce = excluded.key_nonce,
                     wrapped_key = excluded.wrapped_key, value_nonce = excluded.value_nonce,
                     ciphertext = excluded.ciphertext, updated_ms = excluded.updated_ms"
            );
            conn.execute(&sql, sealed_params(&record))?;
            Ok(())
        })
        .await
    }

    async fn sealed_insert_new(&self, record: SealedRecord) -> Result<bool, StoreError> {
        self.run("storing a new sealed record", move |conn| {
            let sql = format!(
                "INSERT INTO sealed ({SEALED_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (kind, name) DO NOTHING"
            );
            Ok(conn.execute(&sql, sealed_params(&record))? == 1)
        })
        .await
    }

    async fn sealed_delete(&self, kind: SealedKind, name: &str) -> Result<bool, StoreError> {
        let name = name.to_owned();
        self.run("deleting a sealed record", move |conn| {
            Ok(conn.execute(
                "DELETE FROM sealed WHERE kind = ?1 AND name = ?2",
                (kind.as_str(), &name),
            )? == 1)
        })
        .await
    }

    async fn sealed_list(&self, kind: SealedKind) -> Result<Vec<SealedMeta>, StoreError> {
        self.run("listing sealed records", move |conn| {
            // V2: the listing never selects nonces, keys or ciphertext.
            let mut stmt = conn.prepare(
                "SELECT name, algorithm, created_ms, updated_ms FROM sealed WHERE kind = ?1 ORDER BY name",
            )?;
            let rows = stmt.query_map([kind.as_str()], |row| {
                Ok(SealedMeta {
                    name: row.get(0)?,
                    algorithm: row.get(1)?,
                    created_ms: row.get(2)?,
                    updated_ms: row.get(3)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn sealed_secrets_version(&self) -> Result<u64, StoreError> {
        // On the read-only probe connection: a WAL reader never waits for the write gate,
        // the writer's transactions or the audit writer's group commit, and sees every
        // transaction committed before its read began.
        // On the caller's thread when it can be: every guarded call asks (see `quick_read`).
        self.quick_read("reading the secrets' version", |conn| {
            let version: i64 = conn
                .prepare_cached("SELECT version FROM secrets_version WHERE id = 1")?
                .query_row([], |row| row.get(0))?;
            Ok(version.cast_unsigned())
        })
        .await
    }

    async fn sealed_rewrap_all(&self, mut rewrap: RewrapFn) -> Result<usize, StoreError> {
        self.run("rewrapping sealed records", move |conn| {
            // V1: rotation is atomic. Dropping the transaction on any early return rolls
            // back every record already rewritten.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let records = {
                let mut stmt = tx.prepare(&format!("SELECT {SEALED_COLUMNS} FROM sealed ORDER BY kind, name"))?;
                let rows = stmt.query_map([], sealed_columns)?.collect::<Result<Vec<_>, _>>()?;
                rows.into_iter().map(sealed_record).collect::<Result<Vec<_>, _>>()?
            };
            for record in &records {
                let rewrapped = rewrap(record.clone())?;
                if rewrapped.kind != record.kind || rewrapped.name != record.name {
                    return Err(StoreError::new(
                        "rewrapping sealed records",
                        format!("rewrapping {} returned another record's kind or name", record.name),
                    )
                    .into());
                }
                tx.execute(
                    "UPDATE sealed SET algorithm = ?3, version = ?4, master_key_id = ?5, key_nonce = ?6,
                         wrapped_key = ?7, value_nonce = ?8, ciphertext = ?9, updated_ms = ?11
                     WHERE kind = ?1 AND name = ?2",
                    sealed_params(&rewrapped),
                )?;
            }
            tx.commit()?;
            Ok(records.len())
        })
        .await
    }

    async fn audit_append(
        &self,
        event: AuditEvent,
        chain: Arc<AuditChain>,
    ) -> Result<AuditRow, StoreError> {
        let sync = self.syncs_promises();
        self.run("appending an audit row", move |conn| {
            let mut rows = append_durably(conn, sync, vec![event], &chain)?;
            rows.pop().ok_or_else(|| {
                StoreError::new("appending an audit row", "no row was written").into()
            })
        })
        .await
    }

    async fn audit_append_many(
        &self,
        events: Vec<AuditEvent>,
        chain: Arc<AuditChain>,
    ) -> Result<Vec<AuditRow>, StoreError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // V7 (amended): a batch of outcome rows only is not synced (see `must_sync`).
        let sync = self.syncs_promises() && events.iter().any(AuditEvent::must_sync);
        if !sync && events.len() <= QUICK_ROWS {
            return self
                .quick_write("appending audit rows", move |tx| {
                    insert_rows(tx, events, &chain)
                })
                .await;
        }
        self.run("appending audit rows", move |conn| {
            append_durably(conn, sync, events, &chain)
        })
        .await
    }

    async fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Result<Vec<i64>, StoreError> {
        if intent_ids.is_empty() {
            return Ok(Vec::new());
        }
        self.run("finding incomplete calls", move |conn| {
            let mut stmt =
                conn.prepare_cached("SELECT 1 FROM audit_log WHERE intent_id = ?1 LIMIT 1")?;
            let mut open = Vec::new();
            for id in intent_ids {
                if !stmt.exists([id])? {
                    open.push(id);
                }
            }
            open.sort_unstable();
            open.dedup();
            Ok(open)
        })
        .await
    }

    async fn audit_list(&self, filter: AuditFilter) -> Result<Vec<AuditRow>, StoreError> {
        self.run("listing audit rows", move |conn| {
            let mut sql = format!("SELECT {AUDIT_COLUMNS} FROM audit_log WHERE 1 = 1");
            let mut args: Vec<Value> = Vec::new();
            if let Some(after_id) = filter.after_id {
                args.push(after_id.into());
                sql.push_str(&format!(" AND id > ?{}", args.len()));
            }
            if let Some(action) = filter.action {
                args.push(action.into());
                sql.push_str(&format!(" AND action = ?{}", args.len()));
            }
            if let Some(correlation) = filter.correlation {
                args.push(correlation.into());
                sql.push_str(&format!(" AND correlation = ?{}", args.len()));
            }
            sql.push_str(if filter.newest_first {
                " ORDER BY id DESC"
            } else {
                " ORDER BY id ASC"
            });
            // A limit of 0 means no limit. The number is written into the text (it is a
            // u32): bound from a parameter, it would make SQLite prepare the statement again
            // on every binding. So each shape of the query (the audit writer's anchor check
            // asks one row, once per synced batch) is prepared once and kept.
            if filter.limit > 0 {
                sql.push_str(&format!(" LIMIT {}", filter.limit));
            }
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt
                .query_map(params_from_iter(args), audit_columns)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(audit_row).collect()
        })
        .await
    }

    async fn audit_tip(&self) -> Result<Option<AuditTip>, StoreError> {
        self.run("reading the audit tip", |conn| read_tip(conn))
            .await
    }

    async fn audit_counts(&self) -> Result<Vec<(String, u64)>, StoreError> {
        // The counts kept beside the log and the few rows not folded in yet.
        self.scan("counting audit rows", audit_counts::read).await
    }

    async fn audit_counts_fold(&self, most: u64) -> Result<u64, StoreError> {
        self.run("folding audit rows into their counts", move |conn| {
            audit_counts::fold(conn, most)
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
        let (key, holder) = (key.to_owned(), holder.to_owned());
        self.run("taking an OAuth refresh lease", move |conn| {
            // One statement: the insert, or the takeover of an expired (or our own) lease.
            let changed = conn.execute(
                "INSERT INTO oauth_refresh_lease (key, holder, expires_ms) VALUES (?1, ?2, ?4)
                 ON CONFLICT (key) DO UPDATE SET holder = excluded.holder, expires_ms = excluded.expires_ms
                 WHERE oauth_refresh_lease.expires_ms <= ?3 OR oauth_refresh_lease.holder = ?2",
                (&key, &holder, now_ms, expires_ms),
            )?;
            Ok(changed == 1)
        })
        .await
    }

    async fn oauth_lease_release(&self, key: &str, holder: &str) -> Result<(), StoreError> {
        let (key, holder) = (key.to_owned(), holder.to_owned());
        self.run("releasing an OAuth refresh lease", move |conn| {
            conn.execute(
                "DELETE FROM oauth_refresh_lease WHERE key = ?1 AND holder = ?2",
                (&key, &holder),
            )?;
            Ok(())
        })
        .await
    }
}

/// Appends `events` in one transaction that is synced to disk before it answers: V7
/// (amended) wants an intent durable before its request leaves, and the anchor file
/// outside the database must never record rows a power cut could take back. The sync is
/// paid once per batch. Under `Durability::ProcessCrash` (`sync` false) it is not paid,
/// and the anchor may then name rows a power cut takes back: `audit verify` reports them.
fn append_durably(
    conn: &mut Connection,
    sync: bool,
    events: Vec<AuditEvent>,
    chain: &AuditChain,
) -> Result<Vec<AuditRow>, Failure> {
    durably(conn, sync, |conn| append_rows(conn, events, chain))
}

/// The most audit rows a batch may hold to be written on the caller's thread
/// (`quick_write`): a call's outcome row, or a few side by side. A larger batch (a burst
/// of cancelled calls) goes to the blocking pool, so no runtime thread stops for long.
const QUICK_ROWS: usize = 4;

fn append_rows(
    conn: &mut Connection,
    events: Vec<AuditEvent>,
    chain: &AuditChain,
) -> Result<Vec<AuditRow>, Failure> {
    // BEGIN IMMEDIATE takes the write lock before reading the tip, so a writer in another
    // process waits (busy timeout) instead of linking to the same tip.
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let rows = insert_rows(&tx, events, chain)?;
    tx.commit()?;
    Ok(rows)
}

/// Appends `events` to the chain inside `tx`, which must hold the write lock (`BEGIN
/// IMMEDIATE`).
fn insert_rows(
    tx: &Transaction<'_>,
    events: Vec<AuditEvent>,
    chain: &AuditChain,
) -> Result<Vec<AuditRow>, Failure> {
    // V7: continue from the anchored tip, not from MAX(id), so a cut tail stays visible to
    // verify instead of being silently overwritten.
    let tip = read_tip(tx)?.map(|t| (t.last_id, t.last_hash));
    let rows = chain.extend(tip, events);
    {
        let mut insert = tx.prepare_cached(&format!(
            "INSERT INTO audit_log ({AUDIT_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17)"
        ))?;
        for AuditRow {
            id,
            event,
            prev_hash,
            hash,
        } in &rows
        {
            let duration_ms = i64::try_from(event.duration_ms).map_err(|_| {
                StoreError::new(
                    "appending an audit row",
                    "the duration does not fit in 63 bits",
                )
            })?;
            insert.execute(params![
                id,
                event.time_ms,
                event.action,
                event.success,
                event.secret,
                event.method,
                event.host,
                event.path,
                event.status,
                duration_ms,
                event.error,
                event.reason,
                event.actor,
                event.correlation,
                &prev_hash[..],
                &hash[..],
                event.intent_id,
            ])?;
        }
    }
    let (prev_id, prev_hash) = rows.last().map_or((0, [0u8; 32]), |r| (r.id, r.hash));
    if prev_id > 0 {
        tx.prepare_cached(
            "INSERT INTO audit_tip (id, last_id, last_hash, anchor) VALUES (1, ?1, ?2, ?3)
             ON CONFLICT (id) DO UPDATE SET
                 last_id = excluded.last_id, last_hash = excluded.last_hash, anchor = excluded.anchor",
        )?
        .execute(params![
            prev_id,
            &prev_hash[..],
            &chain.anchor(prev_id, &prev_hash)[..]
        ])?;
    }
    Ok(rows)
}

fn read_tip(conn: &Connection) -> Result<Option<AuditTip>, Failure> {
    let raw = conn
        .prepare_cached("SELECT last_id, last_hash, anchor FROM audit_tip WHERE id = 1")?
        .query_row([], |row| {
            Ok((
                row.get::<_, i64>(0)?,
                row.get::<_, Vec<u8>>(1)?,
                row.get::<_, Vec<u8>>(2)?,
            ))
        })
        .optional()?;
    raw.map(|(last_id, last_hash, anchor)| {
        Ok(AuditTip {
            last_id,
            last_hash: hash32(last_hash, "the audit tip's last_hash")?,
            anchor: hash32(anchor, "the audit tip's anchor")?,
        })
    })
    .transpose()
}

/// A sealed row as read, before its kind is checked.
type SealedColumns = (
    String,
    String,
    String,
    i64,
    String,
    Vec<u8>,
    Vec<u8>,
    Vec<u8>,
    Vec<u8>,
    i64,
    i64,
);

fn sealed_columns(row: &Row<'_>) -> rusqlite::Result<SealedColumns> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
        row.get(8)?,
        row.get(9)?,
        row.get(10)?,
    ))
}

fn sealed_record(columns: SealedColumns) -> Result<SealedRecord, Failure> {
    let (
        kind,
        name,
        algorithm,
        version,
        master_key_id,
        key_nonce,
        wrapped_key,
        value_nonce,
        ciphertext,
        created_ms,
        updated_ms,
    ) = columns;
    let kind = match kind.as_str() {
        "secret" => SealedKind::Secret,
        "internal" => SealedKind::Internal,
        other => {
            return Err(Failure::Corrupt(format!(
                "sealed record {name} has unknown kind {other:?}"
            )));
        }
    };
    let version = u32::try_from(version).map_err(|_| {
        Failure::Corrupt(format!(
            "sealed record {name} has impossible version {version}"
        ))
    })?;
    Ok(SealedRecord {
        kind,
        name,
        algorithm,
        version,
        master_key_id,
        key_nonce,
        wrapped_key,
        value_nonce,
        ciphertext,
        created_ms,
        updated_ms,
    })
}

fn sealed_params(r: &SealedRecord) -> impl rusqlite::Params + '_ {
    (
        r.kind.as_str(),
        &r.name,
        &r.algorithm,
        r.version,
        &r.master_key_id,
        &r.key_nonce,
        &r.wrapped_key,
        &r.value_nonce,
        &r.ciphertext,
        r.created_ms,
        r.updated_ms,
    )
}

/// An audit row as read, before its integers and hashes are checked.
struct AuditColumns {
    id: i64,
    time_ms: i64,
    action: String,
    success: i64,
    secret: Option<String>,
    method: String,
    host: String,
    path: String,
    status: i64,
    duration_ms: i64,
    error: Option<String>,
    reason: Option<String>,
    actor: String,
    correlation: Option<String>,
    prev_hash: Vec<u8>,
    hash: Vec<u8>,
    intent_id: Option<i64>,
}

fn audit_columns(row: &Row<'_>) -> rusqlite::Result<AuditColumns> {
    Ok(AuditColumns {
        id: row.get(0)?,
        time_ms: row.get(1)?,
        action: row.get(2)?,
        success: row.get(3)?,
        secret: row.get(4)?,
        method: row.get(5)?,
        host: row.get(6)?,
        path: row.get(7)?,
        status: row.get(8)?,
        duration_ms: row.get(9)?,
        error: row.get(10)?,
        reason: row.get(11)?,
        actor: row.get(12)?,
        correlation: row.get(13)?,
        prev_hash: row.get(14)?,
        hash: row.get(15)?,
        intent_id: row.get(16)?,
    })
}

fn audit_row(c: AuditColumns) -> Result<AuditRow, Failure> {
    let id = c.id;
    let corrupt = |column: &str, value: i64| {
        Failure::Corrupt(format!("audit row {id} has impossible {column} {value}"))
    };
    let success = match c.success {
        0 => false,
        1 => true,
        other => return Err(corrupt("success", other)),
    };
    Ok(AuditRow {
        id,
        event: AuditEvent {
            time_ms: c.time_ms,
            action: c.action,
            success,
            secret: c.secret,
            method: c.method,
            host: c.host,
            path: c.path,
            status: u16::try_from(c.status).map_err(|_| corrupt("status", c.status))?,
            duration_ms: u64::try_from(c.duration_ms)
                .map_err(|_| corrupt("duration_ms", c.duration_ms))?,
            error: c.error,
            reason: c.reason,
            actor: c.actor,
            correlation: c.correlation,
            intent_id: c.intent_id,
        },
        prev_hash: hash32(c.prev_hash, &format!("audit row {id}'s prev_hash"))?,
        hash: hash32(c.hash, &format!("audit row {id}'s hash"))?,
    })
}
