//! `GET /healthz` (the process answers) and `GET /readyz` (the store answers too); neither
//! needs a token.

use axum::extract::State;
use runwarden_runtime::RunStore;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;

pub(super) async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    match state.store.run_counts().await {
        Ok(_) => Ok(axum::Json(json!({ "status": "ready" }))),
        Err(error) => {
            tracing::warn!(%error, "not ready: the store does not answer");
            Err(ApiError::NotReady)
        }
    }
}
