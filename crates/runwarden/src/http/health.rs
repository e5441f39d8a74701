//! `GET /healthz` (the process answers) and `GET /readyz` (the store answers too); neither
//! needs a token.

use axum::extract::State;
use serde_json::{Value, json};

use super::AppState;
use super::error::ApiError;

pub(super) async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    // A cheap probe that also takes the write lock: a store locked by another process
    // answers reads (WAL) but not writes, and is not ready.
    let ready = match state.root.backend().await {
        Ok(backend) => backend.ready().await.map_err(anyhow::Error::from),
        Err(error) => Err(error),
    };
    match ready {
        Ok(_) => Ok(axum::Json(json!({ "status": "ready" }))),
        Err(error) => {
            tracing::warn!(%error, "not ready: the store does not answer");
            Err(ApiError::NotReady)
        }
    }
}
