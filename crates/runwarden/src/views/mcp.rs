//! MCP servers and their imported tools as `mcp list --json` prints them, `GET
//! /v1/mcp/servers` answers and the console shows them.

use runwarden_mcp::{CatalogueEntry, SchemaStatus, ServerConfig, ServerHealth};
use serde::Serialize;
use serde_json::Value;

use crate::output;

/// One catalogue entry as `mcp list --json` prints it and `GET /v1/mcp/servers` answers.
#[derive(Serialize)]
pub(crate) struct ToolView<'a> {
    local_name: &'a str,
    remote_name: &'a str,
    effect: &'static str,
    pub(crate) usable: bool,
    refused: Option<&'a str>,
    /// Whether the tool declared an outputSchema its results are checked against.
    checks_output: bool,
}

impl<'a> ToolView<'a> {
    /// The effect shown is the one the configuration declares now, not the
    /// one recorded at import.
    pub(crate) fn new(entry: &'a CatalogueEntry, server: &ServerConfig) -> Self {
        let refused = match &entry.schema {
            SchemaStatus::Usable(_) => None,
            SchemaStatus::Refused(reason) => Some(reason.as_str()),
        };
        Self {
            local_name: &entry.local_name,
            remote_name: &entry.remote_name,
            effect: server.effect_of(&entry.remote_name).as_str(),
            usable: refused.is_none(),
            refused,
            checks_output: entry.output_schema.is_some(),
        }
    }

    pub(crate) fn line(&self) -> String {
        tool_line(&serde_json::to_value(self).unwrap_or(Value::Null))
    }
}

/// One configured server with its tools and liveness, as `mcp list --json` prints it and
/// `GET /v1/mcp/servers` answers.
#[derive(Serialize)]
pub(crate) struct ServerView<'a> {
    name: &'a str,
    url: &'a str,
    /// `http` or `stdio`.
    transport: &'static str,
    /// A local server's command line.
    command: Option<String>,
    /// A local server's sandbox: `namespace` or `none`.
    sandbox: Option<&'static str>,
    effect: &'static str,
    timeout_seconds: u64,
    last_success: Option<String>,
    last_failure: Option<String>,
    last_error: Option<&'a str>,
    tools: Vec<ToolView<'a>>,
}

/// The configured servers (or only one), each with its imported tools and liveness.
pub(crate) fn server_views<'a>(
    config: &'a crate::config::Config,
    only: Option<&str>,
    catalogue: &'a [CatalogueEntry],
    health: &'a [ServerHealth],
) -> Vec<ServerView<'a>> {
    config
        .mcp_servers
        .values()
        .filter(|s| only.is_none_or(|name| s.name == name))
        .map(|s| {
            let h = health.iter().find(|h| h.server == s.name);
            ServerView {
                name: &s.name,
                url: &s.url,
                transport: s.transport(),
                command: s.stdio.as_ref().map(|l| l.command_line()),
                sandbox: s.stdio.as_ref().map(|l| l.sandbox.as_str()),
                effect: s.effect.as_str(),
                timeout_seconds: s.timeout.as_secs(),
                last_success: h.and_then(|h| h.last_success_ms).map(output::time),
                last_failure: h.and_then(|h| h.last_failure_ms).map(output::time),
                last_error: h.and_then(|h| h.last_error.as_deref()),
                tools: catalogue
                    .iter()
                    .filter(|e| e.server == s.name)
                    .map(|e| ToolView::new(e, s))
                    .collect(),
            }
        })
        .collect()
}

/// One tool for people, from its JSON view.
pub(crate) fn tool_line(tool: &Value) -> String {
    let local = tool["local_name"].as_str().unwrap_or_default();
    match tool["refused"].as_str() {
        None => format!(
            "  {:<40} {:<22} {}",
            local,
            tool["effect"].as_str().unwrap_or_default(),
            tool["remote_name"].as_str().unwrap_or_default()
        ),
        Some(reason) => format!("  {local:<40} REFUSED: {reason}"),
    }
}
