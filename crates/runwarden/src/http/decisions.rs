//! `/v1/decisions`: list the operator decisions (by status, by run), read one,
//! answer one (operator role). The answer is audited with the token's name as the actor.

use axum::Extension;
use axum::extract::State;
use runwarden_runtime::{Answer, AnswerRequest, DecisionFilter, DecisionStatus};
use runwarden_vault::ApiToken;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, Json, Path, Query};
use crate::decisions::{answer as answer_decision, decision_json};

/// The query of `GET /v1/decisions`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    status: Option<String>,
    run: Option<String>,
    limit: Option<u32>,
}

pub(super) async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<Value>, ApiError> {
    let status = match query.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(DecisionStatus::parse(text).ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "unknown status {text:?}: use pending, answered, expired or dropped"
            ))
        })?),
    };
    let limit = match query.limit {
        Some(0) => {
            return Err(ApiError::InvalidRequest(
                "limit must be between 1 and 200".into(),
            ));
        }
        Some(n) => n.min(200),
        None => 50,
    };
    let decisions = state
        .runs
        .decision_list(DecisionFilter {
            status,
            run_id: query.run.filter(|r| !r.is_empty()),
            due_by_ms: None,
            limit,
        })
        .await?;
    let views: Vec<Value> = decisions.iter().map(decision_json).collect();
    Ok(axum::Json(json!({ "decisions": views })))
}

pub(super) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    match state.runs.decision_get(&id).await? {
        Some(decision) => Ok(axum::Json(decision_json(&decision))),
        None => Err(ApiError::DecisionNotFound(id)),
    }
}

/// The body of `POST /v1/decisions/{id}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AnswerBody {
    answer: String,
    reason: Option<String>,
    arguments: Option<Value>,
    content: Option<Value>,
}

pub(super) async fn answer(
    State(state): State<AppState>,
    Extension(token): Extension<ApiToken>,
    Path(id): Path<String>,
    Json(body): Json<AnswerBody>,
) -> Result<axum::Json<Value>, ApiError> {
    let parsed = Answer::parse(&body.answer).filter(|a| *a != Answer::Expired);
    let Some(reply) = parsed else {
        return Err(ApiError::InvalidRequest(format!(
            "unknown answer {:?}: use approve, deny, applied, not_applied, accept, decline or cancel",
            body.answer
        )));
    };
    let request = AnswerRequest {
        answer: Some(reply),
        reason: body.reason,
        arguments: body.arguments,
        content: body.content,
    };
    let answered = answer_decision(
        &*state.runs,
        &*state.catalogue,
        &state.vault,
        &id,
        request,
        &token.name,
    )
    .await?;
    let mut view = decision_json(&answered.decision);
    view["audited"] = json!(answered.audited);
    Ok(axum::Json(view))
}
