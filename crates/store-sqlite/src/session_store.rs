//! `SessionStore` for SQLite: console sessions by the SHA-256 of their id (O4),
//! answered only while unexpired and while their token is not revoked.

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_vault::{ApiToken, ConsoleSession, Role, SessionStore};
use rusqlite::{OptionalExtension, params};

use crate::SqliteStore;
use crate::failure::Failure;

#[async_trait]
impl SessionStore for SqliteStore {
    async fn session_insert(
        &self,
        hash: [u8; 32],
        token_id: &str,
        created_ms: i64,
        expires_ms: i64,
    ) -> Result<(), StoreError> {
        let token_id = token_id.to_owned();
        self.run("opening a console session", move |conn| {
            conn.execute(
                "INSERT INTO console_sessions (hash, token_id, created_ms, expires_ms) VALUES (?1, ?2, ?3, ?4)",
                params![hash.as_slice(), token_id, created_ms, expires_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn session_find(
        &self,
        hash: [u8; 32],
        now_ms: i64,
    ) -> Result<Option<ConsoleSession>, StoreError> {
        self.run("checking a console session", move |conn| {
            let row: Option<(String, String, String, i64, i64, i64)> = conn
                .query_row(
                    "SELECT t.id, t.name, t.role, t.created_ms, s.created_ms, s.expires_ms
                     FROM console_sessions s JOIN api_tokens t ON t.id = s.token_id
                     WHERE s.hash = ?1 AND s.expires_ms > ?2 AND t.revoked_ms IS NULL",
                    params![hash.as_slice(), now_ms],
                    |row| {
                        Ok((
                            row.get(0)?,
                            row.get(1)?,
                            row.get(2)?,
                            row.get(3)?,
                            row.get(4)?,
                            row.get(5)?,
                        ))
                    },
                )
                .optional()?;
            let Some((id, name, role, token_created, created_ms, expires_ms)) = row else {
                return Ok(None);
            };
            let role = Role::parse(&role).ok_or_else(|| {
                Failure::Corrupt(format!("token {id} has an unknown role {role:?}"))
            })?;
            Ok(Some(ConsoleSession {
                token: ApiToken {
                    id,
                    name,
                    role,
                    created_ms: token_created,
                },
                created_ms,
                expires_ms,
            }))
        })
        .await
    }

    async fn session_delete(&self, hash: [u8; 32]) -> Result<bool, StoreError> {
        self.run("ending a console session", move |conn| {
            Ok(conn.execute(
                "DELETE FROM console_sessions WHERE hash = ?1",
                [hash.as_slice()],
            )? == 1)
        })
        .await
    }

    async fn session_purge(&self, now_ms: i64) -> Result<u64, StoreError> {
        self.run("purging expired console sessions", move |conn| {
            let n = conn.execute(
                "DELETE FROM console_sessions WHERE expires_ms <= ?1",
                [now_ms],
            )?;
            Ok(n as u64)
        })
        .await
    }
}
