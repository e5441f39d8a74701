//! `serve`'s configuration reload on SIGHUP: the agents and MCP servers are read again
//! from the file and put in force for every run built from then on; runs in flight keep
//! the agent and MCP clients they were built with. A file that does not load keeps the
//! old configuration in force and logs why. Every change is logged by name.

use std::collections::BTreeMap;
use std::sync::Arc;

use runwarden_mcp::McpClient;
use runwarden_runtime::limits::Limiter;

use crate::agents::{AgentBuilder, Registry};
use crate::config::Config;

/// What a reload changed, one line per change ("agent triage added", ...).
pub(crate) fn changes(old: &Config, new: &Config) -> Vec<String> {
    let mut lines = named_changes("agent", &old.agents, &new.agents, |_, _| None);
    lines.extend(named_changes(
        "mcp server",
        &old.mcp_servers,
        &new.mcp_servers,
        |a, b| (a.url != b.url).then(|| "url changed".to_string()),
    ));
    // A server added or removed is said above; a kept one may change its policy alone.
    for (name, after) in &new.approvals {
        if let Some(before) = old.approvals.get(name)
            && format!("{before:?}") != format!("{after:?}")
        {
            lines.push(format!("mcp server {name} approval policy changed"));
        }
    }
    lines.extend(policy_change(old, new));
    // R14: new limits hold for the calls that plan from now on.
    if old.limits != new.limits {
        lines.push("limits changed: in force for calls from now on".to_string());
    }
    lines
}

/// The policies in force after a reload: read again from their files whenever the
/// section is there, so the line says so every time.
fn policy_change(old: &Config, new: &Config) -> Option<String> {
    let count = |p: &crate::config::PolicyConfig| {
        format!(
            "{} from {}",
            crate::output::count(p.policies.len() as u64, "policy", "policies"),
            p.files.join(", ")
        )
    };
    match (&old.policy, &new.policy) {
        (None, None) => None,
        (Some(_), None) => Some("policies off: no [policy] section".to_string()),
        (None, Some(p)) => Some(format!("policies on: {}", count(p))),
        (Some(_), Some(p)) => Some(format!("policies reloaded: {}", count(p))),
    }
}

/// Added, removed and changed entries of two maps, compared by their `Debug` text (every
/// field; secrets are names of vault records, never values). `detail` may name what
/// changed.
fn named_changes<T: std::fmt::Debug>(
    what: &str,
    old: &BTreeMap<String, T>,
    new: &BTreeMap<String, T>,
    detail: impl Fn(&T, &T) -> Option<String>,
) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, after) in new {
        match old.get(name) {
            None => lines.push(format!("{what} {name} added")),
            Some(before) if format!("{before:?}") != format!("{after:?}") => {
                let how = detail(before, after).unwrap_or_else(|| "changed".into());
                lines.push(format!("{what} {name} {how}"));
            }
            Some(_) => {}
        }
    }
    for name in old.keys().filter(|name| !new.contains_key(*name)) {
        lines.push(format!("{what} {name} removed"));
    }
    lines
}

/// Reads the configuration file again and puts its agents, MCP servers, policies and
/// limits in force. An MCP server whose settings did not change keeps its client (and
/// session); a new or changed one gets a new client. Returns the changes, or the error
/// that kept the old configuration in force.
pub(crate) fn reload(
    agents: &AgentBuilder,
    limiter: &Limiter,
    path: &std::path::Path,
) -> anyhow::Result<Vec<String>> {
    let new = Config::load(path)?;
    let current = agents.registry();
    let lines = changes(&current.config, &new);
    let clients = new
        .mcp_servers
        .values()
        .map(|server| {
            let unchanged = current
                .config
                .mcp_servers
                .get(&server.name)
                .filter(|old| format!("{old:?}") == format!("{server:?}"))
                .and_then(|_| current.clients.get(&server.name).cloned());
            let client = unchanged.unwrap_or_else(|| {
                Arc::new(
                    McpClient::new(server.clone(), agents.egress().clone())
                        .with_actor("serve")
                        .with_health(agents.catalogue().clone()),
                )
            });
            (server.name.clone(), client)
        })
        .collect();
    limiter.set_limits(new.limits.clone());
    agents.swap(Registry {
        config: Arc::new(new),
        clients: Arc::new(clients),
    });
    Ok(lines)
}

/// Reloads on every SIGHUP until the process ends, logging each change, or the error
/// that kept the old configuration.
pub(crate) fn on_hangup(
    agents: Arc<AgentBuilder>,
    limiter: Arc<Limiter>,
    path: std::path::PathBuf,
) {
    #[cfg(unix)]
    {
        let Ok(mut hangups) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!(
                "could not listen for SIGHUP: the configuration reloads only on restart"
            );
            return;
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                match reload(&agents, &limiter, &path) {
                    Ok(lines) if lines.is_empty() => {
                        tracing::info!(file = %path.display(), "configuration reloaded: no agent or MCP server changed");
                    }
                    Ok(lines) => {
                        for line in &lines {
                            tracing::info!(file = %path.display(), "configuration reloaded: {line}");
                        }
                    }
                    Err(error) => {
                        tracing::error!(file = %path.display(), error = format!("{error:#}"), "the configuration did not reload; the previous one stays in force");
                    }
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (agents, path);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(&path, text).unwrap();
        Config::load(&path).unwrap()
    }

    #[test]
    fn each_added_removed_or_changed_agent_and_server_is_named() {
        let old = config(
            "[agents.a]\nprovider = \"scripted\"\nscript = \"a.json\"\n\n[agents.b]\nprovider = \"scripted\"\nscript = \"b.json\"\n\n[mcp.servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n\n[mcp.servers.t]\nurl = \"http://127.0.0.1:2/mcp\"\n",
        );
        let new = config(
            "[agents.a]\nprovider = \"scripted\"\nscript = \"a2.json\"\n\n[agents.c]\nprovider = \"scripted\"\nscript = \"c.json\"\n\n[mcp.servers.s]\nurl = \"http://127.0.0.1:3/mcp\"\n",
        );
        assert_eq!(
            changes(&old, &new),
            [
                "agent a changed",
                "agent c added",
                "agent b removed",
                "mcp server s url changed",
                "mcp server t removed",
            ]
        );
        assert!(changes(&new, &new).is_empty());
    }

    #[test]
    fn a_local_server_whose_environment_changed_is_named() {
        let old = config("[mcp.servers.l]\ncommand = \"srv\"\nenv = { LEVEL = \"info\" }\n");
        let new = config("[mcp.servers.l]\ncommand = \"srv\"\nenv = { LEVEL = \"debug\" }\n");
        assert_eq!(changes(&old, &new), ["mcp server l changed"]);
    }

    #[test]
    fn a_changed_limit_is_named() {
        let server = "[mcp.servers.s]\nurl = \"http://127.0.0.1:1/mcp\"\n";
        let old = config(&format!("{server}\n[limits.servers.s]\nconcurrency = 2\n"));
        let new = config(&format!("{server}\n[limits.servers.s]\nconcurrency = 4\n"));
        assert_eq!(
            changes(&old, &new),
            ["limits changed: in force for calls from now on"]
        );
        assert!(changes(&old, &old).is_empty());
    }
}
