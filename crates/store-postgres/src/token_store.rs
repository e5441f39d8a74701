//! `TokenStore` for PostgreSQL: API tokens by the SHA-256 of their value (O2).

use async_trait::async_trait;
use runwarden_vault::store::{StoreError, TokenStore};
use runwarden_vault::{ApiToken, Role};
use tokio_postgres::Row;

use crate::PgStore;
use crate::failure::Failure;
use crate::migrate::now_ms;

fn token_row(row: &Row) -> Result<ApiToken, Failure> {
    let id: String = row.try_get(0)?;
    let role: String = row.try_get(2)?;
    let role = Role::parse(&role)
        .ok_or_else(|| Failure::Corrupt(format!("token {id} has an unknown role {role:?}")))?;
    Ok(ApiToken {
        id,
        name: row.try_get(1)?,
        role,
        created_ms: row.try_get(3)?,
    })
}

#[async_trait]
impl TokenStore for PgStore {
    async fn token_insert(&self, token: ApiToken, hash: [u8; 32]) -> Result<(), StoreError> {
        self.with("storing an API token", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "INSERT INTO api_tokens (id, name, role, hash, created_ms) VALUES ($1, $2, $3, $4, $5)",
                )
                .await?;
            client
                .execute(
                    &stmt,
                    &[
                        &token.id,
                        &token.name,
                        &token.role.as_str(),
                        &&hash[..],
                        &token.created_ms,
                    ],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn token_find(&self, hash: [u8; 32]) -> Result<Option<ApiToken>, StoreError> {
        self.with("checking an API token", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "SELECT id, name, role, created_ms FROM api_tokens WHERE hash = $1 AND revoked_ms IS NULL",
                )
                .await?;
            let row = client.query_opt(&stmt, &[&&hash[..]]).await?;
            row.as_ref().map(token_row).transpose()
        })
        .await
    }

    async fn token_list(&self) -> Result<Vec<ApiToken>, StoreError> {
        self.with("listing API tokens", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "SELECT id, name, role, created_ms FROM api_tokens WHERE revoked_ms IS NULL ORDER BY created_ms, id",
                )
                .await?;
            let rows = client.query(&stmt, &[]).await?;
            rows.iter().map(token_row).collect()
        })
        .await
    }

    async fn token_revoke(&self, id: &str) -> Result<bool, StoreError> {
        self.with("revoking an API token", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(
                    "UPDATE api_tokens SET revoked_ms = $1 WHERE id = $2 AND revoked_ms IS NULL",
                )
                .await?;
            Ok(client.execute(&stmt, &[&now_ms(), &id]).await? == 1)
        })
        .await
    }
}
