//! One conformance suite that every runwarden store backend runs, so the vault can rely on
//! exactly what it checks.
//!
//! [`exercise_vault_store`] takes a fresh, empty
//! [`VaultStore`](runwarden_vault::store::VaultStore) and runs a list of small checks, each
//! named after the property it guards (V1 for sealed records, V7 for the audit
//! log). A backend's tests call it once:
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
//!
//! [`exercise_catalogue_store`] does the same for a fresh
//! [`CatalogueStore`](runwarden_mcp::CatalogueStore): the imported MCP tool catalogue
//! (M8-M10) and per-server liveness (M11).
//!
//! [`exercise_run_store`] does the same for a fresh
//! [`RunStore`](runwarden_runtime::store::RunStore): runs and their events (R1), the
//! lease (R3), the cancel (R4), the boundary step after a cancel (R5), the status probe
//! (R6) and the write fence (R7).
//!
//! [`exercise_queue_store`] does the same for a fresh
//! [`QueueStore`](runwarden_runtime::queue::QueueStore): the worker's claim (R3), requeue
//! and dead-letter, and the reaper's rescue of stale runs (R9), and that every committed
//! run change reaches the store's change feed (O6).
//!
//! [`exercise_decision_store`] checks operator decisions (R12) on a fresh store: asking
//! parks the run, answers are guarded (two racing leave one), a cancel wins, expiry.
//!
//! [`exercise_session_store`] checks console sessions (O4): found by id only, ended by
//! expiry, sign-out and the token's revocation.
//!
//! [`exercise_secret_freshness`] takes two handles of one fresh database (two processes,
//! two nodes) and checks that a secret changed through one is searched for by the next
//! call of a vault on the other.
//!
//! [`exercise_limit_store`] takes two handles of one fresh database and checks limits
//! (R14): K holders across both, a release or a lapsed lease frees a slot, a shared token
//! bucket, a take all or none, racing takes never over K.

#![deny(missing_docs)]

pub use catalogue::exercise_catalogue_store;
pub use decisions::exercise_decision_store;
pub use limits::exercise_limit_store;
pub use queue::exercise_queue_store;
pub use runs::exercise_run_store;
pub use secrets_version::exercise_secret_freshness;
pub use sessions::exercise_session_store;
pub use tokens::exercise_token_store;
pub use vault::exercise_vault_store;

mod catalogue;
mod decisions;
mod epochs;
mod finals;
mod keys;
mod limits;
mod queue;
mod runs;
mod secrets_version;
mod sessions;
mod tokens;
mod vault;

/// The claim epoch run `id` holds now (0 when there is no such run): what the segment
/// that holds it now would carry. The checks of the owner guard use it, so that only the
/// owner decides; the epoch checks build their own.
pub(crate) async fn epoch_of(store: &dyn runwarden_runtime::RunStore, id: impl AsRef<str>) -> i64 {
    store
        .run_get(id.as_ref())
        .await
        .expect("run_get")
        .map_or(0, |run| run.claim_epoch)
}
