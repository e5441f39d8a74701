//! The imported tool catalogue (M8-M10) and per-server liveness (M11), and the store seam
//! that keeps them.

use async_trait::async_trait;
use runwarden_base::StoreError;
use serde_json::Value;

use crate::config::{Effect, ServerConfig};
use crate::naming::local_names;
use crate::schema::normalise_input_schema;

/// A tool as the server listed it, before normalisation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ListedTool {
    /// The remote name.
    pub name: String,
    /// The server's description, if any.
    pub description: Option<String>,
    /// The input schema as sent.
    pub input_schema: Value,
    /// The output schema as sent, if the tool declared one (M7 amended).
    pub output_schema: Option<Value>,
    /// `execution.taskSupport` as sent (`"required"`, `"optional"`, `"forbidden"`).
    pub task_support: Option<String>,
}

/// Whether a tool's input schema can be offered to model providers.
#[derive(Debug, Clone, PartialEq)]
pub enum SchemaStatus {
    /// The normalised schema (M8).
    Usable(Value),
    /// Why the whole tool was refused; it is listed but never offered to a model.
    Refused(String),
}

/// One imported tool.
#[derive(Debug, Clone, PartialEq)]
pub struct CatalogueEntry {
    /// The server's configured name.
    pub server: String,
    /// The provider-valid name the model sees (M9).
    pub local_name: String,
    /// The name that goes on the wire.
    pub remote_name: String,
    /// The server's description.
    pub description: Option<String>,
    /// The effect the configuration declared when the tool was imported: a record only.
    /// M10 (amended): nothing decides by it; runs, `mcp list` and the API resolve the
    /// effect from the configuration in force ([`ServerConfig::effect_of`]).
    pub effect: Effect,
    /// The normalised schema, or why the tool was refused.
    pub schema: SchemaStatus,
    /// M7 (amended): the `outputSchema` the tool declared, as sent; a call's
    /// `structuredContent` must match it. `None` when it declared none.
    pub output_schema: Option<Value>,
    /// When it was imported, Unix milliseconds UTC.
    pub imported_ms: i64,
}

impl CatalogueEntry {
    /// True when the tool can be offered to a model.
    pub fn is_usable(&self) -> bool {
        matches!(self.schema, SchemaStatus::Usable(_))
    }
}

/// Builds catalogue entries from a discovery: local names, normalised schemas and the
/// operator's effects. Never reads annotations the server wrote about itself (M10).
pub fn build_catalogue(
    server: &ServerConfig,
    tools: &[ListedTool],
    now_ms: i64,
) -> Vec<CatalogueEntry> {
    let remote: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    let locals = local_names(&server.name, &remote);
    tools
        .iter()
        .zip(locals)
        .map(|(tool, local_name)| CatalogueEntry {
            server: server.name.clone(),
            local_name,
            remote_name: tool.name.clone(),
            description: tool.description.clone(),
            effect: server.effect_of(&tool.name),
            schema: schema_status(tool),
            output_schema: tool.output_schema.clone(),
            imported_ms: now_ms,
        })
        .collect()
}

/// Whether a listed tool can be offered: its execution mode, its output schema and its
/// input schema (M8 amended), in that order; the first reason to refuse it wins.
fn schema_status(tool: &ListedTool) -> SchemaStatus {
    if tool.task_support.as_deref() == Some("required") {
        // The tasks utility is not implemented: a tool that only runs as a task would
        // answer every plain tools/call with an error, so it is refused at import.
        return SchemaStatus::Refused(
            "the tool requires task-augmented execution (execution.taskSupport is \"required\"), which runwarden does not implement; the tool is refused".into(),
        );
    }
    if let Some(output) = &tool.output_schema
        && let Err(problem) = check_output_schema(output)
    {
        return SchemaStatus::Refused(format!(
            "its outputSchema {problem}, so its results could not be checked; the tool is refused"
        ));
    }
    if let Err(refusal) = crate::stateless::header_params(&tool.input_schema) {
        // M19: a tool whose x-mcp-header declarations break the rules is excluded; the
        // server's other tools are kept.
        return SchemaStatus::Refused(format!(
            "its inputSchema's x-mcp-header is invalid: {refusal}; the tool is refused"
        ));
    }
    match normalise_input_schema(&tool.input_schema) {
        Ok(schema) => SchemaStatus::Usable(schema),
        Err(refusal) => SchemaStatus::Refused(refusal.to_string()),
    }
}

