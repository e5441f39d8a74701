//! The `CatalogueStore` conformance checks: the imported tool catalogue (M8-M10)
//! first, then per-server liveness (M11).

use std::sync::Arc;

use runwarden_mcp::{
    CatalogueEntry, CatalogueStore, Contact, Effect, KnownProtocol, SchemaStatus, ServerHealth,
};
use serde_json::json;

/// Runs every check against `store`, which must be fresh and empty. Panics on the first
/// property that does not hold.
pub async fn exercise_catalogue_store(store: Arc<dyn CatalogueStore>) {
    let s = &*store;
    a_fresh_store_lists_nothing(s).await;
    refused_and_usable_schemas_round_trip(s).await;
    replace_is_atomic_and_scoped_to_one_server(s).await;
    list_is_ordered_and_filters_by_server(s).await;
    a_local_name_taken_by_another_server_is_refused_and_nothing_changes(s).await;
    a_server_may_keep_its_own_local_names_across_a_replace(s).await;
    an_entry_for_another_server_is_refused_and_nothing_changes(s).await;
    an_empty_catalogue_clears_a_server(s).await;

    health_of_an_unknown_server_is_absent(s).await;
    a_success_keeps_the_last_failure_and_vice_versa(s).await;
    a_newer_contact_replaces_the_older_one_of_its_kind(s).await;
    health_is_ordered_by_server_and_separate_from_the_catalogue(s).await;

    what_a_server_speaks_is_kept_replaced_and_forgotten(s).await;
    // Last: it records the liveness of a server of its own.
    the_catalogue_version_moves_with_every_change(s).await;
}

fn entry(server: &str, tool: &str, imported_ms: i64) -> CatalogueEntry {
    CatalogueEntry {
        server: server.into(),
        local_name: format!("{server}__{tool}"),
        remote_name: tool.into(),
        description: Some(format!("{tool} on {server}")),
        effect: Effect::NonIdempotentWrite,
        schema: SchemaStatus::Usable(json!({"type": "object"})),
        output_schema: None,
        imported_ms,
    }
}

async fn list(store: &dyn CatalogueStore, server: Option<&str>) -> Vec<CatalogueEntry> {
    store.catalogue_list(server).await.expect("catalogue_list")
}

async fn replace(store: &dyn CatalogueStore, server: &str, entries: &[CatalogueEntry]) {
    store
        .catalogue_replace(server, entries.to_vec())
        .await
        .expect("catalogue_replace");
}

fn local_names(entries: &[CatalogueEntry]) -> Vec<&str> {
    entries.iter().map(|e| e.local_name.as_str()).collect()
}

/// A backend that keeps a version moves it with every change to the catalogue (so a reader
/// that keeps the list it read sees each change), and not with a server's liveness.
async fn the_catalogue_version_moves_with_every_change(store: &dyn CatalogueStore) {
    let version = || async { store.catalogue_version().await.expect("catalogue_version") };
    let Some(first) = version().await else {
        return; // the reader lists the catalogue every time
    };
    let mut seen = vec![first];
    let mut moved = |v: Option<u64>, what: &str| {
        let v = v.unwrap_or_else(|| panic!("{what}: the version went away"));
        assert!(
            !seen.contains(&v),
            "{what}: the version {v} was seen before"
        );
        seen.push(v);
    };
    replace(store, "ver", &[entry("ver", "a", 1)]).await;
    moved(version().await, "a server's first tools");
    // The same entry again: only the version tells the replacement apart.
    replace(store, "ver", &[entry("ver", "a", 1)]).await;
    moved(version().await, "the same tools again");
    replace(store, "ver", &[entry("ver", "a", 1), entry("ver", "b", 1)]).await;
    moved(version().await, "a tool more");
    let at = version().await;
    store
        .health_record("ver", Contact::Success { at_ms: 5 })
        .await
        .unwrap();
    assert_eq!(
        version().await,
        at,
        "a server's liveness is not the catalogue"
    );
    replace(store, "ver", &[]).await;
    moved(version().await, "a server's tools removed");
}

async fn a_fresh_store_lists_nothing(store: &dyn CatalogueStore) {
    assert!(
        list(store, None).await.is_empty(),
        "the suite needs an empty catalogue"
    );
    assert!(
        store.health_list().await.unwrap().is_empty(),
        "the suite needs an empty health table"
    );
}

