//! Limits on outbound calls (R14): concurrency and rate per MCP server, per tool, per model,
//! per agent and per API token (of the runs it started), shared by every process on the
//! store.
//!
//! [`Limits`] is the configuration: which limits exist and how long a call may wait. A
//! call is subject to every limit whose scope matches it ([`Limits::for_tool`],
//! [`Limits::for_model`]); the [`Limiter`] takes them all or none in one short store
//! transaction ([`LimitStore::limit_take`], deciding by `rules::limits`), and a call that
//! finds one full waits, woken by a release in this process, a bounded poll for other
//! processes, or the run's cancel. A [`Hold`] on a concurrency limit is a row with a lease
//! the holder renews while the call runs, so a crashed holder's slot comes back; it is let
//! go on every path, a drop included.

mod config;
mod hold;
mod limiter;
mod store;

pub use config::{DEFAULT_HOLD_LEASE, DEFAULT_MAX_WAIT, Limit, LimitKey, LimitKind, Limits};
pub use hold::Hold;
pub use limiter::{
    DEFAULT_POLL, Full, LimitObserver, LimitPlan, LimitStop, Limiter, TakeAttempt, WaitEnd,
};
pub use store::{LimitStore, LimitTake};
