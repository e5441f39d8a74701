//! `TokenStore` for SQLite: API tokens by the SHA-256 of their value (O2).

use async_trait::async_trait;
use runwarden_vault::store::{StoreError, TokenStore};
use runwarden_vault::{ApiToken, Role};
use rusqlite::{OptionalExtension, params};

use crate::SqliteStore;
use crate::failure::Failure;

fn token_row(id: String, name: String, role: String, created_ms: i64) -> Result<ApiToken, Failure> {
    let role = Role::parse(&role)
        .ok_or_else(|| Failure::Corrupt(format!("token {id} has an unknown role {role:?}")))?;
    Ok(ApiToken {
        id,
        name,
        role,
        created_ms,
    })
}

#[async_trait]
impl TokenStore for SqliteStore {
    async fn token_insert(&self, token: ApiToken, hash: [u8; 32]) -> Result<(), StoreError> {
        self.run("storing an API token", move |conn| {
            conn.execute(
                "INSERT INTO api_tokens (id, name, role, hash, created_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![token.id, token.name, token.role.as_str(), hash.as_slice(), token.created_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn token_find(&self, hash: [u8; 32]) -> Result<Option<ApiToken>, StoreError> {
        self.run("checking an API token", move |conn| {
            let row = conn
                .query_row(
                    "SELECT id, name, role, created_ms FROM api_tokens WHERE hash = ?1 AND revoked_ms IS NULL",
                    [hash.as_slice()],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
                )
                .optional()?;
            if row.is_none() {
                // A miss is checked once more past the index: a damaged index answers "no
                // such token" for a live one, and a damaged database must never read as an
                // authentication failure. The table is small; only misses pay for it.
                let scanned: Option<i64> = conn
                    .query_row(
                        "SELECT id FROM api_tokens NOT INDEXED WHERE hash = ?1 AND revoked_ms IS NULL",
                        [hash.as_slice()],
                        |row| row.get(0),
                    )
                    .optional()?;
                if scanned.is_some() {
                    return Err(Failure::Corrupt(
                        "the index of API tokens disagrees with their table".into(),
                    ));
                }
            }
            row.map(|(id, name, role, created)| token_row(id, name, role, created)).transpose()
        })
        .await
    }

    async fn token_list(&self) -> Result<Vec<ApiToken>, StoreError> {
        self.run("listing API tokens", |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT id, name, role, created_ms FROM api_tokens WHERE revoked_ms IS NULL ORDER BY created_ms, id",
            )?;
            let rows = stmt
                .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(|(id, name, role, created)| token_row(id, name, role, created)).collect()
        })
        .await
    }

    async fn token_revoke(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_owned();
        self.run("revoking an API token", move |conn| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            Ok(conn.execute(
                "UPDATE api_tokens SET revoked_ms = ?1 WHERE id = ?2 AND revoked_ms IS NULL",
                params![now, id],
            )? == 1)
        })
        .await
    }
}
