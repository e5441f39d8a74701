//! The runtime's integration tests: a real SQLite store, real MCP and model servers on
//! 127.0.0.1, the vault in between.

mod support;

mod bind;
mod budget;
mod cancel;
mod decisions;
mod delivery;
mod events;
mod faults;
mod lease;
mod limits;
mod progress;
mod queue;
mod runs;
mod signal;
