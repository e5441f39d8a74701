//! Both providers against a real model server: llama.cpp's `llama-server` with
//! SmolLM2-135M. Needs `RUNWARDEN_LLAMA_DIR` (what `scripts/llama-server.sh` prints last;
//! `bash .ci/run` sets it). Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden-models --test llama`.

#[path = "../support/mod.rs"]
mod support;

mod llama;
