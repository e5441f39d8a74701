//! `CatalogueStore` for PostgreSQL: the imported tool catalogue (M8-M10) and
//! per-server liveness (M11).

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_mcp::{
    CatalogueEntry, CatalogueStore, Contact, Effect, KnownProtocol, SchemaStatus, ServerHealth,
};
use tokio_postgres::Row;

use crate::PgStore;
use crate::failure::{Failure, finish};

const TOOL_COLUMNS: &str = "server, remote_name, local_name, description, effect, schema_json, refusal, imported_ms, output_schema_json";

const REPLACING: &str = "replacing a server's tool catalogue";

/// Serialises catalogue replacements across nodes ("rwcatlog" in ASCII): the check that a
/// local name is free and the insert must not interleave with another server's import.
const CATALOGUE_LOCK: i64 = 0x7277_6361_746c_6f67;

#[async_trait]
impl CatalogueStore for PgStore {
    async fn catalogue_replace(
        &self,
        server: &str,
        entries: Vec<CatalogueEntry>,
    ) -> Result<(), StoreError> {
        self.with(REPLACING, async {
            let rows = runwarden_mcp::stored_catalogue(server, &entries)
                .map_err(|message| StoreError::new(REPLACING, message))?;
            let mut client = self.client().await?;
            // One transaction: another node sees the old catalogue or the new one, never a
            // half-replaced mix. Any early return drops it, which rolls back.
            let tx = client.transaction().await?;
            let result = async {
                tx.execute("SELECT pg_advisory_xact_lock($1)", &[&CATALOGUE_LOCK])
                    .await?;
                tx.execute("DELETE FROM mcp_tools WHERE server = $1", &[&server])
                    .await?;
                let owner_of = tx
                    .prepare("SELECT server FROM mcp_tools WHERE local_name = $1")
                    .await?;
                let insert = tx
                    .prepare(&format!(
                        "INSERT INTO mcp_tools ({TOOL_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)"
                    ))
                    .await?;
                for (entry, row) in entries.iter().zip(&rows) {
                    // M9: local names are unique across servers. Name the owner rather than
                    // surfacing a bare unique-constraint failure.
                    if let Some(owner) = tx.query_opt(&owner_of, &[&entry.local_name]).await? {
                        let owner: String = owner.try_get(0)?;
                        return Err(StoreError::new(
                            REPLACING,
                            format!(
                                "local name {} is already used by server {owner}: rename one of the servers",
                                entry.local_name
                            ),
                        )
                        .into());
                    }
                    tx.execute(
                        &insert,
                        &[
                            &entry.server,
                            &entry.remote_name,
                            &entry.local_name,
                            &entry.description,
                            &entry.effect.as_str(),
                            &row.schema_json,
                            &row.refusal,
                            &entry.imported_ms,
                            &row.output_schema_json,
                        ],
                    )
                    .await?;
                }
                Ok(())
            }
            .await;
            finish(tx, result).await
        })
        .await
    }

    async fn catalogue_list(
        &self,
        server: Option<&str>,
    ) -> Result<Vec<CatalogueEntry>, StoreError> {
        self.with("listing the tool catalogue", async {
            let client = self.client().await?;
            let stmt = client
                .prepare_cached(&format!(
                    "SELECT {TOOL_COLUMNS} FROM mcp_tools
                     WHERE $1::TEXT IS NULL OR server = $1
                     ORDER BY server, local_name"
                ))
                .await?;
            let rows = client.query(&stmt, &[&server]).await?;
            rows.iter().map(catalogue_entry).collect()
        })
        .await
    }

    async fn catalogue_version(&self) -> Result<Option<u64>, StoreError> {
        self.with("reading the catalogue's version", async {
            let client = self.client().await?;
            // A plain read takes no lock, and its snapshot holds every transaction
            // committed before it began.
            let stmt = client
                .prepare_cached("SELECT version FROM catalogue_version WHERE id = 1")
                .await?;
            let version: i64 = client.query_one(&stmt, &[]).await?.try_get(0)?;
            Ok(Some(version.cast_unsigned()))
        })
        .await
    }

