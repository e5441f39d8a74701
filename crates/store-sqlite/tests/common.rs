//! Helpers shared by the integration tests: a database file in its own temp dir.

use std::path::PathBuf;
use std::sync::Arc;

use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::audit::{AuditChain, AuditEvent, action};

/// A fresh database path that disappears with the value.
pub(crate) struct TempDb {
    _dir: tempfile::TempDir,
    pub(crate) path: PathBuf,
}

impl TempDb {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.db");
        Self { _dir: dir, path }
    }

    /// A store on this file: each call is one more connection, like one more process.
    pub(crate) fn open(&self) -> SqliteStore {
        SqliteStore::open(&self.path).unwrap()
    }

    /// Puts the schema back to `version`, as a build before the later migrations left it,
    /// keeping the rows of the tables it had. Each migration a test undoes is listed here.
    pub(crate) fn schema_back_to(&self, version: i64) {
        let undo = [
            (
                23,
                "DROP TRIGGER audit_row_removed; DROP TRIGGER audit_row_action_changed;
                 DROP TABLE audit_counts; DROP TABLE audit_counted;",
            ),
            (
                24,
                "DROP TRIGGER run_state_changed; DROP TRIGGER run_removed;
                 DROP TRIGGER run_inserted_ended; DROP TABLE run_counts;",
            ),
        ];
        let raw = self.raw();
        for (_, sql) in undo.iter().rev().filter(|(v, _)| *v > version) {
            raw.execute_batch(sql).unwrap();
        }
        raw.execute(
            "DELETE FROM schema_migrations WHERE version > ?1",
            [version],
        )
        .unwrap();
    }

    /// A raw connection for doing what an attacker with file access could do.
    pub(crate) fn raw(&self) -> rusqlite::Connection {
        rusqlite::Connection::open(&self.path).unwrap()
    }
}

pub(crate) fn chain() -> Arc<AuditChain> {
    Arc::new(AuditChain::from_audit_key(&[7u8; 32]))
}

pub(crate) fn event(n: i64) -> AuditEvent {
    AuditEvent {
        time_ms: 1_700_000_000_000 + n,
        action: action::HTTP_CALL.into(),
        success: true,
        secret: Some("api_key".into()),
        method: "GET".into(),
        host: "api.example.com".into(),
        path: format!("/items/{n}"),
        status: 200,
        duration_ms: 5,
        error: None,
        reason: None,
        actor: "cli".into(),
        correlation: Some("run-1".into()),
        intent_id: None,
    }
}