async fn refused_and_usable_schemas_round_trip(store: &dyn CatalogueStore) {
    let usable = CatalogueEntry {
        description: Some("ünïcode \"quoted\" description\nover two lines".into()),
        effect: Effect::ReadOnly,
        schema: SchemaStatus::Usable(json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "what to look for"},
                "limit": {"type": "integer"},
                "ratio": {"type": "number"},
            },
            "required": ["query"],
            "additionalProperties": false,
        })),
        // M7 (amended): the declared output schema comes back exactly as sent.
        output_schema: Some(json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"hits": {"type": "array", "items": {"$ref": "#/$defs/Hit"}}},
            "$defs": {"Hit": {"type": "object", "properties": {"id": {"type": "string"}}}},
            "required": ["hits"],
        })),
        imported_ms: i64::MAX,
        ..entry("roundtrip", "search", 0)
    };
    let refused = CatalogueEntry {
        description: None,
        effect: Effect::IdempotentWrite,
        schema: SchemaStatus::Refused("the schema uses $defs, which providers refuse".into()),
        imported_ms: -1,
        ..entry("roundtrip", "upsert", 0)
    };
    let plain = entry("roundtrip", "delete", 0);
    replace(
        store,
        "roundtrip",
        &[usable.clone(), refused.clone(), plain.clone()],
    )
    .await;
    // Ordered by local name: delete, search, upsert.
    assert_eq!(
        list(store, Some("roundtrip")).await,
        [plain, usable, refused],
        "every field of a usable and a refused tool comes back as it was stored"
    );
    replace(store, "roundtrip", &[]).await;
}

async fn replace_is_atomic_and_scoped_to_one_server(store: &dyn CatalogueStore) {
    replace(
        store,
        "alpha",
        &[entry("alpha", "one", 1), entry("alpha", "two", 1)],
    )
    .await;
    replace(store, "bravo", &[entry("bravo", "one", 1)]).await;
    let new_alpha = [entry("alpha", "three", 2), entry("alpha", "two", 2)];
    replace(store, "alpha", &new_alpha).await;
    assert_eq!(
        local_names(&list(store, Some("alpha")).await),
        ["alpha__three", "alpha__two"],
        "a replace drops tools the server no longer lists"
    );
    assert!(
        list(store, Some("alpha"))
            .await
            .iter()
            .all(|e| e.imported_ms == 2),
        "a replace rewrites tools the server still lists"
    );
    assert_eq!(
        list(store, Some("bravo")).await,
        [entry("bravo", "one", 1)],
        "replacing one server's catalogue leaves the others alone"
    );
}

async fn list_is_ordered_and_filters_by_server(store: &dyn CatalogueStore) {
    // Inserted out of order, so the listing's order comes from the store.
    replace(
        store,
        "charlie",
        &[
            entry("charlie", "zulu", 3),
            entry("charlie", "alpha", 3),
            entry("charlie", "mike", 3),
        ],
    )
    .await;
    assert_eq!(
        local_names(&list(store, None).await),
        [
            "alpha__three",
            "alpha__two",
            "bravo__one",
            "charlie__alpha",
            "charlie__mike",
            "charlie__zulu",
        ],
        "ordered by server, then local name"
    );
    assert_eq!(
        local_names(&list(store, Some("charlie")).await),
        ["charlie__alpha", "charlie__mike", "charlie__zulu"]
    );
    assert!(list(store, Some("nobody")).await.is_empty());
}

async fn a_local_name_taken_by_another_server_is_refused_and_nothing_changes(
    store: &dyn CatalogueStore,
) {
    let before = list(store, None).await;
    // M9: two servers whose names collide after sanitising could produce one local name.
    let mut clash = entry("bravo", "two", 9);
    clash.local_name = "alpha__two".into();
    let error = store
        .catalogue_replace("bravo", vec![entry("bravo", "fresh", 9), clash])
        .await
        .expect_err("a local name another server uses must be refused");
    assert!(
        error
            .message
            .contains("local name alpha__two is already used by server alpha"),
        "the error names the local name and its owner: {error}"
    );
    assert!(
        error.message.contains("rename one of the servers"),
        "the error says what to do: {error}"
    );
    assert_eq!(
        list(store, None).await,
        before,
        "a refused replace changes nothing, not even the refused server's old tools"
    );
}

async fn a_server_may_keep_its_own_local_names_across_a_replace(store: &dyn CatalogueStore) {
    let before = list(store, Some("bravo")).await;
    let mut renamed = entry("bravo", "one", 4);
    renamed.description = None;
    replace(store, "bravo", &[renamed.clone()]).await;
    assert_eq!(
        list(store, Some("bravo")).await,
        [renamed],
        "a server's own old rows never collide with its new ones"
    );
    replace(store, "bravo", &before).await;
}

async fn an_entry_for_another_server_is_refused_and_nothing_changes(store: &dyn CatalogueStore) {
    let before = list(store, None).await;
    let error = store
        .catalogue_replace(
            "bravo",
            vec![entry("bravo", "fine", 5), entry("delta", "stray", 5)],
        )
        .await
        .expect_err("an entry filed under another server must be refused");
    assert!(
        error.message.contains("delta") && error.message.contains("bravo"),
        "the error names both servers: {error}"
    );
    assert_eq!(list(store, None).await, before);
}

async fn an_empty_catalogue_clears_a_server(store: &dyn CatalogueStore) {
    replace(store, "charlie", &[]).await;
    assert!(list(store, Some("charlie")).await.is_empty());
    assert_eq!(
        local_names(&list(store, None).await),
        ["alpha__three", "alpha__two", "bravo__one"],
        "clearing one server leaves the others alone"
    );
    // Replacing an empty server with nothing is not an error.
    replace(store, "never-imported", &[]).await;
}

