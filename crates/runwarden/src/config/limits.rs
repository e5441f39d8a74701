//! `[limits]`: concurrency and rate limits on calls per MCP server, tool, model and
//! agent, checked against the servers and agents the file declares.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use runwarden_runtime::limits::{DEFAULT_MAX_WAIT, Limit, LimitKey, LimitKind, Limits};
use runwarden_runtime::rules::limits::LimitRule;

use super::Config;
use super::agents::{AgentConfig, ProviderConfig};
use super::file::{LimitSection, LimitsSection};
use super::load::seconds;

/// The highest rate a limit may name: above it a limit limits nothing a store could keep up with.
const MAX_RATE: f64 = 100_000.0;

/// The model an agent calls, when it calls a named one.
fn model_of(agent: &AgentConfig) -> Option<&str> {
    match &agent.provider {
        ProviderConfig::OpenAi { model, .. } | ProviderConfig::Anthropic { model, .. } => {
            Some(model)
        }
        ProviderConfig::Scripted { .. } => None,
    }
}

/// The limits in force, checked.
pub(super) fn limits(section: LimitsSection, declared: &Config) -> anyhow::Result<Limits> {
    let agent_models: BTreeMap<String, String> = declared
        .agents
        .iter()
        .filter_map(|(name, a)| model_of(a).map(|m| (name.clone(), m.to_string())))
        .collect();
    let mut found = BTreeMap::new();
    let tables = [
        (LimitKind::Server, section.servers),
        (LimitKind::Tool, section.tools),
        (LimitKind::Model, section.models),
        (LimitKind::Agent, section.agents),
        (LimitKind::Token, section.tokens),
    ];
    for (kind, table) in tables {
        for (name, limit) in table {
            let at = format!("limits.{}s.{name}", kind.as_str());
            check_name(&at, kind, &name, declared, &agent_models)?;
            found.insert(LimitKey::new(kind, &name), limit_of(&at, &limit)?);
        }
    }
    let hold_lease = section
        .lease_seconds
        .map(|s| seconds("[limits] lease_seconds", s))
        .transpose()?;
    Ok(Limits {
        limits: found,
        agent_models,
        hold_lease,
    })
}

/// A limit names something the file declares, so a typo is not a limit on nothing.
fn check_name(
    at: &str,
    kind: LimitKind,
    name: &str,
    declared: &Config,
    agent_models: &BTreeMap<String, String>,
) -> anyhow::Result<()> {
    let servers: Vec<&str> = declared.mcp_servers.keys().map(String::as_str).collect();
    let known = |list: Vec<&str>, what: &str| -> anyhow::Result<()> {
        if list.contains(&name) {
            return Ok(());
        }
        let listed = if list.is_empty() {
            "none is configured".to_string()
        } else {
            format!("the configured ones are {}", list.join(", "))
        };
        bail!("{at}: no {what} named {name:?}: {listed}")
    };
    match kind {
        LimitKind::Server => known(servers, "MCP server"),
        LimitKind::Agent => known(
            declared.agents.keys().map(String::as_str).collect(),
            "agent",
        ),
        // Tokens live in the store, not the file: any name may be limited ahead of time.
        LimitKind::Token => Ok(()),
        LimitKind::Model => {
            let mut models: Vec<&str> = agent_models.values().map(String::as_str).collect();
            models.sort_unstable();
            models.dedup();
            known(models, "model used by an agent")
        }
        LimitKind::Tool => {
            let server = name.split_once("__").map(|(s, _)| s);
            match server {
                Some(server) if servers.contains(&server) => Ok(()),
                Some(server) => bail!(
                    "{at}: the tool's server {server:?} is not configured: add [mcp.servers.{server}], or name a tool of a configured server as SERVER__TOOL"
                ),
                None => bail!(
                    "{at}: name a tool as SERVER__TOOL, its local name (like \"tickets__create_ticket\")"
                ),
            }
        }
    }
}

