//! An agent as a run executes it: a model provider, a system prompt, bound tools.

use std::sync::Arc;

use runwarden_mcp::{CatalogueEntry, Effect, McpClient, SchemaStatus};
use runwarden_models::{ModelProvider, ToolSpec};

use crate::budget::Budgets;

/// The default round limit (R2).
pub(crate) const DEFAULT_MAX_ROUNDS: u32 = 20;
/// The most rounds an agent may be configured with; larger values are clamped (R2).
pub(crate) const MAX_ROUNDS_LIMIT: u32 = 100;

/// A tool an agent may call: what the model sees and where the call goes.
#[derive(Clone)]
pub struct BoundTool {
    /// Local name, description and normalised schema.
    pub spec: ToolSpec,
    /// The name on the wire.
    pub remote_name: String,
    /// The operator's declared effect, resolved from the server's configuration when the
    /// tool was bound (M10 amended); it decides the write fence (R7).
    pub effect: Effect,
    /// The server's client.
    pub client: Arc<McpClient>,
    /// R12: when set, every call waits for an operator's approval, which expires after
    /// this long (and is then denied as "expired"). `None`: no approval (the default).
    pub approval: Option<std::time::Duration>,
    /// The `outputSchema` the tool declared at import, if any (M7 amended).
    pub output_schema: Option<serde_json::Value>,
}

impl std::fmt::Debug for BoundTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundTool")
            .field("name", &self.spec.name)
            .field("effect", &self.effect)
            .field("approval", &self.approval)
            .finish_non_exhaustive()
    }
}

/// An agent ready to run.
pub struct AgentSpec {
    /// The agent's name.
    pub name: String,
    /// The system prompt.
    pub system: Option<String>,
    /// The round limit, already clamped.
    pub max_rounds: u32,
    /// The model.
    pub provider: Arc<dyn ModelProvider>,
    /// The tools on offer.
    pub tools: Vec<BoundTool>,
    /// The output limit per model call the provider was built with (L5), named in a
    /// `MODEL_TRUNCATED` reason; `None` when the provider's own default applies.
    pub max_tokens: Option<u32>,
    /// The agent's budgets per run (R13); a run's request may only lower them.
    pub budgets: Budgets,
    /// P1: the policies every tool call of the run is decided by; `None` when none are
    /// configured, and then nothing is evaluated.
    pub policy: Option<Arc<runwarden_policy::Policies>>,
    /// P1: the agent's tags, `principal.tags` in its policy decisions.
    pub tags: Vec<String>,
}

impl std::fmt::Debug for AgentSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSpec")
            .field("name", &self.name)
            .field("tools", &self.tools)
            .finish_non_exhaustive()
    }
}

/// Clamps a configured round limit into 1..=100 (`MAX_ROUNDS_LIMIT`), 20 when unset (R2).
pub fn clamp_rounds(configured: Option<u32>) -> u32 {
    configured
        .unwrap_or(DEFAULT_MAX_ROUNDS)
        .clamp(1, MAX_ROUNDS_LIMIT)
}

/// True when `pattern` (an exact local name, or a prefix ending in `*`) names `local`.
pub fn pattern_matches(pattern: &str, local: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => local.starts_with(prefix),
        None => pattern == local,
    }
}

/// Binds catalogue entries to an agent's tool patterns. Refused tools are never offered;
/// a pattern that names no usable tool is an error, so a typo does not silently leave an
/// agent without its tools.
///
/// M10 (amended): each tool's effect comes from its server's configuration as the client
/// holds it now, never from the effect recorded in the catalogue at import; and a per-tool
/// declaration of a bound server that names a tool its catalogue lacks is an error.
pub fn bind_tools(
    patterns: &[String],
    catalogue: &[CatalogueEntry],
    client_of: impl Fn(&str) -> Option<Arc<McpClient>>,
) -> Result<Vec<BoundTool>, String> {
    let mut bound: Vec<BoundTool> = Vec::new();
    for pattern in patterns {
        let mut matched = false;
        for entry in catalogue
            .iter()
            .filter(|e| pattern_matches(pattern, &e.local_name))
        {
            let SchemaStatus::Usable(schema) = &entry.schema else {
                continue;
            };
            matched = true;
            if bound.iter().any(|b| b.spec.name == entry.local_name) {
                continue;
            }
            let client = client_of(&entry.server).ok_or_else(|| {
                format!(
                    "tool {} belongs to server {}, which is not configured",
                    entry.local_name, entry.server
                )
            })?;
            bound.push(BoundTool {
                spec: ToolSpec {
                    name: entry.local_name.clone(),
                    description: entry.description.clone(),
                    input_schema: schema.clone(),
                },
                remote_name: entry.remote_name.clone(),
                // M10 (amended): the configuration in force, not the import's snapshot.
                effect: client.server().effect_of(&entry.remote_name),
                client,
                // R12: the binary applies the operator's approval policy after binding.
                approval: None,
                output_schema: entry.output_schema.clone(),
            });
        }
        if !matched {
            return Err(format!(
                "tool pattern {pattern:?} names no usable imported tool: run `runwarden mcp import SERVER` and check `runwarden mcp list`"
            ));
        }
    }
    let mut checked: Vec<&str> = Vec::new();
    for tool in &bound {
        let server = tool.client.server();
        if checked.contains(&server.name.as_str()) {
            continue;
        }
        checked.push(&server.name);
        let offered = catalogue
            .iter()
            .filter(|e| e.server == server.name)
            .map(|e| e.remote_name.as_str());
        server
            .check_tool_overrides(offered)
            .map_err(|e| e.to_string())?;
    }
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_exactly_or_by_prefix() {
        assert!(pattern_matches("files__*", "files__read"));
        assert!(pattern_matches("tickets__create", "tickets__create"));
        assert!(!pattern_matches("tickets__create", "tickets__create_many"));
    }

    #[test]
    fn rounds_are_clamped() {
        assert_eq!(clamp_rounds(None), 20);
        assert_eq!(clamp_rounds(Some(0)), 1);
        assert_eq!(clamp_rounds(Some(10_000)), MAX_ROUNDS_LIMIT);
    }
}
