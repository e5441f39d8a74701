//! What a decision is asked about: who calls, what, with which arguments, in which run.

use serde_json::{Map, Value};

/// One call a run is about to make, as a policy sees it.
#[derive(Debug, Clone)]
pub struct Request {
    /// The agent's name: the principal `Agent::"NAME"`.
    pub agent: String,
    /// The agent's tags (`principal.tags`).
    pub agent_tags: Vec<String>,
    /// The token or console user that started the run, when one did: the agent's parent
    /// `Token::"NAME"`.
    pub token: Option<String>,
    /// What is called; it also names the action.
    pub target: Target,
    /// The call's arguments (`context.arguments`); empty for a model call or a secret.
    pub arguments: Map<String, Value>,
    /// The run the call belongs to (`context.run`).
    pub run: RunFacts,
    /// The host the call goes to (`context.host`); empty when not known.
    pub host: String,
}

/// What a call reaches: the resource, and through it the action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `Action::"call_tool"` on `Tool::"SERVER__TOOL"`.
    Tool {
        /// The tool's local name, `SERVER__TOOL`: the entity's id.
        id: String,
        /// The MCP server's name (`resource.server`).
        server: String,
        /// The tool's name on its server (`resource.name`).
        name: String,
        /// The effect the operator declared (`resource.effect`): `read_only`,
        /// `idempotent_write` or `non_idempotent_write`.
        effect: String,
    },
    /// `Action::"call_model"` on `Model::"NAME"`.
    Model(String),
    /// `Action::"read_secret"` on `Secret::"NAME"`.
    Secret(String),
}

impl Target {
    /// The action's id: `call_tool`, `call_model` or `read_secret`.
    pub fn action(&self) -> &'static str {
        match self {
            Self::Tool { .. } => "call_tool",
            Self::Model(_) => "call_model",
            Self::Secret(_) => "read_secret",
        }
    }

    /// The resource's entity type and id, as in `Tool::"docs__read"`.
    pub fn entity(&self) -> (&'static str, &str) {
        match self {
            Self::Tool { id, .. } => ("Tool", id),
            Self::Model(name) => ("Model", name),
            Self::Secret(name) => ("Secret", name),
        }
    }
}

/// What a policy may read of the run (`context.run`).
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    /// The run's id.
    pub id: String,
    /// The run's tags.
    pub tags: Vec<String>,
    /// The step the call is part of (the model's round).
    pub step: i64,
}
