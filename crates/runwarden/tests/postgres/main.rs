//! The binary on PostgreSQL: several processes and nodes on one database, and its faults.
//! Uses the server `RUNWARDEN_TEST_PG_URL` names (`bash .ci/run` starts one with
//! `scripts/pg-test-cluster.sh`), else starts a throwaway cluster with PostgreSQL's own
//! `initdb` (`apt-get install postgresql-15`). Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test postgres`.

// The fast target's scratch installations, servers and API clients. `api` and `worker` are
// compiled here for their helpers; their own tests run in the fast target, and
// `.config/nextest.toml` keeps them from running twice.
#[allow(dead_code)] // helpers of other targets too
#[path = "../api.rs"]
mod api;
#[allow(dead_code)] // helpers of other targets too
#[path = "../support.rs"]
mod support;
#[allow(dead_code)] // helpers of other targets too
#[path = "../worker.rs"]
mod worker;

mod backend;
mod nodes;
mod pg_faults;
mod secret_freshness;
