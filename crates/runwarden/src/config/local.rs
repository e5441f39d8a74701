//! `[mcp.servers.NAME]` with `command`: a local server started by runwarden and spoken
//! to over stdio, its environment, sandbox and limits.

use std::path::PathBuf;

use anyhow::{Context, bail};
use runwarden_mcp::stdio::{EnvValue, Lifetime, SandboxMode, StdioConfig};
use runwarden_vault::SecretName;

use super::file::{EnvEntry, ServerSection};
use super::load::seconds;

/// The local server a section declares with `command`.
pub(super) fn local_server(
    name: &str,
    section: &mut ServerSection,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<StdioConfig> {
    let at = format!("[mcp.servers.{name}]");
    let command = section.command.take().unwrap_or_default();
    if command.trim().is_empty() {
        bail!("{at}: command is empty: give the program that serves MCP on its stdin and stdout");
    }
    if section.auth.is_some() {
        bail!(
            "{at}: auth is for servers reached by url; give a local server its credentials in env, e.g. env = {{ API_TOKEN = {{ secret = \"NAME\" }} }}"
        );
    }
    if section.protocol.is_some() {
        bail!(
            "{at}: protocol is for servers reached by url; a local server always gets the 2025-11-25 handshake"
        );
    }
    let mut stdio = StdioConfig::new(command, std::mem::take(&mut section.args));
    for (variable, entry) in std::mem::take(&mut section.env) {
        if variable.is_empty() || variable.contains('=') || variable.contains('\0') {
            bail!(
                "{at}: env has a variable named {variable:?}; a name is not empty and has no = or NUL"
            );
        }
        let value = match entry {
            EnvEntry::Literal(text) if text.contains('\0') => {
                bail!("{at}: env.{variable} has a NUL character, which no environment can hold")
            }
            EnvEntry::Literal(text) => EnvValue::Literal(text),
            EnvEntry::Secret { secret } => EnvValue::Secret(
                SecretName::new(secret).with_context(|| format!("{at}: env.{variable} secret"))?,
            ),
        };
        stdio.env.insert(variable, value);
    }
    stdio.cwd = section.cwd.take().map(resolve);
    if let Some(text) = section.sandbox.take() {
        stdio.sandbox = SandboxMode::parse(&text).with_context(|| {
            format!("{at}: unknown sandbox {text:?}: use \"namespace\" (the default) or \"none\"")
        })?;
    }
    if let Some(mb) = section.memory_mb.take() {
        if mb < 16 {
            bail!("{at}: memory_mb = {mb} is too small for any server: give at least 16");
        }
        stdio.limits.memory_mb = mb;
    }
    if let Some(cpu) = section.cpu_seconds.take() {
        if cpu == 0 {
            bail!(
                "{at}: cpu_seconds = 0 would stop the server at once: give at least 1, or leave it out for no limit"
            );
        }
        stdio.limits.cpu_seconds = Some(cpu);
    }
    if let Some(files) = section.open_files.take() {
        if files < 16 {
            bail!("{at}: open_files = {files} is too small to start a program: give at least 16");
        }
        stdio.limits.open_files = files;
    }
    if let Some(text) = section.lifetime.take() {
        stdio.lifetime = Lifetime::parse(&text).with_context(|| {
            format!("{at}: unknown lifetime {text:?}: use \"process\" (the default) or \"run\"")
        })?;
    }
    if let Some(grace) = section.cancel_grace_seconds.take() {
        stdio.cancel_grace = seconds(&format!("{at} cancel_grace_seconds"), grace)?;
    }
    Ok(stdio)
}

/// The settings only a local server has, when a server reached by `url` sets one.
pub(super) fn stray_local_setting(section: &ServerSection) -> Option<&'static str> {
    [
        ("args", !section.args.is_empty()),
        ("env", !section.env.is_empty()),
        ("cwd", section.cwd.is_some()),
        ("sandbox", section.sandbox.is_some()),
        ("memory_mb", section.memory_mb.is_some()),
        ("cpu_seconds", section.cpu_seconds.is_some()),
        ("open_files", section.open_files.is_some()),
        (
            "cancel_grace_seconds",
            section.cancel_grace_seconds.is_some(),
        ),
        ("lifetime", section.lifetime.is_some()),
    ]
    .into_iter()
    .find_map(|(key, set)| set.then_some(key))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use runwarden_mcp::stdio::{EnvValue, Lifetime, SandboxMode};

    use crate::config::{Config, TEMPLATE};

    fn load(section: &str) -> anyhow::Result<Config> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runwarden.toml");
        std::fs::write(&path, format!("{TEMPLATE}\n{section}")).unwrap();
        Config::load(&path)
    }

    #[test]
    fn a_local_server_gets_its_command_environment_sandbox_and_limits() {
        let config = load(
            "[mcp.servers.files]\ncommand = \"npx\"\nargs = [\"-y\", \"server-filesystem\", \"/srv\"]\nenv = { TOKEN = { secret = \"files-token\" }, LEVEL = \"info\" }\ncwd = \"work\"\nsandbox = \"none\"\nmemory_mb = 256\ncpu_seconds = 60\nopen_files = 64\ncancel_grace_seconds = 0.5\nlifetime = \"run\"\n",
        )
        .unwrap();
        let server = config.mcp_server("files").unwrap();
        assert_eq!(server.transport(), "stdio");
        assert_eq!(server.url, "stdio:files");
        let stdio = server.stdio.as_ref().unwrap();
        assert_eq!(stdio.command_line(), "npx -y server-filesystem /srv");
        assert_eq!(stdio.env["LEVEL"], EnvValue::Literal("info".into()));
        assert!(matches!(&stdio.env["TOKEN"], EnvValue::Secret(s) if s.as_str() == "files-token"));
        assert!(stdio.cwd.as_ref().unwrap().ends_with("work"));
        assert!(stdio.cwd.as_ref().unwrap().is_absolute());
        assert_eq!(stdio.sandbox, SandboxMode::Unsandboxed);
        assert_eq!(
            (
                stdio.limits.memory_mb,
                stdio.limits.cpu_seconds,
                stdio.limits.open_files
            ),
            (256, Some(60), 64)
        );
        assert_eq!(stdio.cancel_grace, Duration::from_millis(500));
        assert_eq!(stdio.lifetime, Lifetime::Run);
        // Sandboxed unless the operator says otherwise.
        let config =
            load("[mcp.servers.git]\ncommand = \"uvx\"\nargs = [\"mcp-server-git\"]\n").unwrap();
        let stdio = config.mcp_server("git").unwrap().stdio.clone().unwrap();
        assert_eq!(stdio.sandbox, SandboxMode::Namespace);
    }

    #[test]
    fn a_server_is_either_reached_by_url_or_started_by_command() {
        for (section, says) in [
            (
                "[mcp.servers.x]\nurl = \"http://127.0.0.1:1/mcp\"\ncommand = \"srv\"\n",
                "either url",
            ),
            ("[mcp.servers.x]\neffect = \"read_only\"\n", "give url = "),
            (
                "[mcp.servers.x]\nurl = \"http://127.0.0.1:1/mcp\"\nsandbox = \"none\"\n",
                "sandbox is for a local server",
            ),
            ("[mcp.servers.x]\ncommand = \" \"\n", "command is empty"),
            (
                "[mcp.servers.x]\ncommand = \"srv\"\nsandbox = \"docker\"\n",
                "unknown sandbox \"docker\"",
            ),
            (
                "[mcp.servers.x]\ncommand = \"srv\"\nauth = { secret = \"s\", placement = \"bearer\" }\n",
                "env = {",
            ),
            (
                "[mcp.servers.x]\ncommand = \"srv\"\nmemory_mb = 1\n",
                "memory_mb = 1 is too small",
            ),
            (
                "[mcp.servers.x]\ncommand = \"srv\"\nlifetime = \"call\"\n",
                "unknown lifetime \"call\"",
            ),
            (
                "[mcp.servers.x]\ncommand = \"srv\"\nenv = { \"A=B\" = \"c\" }\n",
                "no = or NUL",
            ),
        ] {
            let error = format!("{:#}", load(section).unwrap_err());
            assert!(error.contains(says), "{section}: {error}");
        }
    }
}
