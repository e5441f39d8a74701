//! `LimitStore` for PostgreSQL (R14): holds and token buckets shared by every node. A take
//! is one transaction that first takes a transaction-scoped advisory lock per key, in the
//! one order the runtime gives (so two takers never wait on each other in a circle), then
//! reads, asks `rules::limits::decide`, and writes; the locks go with the commit.

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::limits::{LimitStore, LimitTake};
use runwarden_runtime::rules::limits::{self as rules, Bucket, LimitRead, TakeDecision};
use tokio_postgres::GenericClient;

use crate::PgStore;
use crate::failure::{Failure, finish};

#[async_trait]
impl LimitStore for PgStore {
    async fn limit_take(&self, params: LimitTake) -> Result<TakeDecision, StoreError> {
        self.with("taking a call's limits", async {
            let mut client = self.client().await?;
            let tx = client.transaction().await?;
            let result = take(&*tx, &params).await;
            finish(tx, result).await
        })
        .await
    }

    async fn limit_renew(&self, holder: &str, until_ms: i64) -> Result<(), StoreError> {
        self.with("renewing a limit's slot", async {
            let client = self.client().await?;
            client
                .execute(
                    "UPDATE limit_holds SET expires_ms = $1 WHERE holder = $2",
                    &[&until_ms, &holder],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn limit_release(&self, holder: &str) -> Result<(), StoreError> {
        self.with("releasing a limit's slot", async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM limit_holds WHERE holder = $1", &[&holder])
                .await?;
            Ok(())
        })
        .await
    }

    async fn limit_holders(&self, key: &str, now_ms: i64) -> Result<u32, StoreError> {
        self.with("counting a limit's holders", async {
            let client = self.client().await?;
            let row = client
                .query_one(
                    "SELECT COUNT(*) FROM limit_holds WHERE limit_key = $1 AND expires_ms > $2",
                    &[&key, &now_ms],
                )
                .await?;
            Ok(u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX))
        })
        .await
    }
}

/// The take inside its transaction.
async fn take(tx: &impl GenericClient, params: &LimitTake) -> Result<TakeDecision, Failure> {
    let mut reads = Vec::with_capacity(params.limits.len());
    for (key, rule) in &params.limits {
        // Serialises every taker of this key on every node until the commit.
        tx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            &[key],
        )
        .await?;
        // A hold whose lease ran out is a holder that died: its slot comes back.
        tx.execute(
            "DELETE FROM limit_holds WHERE limit_key = $1 AND expires_ms <= $2",
            &[key, &params.now_ms],
        )
        .await?;
        let holders = match rule.concurrency {
            Some(_) => {
                let row = tx
                    .query_one(
                        "SELECT COUNT(*) FROM limit_holds WHERE limit_key = $1",
                        &[key],
                    )
                    .await?;
                u32::try_from(row.get::<_, i64>(0)).unwrap_or(u32::MAX)
            }
            None => 0,
        };
        let bucket = match rule.rate_per_second {
            Some(_) => tx
                .query_opt(
                    "SELECT tokens, refilled_ms FROM limit_buckets WHERE limit_key = $1",
                    &[key],
                )
                .await?
                .map(|row| Bucket {
                    tokens: row.get(0),
                    refilled_ms: row.get(1),
                }),
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
            tx.execute(
                "INSERT INTO limit_buckets (limit_key, tokens, refilled_ms) VALUES ($1, $2, $3)
                 ON CONFLICT (limit_key) DO UPDATE SET tokens = excluded.tokens,
                     refilled_ms = excluded.refilled_ms",
                &[key, &bucket.tokens, &bucket.refilled_ms],
            )
            .await?;
        }
        for key in holds {
            tx.execute(
                "INSERT INTO limit_holds (limit_key, holder, expires_ms) VALUES ($1, $2, $3)",
                &[key, &params.holder, &params.hold_until_ms],
            )
            .await?;
        }
    }
    Ok(decision)
}
