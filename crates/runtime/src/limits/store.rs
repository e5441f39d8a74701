//! The limit store seam (R14): holds with leases and token buckets, shared by every process
//! on the store. Backends run SQL only; what a take decides comes from `rules::limits`.

use async_trait::async_trait;
use runwarden_base::StoreError;

use crate::rules::limits::{LimitRule, TakeDecision};

/// A take of every limit one call is subject to.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitTake {
    /// This take's holder id (unique per call).
    pub holder: String,
    /// The limits by stored key, in the one order they are locked and taken.
    pub limits: Vec<(String, LimitRule)>,
    /// Now, Unix milliseconds UTC.
    pub now_ms: i64,
    /// The lease of the holds it takes.
    pub hold_until_ms: i64,
}

/// Where limits are kept. Implemented by every store backend; `runwarden-storetest`
/// checks each one.
#[async_trait]
pub trait LimitStore: Send + Sync {
    /// In one transaction, with every key locked in the given order: drops the expired
    /// holds of the keys, counts the live ones, reads the buckets, asks
    /// `rules::limits::decide`, and stores what it says (the buckets and one hold per
    /// concurrency-limited key under `holder`). Returns the decision.
    async fn limit_take(&self, params: LimitTake) -> Result<TakeDecision, StoreError>;

    /// Moves the lease of every hold of `holder` to `until_ms`.
    async fn limit_renew(&self, holder: &str, until_ms: i64) -> Result<(), StoreError>;

    /// Drops every hold of `holder`.
    async fn limit_release(&self, holder: &str) -> Result<(), StoreError>;

    /// The live holds of a stored key at `now_ms` (for tests and the operator).
    async fn limit_holders(&self, key: &str, now_ms: i64) -> Result<u32, StoreError>;
}
