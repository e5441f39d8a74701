//! G4: the stateless 2026-07-28 revision. There is no session: a client probes
//! `server/discover`, and every request carries the version, its identity and its
//! capabilities in `_meta`. With no session to hold, each `tools/call` is a run of its own
//! (opened for the call, settled when it ends), so an operator's cancel of that run stops
//! that call.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use runwarden_vault::ApiToken;
use serde_json::{Value, json};

use super::session::Session;
use super::wire::{self, FORBIDDEN, METHOD_NOT_FOUND};
use super::{AppState, VERSION_HEADER, answer, call, client_name};

/// The stateless revision's version.
pub(super) const STATELESS: &str = "2026-07-28";

/// `_meta` key: the version of this request.
const META_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
/// `_meta` key: the client's name and version.
const META_CLIENT: &str = "io.modelcontextprotocol/clientInfo";

/// True when the request speaks the stateless revision (by its header or its `_meta`).
pub(super) fn asked(headers: &HeaderMap, params: &Value) -> bool {
    let by_header = headers
        .get(VERSION_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v == STATELESS);
    by_header || params["_meta"][META_VERSION] == STATELESS
}

/// `server/discover`: the versions served, newest first, and what the gateway offers.
pub(super) fn discover(id: &Value) -> Response {
    let mut versions = vec![STATELESS];
    versions.extend(wire::VERSIONS);
    let mut result = json!({
        "supportedVersions": versions,
        "capabilities": {"tools": {"listChanged": false}},
        "resultType": "complete",
        // What a token sees is its own and may change on a reload: never cached.
        "ttlMs": 0,
        "cacheScope": "private",
    });
    result["instructions"] = wire::initialized(STATELESS)["instructions"].clone();
    answer(StatusCode::OK, wire::result(id, result))
}

/// One stateless request of `token`.
pub(super) async fn serve(
    state: &AppState,
    headers: &HeaderMap,
    (token, hash): (&ApiToken, [u8; 32]),
    id: Value,
    (method, params): (&str, Value),
) -> Response {
    if method == "ping" {
        let result = json!({"resultType": "complete"});
        return answer(StatusCode::OK, wire::result(&id, result));
    }
    if method != "tools/list" && method != "tools/call" {
        let why = format!("the gateway does not serve {method}");
        return answer(StatusCode::OK, wire::error(&id, METHOD_NOT_FOUND, why));
    }
    let agent = match state.agents.build_gateway(&token.name).await {
        Ok(agent) => agent,
        Err(error) => {
            let why = crate::output::one_line(&error);
            return answer(StatusCode::FORBIDDEN, wire::error(&id, FORBIDDEN, why));
        }
    };
    if method == "tools/list" {
        let mut result = wire::tools(&agent);
        result["resultType"] = json!("complete");
        result["ttlMs"] = json!(0);
        result["cacheScope"] = json!("private");
        return answer(StatusCode::OK, wire::result(&id, result));
    }
    // The call's own run: it ends when the call's answer is written and the session drops.
    let client = client_name(&json!({"clientInfo": params["_meta"][META_CLIENT]}));
    let opened = Session::open(
        state.executor.clone(),
        agent,
        (hash, &token.name),
        (&client, super::session::Answers::default()),
        STATELESS,
        |_| {},
    )
    .await;
    let session: Arc<Session> = match opened {
        Ok(session) => session,
        Err(error) => {
            let why = format!(
                "could not open the call's run: {}",
                crate::output::one_line(&error)
            );
            let body = wire::error(&id, wire::INTERNAL_ERROR, why);
            return answer(StatusCode::SERVICE_UNAVAILABLE, body);
        }
    };
    call(state, headers, token, session, id, params).await
}
