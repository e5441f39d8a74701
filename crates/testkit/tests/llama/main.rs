//! `scripts/llama-server.sh` and `LlamaServer` with the real model server builds. Installs
//! or compiles the builds it checks (PyPI, GitHub releases), so it is not part of plain
//! `cargo test`: run it with `cargo test -p runwarden-testkit --test llama`.

mod llama_build;