async fn health(store: &dyn CatalogueStore, server: &str) -> Option<ServerHealth> {
    store
        .health_list()
        .await
        .expect("health_list")
        .into_iter()
        .find(|h| h.server == server)
}

async fn record(store: &dyn CatalogueStore, server: &str, contact: Contact) {
    store
        .health_record(server, contact)
        .await
        .expect("health_record");
}

fn failure(at_ms: i64, error: &str) -> Contact {
    Contact::Failure {
        at_ms,
        error: error.into(),
    }
}

async fn health_of_an_unknown_server_is_absent(store: &dyn CatalogueStore) {
    assert_eq!(
        health(store, "alpha").await,
        None,
        "importing a catalogue records no contact"
    );
    assert_eq!(health(store, "nobody").await, None);
}

async fn a_success_keeps_the_last_failure_and_vice_versa(store: &dyn CatalogueStore) {
    record(store, "tickets", Contact::Success { at_ms: 100 }).await;
    assert_eq!(
        health(store, "tickets").await,
        Some(ServerHealth {
            server: "tickets".into(),
            last_success_ms: Some(100),
            ..ServerHealth::default()
        })
    );
    record(store, "tickets", failure(200, "connection refused")).await;
    let expected = ServerHealth {
        server: "tickets".into(),
        last_success_ms: Some(100),
        last_failure_ms: Some(200),
        last_error: Some("connection refused".into()),
    };
    assert_eq!(
        health(store, "tickets").await,
        Some(expected.clone()),
        "a failure keeps the last success"
    );
    record(store, "tickets", Contact::Success { at_ms: 300 }).await;
    assert_eq!(
        health(store, "tickets").await,
        Some(ServerHealth {
            last_success_ms: Some(300),
            ..expected
        }),
        "a success keeps the last failure and its error"
    );

    record(store, "flaky", failure(50, "timed out after 20s")).await;
    assert_eq!(
        health(store, "flaky").await,
        Some(ServerHealth {
            server: "flaky".into(),
            last_success_ms: None,
            last_failure_ms: Some(50),
            last_error: Some("timed out after 20s".into()),
        }),
        "a server that never answered has no success"
    );
}

async fn a_newer_contact_replaces_the_older_one_of_its_kind(store: &dyn CatalogueStore) {
    record(store, "tickets", failure(400, "HTTP 503")).await;
    record(store, "tickets", Contact::Success { at_ms: 500 }).await;
    assert_eq!(
        health(store, "tickets").await,
        Some(ServerHealth {
            server: "tickets".into(),
            last_success_ms: Some(500),
            last_failure_ms: Some(400),
            last_error: Some("HTTP 503".into()),
        }),
        "the newest failure's time and error travel together"
    );
}

async fn health_is_ordered_by_server_and_separate_from_the_catalogue(store: &dyn CatalogueStore) {
    record(store, "bravo", Contact::Success { at_ms: 1 }).await;
    let servers: Vec<String> = store
        .health_list()
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.server)
        .collect();
    assert_eq!(servers, ["bravo", "flaky", "tickets"]);
    assert_eq!(
        local_names(&list(store, None).await),
        ["alpha__three", "alpha__two", "bravo__one"],
        "recording health never touches the catalogue"
    );
    replace(store, "bravo", &[]).await;
    assert!(
        health(store, "bravo").await.is_some(),
        "clearing a catalogue keeps the server's health"
    );
}

/// M19: what each server speaks, kept across processes: per server, replaced whole,
/// forgotten on request (forgetting what is not there is no error).
async fn what_a_server_speaks_is_kept_replaced_and_forgotten(store: &dyn CatalogueStore) {
    let known = |protocol: &str, tools: bool, until_ms: i64| KnownProtocol {
        url: "http://127.0.0.1:1/mcp".into(),
        protocol: protocol.into(),
        tools,
        until_ms,
    };
    assert_eq!(store.protocol_get("tickets").await.unwrap(), None);
    store
        .protocol_put("tickets", known("2025-11-25", true, 10))
        .await
        .unwrap();
    store
        .protocol_put("web", known("2026-07-28", false, 20))
        .await
        .unwrap();
    store
        .protocol_put("tickets", known("2026-07-28", true, 30))
        .await
        .unwrap();
    assert_eq!(
        store.protocol_get("tickets").await.unwrap(),
        Some(known("2026-07-28", true, 30)),
        "replaced whole"
    );
    store.protocol_forget("tickets").await.unwrap();
    store.protocol_forget("tickets").await.unwrap();
    assert_eq!(store.protocol_get("tickets").await.unwrap(), None);
    assert_eq!(
        store.protocol_get("web").await.unwrap(),
        Some(known("2026-07-28", false, 20)),
        "another server's is untouched"
    );
}
