//! The binary running agents on a real model server: llama.cpp's `llama-server` with
//! SmolLM2-135M. Needs `RUNWARDEN_LLAMA_DIR` (what `scripts/llama-server.sh` prints last;
//! `bash .ci/run` sets it). Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test llama`.

#[allow(dead_code)] // helpers of other targets too
#[path = "../support.rs"]
mod support;

mod llama;