/// M7 (amended): an output schema must compile, with no reference leaving the document
/// (the validator has no resolver that could fetch one), so every result can be checked.
fn check_output_schema(schema: &Value) -> Result<(), String> {
    if !schema.is_object() {
        return Err("is not a JSON object".into());
    }
    crate::result::output_validator(schema).map(|_| ())
}

/// One contact with a server, for its liveness record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contact {
    /// The server answered an operation.
    Success {
        /// When, Unix milliseconds UTC.
        at_ms: i64,
    },
    /// An operation failed for a reason on the server's side or the way to it.
    Failure {
        /// When, Unix milliseconds UTC.
        at_ms: i64,
        /// One line, no secrets (an `McpError`'s text).
        error: String,
    },
}

/// A server's liveness (M11): the last success and the last failure. The run's events,
/// not this, are the call log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ServerHealth {
    /// The server's configured name.
    pub server: String,
    /// The last successful contact.
    pub last_success_ms: Option<i64>,
    /// The last failure.
    pub last_failure_ms: Option<i64>,
    /// What the last failure was.
    pub last_error: Option<String>,
}

/// M19: what a server was last found to speak, so a new process does not probe it again
/// before its time is up. Kept per server name and only trusted for the same URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownProtocol {
    /// The endpoint it was learnt from; another URL is a server not yet known.
    pub url: String,
    /// The protocol version (`2026-07-28`, or the handshake's).
    pub protocol: String,
    /// Whether the server declared the `tools` capability.
    pub tools: bool,
    /// Until when it is trusted, Unix milliseconds UTC.
    pub until_ms: i64,
}

/// The schema columns a backend stores for one catalogue entry: the normalised schema as
/// JSON text, or the reason it was refused (exactly one is set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredSchema {
    /// The usable schema, as JSON text.
    pub schema_json: Option<String>,
    /// Why the schema was refused.
    pub refusal: Option<String>,
    /// The declared output schema, as JSON text (M7 amended).
    pub output_schema_json: Option<String>,
}

/// What every backend checks before it replaces a server's catalogue: each entry is filed
/// under `server`, and no local or remote name appears twice (a caller bug, said plainly
/// rather than as a constraint failure). Answers each entry's schema columns, in order.
pub fn stored_catalogue(
    server: &str,
    entries: &[CatalogueEntry],
) -> Result<Vec<StoredSchema>, String> {
    let mut locals = std::collections::BTreeSet::new();
    let mut remotes = std::collections::BTreeSet::new();
    let mut rows = Vec::with_capacity(entries.len());
    for entry in entries {
        if entry.server != server {
            return Err(format!(
                "tool {} belongs to server {}, not {server}: replace each server's catalogue separately",
                entry.local_name, entry.server
            ));
        }
        let twice = if !locals.insert(entry.local_name.as_str()) {
            Some(format!("local name {}", entry.local_name))
        } else if !remotes.insert(entry.remote_name.as_str()) {
            Some(format!("remote tool {}", entry.remote_name))
        } else {
            None
        };
        if let Some(problem) = twice {
            return Err(format!(
                "the catalogue for server {server} lists {problem} twice: build it with build_catalogue"
            ));
        }
        let output_schema_json = entry.output_schema.as_ref().map(Value::to_string);
        rows.push(match &entry.schema {
            SchemaStatus::Usable(schema) => StoredSchema {
                schema_json: Some(schema.to_string()),
                refusal: None,
                output_schema_json,
            },
            SchemaStatus::Refused(reason) => StoredSchema {
                schema_json: None,
                refusal: Some(reason.clone()),
                output_schema_json,
            },
        });
    }
    Ok(rows)
}

