//! The error every store call answers with, from the base crate every layer shares.

pub use runwarden_base::{STORE_FAULTS, StoreError, StoreFault, store_errors_seen};
