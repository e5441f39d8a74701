//! The web console in a real browser: Debian's chromium driven by playwright-core
//! (`RUNWARDEN_BROWSER_DIR`, from `scripts/browser.sh`), against `runwarden serve` and the
//! Python MCP peer (`RUNWARDEN_PEER_PYTHON`). `bash .ci/run` sets both. Not part of plain
//! `cargo test`: run it with `cargo test -p runwarden --test browser`.

// The fast target's scratch installations and API clients. `api` is compiled here for its
// helpers; its own tests run in the fast target, and `.config/nextest.toml` keeps them
// from running twice.
#[allow(dead_code)] // helpers of other targets too
#[path = "../api.rs"]
mod api;
#[allow(dead_code)] // helpers of other targets too
#[path = "../support.rs"]
mod support;

mod console;
