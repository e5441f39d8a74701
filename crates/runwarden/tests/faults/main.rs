//! The binary's storage under faults injected by the operating system: `strace --inject`
//! failing the store's system calls (`apt-get install strace`, and ptrace allowed) and a
//! small tmpfs filled to the last byte (mounting it takes root). `bash .ci/run` runs it as
//! root with strace installed. Not part of plain `cargo test`: run it with
//! `cargo test -p runwarden --test faults`; a missing tool fails it at once, saying so.

// The scratch installations, servers and clients every target of the binary shares.
#[allow(dead_code)] // some helpers serve other targets only
#[path = "../support/mod.rs"]
mod support;

mod os_faults;
