//! The console's state changes: cancel a run and answer a decision. Each checks the
//! origin and the session's CSRF token, then the operator role, and then goes through
//! the exact code the API uses: the executor's cancel (the cancel hub wakes the call in
//! flight) and `crate::decisions::answer` (guarded update, audited with the actor).

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use runwarden_runtime::{Answer, AnswerRequest, CancelRefused, Canceller, DecideError, cancel_run};
use serde_json::Value;

use super::render::Form;
use super::session::{Signed, same_origin};
use super::{AppState, PageError};
use crate::decisions::answer as answer_decision;

/// The checks in front of every console state change, in order: same origin, the CSRF
/// token, the operator role.
fn guard(signed: &Signed, headers: &HeaderMap, form: &Form) -> Result<(), PageError> {
    same_origin(headers)?;
    signed.check_csrf(headers, form)?;
    signed.require_operator()
}

/// `POST /console/runs/{id}/cancel`: the path of `POST /v1/runs/{id}/cancel`.
pub(super) async fn cancel(
    State(state): State<AppState>,
    signed: Signed,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, PageError> {
    guard(&signed, &headers, &Form::parse(&body))?;
    // R4 through this process: the guarded row update, then the hub wakes the run's
    // in-flight calls if it executes here.
    match cancel_run(Canceller::Executor(&state.executor), &id).await {
        Ok(previous) => {
            // O5: who stopped the run, by the token's name.
            tracing::info!(run = %id, actor = %signed.token.name, previous = previous.as_str(), via = "console", "run cancelled");
            Ok(Redirect::to(&format!("/runs/{id}")).into_response())
        }
        Err(refused @ CancelRefused::Finished { .. }) => {
            Err(PageError::Conflict(refused.to_string()))
        }
        Err(CancelRefused::NotFound(_)) => Err(PageError::NotFound(format!("no run {id}"))),
        Err(CancelRefused::Store(error)) => Err(error.into()),
    }
}

/// A JSON object typed into a form field, or a message saying what is wrong with it.
fn json_field(form: &Form, name: &str) -> Result<Option<Value>, PageError> {
    let Some(text) = form.text(name) else {
        return Ok(None);
    };
    serde_json::from_str::<Value>(&text).map(Some).map_err(|e| {
        PageError::BadRequest(format!(
            "the {name} field is not JSON ({e}): give a JSON object like {{\"key\": \"value\"}}"
        ))
    })
}

/// `POST /console/decisions/{id}`: answers a decision as the signed-in token.
pub(super) async fn answer(
    State(state): State<AppState>,
    signed: Signed,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, PageError> {
    let form = Form::parse(&body);
    guard(&signed, &headers, &form)?;
    let text = form.text("answer").unwrap_or_default();
    let Some(reply) = Answer::parse(&text).filter(|a| *a != Answer::Expired) else {
        return Err(PageError::BadRequest(format!(
            "unknown answer {text:?}: use approve, deny, applied, not_applied, accept, decline or cancel"
        )));
    };
    let request = AnswerRequest {
        answer: Some(reply),
        reason: form.text("reason"),
        arguments: json_field(&form, "arguments")?,
        content: json_field(&form, "content")?,
    };
    let answered = answer_decision(
        &*state.runs,
        &*state.catalogue,
        &state.vault,
        &id,
        request,
        &signed.token.name,
    )
    .await
    .map_err(|e| match e {
        DecideError::NotFound(id) => PageError::NotFound(format!("no decision {id}")),
        DecideError::Store(error) => PageError::from(error),
        error @ (DecideError::WrongAnswer { .. } | DecideError::Invalid(_)) => {
            PageError::BadRequest(error.to_string())
        }
        other => PageError::Conflict(other.to_string()),
    })?;
    tracing::debug!(run = %answered.decision.run_id, "decision answered from the console");
    Ok(Redirect::to("/decisions").into_response())
}
