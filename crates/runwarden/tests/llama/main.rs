//! The binary running agents on a real model server: llama.cpp's `llama-server` with
//! SmolLM2-135M. Needs `RUNWARDEN_LLAMA_DIR` (what `scripts/llama-server.sh` prints last;
//! `bash .ci/run` sets it). Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test llama`.

// The scratch installations, servers and clients every target of the binary shares.
#[allow(dead_code)] // some helpers serve other targets only
#[path = "../support/mod.rs"]
mod support;

mod llama;
