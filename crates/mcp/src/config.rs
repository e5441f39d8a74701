//! A server as the operator declared it: where it is, how to authenticate, what its tools do.

use std::collections::BTreeMap;
use std::time::Duration;

use runwarden_oauth::OAuthSettings;
use runwarden_vault::Credential;
use serde::{Deserialize, Serialize};

/// The default budget of one operation (M3).
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(20);

/// The default of `max_response_bytes`: the most of one response that is read (M5); the
/// vault's own default cap, so the two cannot drift apart.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = runwarden_vault::DEFAULT_MAX_RESPONSE_BYTES;

/// The largest `max_response_bytes` the configuration accepts: a response is held in
/// memory whole, so the limit stays a bound, not a switch that turns it off.
pub const MAX_RESPONSE_BYTES_CEILING: usize = 256 * 1024 * 1024;

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

/// What the client does with a server's `elicitation/create` (M14).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ElicitationPolicy {
    /// Decline at once; the client does not declare the `elicitation` capability.
    #[default]
    Decline,
    /// Ask the caller's [`Elicitor`](crate::Elicitor) (an operator, through a decision) and
    /// send its answer; declared as the `elicitation` capability (form mode).
    Operator,
}

impl ElicitationPolicy {
    /// The stable name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Decline => "decline",
            Self::Operator => "operator",
        }
    }

    /// Parses a configured name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Decline, Self::Operator]
            .into_iter()
            .find(|p| p.as_str() == text)
    }
}

/// Which protocol revision the client speaks with a server (M19).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProtocolPolicy {
    /// Probe `server/discover` and speak the stateless 2026-07-28 revision when the server
    /// serves it; fall back to the `initialize` handshake (2025-11-25) when it answers the
    /// probe with an error or an HTTP status, as older servers do.
    #[default]
    Auto,
    /// Only the `initialize` handshake (2025-11-25 and older), no probe: for a server
    /// known to be old, or one whose 2026-07-28 support the operator does not want.
    Handshake,
}

impl ProtocolPolicy {
    /// The stable name used in configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Handshake => "2025-11-25",
        }
    }

    /// Parses a configured name.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Auto, Self::Handshake]
            .into_iter()
            .find(|p| p.as_str() == text)
    }
}

/// The longest one operation may last when progress notifications extend its deadline
/// (M15): the hard maximum behind `progress_extends_deadline`.
pub(crate) const PROGRESS_HARD_MAX: Duration = Duration::from_secs(600);

/// One MCP server from `[mcp.servers.NAME]`.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The operator's name for the server; the prefix of its tools' local names.
    pub name: String,
    /// The Streamable HTTP endpoint.
    pub url: String,
    /// The credential to place on every leg, if the server needs one.
    pub auth: Option<Credential>,
    /// M18: OAuth 2.1 instead of a static credential; the OAuth client obtains the tokens,
    /// the vault keeps and places them.
    pub oauth: Option<OAuthSettings>,
    /// The effect of every tool without its own declaration.
    pub effect: Effect,
    /// Per-tool effects, by remote tool name.
    pub tools: BTreeMap<String, Effect>,
    /// The budget of one operation.
    pub timeout: Duration,
    /// What to do with the server's `elicitation/create` (M14); declining is the default.
    pub elicitation: ElicitationPolicy,
    /// G2: declare the `sampling` capability and hand the server's
    /// `sampling/createMessage` to the call's sampler (a gateway client that answers it);
    /// a call without one refuses it. Off by default: refused at once.
    pub sampling: bool,
    /// M15: a progress notification restarts the `tools/call` budget, never past
    /// ten minutes in all; off by default, so a chatty server cannot hold a call open.
    pub progress_extends_deadline: bool,
    /// M19: whether to probe for the stateless 2026-07-28 revision.
    pub protocol: ProtocolPolicy,
    /// M5: the most of one response that is read; a longer one is refused with an error
    /// that names its size and this setting.
    pub max_response_bytes: usize,
    /// A local server spoken to over its stdin and stdout instead of `url`.
    pub stdio: Option<crate::stdio::StdioConfig>,
}

