//! The binary against real peers: the official Python MCP SDK and fastmcp
//! (`RUNWARDEN_PEER_PYTHON`, from `scripts/peer-venv.sh`), the official MCP conformance
//! suite on Node (`RUNWARDEN_CONFORMANCE_DIR`, from `scripts/conformance.sh`) and the
//! OpenAPI validator (`RUNWARDEN_OPENAPI_PYTHON`, from `scripts/openapi-venv.sh`).
//! `bash .ci/run` sets all three. Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test peer`.

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

mod api_description;
mod conformance_suite;
mod decisions;
mod fastmcp;
mod mrtr;
mod wire;
