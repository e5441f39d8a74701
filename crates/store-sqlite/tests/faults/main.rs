//! What only the operating system shows about the store: its system calls, watched with
//! `strace` (`apt-get install strace`, and ptrace allowed). `bash .ci/run` installs it.
//! Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden-store-sqlite --test faults`; without strace it fails at once,
//! saying so.

#[allow(dead_code)] // the fast target's helpers; some serve it only
#[path = "../common.rs"]
mod common;

mod fence_durable;
