//! `GET /metrics`: OpenMetrics text from this process's registry ([`crate::metrics`]),
//! with the database-wide gauges read from the store at each scrape.

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::AppState;
use super::error::ApiError;

/// `GET /metrics`.
pub(crate) async fn metrics(State(state): State<AppState>) -> Result<Response, ApiError> {
    let runs = state.runs.run_counts().await?;
    let calls = runwarden_vault::store::audit_rows_by_action(state.audit.as_ref()).await?;
    let text = state.metrics.render(&runs, &calls);
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