impl ServerConfig {
    /// A server with no credential, the default effect and the default budget.
    pub fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            url: url.into(),
            auth: None,
            oauth: None,
            effect: Effect::default(),
            tools: BTreeMap::new(),
            timeout: DEFAULT_TIMEOUT,
            elicitation: ElicitationPolicy::Decline,
            sampling: false,
            progress_extends_deadline: false,
            protocol: ProtocolPolicy::Auto,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            stdio: None,
        }
    }

    /// A local server started from `stdio`'s command and spoken to over its stdin and
    /// stdout; its `url` names the transport (`stdio:NAME`) for lists and audit rows.
    pub fn local(name: impl Into<String>, stdio: crate::stdio::StdioConfig) -> Self {
        let name = name.into();
        let mut server = Self::new(name.clone(), format!("stdio:{name}"));
        server.stdio = Some(stdio);
        // The stateless revision is an HTTP one: a local server gets the handshake.
        server.protocol = ProtocolPolicy::Handshake;
        server
    }

    /// The transport as `mcp list` shows it: `http` or `stdio`.
    pub fn transport(&self) -> &'static str {
        if self.stdio.is_some() {
            "stdio"
        } else {
            "http"
        }
    }

    /// The same server with another protocol policy (M19).
    pub fn with_protocol(mut self, protocol: ProtocolPolicy) -> Self {
        self.protocol = protocol;
        self
    }

    /// M10: the tool's own declaration, else the server's, else NON_IDEMPOTENT_WRITE.
    pub fn effect_of(&self, remote_tool: &str) -> Effect {
        self.tools.get(remote_tool).copied().unwrap_or(self.effect)
    }

    /// M10 (amended): every per-tool declaration must name a tool the server offers, so a
    /// typo or a renamed tool cannot leave a write with the default effect the operator
    /// meant to change. `offered` are the remote names of the server's catalogue.
    pub fn check_tool_overrides<'a>(
        &self,
        offered: impl IntoIterator<Item = &'a str> + Clone,
    ) -> Result<(), ServerConfigError> {
        let unknown = self
            .tools
            .keys()
            .find(|declared| !offered.clone().into_iter().any(|o| o == declared.as_str()));
        match unknown {
            None => Ok(()),
            Some(tool) => {
                let mut names: Vec<&str> = offered.into_iter().collect();
                names.sort_unstable();
                names.dedup();
                Err(ServerConfigError::UnknownTool {
                    server: self.name.clone(),
                    tool: tool.clone(),
                    offered: names.join(", "),
                })
            }
        }
    }
}

/// The operator's server configuration does not fit what the server offers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServerConfigError {
    /// M10 (amended): `[mcp.servers.SERVER.tools.TOOL]` names a tool the server's
    /// catalogue does not have.
    #[error(
        "[mcp.servers.{server}.tools.{tool}] declares an effect for tool {tool:?}, but server {server} offers no such tool (it offers: {offered}): fix the name in the configuration, or run `runwarden mcp import {server}` if the server added it"
    )]
    UnknownTool {
        /// The server's configured name.
        server: String,
        /// The remote tool name the configuration declares.
        tool: String,
        /// The remote names the catalogue has, comma-separated.
        offered: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_declaration_must_name_an_offered_tool() {
        let mut server = ServerConfig::new("tickets", "http://x");
        server.tools.insert("search".into(), Effect::ReadOnly);
        assert_eq!(server.check_tool_overrides(["search", "create"]), Ok(()));
        server.tools.insert("creat".into(), Effect::ReadOnly);
        let error = server
            .check_tool_overrides(["search", "create"])
            .unwrap_err();
        assert_eq!(
            error,
            ServerConfigError::UnknownTool {
                server: "tickets".into(),
                tool: "creat".into(),
                offered: "create, search".into(),
            }
        );
        let text = error.to_string();
        assert!(
            text.contains("server tickets") && text.contains("\"creat\""),
            "{text}"
        );
    }

    #[test]
    fn without_declarations_anything_offered_fits() {
        let server = ServerConfig::new("tickets", "http://x");
        assert_eq!(server.check_tool_overrides(Vec::<&str>::new()), Ok(()));
    }
}
