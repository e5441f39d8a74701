//! Local MCP servers spoken to over stdin and stdout: their configuration, the sandbox
//! they run in and the process that serves them.

mod config;
mod link;
mod process;
mod sandbox;

pub use config::{
    ChildLimits, DEFAULT_CANCEL_GRACE, DEFAULT_MEMORY_MB, DEFAULT_OPEN_FILES, EnvValue, Lifetime,
    SandboxMode, StdioConfig,
};
pub use process::EGRESS_PROXY_PORT;

/// Whether this kernel gives a local server its sandbox (user and network namespaces),
/// tried once in a throwaway process; the error says what failed and what to do.
pub fn sandbox_available() -> Result<(), String> {
    sandbox::probe().map_err(|e| e.to_string())
}
pub(crate) use process::{LocalServer, Process};
