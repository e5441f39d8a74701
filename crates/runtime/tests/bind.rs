//! M10 (amended): a bound tool's effect comes from its server's configuration when the
//! run binds its tools, never from the effect the catalogue recorded at import.

use std::collections::HashMap;
use std::sync::Arc;

use runwarden_mcp::{CatalogueEntry, Effect, McpClient, SchemaStatus, ServerConfig};
use runwarden_runtime::bind_tools;
use serde_json::json;

use crate::support::fixture;

/// An entry as `mcp import` stored it, with the effect the configuration had then.
fn imported(remote: &str, effect_at_import: Effect) -> CatalogueEntry {
    CatalogueEntry {
        server: "srv".into(),
        local_name: format!("srv__{remote}"),
        remote_name: remote.into(),
        description: None,
        effect: effect_at_import,
        schema: SchemaStatus::Usable(json!({"type": "object"})),
        output_schema: None,
        imported_ms: 1,
    }
}

fn clients(f: &crate::support::Fixture, config: ServerConfig) -> HashMap<String, Arc<McpClient>> {
    HashMap::from([(
        config.name.clone(),
        Arc::new(McpClient::new(config, f.egress.clone())),
    )])
}

#[tokio::test]
async fn a_bound_effect_is_the_configured_one_not_the_one_recorded_at_import() {
    let f = fixture().await;
    // Imported while everything was a non-idempotent write; since then the operator
    // declared the server idempotent and one tool read-only.
    let catalogue = [
        imported("search", Effect::NonIdempotentWrite),
        imported("create", Effect::NonIdempotentWrite),
    ];
    let mut config = ServerConfig::new("srv", "http://127.0.0.1:9/mcp");
    config.effect = Effect::IdempotentWrite;
    config.tools.insert("search".into(), Effect::ReadOnly);
    let clients = clients(&f, config);
    let bound = bind_tools(&["srv__*".into()], &catalogue, |s| clients.get(s).cloned()).unwrap();
    let effects: Vec<(&str, Effect)> = bound
        .iter()
        .map(|t| (t.remote_name.as_str(), t.effect))
        .collect();
    assert_eq!(
        effects,
        [
            ("search", Effect::ReadOnly),
            ("create", Effect::IdempotentWrite)
        ]
    );

    // And the other way: imported as read-only, now left to the default (a write).
    let catalogue = [imported("search", Effect::ReadOnly)];
    let clients = self::clients(&f, ServerConfig::new("srv", "http://127.0.0.1:9/mcp"));
    let bound = bind_tools(&["srv__search".into()], &catalogue, |s| {
        clients.get(s).cloned()
    })
    .unwrap();
    assert_eq!(bound[0].effect, Effect::NonIdempotentWrite);
}

#[tokio::test]
async fn binding_refuses_a_tool_declaration_the_catalogue_does_not_have_naming_server_and_tool() {
    let f = fixture().await;
    let catalogue = [imported("create", Effect::NonIdempotentWrite)];
    let mut config = ServerConfig::new("srv", "http://127.0.0.1:9/mcp");
    config.tools.insert("creat".into(), Effect::ReadOnly);
    let clients = clients(&f, config);
    let error = bind_tools(&["srv__create".into()], &catalogue, |s| {
        clients.get(s).cloned()
    })
    .unwrap_err();
    assert!(
        error.contains("server srv") && error.contains("\"creat\""),
        "{error}"
    );
}