    async fn health_record(&self, server: &str, contact: Contact) -> Result<(), StoreError> {
        self.with("recording a server's health", async {
            let client = self.client().await?;
            // M11: a success keeps the last failure (and its error) and vice versa.
            match contact {
                Contact::Success { at_ms } => {
                    client
                        .execute(
                            "INSERT INTO mcp_health (server, last_success_ms) VALUES ($1, $2)
                             ON CONFLICT (server) DO UPDATE SET last_success_ms = excluded.last_success_ms",
                            &[&server, &at_ms],
                        )
                        .await?
                }
                Contact::Failure { at_ms, error } => {
                    client
                        .execute(
                            "INSERT INTO mcp_health (server, last_failure_ms, last_error) VALUES ($1, $2, $3)
                             ON CONFLICT (server) DO UPDATE SET
                                 last_failure_ms = excluded.last_failure_ms, last_error = excluded.last_error",
                            &[&server, &at_ms, &error],
                        )
                        .await?
                }
            };
            Ok(())
        })
        .await
    }

    async fn health_list(&self) -> Result<Vec<ServerHealth>, StoreError> {
        self.with("listing server health", async {
            let client = self.client().await?;
            let rows = client
                .query(
                    "SELECT server, last_success_ms, last_failure_ms, last_error
                     FROM mcp_health ORDER BY server",
                    &[],
                )
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(ServerHealth {
                        server: row.try_get(0)?,
                        last_success_ms: row.try_get(1)?,
                        last_failure_ms: row.try_get(2)?,
                        last_error: row.try_get(3)?,
                    })
                })
                .collect()
        })
        .await
    }

    async fn protocol_get(&self, server: &str) -> Result<Option<KnownProtocol>, StoreError> {
        self.with("reading what a server speaks", async {
            let client = self.client().await?;
            let row = client
                .query_opt(
                    "SELECT url, protocol, tools, until_ms FROM mcp_protocol WHERE server = $1",
                    &[&server],
                )
                .await?;
            let Some(row) = row else { return Ok(None) };
            Ok(Some(KnownProtocol {
                url: row.try_get(0)?,
                protocol: row.try_get(1)?,
                tools: row.try_get(2)?,
                until_ms: row.try_get(3)?,
            }))
        })
        .await
    }

    async fn protocol_put(&self, server: &str, known: KnownProtocol) -> Result<(), StoreError> {
        self.with("remembering what a server speaks", async {
            let client = self.client().await?;
            client
                .execute(
                    "INSERT INTO mcp_protocol (server, url, protocol, tools, until_ms) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (server) DO UPDATE SET url = excluded.url, protocol = excluded.protocol,
                         tools = excluded.tools, until_ms = excluded.until_ms",
                    &[&server, &known.url, &known.protocol, &known.tools, &known.until_ms],
                )
                .await?;
            Ok(())
        })
        .await
    }

    async fn protocol_forget(&self, server: &str) -> Result<(), StoreError> {
        self.with("forgetting what a server speaks", async {
            let client = self.client().await?;
            client
                .execute("DELETE FROM mcp_protocol WHERE server = $1", &[&server])
                .await?;
            Ok(())
        })
        .await
    }
}

fn catalogue_entry(row: &Row) -> Result<CatalogueEntry, Failure> {
    let local_name: String = row.try_get(2)?;
    let corrupt = |what: String| Failure::Corrupt(format!("tool {local_name} {what}"));
    let effect_text: String = row.try_get(4)?;
    let effect = Effect::parse(&effect_text)
        .ok_or_else(|| corrupt(format!("has unknown effect {effect_text:?}")))?;
    let schema_json: Option<String> = row.try_get(5)?;
    let refusal: Option<String> = row.try_get(6)?;
    let schema = match (schema_json, refusal) {
        (Some(json), None) => SchemaStatus::Usable(
            serde_json::from_str(&json)
                .map_err(|e| corrupt(format!("has a schema that is not JSON ({e})")))?,
        ),
        (None, Some(reason)) => SchemaStatus::Refused(reason),
        _ => {
            return Err(corrupt(
                "has both or neither of a schema and a refusal".into(),
            ));
        }
    };
    let output_schema_json: Option<String> = row.try_get(8)?;
    let output_schema = output_schema_json
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| corrupt(format!("has an output schema that is not JSON ({e})")))?;
    Ok(CatalogueEntry {
        output_schema,
        server: row.try_get(0)?,
        remote_name: row.try_get(1)?,
        description: row.try_get(3)?,
        effect,
        schema,
        imported_ms: row.try_get(7)?,
        local_name,
    })
}
