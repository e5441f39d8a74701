//! `CatalogueStore` for SQLite: the imported tool catalogue (M8-M10) and per-server
//! liveness (M11).

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_mcp::{
    CatalogueEntry, CatalogueStore, Contact, Effect, KnownProtocol, SchemaStatus, ServerHealth,
};
use rusqlite::types::Value;
use rusqlite::{OptionalExtension, Row, TransactionBehavior, params, params_from_iter};

use crate::SqliteStore;
use crate::failure::Failure;

const TOOL_COLUMNS: &str = "server, remote_name, local_name, description, effect, schema_json, refusal, imported_ms, output_schema_json";

const REPLACING: &str = "replacing a server's tool catalogue";

#[async_trait]
impl CatalogueStore for SqliteStore {
    async fn catalogue_replace(
        &self,
        server: &str,
        entries: Vec<CatalogueEntry>,
    ) -> Result<(), StoreError> {
        let server = server.to_owned();
        self.run(REPLACING, move |conn| {
            let rows = runwarden_mcp::stored_catalogue(&server, &entries)
                .map_err(|message| StoreError::new(REPLACING, message))?;
            // One immediate transaction: another process sees the old catalogue or the new
            // one, never a half-replaced mix. Any early return drops it, which rolls back.
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute("DELETE FROM mcp_tools WHERE server = ?1", [&server])?;
            for (entry, row) in entries.iter().zip(&rows) {
                // M9: local names are unique across servers. Name the owner rather than
                // surfacing a bare UNIQUE constraint failure.
                let owner: Option<String> = tx
                    .query_row(
                        "SELECT server FROM mcp_tools WHERE local_name = ?1",
                        [&entry.local_name],
                        |r| r.get(0),
                    )
                    .optional()?;
                if let Some(owner) = owner {
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
                    &format!(
                        "INSERT INTO mcp_tools ({TOOL_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)"
                    ),
                    params![
                        entry.server,
                        entry.remote_name,
                        entry.local_name,
                        entry.description,
                        entry.effect.as_str(),
                        row.schema_json,
                        row.refusal,
                        entry.imported_ms,
                        row.output_schema_json,
                    ],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn catalogue_list(
        &self,
        server: Option<&str>,
    ) -> Result<Vec<CatalogueEntry>, StoreError> {
        let server = server.map(str::to_owned);
        // On the read-only probe connection: every run binds its tools from this list, and
        // the read need not queue behind the writes of the runs in flight.
        self.probe("listing the tool catalogue", move |conn| {
            let mut sql = format!("SELECT {TOOL_COLUMNS} FROM mcp_tools");
            let mut args: Vec<Value> = Vec::new();
            if let Some(server) = server {
                args.push(server.into());
                sql.push_str(" WHERE server = ?1");
            }
            sql.push_str(" ORDER BY server, local_name");
            let mut stmt = conn.prepare_cached(&sql)?;
            let rows = stmt
                .query_map(params_from_iter(args), tool_columns)?
                .collect::<Result<Vec<_>, _>>()?;
            rows.into_iter().map(catalogue_entry).collect()
        })
        .await
    }

    async fn catalogue_version(&self) -> Result<Option<u64>, StoreError> {
        // Every run asks before it binds its tools: on the caller's thread when it can be,
        // else on the read-only probe connection, never behind the writes.
        self.quick_read("reading the catalogue's version", |conn| {
            let version: i64 = conn
                .prepare_cached("SELECT version FROM catalogue_version WHERE id = 1")?
                .query_row([], |row| row.get(0))?;
            Ok(Some(version.cast_unsigned()))
        })
        .await
    }

    async fn health_record(&self, server: &str, contact: Contact) -> Result<(), StoreError> {
        let server = server.to_owned();
        self.run("recording a server's health", move |conn| {
            // M11: a success keeps the last failure (and its error) and vice versa.
            match contact {
                Contact::Success { at_ms } => conn.execute(
                    "INSERT INTO mcp_health (server, last_success_ms) VALUES (?1, ?2)
                     ON CONFLICT (server) DO UPDATE SET last_success_ms = excluded.last_success_ms",
                    params![server, at_ms],
                )?,
                Contact::Failure { at_ms, error } => conn.execute(
                    "INSERT INTO mcp_health (server, last_failure_ms, last_error) VALUES (?1, ?2, ?3)
                     ON CONFLICT (server) DO UPDATE SET
                         last_failure_ms = excluded.last_failure_ms, last_error = excluded.last_error",
                    params![server, at_ms, error],
                )?,
            };
            Ok(())
        })
        .await
    }

    async fn health_list(&self) -> Result<Vec<ServerHealth>, StoreError> {
        self.run("listing server health", |conn| {
            let mut stmt = conn.prepare(
                "SELECT server, last_success_ms, last_failure_ms, last_error
                 FROM mcp_health ORDER BY server",
            )?;
            let rows = stmt.query_map([], |row| {
                Ok(ServerHealth {
                    server: row.get(0)?,
                    last_success_ms: row.get(1)?,
                    last_failure_ms: row.get(2)?,
                    last_error: row.get(3)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn protocol_get(&self, server: &str) -> Result<Option<KnownProtocol>, StoreError> {
        let server = server.to_owned();
        self.run("reading what a server speaks", move |conn| {
            Ok(conn
                .query_row(
                    "SELECT url, protocol, tools, until_ms FROM mcp_protocol WHERE server = ?1",
                    [&server],
                    |row| {
                        Ok(KnownProtocol {
                            url: row.get(0)?,
                            protocol: row.get(1)?,
                            tools: row.get(2)?,
                            until_ms: row.get(3)?,
                        })
                    },
                )
                .optional()?)
        })
        .await
    }

    async fn protocol_put(&self, server: &str, known: KnownProtocol) -> Result<(), StoreError> {
        let server = server.to_owned();
        self.run("remembering what a server speaks", move |conn| {
            conn.execute(
                "INSERT INTO mcp_protocol (server, url, protocol, tools, until_ms) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (server) DO UPDATE SET url = excluded.url, protocol = excluded.protocol,
                     tools = excluded.tools, until_ms = excluded.until_ms",
                params![server, known.url, known.protocol, known.tools, known.until_ms],
            )?;
            Ok(())
        })
        .await
    }

    async fn protocol_forget(&self, server: &str) -> Result<(), StoreError> {
        let server = server.to_owned();
        self.run("forgetting what a server speaks", move |conn| {
            conn.execute("DELETE FROM mcp_protocol WHERE server = ?1", [&server])?;
            Ok(())
        })
        .await
    }
}

/// A catalogue row as read, before its effect and schema are checked.
struct ToolColumns {
    server: String,
    remote_name: String,
    local_name: String,
    description: Option<String>,
    effect: String,
    schema_json: Option<String>,
    refusal: Option<String>,
    imported_ms: i64,
    output_schema_json: Option<String>,
}

fn tool_columns(row: &Row<'_>) -> rusqlite::Result<ToolColumns> {
    Ok(ToolColumns {
        server: row.get(0)?,
        remote_name: row.get(1)?,
        local_name: row.get(2)?,
        description: row.get(3)?,
        effect: row.get(4)?,
        schema_json: row.get(5)?,
        refusal: row.get(6)?,
        imported_ms: row.get(7)?,
        output_schema_json: row.get(8)?,
    })
}

fn catalogue_entry(c: ToolColumns) -> Result<CatalogueEntry, Failure> {
    let corrupt = |what: String| Failure::Corrupt(format!("tool {} {what}", c.local_name));
    let effect = Effect::parse(&c.effect)
        .ok_or_else(|| corrupt(format!("has unknown effect {:?}", c.effect)))?;
    let schema = match (&c.schema_json, &c.refusal) {
        (Some(json), None) => SchemaStatus::Usable(
            serde_json::from_str(json)
                .map_err(|e| corrupt(format!("has a schema that is not JSON ({e})")))?,
        ),
        (None, Some(reason)) => SchemaStatus::Refused(reason.clone()),
        _ => {
            return Err(corrupt(
                "has both or neither of a schema and a refusal".into(),
            ));
        }
    };
    let output_schema = c
        .output_schema_json
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| corrupt(format!("has an output schema that is not JSON ({e})")))?;
    Ok(CatalogueEntry {
        output_schema,
        server: c.server,
        local_name: c.local_name,
        remote_name: c.remote_name,
        description: c.description,
        effect,
        schema,
        imported_ms: c.imported_ms,
    })
}
