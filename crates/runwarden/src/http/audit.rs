//! `GET /v1/audit` (the rows `audit list --json` prints, with its filters) and
//! `GET /v1/audit/verify` (the chain check's report).

use axum::extract::State;
use runwarden_vault::store::AuditFilter;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, Query};
use crate::views::audit::RowView;

/// The query of `GET /v1/audit`: the filters of `runwarden audit list`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AuditQuery {
    action: Option<String>,
    run: Option<String>,
    limit: Option<u32>,
}

/// Rows when no limit is asked for, and the most one answer carries.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 1000;

pub(super) async fn list(
    State(state): State<AppState>,
    Query(query): Query<AuditQuery>,
) -> Result<axum::Json<Value>, ApiError> {
    let limit = match query.limit {
        None => DEFAULT_LIMIT,
        Some(0) => {
            return Err(ApiError::InvalidRequest(format!(
                "limit must be between 1 and {MAX_LIMIT}"
            )));
        }
        Some(n) => n.min(MAX_LIMIT),
    };
    let filter = AuditFilter {
        action: query.action.filter(|a| !a.is_empty()),
        correlation: query.run.filter(|r| !r.is_empty()),
        newest_first: true,
        limit,
        after_id: None,
    };
    let rows = state.vault.audit_list(filter).await?;
    let views = RowView::all(&state.vault, &rows)
        .await
        .map_err(ApiError::Internal)?;
    Ok(axum::Json(json!({ "rows": views })))
}

pub(super) async fn verify(State(state): State<AppState>) -> Result<axum::Json<Value>, ApiError> {
    let report = state.vault.audit_verify().await?;
    let value = serde_json::to_value(&report).map_err(|e| {
        ApiError::Internal(anyhow::Error::new(e).context("while encoding the report"))
    })?;
    Ok(axum::Json(value))
}