/// One limit's values, checked.
fn limit_of(at: &str, section: &LimitSection) -> anyhow::Result<Limit> {
    if section.concurrency.is_none() && section.rate_per_second.is_none() {
        bail!("{at}: set concurrency, rate_per_second or both");
    }
    if section.concurrency == Some(0) {
        bail!("{at}.concurrency must be at least 1 (remove the limit to allow any number)");
    }
    if let Some(rate) = section.rate_per_second
        && !(rate.is_finite() && rate > 0.0 && rate <= MAX_RATE)
    {
        bail!("{at}.rate_per_second must be a number above 0 and at most {MAX_RATE}, not {rate}");
    }
    let burst = match (section.burst, section.rate_per_second) {
        (Some(0), _) => bail!("{at}.burst must be at least 1"),
        (Some(_), None) => {
            bail!("{at}.burst needs rate_per_second: it is the size of the rate's bucket")
        }
        (Some(burst), Some(_)) => burst,
        // As many as the rate gives in one second, at least one.
        (None, Some(rate)) => (rate.ceil() as u32).max(1),
        (None, None) => 1,
    };
    let max_wait = match section.max_wait_seconds {
        None => DEFAULT_MAX_WAIT,
        Some(0.0) => Duration::ZERO,
        Some(s) => seconds(&format!("{at}.max_wait_seconds"), s)?,
    };
    Ok(Limit {
        rule: LimitRule {
            concurrency: section.concurrency,
            rate_per_second: section.rate_per_second,
            burst,
        },
        max_wait,
    })
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    const BASE: &str = "[mcp.servers.tickets]\nurl = \"http://127.0.0.1:9/mcp\"\n\n[agents.helper]\nprovider = \"openai\"\nmodel = \"small\"\nbase_url = \"http://127.0.0.1:9/v1\"\n";

    fn load(limits: &str) -> anyhow::Result<Config> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(&path, format!("{BASE}\n{limits}")).unwrap();
        Config::load(&path)
    }

    fn error(limits: &str) -> String {
        format!("{:#}", load(limits).expect_err("refused"))
    }

    #[test]
    fn every_scope_is_read_with_its_defaults() {
        let config = load(
            "[limits]\nlease_seconds = 5\n\n[limits.servers.tickets]\nconcurrency = 4\nrate_per_second = 2.5\nmax_wait_seconds = 0\n\n[limits.tools.\"tickets__create\"]\nrate_per_second = 1\nburst = 3\n\n[limits.models.small]\nconcurrency = 2\n\n[limits.agents.helper]\nconcurrency = 1\n\n[limits.tokens.ci]\nrate_per_second = 0.5\n",
        )
        .unwrap();
        let limits = &config.limits;
        assert_eq!(limits.hold_lease(), Duration::from_secs(5));
        let server = limits.limits[&LimitKey::new(LimitKind::Server, "tickets")];
        assert_eq!(server.rule.concurrency, Some(4));
        assert_eq!(server.rule.burst, 3, "the rate rounded up");
        assert_eq!(server.max_wait, Duration::ZERO);
        let tool = limits.limits[&LimitKey::new(LimitKind::Tool, "tickets__create")];
        assert_eq!((tool.rule.burst, tool.max_wait), (3, DEFAULT_MAX_WAIT));
        assert_eq!(
            limits.for_model("helper", None).len(),
            2,
            "the agent's and its model's"
        );
        assert_eq!(
            limits
                .for_tool("helper", Some("ci"), "tickets", "tickets__create")
                .len(),
            4,
            "the agent's, the token's, the server's and the tool's"
        );
        let token = limits.limits[&LimitKey::new(LimitKind::Token, "ci")];
        assert_eq!(token.rule.burst, 1, "a rate under one rounds up to one");
    }

    #[test]
    fn no_limits_section_is_no_limits() {
        assert!(load("").unwrap().limits.is_empty());
    }

    #[test]
    fn a_limit_on_something_not_configured_names_what_is() {
        assert!(
            error("[limits.servers.tickts]\nconcurrency = 1\n").contains(
                "limits.servers.tickts: no MCP server named \"tickts\": the configured ones are tickets"
            ),
            "{}",
            error("[limits.servers.tickts]\nconcurrency = 1\n")
        );
        assert!(
            error("[limits.agents.nobody]\nconcurrency = 1\n")
                .contains("no agent named \"nobody\"")
        );
        assert!(
            error("[limits.models.big]\nconcurrency = 1\n")
                .contains("no model used by an agent named \"big\": the configured ones are small")
        );
        assert!(
            error("[limits.tools.create]\nconcurrency = 1\n")
                .contains("name a tool as SERVER__TOOL")
        );
        assert!(
            error("[limits.tools.\"other__create\"]\nconcurrency = 1\n")
                .contains("server \"other\" is not configured")
        );
    }

    #[test]
    fn a_limit_with_bad_values_says_which_and_why() {
        for (limit, says) in [
            (
                "max_wait_seconds = 3",
                "set concurrency, rate_per_second or both",
            ),
            (
                "concurrency = 0",
                "limits.servers.tickets.concurrency must be at least 1",
            ),
            (
                "rate_per_second = 0",
                "rate_per_second must be a number above 0",
            ),
            (
                "rate_per_second = -1",
                "rate_per_second must be a number above 0",
            ),
            ("concurrency = 1\nburst = 2", "burst needs rate_per_second"),
            ("rate_per_second = 1\nburst = 0", "burst must be at least 1"),
            (
                "concurrency = 1\nmax_wait_seconds = 5000",
                "max_wait_seconds must be a number of seconds",
            ),
            ("concurrency = 1\ncapacity = 2", "unknown field `capacity`"),
        ] {
            let text = error(&format!("[limits.servers.tickets]\n{limit}\n"));
            assert!(text.contains(says), "{limit}: {text}");
        }
    }
}
