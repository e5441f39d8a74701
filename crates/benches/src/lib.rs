//! runwarden's benchmarks. Each is a harness-less binary under `benches/` (run one with
//! `cargo bench -p runwarden-benches --bench NAME`); `BENCHMARKS.md` holds their figures
//! and commands. They sit in this crate, above every other, so what they measure against
//! (the official MCP SDK's client, a second reqwest, PostgreSQL) stays out of the product
//! crates' dependencies. This library is empty.
