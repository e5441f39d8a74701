//! The binary against real peers: the official Python MCP SDK and fastmcp
//! (`RUNWARDEN_PEER_PYTHON`, from `scripts/peer-venv.sh`), the official MCP conformance
//! suite on Node (`RUNWARDEN_CONFORMANCE_DIR`, from `scripts/conformance.sh`) and the
//! OpenAPI validator (`RUNWARDEN_OPENAPI_PYTHON`, from `scripts/openapi-venv.sh`).
//! `bash .ci/run` sets all three. Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test peer`.

// The scratch installations, servers and clients every target of the binary shares.
#[allow(dead_code)] // some helpers serve other targets only
#[path = "../support/mod.rs"]
mod support;

mod api_description;
mod conformance_suite;
mod decisions;
mod fastmcp;
mod gateway;
mod gateway_conformance;
mod limits;
mod mrtr;
mod policy;
mod stdio;
mod wire;
