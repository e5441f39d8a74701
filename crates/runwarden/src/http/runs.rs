//! `/v1/runs`: start a run (queued or synchronous), list runs a page at a time, read one,
//! cancel one through the process's cancel hub.

use anyhow::Context as _;
use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use runwarden_runtime::idempotency::check_key;
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_runtime::{
    Budgets, CancelRefused, Canceller, KeyedCreate, RunCreateKeyed, RunFilter, RunState,
    cancel_run, run_request,
};
use runwarden_vault::ApiToken;
use serde::Deserialize;
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, Json, Path, Query};
use crate::views::{run_json, run_json_with_usage};

/// How `POST /v1/runs` runs the agent.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Mode {
    /// Stored for a worker; the answer comes at once (202).
    #[default]
    Queued,
    /// Executed in this process while the request waits (200 with the final run).
    Sync,
}

/// The body of `POST /v1/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateRun {
    agent: String,
    prompt: String,
    #[serde(default)]
    mode: Mode,
    /// The run's own budgets; each may only lower the agent's.
    max_output_tokens_total: Option<u64>,
    max_wall_seconds: Option<u64>,
    max_tool_calls: Option<u32>,
}

use runwarden_base::now_ms;

/// The run's row as JSON, or `run_not_found`.
async fn run_view(state: &AppState, id: &str) -> Result<Value, ApiError> {
    match state.runs.run_get(id).await? {
        Some(run) => {
            let events = state.runs.run_events(id, 0, 0).await?;
            Ok(run_json_with_usage(&run, &events))
        }
        None => Err(ApiError::RunNotFound(id.to_string())),
    }
}

/// The header a client sends to make `POST /v1/runs` safe to retry.
const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The client's `Idempotency-Key`, checked; `None` when it sent none.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let key = value.to_str().map_err(|_| {
        ApiError::InvalidRequest("the Idempotency-Key header is not printable ASCII".into())
    })?;
    check_key(key).map_err(ApiError::InvalidRequest)?;
    Ok(Some(key.to_string()))
}

pub(super) async fn create(
    State(state): State<AppState>,
    token: Option<Extension<ApiToken>>,
    headers: HeaderMap,
    Json(body): Json<CreateRun>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    // The agents in force now: `serve` reloads them on SIGHUP.
    let config = state.agents.config();
    let Some(agent) = config.agents.get(&body.agent) else {
        return Err(ApiError::AgentNotFound(body.agent));
    };
    let budgets = Budgets {
        max_output_tokens_total: body.max_output_tokens_total,
        max_wall_seconds: body.max_wall_seconds,
        max_tool_calls: body.max_tool_calls,
    };
    // R13: a request may only lower its agent's budgets.
    agent
        .budgets
        .check_request(&budgets)
        .map_err(|e| ApiError::InvalidRequest(format!("agent {}: {e}", body.agent)))?;
    match body.mode {
        Mode::Queued => create_queued(&state, token, key, body, budgets).await,
        Mode::Sync => create_sync(&state, key, body, budgets).await,
    }
}

/// `POST /v1/runs` for a worker: the run is stored with its request and answered at once
/// (202); with an `Idempotency-Key`, a retry answers the run the first request made.
async fn create_queued(
    state: &AppState,
    token: Option<Extension<ApiToken>>,
    key: Option<String>,
    body: CreateRun,
    budgets: Budgets,
) -> Result<Response, ApiError> {
    // R9: the row is the state; the stored request is all a worker needs.
    let id = uuid::Uuid::now_v7().to_string();
    let hash = crate::views::run_request_hash(&body.agent, &body.prompt, "queued", &budgets);
    let mut request = run_request(&body.prompt, &budgets);
    if let Some(token) = &token {
        // Who started the run: its policies see the token as the agent's parent.
        request[runwarden_runtime::REQUEST_STARTED_BY_FIELD] = json!(token.0.name);
    }
    let create = RunCreate {
        id: id.clone(),
        agent: body.agent,
        correlation: id,
        request: Some(request),
        status: NewRunStatus::Queued,
        now_ms: now_ms(),
    };
    let run = match key {
        None => state
            .runs
            .run_create(create)
            .await
            .context("while storing a queued run")?,
        Some(key) => {
            // Keys are per caller: one token's key never answers another's run.
            let scope = token.map_or_else(|| "api".to_string(), |t| t.0.id);
            let keyed = RunCreateKeyed {
                run: create,
                scope,
                key,
                body_hash: hash,
            };
            match state
                .runs
                .run_create_keyed(keyed)
                .await
                .context("while storing a queued run")?
            {
                KeyedCreate::Created(run) => run,
                // The retry of a request that made its run: the same run, as it is now.
                KeyedCreate::Existing(run) => {
                    return Ok(axum::Json(run_view(state, &run.id).await?).into_response());
                }
                KeyedCreate::Reused { run_id } => {
                    return Err(ApiError::IdempotencyKeyReused { run_id });
                }
            }
        }
    };
    // A new run has no steps: its usage is zero, in the shape a read answers.
    let view = run_json_with_usage(&run, &[]);
    Ok((StatusCode::ACCEPTED, axum::Json(view)).into_response())
}

