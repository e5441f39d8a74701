//! The store-postgres integration tests, against a real PostgreSQL 15 (a cluster in a
//! temporary directory, or the one `RUNWARDEN_TEST_PG_URL` names): the conformance suites
//! every backend runs, plus what only several nodes on one database can show.

mod appends;
mod audit_counts;
mod common;
mod conformance;
mod faults;
mod limits;
mod nodes;
mod run_counts;
mod secrets_version;
