//! What every runwarden crate shares and none owns: the store error that crosses every
//! layer, the wall clock in the unit every row stores, and server or library text cut to
//! one line for an error message. It depends on nothing of ours, so every crate may use it.

mod store_error;
mod text;
mod time;

pub use store_error::{STORE_FAULTS, StoreError, StoreFault, store_errors_seen};
pub use text::one_line;
pub use time::now_ms;
