//! `mcp call`'s local refusal: a tool the server's catalogue does not offer (unknown, or
//! refused at import) is refused before anything is sent, naming the close names; a
//! server never imported has its tools listed live first and is checked the same way.

use anyhow::bail;
use runwarden_mcp::{
    CatalogueEntry, CatalogueStore, McpClient, McpError, Reply, Request, SchemaStatus,
    ServerConfig, build_catalogue,
};
use runwarden_vault::CancelFlag;

/// Where the catalogue a call is checked against came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    /// `mcp import` stored it.
    Imported,
    /// The server was never imported: one `tools/list` just now, kept nowhere.
    Live,
}

/// The catalogue a call to `server` is checked against: the imported one, else (the
/// server was never imported) the tools it lists now, built by the same rules as an
/// import and not stored. A server that offers no tools has an empty catalogue.
pub(super) async fn catalogue_for_call(
    store: &dyn CatalogueStore,
    client: &McpClient,
    server: &ServerConfig,
    stop: &CancelFlag,
) -> Result<(Vec<CatalogueEntry>, Source), ListError> {
    let imported = store
        .catalogue_list(Some(&server.name))
        .await
        .map_err(|e| ListError::Store(e.into()))?;
    if !imported.is_empty() {
        return Ok((imported, Source::Imported));
    }
    let tools = match client.send_request(Request::ListTools, Some(stop)).await {
        Ok(Reply::Tools(tools)) => tools,
        Ok(_) => {
            return Err(ListError::Mcp(anyhow::anyhow!(
                "server {} answered tools/list with something else",
                server.name
            )));
        }
        Err(McpError::NoTools { .. }) => Vec::new(),
        Err(e) if e.is_cancelled() => return Err(ListError::Cancelled(e)),
        Err(e) => {
            let trail = client.last_request().map(|t| t.trail).unwrap_or_default();
            return Err(ListError::Mcp(anyhow::anyhow!("{e} {trail}")));
        }
    };
    let now = chrono::Utc::now().timestamp_millis();
    Ok((build_catalogue(server, &tools, now), Source::Live))
}

/// Why the catalogue for a call could not be had.
#[derive(Debug)]
pub(super) enum ListError {
    /// The store could not be read.
    Store(anyhow::Error),
    /// The live `tools/list` failed.
    Mcp(anyhow::Error),
    /// The operator interrupted the live `tools/list`.
    Cancelled(McpError),
}

impl ListError {
    /// The error for the operator, with what to do; `None` for a cancel.
    pub(super) fn into_error(self, server: &str) -> Result<anyhow::Error, McpError> {
        match self {
            Self::Store(e) => Ok(e),
            Self::Mcp(e) => Ok(e.context(format!(
                "while listing the tools of server {server}, which was never imported, to check the call; nothing was sent: run `runwarden mcp import {server}`, or pass --force to send the call unchecked"
            ))),
            Self::Cancelled(e) => Err(e),
        }
    }
}

/// `mcp call` refuses, before anything is sent, a tool the catalogue does not offer: one
/// it does not list (naming the close names it does), or one refused by the catalogue's
/// rules. `--force` sends it anyway (the audit rows say so).
pub(super) fn refuse_locally(
    server: &str,
    tool: &str,
    entry: Option<&CatalogueEntry>,
    catalogue: &[CatalogueEntry],
    source: Source,
) -> anyhow::Result<()> {
    let how = match source {
        Source::Imported => String::new(),
        Source::Live => format!(
            "; server {server} was never imported, so its tools were listed live: `runwarden mcp import {server}` imports them"
        ),
    };
    match entry {
        Some(entry) => match &entry.schema {
            SchemaStatus::Usable(_) => Ok(()),
            SchemaStatus::Refused(reason) => bail!(
                "tool {} of server {server} is refused by the catalogue ({reason}); nothing was sent{how}; pass --force to send it anyway",
                entry.local_name
            ),
        },
        None => {
            let close = close_names(tool, catalogue);
            let hint = if close.is_empty() {
                String::new()
            } else {
                format!(" (did you mean {}?)", close.join(", "))
            };
            let check = match source {
                Source::Imported => format!(
                    ": check the name with `runwarden mcp list {server}`, run `runwarden mcp import {server}` if the server added it, or pass --force to send it anyway"
                ),
                Source::Live => format!("{how}; pass --force to send it anyway"),
            };
            bail!("server {server} offers no tool {tool:?}{hint}; nothing was sent{check}")
        }
    }
}

