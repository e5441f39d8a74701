//! Operator decisions as the API and the CLI answer them: the one place that reads
//! the tool's schema for an edit, applies the answer with the runtime's guarded update and
//! then writes the audit row.
//!
//! The audit row (`decision_answered`, with the actor, in the hash chain) is written right
//! after the answer commits, not inside its transaction: the chain's links are computed
//! by the vault, which the store's transaction cannot call. An answer whose audit write
//! fails stays answered (undoing it could race a worker that already resumed the run);
//! the failure is logged at error level and reported to the caller.

use runwarden_mcp::{CatalogueStore, SchemaStatus};
use runwarden_runtime::{AnswerRequest, DecideError, Decision, RunStore, decide};
use runwarden_vault::Vault;
use runwarden_vault::audit::{AuditEvent, action};
use serde_json::{Value, json};

use crate::output;

/// What an answer did: the decision as it now stands, and whether its audit row was
/// written.
pub(crate) struct Answered {
    pub(crate) decision: Decision,
    pub(crate) audited: bool,
}

/// Answers decision `id` as `actor`, then audits it; one `decision` span and one
/// log line naming who answered.
pub(crate) async fn answer(
    runs: &dyn RunStore,
    catalogue: &dyn CatalogueStore,
    vault: &Vault,
    id: &str,
    request: AnswerRequest,
    actor: &str,
) -> Result<Answered, DecideError> {
    let span = tracing::info_span!(
        "decision",
        decision.id = %id,
        actor = %actor,
        answer = tracing::field::Empty,
        run.id = tracing::field::Empty,
    );
    let answered = tracing::Instrument::instrument(
        answer_in_span(runs, catalogue, vault, id, request, actor),
        span.clone(),
    )
    .await;
    if let Ok(answered) = &answered {
        let decision = &answered.decision;
        let given = decision.answer.map_or("?", |a| a.as_str());
        span.record("answer", given);
        span.record("run.id", decision.run_id.as_str());
        tracing::info!(decision = %decision.id, run = %decision.run_id, kind = decision.kind.as_str(), answer = given, actor = %actor, "decision answered");
    }
    answered
}

async fn answer_in_span(
    runs: &dyn RunStore,
    catalogue: &dyn CatalogueStore,
    vault: &Vault,
    id: &str,
    request: AnswerRequest,
    actor: &str,
) -> Result<Answered, DecideError> {
    let Some(decision) = runs.decision_get(id).await? else {
        return Err(DecideError::NotFound(id.to_string()));
    };
    // An edit is checked against the tool's schema as imported (M8 normalised).
    let schema = match &request.arguments {
        Some(_) => catalogue
            .catalogue_list(None)
            .await
            .map_err(DecideError::Store)?
            .into_iter()
            .find(|e| e.local_name == decision.tool)
            .and_then(|e| match e.schema {
                SchemaStatus::Usable(schema) => Some(schema),
                _ => None,
            }),
        None => None,
    };
    let now = chrono::Utc::now().timestamp_millis();
    let decision = decide(runs, &decision, request, actor, schema.as_ref(), now).await?;
    let event = AuditEvent {
        time_ms: now,
        action: action::DECISION_ANSWERED.to_string(),
        success: true,
        secret: None,
        method: String::new(),
        host: String::new(),
        path: String::new(),
        status: 0,
        duration_ms: 0,
        error: None,
        // The operator's free text (a reason, edited arguments, content) stays out of the
        // audit log: it is in the decision and the run's log.
        reason: Some(format!(
            "decision {} ({}) about {}: {}",
            decision.id,
            decision.kind.as_str(),
            decision.tool,
            decision.answer.map_or("?", |a| a.as_str())
        )),
        actor: actor.to_string(),
        correlation: Some(decision.run_id.clone()),
        intent_id: None,
    };
    let audited = match vault.audit_record(event).await {
        Ok(_) => true,
        Err(error) => {
            tracing::error!(decision = %decision.id, %error, "the answer stands but its audit row could not be written");
            false
        }
    };
    Ok(Answered { decision, audited })
}

/// A decision as `runwarden decisions list --json` prints it and the API answers it.
pub(crate) fn decision_json(d: &Decision) -> Value {
    json!({
        "decision_id": d.id,
        "run_id": d.run_id,
        "kind": d.kind.as_str(),
        "waits_in_call": d.in_call,
        "status": d.status.as_str(),
        "round": d.round,
        "call_id": d.call_id,
        "tool": d.tool,
        "arguments": d.arguments,
        "arguments_hash": d.arguments_hash,
        "message": d.message,
        "requested_schema": d.requested_schema,
        "asked": output::time(d.asked_ms),
        // Uncertain effects never expire (R11: only a person says what they did).
        "expires": (d.expires_ms != i64::MAX).then(|| output::time(d.expires_ms)),
        "answer": d.answer.map(|a| a.as_str()),
        "reason": d.reason,
        "answer_arguments": d.answer_arguments,
        "content": d.content,
        "actor": d.actor,
        "answered": d.answered_ms.map(output::time),
        "answers": d.kind.answers().iter().map(|a| a.as_str()).collect::<Vec<_>>(),
    })
}

/// A decision for people, from its JSON (the server and the store print the same).
pub(crate) fn decision_text(d: &Value) -> String {
    let field = |name: &str| d[name].as_str().unwrap_or_default().to_string();
    let mut text = format!(
        "decision {} ({}, {}) run {}\n  tool {} {}",
        field("decision_id"),
        field("kind"),
        field("status"),
        field("run_id"),
        field("tool"),
        d["arguments"]
    );
    if let Some(message) = d["message"].as_str() {
        text.push_str(&format!("\n  {message}"));
    }
    match d["answer"].as_str() {
        Some(answer) => text.push_str(&format!(
            "\n  answered {answer} by {} at {}",
            field("actor"),
            field("answered")
        )),
        None => {
            let answers: Vec<&str> = d["answers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            text.push_str(&format!("\n  asked {}", field("asked")));
            if let Some(expires) = d["expires"].as_str() {
                text.push_str(&format!(", expires {expires}"));
            }
            text.push_str(&format!("; answers: {}", answers.join(", ")));
        }
    }
    text
}
