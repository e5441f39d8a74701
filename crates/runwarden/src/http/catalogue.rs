//! `GET /v1/mcp/servers`: the configured MCP servers with their imported tools (local and
//! remote names, effect, usable or why refused) and liveness, as `mcp list --json` says.

use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;
use crate::views::mcp::server_views;

pub(super) async fn servers(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    let catalogue = state.catalogue.catalogue_list(None).await?;
    let health = state.catalogue.health_list().await?;
    // The MCP servers in force now: `serve` reloads them on SIGHUP.
    let config = state.agents.config();
    let views = server_views(&config, None, &catalogue, &health);
    Ok(axum::Json(json!({ "servers": views })))
}