/// The catalogue's names closest to `tool` (local or remote, whichever is closer), best
/// first, at most three.
fn close_names(tool: &str, catalogue: &[CatalogueEntry]) -> Vec<String> {
    let mut scored: Vec<(f64, &str)> = catalogue
        .iter()
        .map(|e| {
            let local = strsim::jaro_winkler(tool, &e.local_name);
            let remote = strsim::jaro_winkler(tool, &e.remote_name);
            if remote >= local {
                (remote, e.remote_name.as_str())
            } else {
                (local, e.local_name.as_str())
            }
        })
        .filter(|(score, _)| *score >= 0.8)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored
        .into_iter()
        .take(3)
        .map(|(_, n)| n.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn catalogue() -> Vec<CatalogueEntry> {
        let entry = |remote: &str, schema: SchemaStatus| CatalogueEntry {
            server: "peer".into(),
            local_name: format!("peer__{remote}"),
            remote_name: remote.into(),
            description: None,
            effect: runwarden_mcp::Effect::ReadOnly,
            schema,
            output_schema: None,
            imported_ms: 0,
        };
        let usable = SchemaStatus::Usable(json!({"type": "object"}));
        vec![
            entry("echo", usable.clone()),
            entry("echo_twice", usable.clone()),
            entry("create_ticket", usable),
            entry("tasky", SchemaStatus::Refused("needs tasks".into())),
        ]
    }

    #[test]
    fn an_unknown_tool_is_refused_with_the_close_names() {
        let catalogue = catalogue();
        let refuse = |tool: &str, entry: Option<&CatalogueEntry>| {
            refuse_locally("peer", tool, entry, &catalogue, Source::Imported)
        };
        let error = refuse("ecoh", None).unwrap_err().to_string();
        assert!(
            error.contains("offers no tool \"ecoh\" (did you mean echo?)"),
            "{error}"
        );
        let twice = refuse("echo_twise", None).unwrap_err().to_string();
        assert!(
            twice.contains("(did you mean echo_twice, echo?)"),
            "best first, far names left out: {twice}"
        );
        assert!(error.contains("--force"), "{error}");
        assert!(!error.contains("never imported"), "{error}");
        let refused = refuse("tasky", Some(&catalogue[3]))
            .unwrap_err()
            .to_string();
        assert!(
            refused.contains("is refused by the catalogue (needs tasks)"),
            "{refused}"
        );
        assert!(refuse("echo", Some(&catalogue[0])).is_ok());
    }

    #[test]
    fn a_refusal_against_a_live_listing_says_the_server_was_never_imported_and_how_to_import() {
        let catalogue = catalogue();
        let error = refuse_locally("peer", "ecoh", None, &catalogue, Source::Live)
            .unwrap_err()
            .to_string();
        assert!(error.contains("(did you mean echo?)"), "{error}");
        assert!(
            error.contains("server peer was never imported, so its tools were listed live: `runwarden mcp import peer` imports them"),
            "{error}"
        );
        assert!(error.contains("pass --force"), "{error}");
        let none = refuse_locally("peer", "echo", None, &[], Source::Live)
            .unwrap_err()
            .to_string();
        assert!(
            none.contains("offers no tool \"echo\"; nothing was sent;"),
            "a server that lists no tools offers none: {none}"
        );
    }
}
