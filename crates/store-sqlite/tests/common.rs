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
