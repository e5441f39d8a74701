//! A server as the operator declared it: where it is, how to authenticate, what its tools do.

use std::collections::BTreeMap;
use std::time::Duration;

use runwarden_vault::Credential;
use serde::{Deserialize, Serialize};

/// The default budget of one operation (M3).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// What a tool does to the world, as the operator declares it (M10). Never taken from
/// annotations a server wrote about itself.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, PartialOrd, Ord,
)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// Reads only; safe to retry.
    ReadOnly,
    /// Writes, but repeating the same call leaves the same state.
    IdempotentWrite,
    /// Writes that must run at most once (the default for every MCP tool).
    #[default]
    NonIdempotentWrite,
}

impl Effect {
    /// The stable name used in configuration and storage.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ReadOnly => "read_only",
            Self::IdempotentWrite => "idempotent_write",
            Self::NonIdempotentWrite => "non_idempotent_write",
        }
    }

    /// Parses a stored or configured name.
    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::ReadOnly,
            Self::IdempotentWrite,
            Self::NonIdempotentWrite,
        ]
        .into_iter()
        .find(|e| e.as_str() == text)
    }

    /// True for either kind of write.
    pub fn is_write(self) -> bool {
        self != Self::ReadOnly
    }
}

/// One MCP server from `[mcp.servers.NAME]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The operator's name for the server; the prefix of its tools' local names.
    pub name: String,
    /// The Streamable HTTP endpoint.
    pub url: String,
    /// The credential to place on every leg, if the server needs one.
    pub auth: Option<Credential>,
    /// The effect of every tool without its own declaration.
    pub effect: Effect,
    /// Per-tool effects, by remote tool name.
    pub tools: BTreeMap<String, Effect>,
    /// The budget of one operation.
    pub timeout: Duration,
}

impl ServerConfig {
    /// A server with no credential, the default effect and the default budget.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            auth: None,
            effect: Effect::default(),
            tools: BTreeMap::new(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// M10: the tool's own declaration, else the server's, else NON_IDEMPOTENT_WRITE.
    pub fn effect_of(&self, remote_tool: &str) -> Effect {
        self.tools.get(remote_tool).copied().unwrap_or(self.effect)
    }
}
