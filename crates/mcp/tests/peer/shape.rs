//! M7 and M8 (amended) against the real peer (the official Python SDK, tests/peer/
//! shape_tools.py) in its three modes: a pydantic nested model imports with its
//! references inlined and its constraints kept, and is callable; a typed result's
//! `structuredContent` reaches the model and is checked against its `outputSchema`; a
//! tool that only runs as a task is refused at import.

use runwarden_mcp::{
    CatalogueEntry, McpCall, McpClient, ProtocolPolicy, Reply, Request, SchemaStatus, ServerConfig,
    ToolOutcome, build_catalogue,
};
use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::fixture;

/// The peer's three modes: stateful SSE, stateful JSON responses, stateless JSON.
const MODES: [&[&str]; 3] = [
    &[],
    &["--json-response"],
    &["--stateless", "--json-response"],
];

async fn start(flags: &'static [&'static str]) -> Peer {
    tokio::task::spawn_blocking(move || Peer::start(flags))
        .await
        .unwrap()
}

fn call(entry: &CatalogueEntry, arguments: Value) -> McpCall {
    McpCall {
        tool: entry.remote_name.clone(),
        arguments: arguments.as_object().unwrap().clone(),
        output_schema: entry.output_schema.clone(),
        ..McpCall::default()
    }
}

/// Imports the peer's catalogue as `mcp import` does.
async fn import(client: &McpClient) -> Vec<CatalogueEntry> {
    let Ok(Reply::Tools(tools)) = client.send_request(Request::ListTools, None).await else {
        panic!("discovery failed")
    };
    build_catalogue(client.server(), &tools, 0)
}

fn entry<'a>(catalogue: &'a [CatalogueEntry], remote: &str) -> &'a CatalogueEntry {
    catalogue
        .iter()
        .find(|e| e.remote_name == remote)
        .unwrap_or_else(|| panic!("{remote} was not listed"))
}

/// Every `$ref`/`$defs` anywhere in a schema, to show none is left.
fn refs(schema: &Value) -> usize {
    match schema {
        Value::Object(map) => {
            map.keys().filter(|k| *k == "$ref" || *k == "$defs").count()
                + map.values().map(refs).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(refs).sum(),
        _ => 0,
    }
}

#[tokio::test]
async fn a_pydantic_nested_model_imports_with_its_constraints_and_is_callable_in_every_mode() {
    for flags in MODES {
        let peer = start(flags).await;
        let f = fixture().await;
        let client = McpClient::new(
            ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
            f.egress.clone(),
        );
        let catalogue = import(&client).await;
        let order = entry(&catalogue, "place_order");
        let SchemaStatus::Usable(schema) = &order.schema else {
            panic!("{flags:?}: place_order was refused: {:?}", order.schema)
        };
        assert_eq!(refs(schema), 0, "{flags:?}: {schema}");
        let fields = &schema["properties"]["order"]["properties"];
        // M8 (amended): the Literal, the bounds and the pattern survive the inlining.
        assert_eq!(fields["item"]["enum"], json!(["book", "pen"]), "{schema}");
        assert_eq!(
            (
                fields["quantity"]["minimum"].as_i64(),
                fields["quantity"]["maximum"].as_i64()
            ),
            (Some(1), Some(10))
        );
        assert_eq!(
            fields["ship_to"]["properties"]["zip"]["pattern"],
            "^[0-9]{5}$"
        );
        assert_eq!(
            fields["gift_wrap"]["anyOf"][0]["properties"]["zip"]["pattern"],
            "^[0-9]{5}$"
        );

        let placed = client
            .call_tool(
                call(order, json!({"order": {"item": "book", "quantity": 2, "ship_to": {"street": "Main St", "zip": "12345"}}})),
                None,
            )
            .await;
        assert_eq!(
            (placed.result.outcome, placed.result.text.as_str()),
            (ToolOutcome::Succeeded, "2 x book to Main St 12345"),
            "{flags:?}"
        );
        client.close().await.ok();
    }
}

#[tokio::test]
async fn structured_content_reaches_the_model_and_a_result_off_its_output_schema_fails_in_every_mode()
 {
    for flags in MODES {
        let peer = start(flags).await;
        let f = fixture().await;
        let client = McpClient::new(
            ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
            f.egress.clone(),
        );
        let catalogue = import(&client).await;
        let weather = entry(&catalogue, "weather");
        assert!(
            weather.output_schema.is_some(),
            "{flags:?}: the outputSchema was kept"
        );
        let answered = client
            .call_tool(call(weather, json!({"city": "Paris"})), None)
            .await;
        assert_eq!(
            answered.result.outcome,
            ToolOutcome::Succeeded,
            "{flags:?}: {}",
            answered.result.text
        );
        assert_eq!(
            answered.result.structured,
            Some(json!({"city": "Paris", "celsius": 21.5}))
        );
        // The SDK also sends the model's JSON as a text block; the model reads it once.
        let seen: Value = serde_json::from_str(&answered.result.text).unwrap_or_else(|e| {
            panic!(
                "{flags:?}: the model sees no JSON ({e}): {}",
                answered.result.text
            )
        });
        assert_eq!(seen, json!({"city": "Paris", "celsius": 21.5}));

        let bad = entry(&catalogue, "bad_weather");
        let failed = client
            .call_tool(call(bad, json!({"city": "Oslo"})), None)
            .await;
        assert_eq!(failed.result.outcome, ToolOutcome::ToolError, "{flags:?}");
        assert!(
            failed
                .result
                .text
                .contains("does not match the outputSchema it declared")
                && failed.result.text.contains("/celsius"),
            "{flags:?}: {}",
            failed.result.text
        );
        client.close().await.ok();
    }
}

#[tokio::test]
async fn a_tool_that_requires_tasks_is_listed_as_refused_with_the_reason() {
    let peer = start(&[]).await;
    let f = fixture().await;
    let client = McpClient::new(
        ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake),
        f.egress.clone(),
    );
    let catalogue = import(&client).await;
    let job = entry(&catalogue, "long_job");
    assert!(
        matches!(&job.schema, SchemaStatus::Refused(reason) if reason.contains("task-augmented execution")),
        "{:?}",
        job.schema
    );
    assert!(entry(&catalogue, "place_order").is_usable());
    client.close().await.ok();
}
