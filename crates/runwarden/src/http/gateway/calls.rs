//! G3: an operator's view of a gateway session's calls in flight, and the cancel of one of
//! them alone (the session goes on; its client hears "cancelled by an operator"). Only the
//! server that holds the session knows its open calls.

use axum::Json;
use axum::extract::{Path, State};
use serde_json::{Value, json};

use super::AppState;
use crate::http::ApiError;

/// `GET /v1/runs/{id}/calls`: the calls open in a gateway session held by this server,
/// oldest first (none for any other run).
pub(crate) async fn open_calls(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Json<Value> {
    let calls: Vec<Value> = state
        .gateway
        .get(&id)
        .map(|session| session.open_calls())
        .unwrap_or_default()
        .into_iter()
        .map(|(call_id, tool, started)| {
            json!({"call_id": call_id, "tool": tool, "started": crate::output::time(started)})
        })
        .collect();
    Json(json!({ "run_id": id, "calls": calls }))
}

/// `POST /v1/runs/{id}/calls/{call_id}/cancel`: stops that call on the wire.
pub(crate) async fn cancel_call(
    State(state): State<AppState>,
    Path((id, call_id)): Path<(String, String)>,
    axum::Extension(token): axum::Extension<runwarden_vault::ApiToken>,
) -> Result<Json<Value>, ApiError> {
    let cancelled = state
        .gateway
        .get(&id)
        .is_some_and(|session| session.cancel_call(&call_id));
    if !cancelled {
        return Err(ApiError::CallNotFound {
            run_id: id,
            call_id,
        });
    }
    tracing::info!(run = %id, call = %call_id, actor = %token.name, "gateway call cancelled");
    Ok(Json(
        json!({ "run_id": id, "call_id": call_id, "cancelled": true }),
    ))
}
