//! `GET /healthz` (the process answers) and `GET /readyz` (the store answers too); neither
//! needs a token.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::{Request, State};
use axum::response::IntoResponse as _;
use runwarden_vault::store::{StoreError, StoreFault};
use serde_json::{Value, json};
use tower::ServiceExt as _;

use super::AppState;
use super::error::ApiError;

pub(super) async fn healthz() -> axum::Json<Value> {
    axum::Json(json!({ "status": "ok" }))
}

pub(super) async fn readyz(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    // The probe makes a small real write: a store that is full, read-only, failing its
    // I/O, locked by another process or damaged answers reads but not writes, and is not
    // ready.
    let ready = match state.root.backend().await {
        Ok(backend) => backend.ready().await.map_err(anyhow::Error::from),
        Err(error) => Err(error),
    };
    let fault = ready.as_ref().err().map(|error| {
        error
            .chain()
            .find_map(|cause| cause.downcast_ref::<StoreError>())
            .map(|fault| fault.fault.as_str())
    });
    report_change(
        fault.map(|kind| kind.unwrap_or("unreachable")),
        ready.as_ref().err(),
    );
    match fault {
        None => Ok(axum::Json(json!({ "status": "ready" }))),
        Some(kind) => Err(ApiError::NotReady(kind)),
    }
}

/// Reports the probe's finding to the process's store state, which logs and counts a
/// change once, however often the probe runs.
fn report_change(state: Option<&'static str>, error: Option<&anyhow::Error>) {
    let error = error.map(|e| format!("{e:#}"));
    runwarden_runtime::report_store_state(
        state.unwrap_or("ready"),
        error.as_ref().map(|e| e as &dyn std::fmt::Display),
    );
}

/// The API's router once `live` holds it; until then (a server started on a full disk,
/// waiting for room) `/healthz` answers, `/readyz` is 503 not ready (disk full), and every
/// other path 503 `store_unavailable` with `Retry-After`.
pub(crate) fn until_open(live: Arc<OnceLock<Router>>) -> Router {
    Router::new().fallback(move |request: Request| {
        let live = live.clone();
        async move {
            match live.get() {
                Some(app) => match app.clone().oneshot(request).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                },
                None => match request.uri().path() {
                    "/healthz" => healthz().await.into_response(),
                    "/readyz" => {
                        ApiError::NotReady(Some(StoreFault::DiskFull.as_str())).into_response()
                    }
                    _ => ApiError::StoreUnavailable(StoreError::with_fault(
                        "opening the database",
                        StoreFault::DiskFull,
                        "the disk holding the database is full",
                    ))
                    .into_response(),
                },
            }
        }
    })
}
