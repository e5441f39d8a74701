//! `LimitStore` for SQLite (R14): holds and token buckets shared by every process on the
//! file. A take is one `BEGIN IMMEDIATE` transaction, so it reads and writes while no other
//! process can write; the decision is the runtime's (`rules::limits::decide`).

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::limits::{LimitStore, LimitTake};
use runwarden_runtime::rules::limits::{self as rules, Bucket, LimitRead, TakeDecision};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::SqliteStore;
use crate::failure::Failure;

#[async_trait]
impl LimitStore for SqliteStore {
    async fn limit_take(&self, params: LimitTake) -> Result<TakeDecision, StoreError> {
        self.run("taking a call's limits", move |conn| take(conn, &params))
            .await
    }

    async fn limit_renew(&self, holder: &str, until_ms: i64) -> Result<(), StoreError> {
        let holder = holder.to_owned();
        self.run("renewing a limit's slot", move |conn| {
            conn.prepare_cached("UPDATE limit_holds SET expires_ms = ?1 WHERE holder = ?2")?
                .execute(params![until_ms, holder])?;
            Ok(())
        })
        .await
    }

    async fn limit_release(&self, holder: &str) -> Result<(), StoreError> {
        let holder = holder.to_owned();
        self.run("releasing a limit's slot", move |conn| {
            conn.prepare_cached("DELETE FROM limit_holds WHERE holder = ?1")?
                .execute([holder])?;
            Ok(())
        })
        .await
    }

    async fn limit_holders(&self, key: &str, now_ms: i64) -> Result<u32, StoreError> {
        let key = key.to_owned();
        self.quick_read("counting a limit's holders", move |conn| {
            Ok(conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM limit_holds WHERE limit_key = ?1 AND expires_ms > ?2",
                )?
                .query_row(params![&key, now_ms], |row| row.get::<_, u32>(0))?)
        })
        .await
    }
}

/// The take: reads every key's state, asks the rule, stores its answer; one transaction.
fn take(conn: &mut Connection, params: &LimitTake) -> Result<TakeDecision, Failure> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut reads = Vec::with_capacity(params.limits.len());
    for (key, rule) in &params.limits {
        // A hold whose lease ran out is a holder that died: its slot comes back.
        tx.prepare_cached("DELETE FROM limit_holds WHERE limit_key = ?1 AND expires_ms <= ?2")?
            .execute(params![key, params.now_ms])?;
        let holders = match rule.concurrency {
            Some(_) => tx
                .prepare_cached("SELECT COUNT(*) FROM limit_holds WHERE limit_key = ?1")?
                .query_row([key], |row| row.get::<_, u32>(0))?,
            None => 0,
        };
        let bucket = match rule.rate_per_second {
            Some(_) => tx
                .prepare_cached(
                    "SELECT tokens, refilled_ms FROM limit_buckets WHERE limit_key = ?1",
                )?
                .query_row([key], |row| {
                    Ok(Bucket {
                        tokens: row.get(0)?,
                        refilled_ms: row.get(1)?,
                    })
                })
                .optional()?,
            None => None,
        };
        reads.push(LimitRead {
            key: key.clone(),
            rule: *rule,
            holders,
            bucket,
        });
    }
    let decision = rules::decide(&reads, params.now_ms);
    if let TakeDecision::Take { buckets, holds } = &decision {
        for (key, bucket) in buckets {
            tx.prepare_cached(
                "INSERT INTO limit_buckets (limit_key, tokens, refilled_ms) VALUES (?1, ?2, ?3)
                 ON CONFLICT (limit_key) DO UPDATE SET tokens = excluded.tokens,
                     refilled_ms = excluded.refilled_ms",
            )?
            .execute(params![key, bucket.tokens, bucket.refilled_ms])?;
        }
        for key in holds {
            tx.prepare_cached(
                "INSERT INTO limit_holds (limit_key, holder, expires_ms) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![key, params.holder, params.hold_until_ms])?;
        }
    }
    tx.commit()?;
    Ok(decision)
}
