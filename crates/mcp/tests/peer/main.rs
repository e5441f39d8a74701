//! The MCP client against the real Python MCP peers (the official SDK, 2.x and 1.x), each
//! in its own process on 127.0.0.1. Needs `RUNWARDEN_PEER_PYTHON` and
//! `RUNWARDEN_PEER1_PYTHON` (what `scripts/peer-venv.sh` and `scripts/peer1-venv.sh` print
//! last; `bash .ci/run` sets both). Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden-mcp --test peer`.

#[path = "../support/mod.rs"]
mod support;

mod peer;
mod sandbox;
mod servers;
mod shape;
mod stateless;
mod stdio;
mod wire;
