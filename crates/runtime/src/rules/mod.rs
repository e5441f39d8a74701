//! The domain rules every store backend applies, written once as plain functions over
//! plain values (the row as read, the request, the time) and tested without a database.
//!
//! A store runs the SQL (the guarded updates, the row locks, the transactions) and maps
//! rows; whenever it must decide something from what it read (what a cancel answers, why
//! an answer was refused, what a lost guard means), it asks these functions, so SQLite
//! and PostgreSQL cannot drift apart.
//!
//! - [`runs`]: a run's birth, the cancel, and the endings a segment may write.
//! - [`decisions`]: when an answer is refused, and what an answer does to its run.
//! - [`claims`]: claim epochs and what applying a retry decision answers.
//! - [`rows`]: what a stored run or decision must hold to be read back.
//! - [`origin`]: what may be a run's tag.
//! - [`limits`]: token buckets and concurrency limits, taken all or none.

pub mod claims;
pub mod decisions;
pub mod limits;
pub mod origin;
pub mod rows;
pub mod runs;

pub use origin::check_tags;
