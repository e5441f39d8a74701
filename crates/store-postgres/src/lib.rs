//! The PostgreSQL store behind runwarden's vault, tool catalogue, runs and queue: many
//! nodes share one database (O3 amended).
//!
//! [`PgStore`] connects a pool, applies the embedded migrations (the same numbers and
//! names as SQLite's) under an advisory lock and implements every store seam:
//! [`runwarden_vault::store::VaultStore`] and [`runwarden_vault::store::TokenStore`],
//! [`runwarden_mcp::CatalogueStore`], `runwarden_runtime::store::RunStore` and
//! `runwarden_runtime::queue::QueueStore`. Every racing write is one guarded statement;
//! claims use `FOR UPDATE SKIP LOCKED`; the audit chain is appended under a transaction
//! advisory lock, so writers on every node extend one chain. Triggers `NOTIFY` each
//! committed run change and a listener on a dedicated connection publishes them on the
//! store's change feed, so a change made on any node reaches every node (O6).
//!
//! ```no_run
//! use runwarden_store_postgres::PgStore;
//! use runwarden_vault::store::{SealedKind, VaultStore};
//!
//! # async fn demo() -> Result<(), runwarden_base::StoreError> {
//! let store = PgStore::connect("postgres://runwarden@127.0.0.1:5432/runwarden").await?;
//! store.ready().await?;
//! for meta in store.sealed_list(SealedKind::Secret).await? {
//!     println!("{}", meta.name);
//! }
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

pub use connection::{PgOptions, PgStore};

mod append_batch;
mod append_queue;
mod audit_counts;
mod catalogue_store;
mod connection;
mod decision_store;
mod failure;
mod final_event;
mod flight;
mod idempotency_store;
mod keepalive;
mod limit_store;
mod listener;
mod migrate;
mod queue_store;
mod run_counts;
mod run_store;
mod session_store;
mod token_store;
mod vault_store;
