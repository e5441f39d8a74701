//! The MCP catalogue and liveness tables (M8-M11) on a real file: the conformance
//! suite, the upgrade from a vault-only database, and rows damaged through raw SQL.

use std::sync::Arc;

use runwarden_mcp::{CatalogueEntry, CatalogueStore, Contact, Effect, SchemaStatus};
use runwarden_runtime::migrations::MIGRATIONS;
use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::store::{SealedKind, SealedRecord, VaultStore};
use serde_json::json;

use crate::common::TempDb;

fn entry(server: &str, tool: &str) -> CatalogueEntry {
    CatalogueEntry {
        server: server.into(),
        local_name: format!("{server}__{tool}"),
        remote_name: tool.into(),
        description: None,
        effect: Effect::ReadOnly,
        schema: SchemaStatus::Usable(json!({"type": "object"})),
        output_schema: None,
        imported_ms: 7,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sqlite_store_passes_the_catalogue_conformance_suite() {
    let db = TempDb::new();
    runwarden_storetest::exercise_catalogue_store(Arc::new(db.open())).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vault_only_database_gets_the_mcp_tables_on_open_and_keeps_its_records() {
    let db = TempDb::new();
    {
        // What a build that knew only migration 1 left behind.
        let conn = db.raw();
        conn.execute_batch(
            "CREATE TABLE schema_migrations (
                 version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_ms INTEGER NOT NULL
             );
             INSERT INTO schema_migrations VALUES (1, '0001_vault', 0);",
        )
        .unwrap();
        conn.execute_batch(include_str!("../migrations/0001_vault.sql"))
            .unwrap();
        conn.execute(
            "INSERT INTO sealed VALUES ('secret', 'old', 'xchacha20poly1305', 1, 'mk-1', x'01', x'02', x'03', x'04', 1, 2)",
            [],
        )
        .unwrap();
    }
    let store = SqliteStore::open_existing(&db.path).unwrap();
    let versions: Vec<(i64, String)> = {
        let conn = db.raw();
        let mut stmt = conn
            .prepare("SELECT version, name FROM schema_migrations ORDER BY version")
            .unwrap();
        stmt.query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .unwrap()
            .map(Result::unwrap)
            .collect()
    };
    let listed: Vec<(i64, String)> = MIGRATIONS
        .iter()
        .map(|m| (m.version, m.name.to_owned()))
        .collect();
    assert_eq!(versions, listed);
    let old: Option<SealedRecord> = store.sealed_get(SealedKind::Secret, "old").await.unwrap();
    assert_eq!(old.map(|r| r.ciphertext), Some(vec![4]));
    store
        .catalogue_replace("tickets", vec![entry("tickets", "search")])
        .await
        .unwrap();
    store
        .health_record("tickets", Contact::Success { at_ms: 1 })
        .await
        .unwrap();
    assert_eq!(store.catalogue_list(None).await.unwrap().len(), 1);
    assert_eq!(store.health_list().await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_catalogue_written_by_one_connection_is_read_by_another() {
    let db = TempDb::new();
    let writer = db.open();
    writer
        .catalogue_replace("tickets", vec![entry("tickets", "search")])
        .await
        .unwrap();
    drop(writer);
    assert_eq!(
        db.open().catalogue_list(Some("tickets")).await.unwrap(),
        [entry("tickets", "search")]
    );
}

/// Stores one good tool, then damages it with `damage` through a raw connection.
async fn damaged(db: &TempDb, damage: &str) -> SqliteStore {
    let store = db.open();
    store
        .catalogue_replace("tickets", vec![entry("tickets", "search")])
        .await
        .unwrap();
    db.raw().execute(damage, []).unwrap();
    store
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_stored_effect_is_a_corrupt_error_not_a_panic() {
    let db = TempDb::new();
    let store = damaged(&db, "UPDATE mcp_tools SET effect = 'harmless'").await;
    let text = store.catalogue_list(None).await.unwrap_err().to_string();
    assert!(text.contains("tickets__search"), "{text}");
    assert!(text.contains("unknown effect \"harmless\""), "{text}");
    assert!(text.contains("the database is corrupt"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_schema_that_is_not_json_is_a_corrupt_error() {
    let db = TempDb::new();
    let store = damaged(&db, "UPDATE mcp_tools SET schema_json = '{\"type\": '").await;
    let text = store
        .catalogue_list(Some("tickets"))
        .await
        .unwrap_err()
        .to_string();
    assert!(text.contains("tickets__search"), "{text}");
    assert!(text.contains("not JSON"), "{text}");
    assert!(text.contains("the database is corrupt"), "{text}");
}

#[test]
fn the_table_holds_exactly_one_of_a_schema_and_a_refusal() {
    let db = TempDb::new();
    drop(db.open());
    let conn = db.raw();
    let insert = "INSERT INTO mcp_tools (server, remote_name, local_name, effect, schema_json, refusal, imported_ms)
                  VALUES ('s', ?1, ?1, 'read_only', ?2, ?3, 0)";
    for (name, schema, refusal) in [("both", Some("{}"), Some("why")), ("neither", None, None)] {
        let error = conn
            .execute(insert, (name, schema, refusal))
            .expect_err(name);
        assert!(error.to_string().contains("CHECK"), "{name}: {error}");
    }
    conn.execute(insert, ("usable", Some("{}"), None::<&str>))
        .unwrap();
    conn.execute(insert, ("refused", None::<&str>, Some("why")))
        .unwrap();
}
