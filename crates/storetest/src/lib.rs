//! One conformance suite that every runwarden store backend runs, so the vault can rely on
//! exactly what it checks.
//!
//! [`exercise_vault_store`] takes a fresh, empty [`VaultStore`] and runs a list of small
//! checks, each named after the property it guards (SPEC V1 for sealed records, SPEC V7
//! for the audit log). A backend's tests call it once:
//!
//! ```no_run
//! use std::sync::Arc;
//! use runwarden_vault::store::VaultStore;
//!
//! // In a backend's `#[tokio::test(flavor = "multi_thread")]`, on a fresh database:
//! async fn conformance(fresh_store: Arc<dyn VaultStore>) {
//!     runwarden_storetest::exercise_vault_store(fresh_store).await;
//! }
//! ```

#![deny(missing_docs)]

pub use vault::exercise_vault_store;

mod vault;
