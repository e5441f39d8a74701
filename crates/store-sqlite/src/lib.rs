//! The embedded SQLite store behind runwarden's vault: sealed records and the audit log
//! in one local file that `serve`, workers and CLI processes share (O3).
//!
//! [`SqliteStore`] opens (or creates) the database, applies the embedded migrations and
//! implements [`runwarden_vault::store::VaultStore`] and, for the imported MCP tool
//! catalogue and server liveness (M8-M11), [`runwarden_mcp::CatalogueStore`], and,
//! for durable runs and their events (R1-R7), `runwarden_runtime::store::RunStore`,
//! and, for the queue and the reaper (R3, R9), `runwarden_runtime::queue::QueueStore`.
//! It is cheap to clone; every call runs on tokio's blocking pool, except the synchronous
//! run-status probe, which answers at once from a read-only connection of its own (R6),
//! and short reads and unsynced audit rows, which run on the caller's thread when the
//! database is free and nothing would wait for a lock.
//! Its run writes are published on its change feed (O6); what other processes commit to
//! the same file reaches the feed as a resync through the opt-in
//! [`SqliteStore::watch_other_writers`].
//!
//! ```no_run
//! use std::sync::Arc;
//! use runwarden_store_sqlite::SqliteStore;
//! use runwarden_vault::store::{SealedKind, VaultStore};
//!
//! # async fn demo() -> Result<(), runwarden_base::StoreError> {
//! let store = Arc::new(SqliteStore::open_existing("/var/lib/runwarden/runwarden.db")?);
//! for meta in store.sealed_list(SealedKind::Secret).await? {
//!     println!("{}", meta.name);
//! }
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub use connection::{Durability, SqliteStore};
pub use other_writers::OtherWriters;

mod append_batch;
mod append_queue;
mod audit_counts;
mod cached;
mod catalogue_store;
mod checkpoint;
mod confirm;
mod connection;
mod decision_store;
mod failure;
mod final_event;
mod idempotency_store;
mod limit_store;
mod migrate;
mod other_writers;
mod permissions;
#[cfg(test)]
mod plan;
mod publish;
mod queue_store;
mod quick_write;
mod removed;
mod run_store;
mod session_store;
mod token_store;
mod vault_store;
