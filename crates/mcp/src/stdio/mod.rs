//! Local MCP servers spoken to over stdin and stdout: their configuration, the sandbox
//! they run in and the process that serves them.

mod config;
// The process a local server runs as; the stdio process (process.rs) starts it through here.
#[cfg_attr(
    not(test),
    expect(
        dead_code,
        unused_imports,
        reason = "used by the stdio process, which is not written yet"
    )
)]
mod sandbox;

pub use config::{
    ChildLimits, DEFAULT_CANCEL_GRACE, DEFAULT_MEMORY_MB, DEFAULT_OPEN_FILES, EnvValue, Lifetime,
    SandboxMode, StdioConfig,
};