/// `POST /v1/runs` with `"mode": "sync"`: executed in this process while the request waits.
async fn create_sync(
    state: &AppState,
    key: Option<String>,
    body: CreateRun,
    budgets: Budgets,
) -> Result<Response, ApiError> {
    if key.is_some() {
        // A synchronous run answers when it ends; a retry cannot be told apart from
        // a second run while the first still executes. Queued runs take keys.
        return Err(ApiError::InvalidRequest(
            "Idempotency-Key applies to queued runs: leave \"mode\" out, or drop the header".into(),
        ));
    }
    let agent = state.agents.build(&body.agent).await.map_err(|e| {
        if ApiError::store_fault(&e).is_some() {
            return ApiError::from(e); // the catalogue could not be read: 503
        }
        ApiError::AgentUnavailable(format!(
            "agent {} cannot run: {}",
            body.agent,
            crate::output::one_line(&e)
        ))
    })?;
    let run = state
        .executor
        .create_sync_with(&agent.name, &body.prompt, &budgets)
        .await
        .context("while creating a synchronous run")?;
    // The run belongs to the process, not to the request: if the client goes away
    // the spawned execution goes on; only an operator's cancel stops it.
    let (executor, for_task) = (state.executor.clone(), run.clone());
    let execution = tokio::spawn(async move {
        executor
            .execute(&for_task, &agent, &body.prompt, None)
            .await
    });
    execution
        .await
        .context("the run's execution ended abnormally")?;
    Ok(axum::Json(run_view(state, &run.id).await?).into_response())
}

/// The query of `GET /v1/runs`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    status: Option<String>,
    agent: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// The page size when none is asked for, and the largest one served.
const DEFAULT_LIMIT: u32 = 50;
const MAX_LIMIT: u32 = 200;

pub(super) async fn list(
    State(state): State<AppState>,
    Query(query): Query<ListQuery>,
) -> Result<axum::Json<Value>, ApiError> {
    let status = match query.status.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(text) => Some(RunState::parse(text).ok_or_else(|| {
            ApiError::InvalidRequest(format!(
                "unknown status {text:?}: use queued, running, waiting_for_approval, completed, failed or cancelled"
            ))
        })?),
    };
    let limit = match query.limit {
        None => DEFAULT_LIMIT,
        Some(0) => {
            return Err(ApiError::InvalidRequest(format!(
                "limit must be between 1 and {MAX_LIMIT}"
            )));
        }
        Some(n) => n.min(MAX_LIMIT),
    };
    // One more than the page tells whether a next page exists.
    let mut runs = state
        .runs
        .run_list(RunFilter {
            status,
            agent: query.agent.filter(|a| !a.is_empty()),
            before_id: query.cursor.filter(|c| !c.is_empty()),
            limit: limit + 1,
        })
        .await?;
    let more = runs.len() > limit as usize;
    runs.truncate(limit as usize);
    let next_cursor = more.then(|| runs.last().map(|r| r.id.clone())).flatten();
    let views: Vec<Value> = runs.iter().map(run_json).collect();
    Ok(axum::Json(
        json!({ "runs": views, "next_cursor": next_cursor }),
    ))
}

pub(super) async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<axum::Json<Value>, ApiError> {
    Ok(axum::Json(run_view(&state, &id).await?))
}

pub(super) async fn cancel(
    State(state): State<AppState>,
    Path(id): Path<String>,
    axum::Extension(token): axum::Extension<runwarden_vault::ApiToken>,
) -> Result<axum::Json<Value>, ApiError> {
    // R4 through this process: the guarded row update, then the hub wakes the run's
    // in-flight calls if it executes here (a worker slot or a sync API run).
    match cancel_run(Canceller::Executor(&state.executor), &id).await {
        Ok(previous) => {
            // O5: who stopped the run, by the token's name.
            tracing::info!(run = %id, actor = %token.name, previous = previous.as_str(), "run cancelled");
            Ok(axum::Json(
                json!({ "run_id": id, "cancelled": true, "previous": previous.as_str() }),
            ))
        }
        Err(refused @ CancelRefused::Finished { .. }) => {
            Err(ApiError::RunAlreadyTerminal(refused.to_string()))
        }
        Err(CancelRefused::NotFound(_)) => Err(ApiError::RunNotFound(id)),
        Err(CancelRefused::Store(error)) => Err(error.into()),
    }
}