/// Storage for catalogues and liveness. An internal seam: every backend runs
/// `runwarden-storetest`'s catalogue checks.
#[async_trait]
pub trait CatalogueStore: Send + Sync + 'static {
    /// Replaces a server's whole catalogue atomically. A local name already used by
    /// another server's tool is refused and nothing changes.
    async fn catalogue_replace(
        &self,
        server: &str,
        entries: Vec<CatalogueEntry>,
    ) -> Result<(), StoreError>;

    /// Every entry, or one server's, ordered by server then local name.
    async fn catalogue_list(&self, server: Option<&str>)
    -> Result<Vec<CatalogueEntry>, StoreError>;

    /// A number that moves with every change to the catalogue, whoever makes it, so a
    /// reader may keep a list it read until the number moves. `None` (the default) for a
    /// backend that keeps none: the reader then lists the catalogue every time. Read it
    /// before the list it goes with: a change in between then shows as a move next time.
    async fn catalogue_version(&self) -> Result<Option<u64>, StoreError> {
        Ok(None)
    }

    /// Records one contact; a success keeps the last failure and vice versa.
    async fn health_record(&self, server: &str, contact: Contact) -> Result<(), StoreError>;

    /// Every server's liveness, ordered by server.
    async fn health_list(&self) -> Result<Vec<ServerHealth>, StoreError>;

    /// M19: what `server` was last found to speak, if anything is remembered (expired or
    /// not: the client compares `until_ms`). A backend that keeps nothing answers `None`,
    /// and the client then probes every process.
    async fn protocol_get(&self, server: &str) -> Result<Option<KnownProtocol>, StoreError> {
        let _ = server;
        Ok(None)
    }

    /// M19: remembers what `server` speaks, replacing what was remembered.
    async fn protocol_put(&self, server: &str, known: KnownProtocol) -> Result<(), StoreError> {
        let _ = (server, known);
        Ok(())
    }

    /// M19: forgets what `server` speaks (after a failure), so the next process probes.
    async fn protocol_forget(&self, server: &str) -> Result<(), StoreError> {
        let _ = server;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(server: &str, local: &str, remote: &str, schema: SchemaStatus) -> CatalogueEntry {
        CatalogueEntry {
            server: server.into(),
            local_name: local.into(),
            remote_name: remote.into(),
            description: None,
            effect: Effect::ReadOnly,
            schema,
            output_schema: None,
            imported_ms: 1,
        }
    }

    #[test]
    fn a_catalogue_is_checked_the_same_way_for_every_backend() {
        let usable = SchemaStatus::Usable(json!({"type": "object"}));
        let refused = SchemaStatus::Refused("uses $ref".into());
        let rows = stored_catalogue(
            "srv",
            &[
                stored("srv", "srv__a", "a", usable.clone()),
                stored("srv", "srv__b", "b", refused),
            ],
        )
        .unwrap();
        assert_eq!(rows[0].schema_json.as_deref(), Some(r#"{"type":"object"}"#));
        assert_eq!(rows[0].refusal, None);
        assert_eq!(rows[1].schema_json, None);
        assert_eq!(rows[1].refusal.as_deref(), Some("uses $ref"));

        let other = stored_catalogue("srv", &[stored("web", "web__a", "a", usable.clone())]);
        assert!(
            other
                .unwrap_err()
                .contains("belongs to server web, not srv")
        );
        let local_twice = stored_catalogue(
            "srv",
            &[
                stored("srv", "srv__a", "a", usable.clone()),
                stored("srv", "srv__a", "b", usable.clone()),
            ],
        );
        assert!(
            local_twice
                .unwrap_err()
                .contains("lists local name srv__a twice")
        );
        let remote_twice = stored_catalogue(
            "srv",
            &[
                stored("srv", "srv__a", "a", usable.clone()),
                stored("srv", "srv__b", "a", usable),
            ],
        );
        assert!(
            remote_twice
                .unwrap_err()
                .contains("lists remote tool a twice")
        );
    }

    #[test]
    fn effects_come_from_the_operator_never_from_annotations() {
        let mut server = ServerConfig::new("tickets", "http://x");
        server.tools.insert("search".into(), Effect::ReadOnly);
        let tools = vec![
            ListedTool {
                name: "search".into(),
                description: None,
                input_schema: json!({"type": "object"}),
                ..ListedTool::default()
            },
            // The server claims this one is harmless; the default still applies.
            ListedTool {
                name: "delete".into(),
                description: Some("readOnlyHint: true".into()),
                input_schema: json!({}),
                ..ListedTool::default()
            },
        ];
        let entries = build_catalogue(&server, &tools, 1);
        assert_eq!(entries[0].effect, Effect::ReadOnly);
        assert_eq!(entries[1].effect, Effect::NonIdempotentWrite);
        assert_eq!(entries[1].local_name, "tickets__delete");
    }

    #[test]
    fn a_refused_schema_keeps_the_tool_listed_with_its_reason() {
        let server = ServerConfig::new("s", "http://x");
        let tools = vec![ListedTool {
            name: "t".into(),
            description: None,
            input_schema: json!({"type": "object", "properties": {"p": {"prefixItems": []}}}),
            ..ListedTool::default()
        }];
        let entries = build_catalogue(&server, &tools, 1);
        assert!(
            matches!(&entries[0].schema, SchemaStatus::Refused(reason) if reason.contains("prefixItems"))
        );
        assert!(!entries[0].is_usable());
    }

    #[test]
    fn a_tool_that_requires_tasks_is_refused_with_the_reason() {
        let server = ServerConfig::new("s", "http://x");
        let tool = |name: &str, support: Option<&str>| ListedTool {
            name: name.into(),
            input_schema: json!({"type": "object"}),
            task_support: support.map(str::to_string),
            ..ListedTool::default()
        };
        let tools = vec![
            tool("required", Some("required")),
            tool("optional", Some("optional")),
            tool("forbidden", Some("forbidden")),
            tool("plain", None),
        ];
        let entries = build_catalogue(&server, &tools, 1);
        assert!(
            matches!(&entries[0].schema, SchemaStatus::Refused(reason)
                if reason.contains("execution.taskSupport is \"required\"")),
            "{:?}",
            entries[0].schema
        );
        assert!(entries[1..].iter().all(CatalogueEntry::is_usable));
    }

    #[test]
    fn an_output_schema_is_kept_as_sent_and_one_that_cannot_be_checked_refuses_the_tool() {
        let server = ServerConfig::new("s", "http://x");
        let output =
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
        let tool = |name: &str, output: Value| ListedTool {
            name: name.into(),
            input_schema: json!({"type": "object"}),
            output_schema: Some(output),
            ..ListedTool::default()
        };
        let tools = vec![
            tool("good", output.clone()),
            tool(
                "remote",
                json!({"type": "object", "properties": {"p": {"$ref": "https://example.com/p.json"}}}),
            ),
            tool(
                "broken",
                json!({"type": "object", "properties": {"n": {"type": "nope"}}}),
            ),
        ];
        let entries = build_catalogue(&server, &tools, 1);
        assert!(entries[0].is_usable());
        assert_eq!(entries[0].output_schema, Some(output));
        for entry in &entries[1..] {
            assert!(
                matches!(&entry.schema, SchemaStatus::Refused(reason)
                    if reason.starts_with("its outputSchema") && reason.ends_with("the tool is refused")),
                "{:?}",
                entry.schema
            );
        }
    }
}
