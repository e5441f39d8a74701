//! The binary on PostgreSQL: several processes and nodes on one database, and its faults.
//! Uses the server `RUNWARDEN_TEST_PG_URL` names (`bash .ci/run` starts one with
//! `scripts/pg-test-cluster.sh`), else starts a throwaway cluster with PostgreSQL's own
//! `initdb` (`apt-get install postgresql-15`). Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test postgres`.

// The scratch installations, servers and clients every target of the binary shares.
#[allow(dead_code)] // some helpers serve other targets only
#[path = "../support/mod.rs"]
mod support;

mod backend;
mod catalogue_freshness;
mod limits;
mod nodes;
mod pg_faults;
mod secret_freshness;
