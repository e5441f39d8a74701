//! The web console in a real browser: Debian's chromium driven by playwright-core
//! (`RUNWARDEN_BROWSER_DIR`, from `scripts/browser.sh`), against `runwarden serve` and the
//! Python MCP peer (`RUNWARDEN_PEER_PYTHON`). `bash .ci/run` sets both. Not part of plain
//! `cargo test`: run it with `cargo test -p runwarden --test browser`.

// The scratch installations, servers and clients every target of the binary shares.
#[allow(dead_code)] // some helpers serve other targets only
#[path = "../support/mod.rs"]
mod support;

mod console;
