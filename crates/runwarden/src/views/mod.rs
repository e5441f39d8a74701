//! Wire shapes and words shared by the CLI's `--json` output, the HTTP API and the
//! console, so all say the same.

pub(crate) mod audit;
mod events;
pub(crate) mod mcp;

pub(crate) use events::{event_from_json, event_json, event_line};

use runwarden_runtime::{Budgets, Run, RunEvent, usage_of};
use serde_json::{Value, json};

use crate::output;

/// A run as `runwarden status --json` prints it and `GET /v1/runs/{id}` answers it.
pub(crate) fn run_json(run: &Run) -> Value {
    json!({
        "run_id": run.id,
        "agent": run.agent,
        "status": run.status.as_str(),
        "termination_reason": run.termination_reason,
        "rounds": run.rounds,
        "attempts": run.requeue_count + 1,
        "requeue_count": run.requeue_count,
        "lease_holder": run.claimed_by,
        "lease_expires": run.lease_expires_ms.map(output::time),
        "pending_effect": run.pending_effect,
        "created": output::time(run.created_ms),
        "updated": output::time(run.updated_ms),
        "started_by": run.origin.started_by,
        "tags": run.origin.tags,
    })
}

/// A run with its token usage (L5), summed from its model steps at read time so every
/// store backend answers the same: `runwarden status`, `GET /v1/runs/{id}`, a finished
/// synchronous run. Lists leave it out (it costs a read of each run's events).
pub(crate) fn run_json_with_usage(run: &Run, events: &[RunEvent]) -> Value {
    let usage = usage_of(events);
    let mut view = run_json(run);
    view["usage"] = json!({
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
    });
    view
}

/// The SHA-256 of a run request as understood (defaults filled in, keys sorted): what an
/// `Idempotency-Key` is bound to, the same for the API and `enqueue --idempotency-key`,
/// so two spellings of one request hash the same.
pub(crate) fn run_request_hash(
    agent: &str,
    prompt: &str,
    mode: &str,
    budgets: &Budgets,
    tags: &[String],
) -> String {
    let mut request = json!({
        "agent": agent,
        "prompt": prompt,
        "mode": mode,
        "max_output_tokens_total": budgets.max_output_tokens_total,
        "max_wall_seconds": budgets.max_wall_seconds,
        "max_tool_calls": budgets.max_tool_calls,
    });
    // Only when there are tags, so a key stored before tags existed still matches.
    if !tags.is_empty() {
        request["tags"] = json!(tags);
    }
    runwarden_runtime::decision::arguments_hash(&request)
}

/// Whether an audit row (as JSON) is an intent: written before a call is sent, its outcome
/// is a later row. The CLI and the console count it as an intent, never as a failure.
pub(crate) fn is_intent(row: &Value) -> bool {
    row["action"]
        .as_str()
        .is_some_and(runwarden_vault::audit::action::is_intent)
}
