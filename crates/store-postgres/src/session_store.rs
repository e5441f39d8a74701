//! `SessionStore` for PostgreSQL: console sessions by the SHA-256 of their id (O4),
//! answered only while unexpired and while their token is not revoked.

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_vault::{ApiToken, ConsoleSession, Role, SessionStore};

use crate::PgStore;
use crate::failure::Failure;

#[async_trait]
impl SessionStore for PgStore {
    async fn session_insert(
        &self,
        hash: [u8; 32],
        token_id: &str,
        created_ms: i64,
        expires_ms: i64,
    ) -> Result<(), StoreError> {
        self.with("opening a console session", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "INSERT INTO console_sessions (hash, token_id, created_ms, expires_ms) VALUES ($1, $2, $3, $4)",
                )
                .await?;
            client
                .execute(&stmt, &[&&hash[..], &token_id, &created_ms, &expires_ms])
                .await?;
            Ok(())
        })
        .await
    }

    async fn session_find(
        &self,
        hash: [u8; 32],
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        self.with("checking a console session", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "SELECT t.id, t.name, t.role, t.created_ms, s.created_ms, s.expires_ms
                     FROM console_sessions s JOIN api_tokens t ON t.id = s.token_id
                     WHERE s.hash = $1 AND s.expires_ms > $2 AND t.revoked_ms IS NULL",
                )
                .await?;
            let Some(row) = client.query_opt(&stmt, &[&&hash[..], &now_ms]).await? else {
                return Ok(None);
            };
            let id: String = row.try_get(0)?;
            let role: String = row.try_get(2)?;
            let role = Role::parse(&role).ok_or_else(|| {
                Failure::Corrupt(format!("token {id} has an unknown role {role:?}"))
            })?;
            Ok(Some(ConsoleSession {
                token: ApiToken {
                    id,
                    name: row.try_get(1)?,
                    role,
                    created_ms: row.try_get(3)?,
                },
                created_ms: row.try_get(4)?,
                expires_ms: row.try_get(5)?,
            }))
        })
        .await
    }

    async fn session_delete(&self, hash: [u8; 32]) -> Result<bool, StoreError> {
        self.with("ending a console session", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("DELETE FROM console_sessions WHERE hash = $1")
                .await?;
            Ok(client.execute(&stmt, &[&&hash[..]]).await? == 1)
        })
        .await
    }

    async fn session_purge(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.with("purging expired console sessions", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached("DELETE FROM console_sessions WHERE expires_ms <= $1")
                .await?;
            Ok(client.execute(&stmt, &[&now_ms]).await?)
        })
        .await
    }
}
