//! The limits in force: what each one allows, which calls it applies to, and the one
//! order in which a call takes them.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::rules::limits::LimitRule;

/// The default lease of a held slot: a holder that dies without letting go frees its slot
/// this long after its last renewal.
pub const DEFAULT_HOLD_LEASE: Duration = Duration::from_secs(30);

/// The default longest wait of a call for its limits.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(30);

/// What a limit applies to. The order of the variants is the order in which a call takes
/// its limits (then by name), the same in every process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LimitKind {
    /// Every call (model and tool) of an agent's runs.
    Agent,
    /// Every call (model and tool) of the runs an API token (by name) started.
    Token,
    /// Every call to a model, by the model's name.
    Model,
    /// Every call to an MCP server's tools.
    Server,
    /// Every call to one tool, by its local name (`SERVER__TOOL`).
    Tool,
}

impl LimitKind {
    /// The word people read: `server`, `tool`, `model`, `agent`, `token`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Agent => "agent",
            Self::Token => "token",
            Self::Model => "model",
            Self::Server => "server",
            Self::Tool => "tool",
        }
    }
}

/// One limit's identity: its kind and the name it applies to.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LimitKey {
    /// What it applies to.
    pub kind: LimitKind,
    /// The server's, tool's, model's, agent's or token's name.
    pub name: String,
}

impl LimitKey {
    /// A key.
    pub fn new(kind: LimitKind, name: &str) -> Self {
        Self {
            kind,
            name: name.to_string(),
        }
    }

    /// The key as stored (`server:tickets`), shared by every process.
    pub fn stored(&self) -> String {
        format!("{}:{}", self.kind.as_str(), self.name)
    }
}

impl std::fmt::Display for LimitKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.kind.as_str(), self.name)
    }
}

/// One configured limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    /// Concurrency, rate and burst.
    pub rule: LimitRule,
    /// How long a call waits for it before it fails.
    pub max_wait: Duration,
}

/// Every limit in force. Empty (the default): no call is limited and nothing is read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    /// Every configured limit, by key.
    pub limits: BTreeMap<LimitKey, Limit>,
    /// The model each agent calls, so a model's limit finds the agent's calls.
    pub agent_models: BTreeMap<String, String>,
    /// The lease of a held slot; `None` for [`DEFAULT_HOLD_LEASE`].
    pub hold_lease: Option<Duration>,
}

impl Limits {
    /// True when no limit is configured.
    pub fn is_empty(&self) -> bool {
        self.limits.is_empty()
    }

    /// The lease of a held slot.
    pub fn hold_lease(&self) -> Duration {
        self.hold_lease.unwrap_or(DEFAULT_HOLD_LEASE)
    }

    /// The limits a tool call to `tool` (its local name) on `server` is subject to, by a
    /// run of `agent` that `token` started (when a token did), in the order they are taken.
    pub fn for_tool(
        &self,
        agent: &str,
        token: Option<&str>,
        server: &str,
        tool: &str,
    ) -> Vec<(LimitKey, Limit)> {
        let mut keys = starters(agent, token);
        keys.push(LimitKey::new(LimitKind::Server, server));
        keys.push(LimitKey::new(LimitKind::Tool, tool));
        self.matching(&keys)
    }

    /// The limits a model call by a run of `agent` that `token` started is subject to, in
    /// the order they are taken.
    pub fn for_model(&self, agent: &str, token: Option<&str>) -> Vec<(LimitKey, Limit)> {
        let mut keys = starters(agent, token);
        if let Some(model) = self.agent_models.get(agent) {
            keys.push(LimitKey::new(LimitKind::Model, model));
        }
        self.matching(&keys)
    }

    fn matching(&self, keys: &[LimitKey]) -> Vec<(LimitKey, Limit)> {
        if self.limits.is_empty() {
            return Vec::new();
        }
        let mut found: Vec<(LimitKey, Limit)> = keys
            .iter()
            .filter_map(|k| self.limits.get(k).map(|l| (k.clone(), *l)))
            .collect();
        // R14: one fixed order in every process.
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }
}

/// The keys of whoever a run acts for: its agent, and the token that started it.
fn starters(agent: &str, token: Option<&str>) -> Vec<LimitKey> {
    let mut keys = vec![LimitKey::new(LimitKind::Agent, agent)];
    if let Some(token) = token {
        keys.push(LimitKey::new(LimitKind::Token, token));
    }
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(k: u32) -> Limit {
        Limit {
            rule: LimitRule {
                concurrency: Some(k),
                rate_per_second: None,
                burst: 1,
            },
            max_wait: DEFAULT_MAX_WAIT,
        }
    }

    #[test]
    fn a_call_is_subject_to_every_limit_whose_scope_matches_in_one_order() {
        let mut limits = Limits::default();
        for key in [
            LimitKey::new(LimitKind::Tool, "t__create"),
            LimitKey::new(LimitKind::Server, "t"),
            LimitKey::new(LimitKind::Agent, "helper"),
            LimitKey::new(LimitKind::Model, "small"),
            LimitKey::new(LimitKind::Server, "other"),
            LimitKey::new(LimitKind::Token, "ci"),
        ] {
            limits.limits.insert(key, limit(1));
        }
        limits.agent_models.insert("helper".into(), "small".into());
        let tool: Vec<String> = limits
            .for_tool("helper", None, "t", "t__create")
            .iter()
            .map(|(k, _)| k.stored())
            .collect();
        assert_eq!(tool, ["agent:helper", "server:t", "tool:t__create"]);
        let model: Vec<String> = limits
            .for_model("helper", Some("ci"))
            .iter()
            .map(|(k, _)| k.to_string())
            .collect();
        assert_eq!(model, ["agent helper", "token ci", "model small"]);
        assert!(limits.for_tool("other-agent", None, "u", "u__x").is_empty());
        assert_eq!(
            limits
                .for_tool("other-agent", Some("ci"), "u", "u__x")
                .len(),
            1,
            "a run the token started"
        );
    }

    #[test]
    fn no_limits_match_nothing() {
        let limits = Limits::default();
        assert!(limits.is_empty());
        assert!(limits.for_tool("a", Some("t"), "s", "s__t").is_empty());
        assert!(limits.for_model("a", None).is_empty());
    }
}
