//! Local MCP servers spoken to over stdin and stdout: their configuration, the sandbox
//! they run in and the process that serves them.

mod config;

pub use config::{
    ChildLimits, DEFAULT_CANCEL_GRACE, DEFAULT_MEMORY_MB, DEFAULT_OPEN_FILES, EnvValue,
    SandboxMode, StdioConfig,
};

mod link;
mod process;
mod sandbox;

pub use process::EGRESS_PROXY_PORT;
pub(crate) use process::{LocalServer, Process};
