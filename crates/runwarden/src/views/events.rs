//! Run events as people and machines read them: one line each (`run`, `events`, the
//! console's timeline, the demo) or one JSON object each (`--json`, the API's stream).

use runwarden_runtime::RunEvent;
use runwarden_runtime::events::{DecisionAnswered, EventBody, EventDecodeError, ToolExecuted};
use serde_json::{Value, json};

use crate::output;

/// One event as a line for people, rendered from its typed body. An event this binary
/// cannot read (a newer kind, a damaged payload) is still shown, raw, with why: a viewer
/// never hides a row.
pub(crate) fn event_line(event: &RunEvent) -> String {
    let body = match EventBody::decode(&event.run_id, event.seq, &event.kind, &event.payload) {
        Ok(body) => body,
        Err(EventDecodeError::UnknownKind { .. }) => {
            return format!("[{}] {}: {}", event.seq, event.kind, event.payload);
        }
        Err(error) => return format!("[{}] {}: unreadable ({error})", event.seq, event.kind),
    };
    let round = body
        .round()
        .map(|r| format!("round {r}: "))
        .unwrap_or_default();
    format!("[{}] {round}{}", event.seq, body_line(&body))
}

/// Never cut: an error is read to find out why a run failed, and its end is often the
/// part that says why. A text of several lines goes on indented continuation lines.
fn text(s: &str) -> String {
    s.trim_end().lines().collect::<Vec<_>>().join("\n    ")
}

/// What one event says, after its sequence number and round.
fn body_line(body: &EventBody) -> String {
    match body {
        EventBody::RunStarted(e) => format!("started: agent {}", text(&e.agent)),
        EventBody::RunResumed(e) => {
            format!(
                "resumed: attempt {} after round {}",
                e.attempt, e.from_round
            )
        }
        EventBody::ModelResponse(e) if !e.tool_calls.is_empty() => {
            let names: Vec<&str> = e.tool_calls.iter().map(|c| c.name.as_str()).collect();
            format!("model asked for {}", names.join(", "))
        }
        EventBody::ModelResponse(e) => {
            format!(
                "model answered: {}",
                text(e.text.as_deref().unwrap_or_default())
            )
        }
        EventBody::ModelFailed(e) => format!("model call failed: {}", text(&e.error)),
        EventBody::ModelCancelled(e) => format!("model call cancelled: {}", text(&e.error)),
        EventBody::ToolExecuted(e) => tool_line(e),
        // The text says that the call may have reached the server and what became of it.
        EventBody::EffectUncertain(e) => format!(
            "tool {} {}: {}",
            text(&e.tool),
            e.outcome.as_str(),
            text(&e.text)
        ),
        EventBody::RunRequeued(e) => format!(
            "requeued (retry in {} ms): {}",
            e.retry_in_ms,
            text(&e.reason)
        ),
        EventBody::RunCompleted(e) => format!("completed: {}", text(&e.reason)),
        EventBody::RunFailed(e) => format!("failed: {}", text(&e.reason)),
        EventBody::RunStopped(e) => match &e.reason {
            Some(reason) => format!("stopped: {}: {}", e.outcome.as_str(), text(reason)),
            None => format!("stopped: {}", e.outcome.as_str()),
        },
        EventBody::ModelProgress(e) => format!(
            "model streaming: {} so far",
            crate::output::count(e.tokens, "token", "tokens")
        ),
        EventBody::ToolProgress(e) => {
            let of = e.total.map(|t| format!(" of {t}")).unwrap_or_default();
            let message = e
                .message
                .as_deref()
                .map(|m| format!(": {}", text(m)))
                .unwrap_or_default();
            format!(
                "tool {} progress {}{of}{message}",
                text(&e.tool),
                e.progress
            )
        }
        EventBody::ToolLog(e) => format!(
            "tool {} log {}: {}",
            text(&e.tool),
            text(&e.level),
            text(&e.data.to_string())
        ),
        EventBody::DecisionAsked(e) => format!(
            "waiting for an operator: {} decision {} about {}",
            e.kind.as_str(),
            e.decision_id,
            text(&e.tool)
        ),
        EventBody::DecisionAnswered(e) => answered_line(e),
        EventBody::LimitWait(e) => format!(
            "{} waiting: the {} is full",
            limit_call(&e.call),
            text(&e.limit)
        ),
        EventBody::LimitWaited(e) => format!(
            "{} waited {} ms for the {}: {}",
            limit_call(&e.call),
            e.waited_ms,
            text(&e.limit),
            e.outcome.replace('_', " ")
        ),
    }
}

/// A tool step: its outcome and text, and which policies allowed it. A denial's text
/// already names its policies.
fn tool_line(e: &ToolExecuted) -> String {
    let decided = match &e.policy {
        Some(note) if note.decision != "deny" && !note.policies.is_empty() => {
            format!(
                " ({} by policy {})",
                note.decision,
                note.policies.join(", ")
            )
        }
        _ => String::new(),
    };
    format!(
        "tool {} {}: {}{decided}",
        text(&e.tool),
        e.outcome.as_str(),
        text(&e.text)
    )
}

/// The call a limit held back: `tool NAME`, or `model call`.
fn limit_call(call: &str) -> String {
    if call == "model" {
        "model call".to_string()
    } else {
        format!("tool {}", text(call))
    }
}

/// A decision's answer: who gave which, with their reason and whether they edited the
/// call's arguments.
fn answered_line(e: &DecisionAnswered) -> String {
    let reason = e
        .reason
        .as_deref()
        .map(|r| format!(" ({})", text(r)))
        .unwrap_or_default();
    let edited = if e.arguments.is_some() {
        " with edited arguments"
    } else {
        ""
    };
    format!(
        "decision {} answered {}{edited} by {}{reason}",
        e.decision_id,
        e.answer.as_str(),
        text(&e.actor)
    )
}

/// One event as JSON for machines (`--json`): one object per line, with the run id.
pub(crate) fn event_json(event: &RunEvent) -> Value {
    json!({ "run_id": event.run_id, "seq": event.seq, "kind": event.kind, "time": output::time(event.time_ms), "payload": event.payload })
}

/// The inverse of [`event_json`].
pub(crate) fn event_from_json(event: &Value) -> RunEvent {
    let time_ms = event["time"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map_or(0, |t| t.timestamp_millis());
    RunEvent {
        run_id: event["run_id"].as_str().unwrap_or_default().to_string(),
        seq: event["seq"].as_i64().unwrap_or_default(),
        kind: event["kind"].as_str().unwrap_or_default().to_string(),
        payload: event["payload"].clone(),
        time_ms,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str, payload: Value) -> RunEvent {
        RunEvent {
            run_id: "r-1".into(),
            seq: 3,
            kind: kind.into(),
            payload,
            time_ms: 0,
        }
    }

    #[test]
    fn each_event_is_rendered_from_its_type_and_an_unreadable_one_is_shown_with_why() {
        let requeued =
            json!({"reason": "the model answered 503", "counts": true, "retry_in_ms": 1500});
        assert_eq!(
            event_line(&event("run_requeued", requeued)),
            "[3] requeued (retry in 1500 ms): the model answered 503"
        );
        let refused = json!({"round": 2, "call_id": "c", "tool": "srv__x", "outcome": "refused", "text": "no tool named \"srv__x\""});
        assert_eq!(
            event_line(&event("tool_executed", refused)),
            "[3] round 2: tool srv__x refused: no tool named \"srv__x\""
        );
        let damaged = event_line(&event("run_failed", json!({"why": "?"})));
        assert!(
            damaged.starts_with("[3] run_failed: unreadable (event 3 (run_failed) of run r-1"),
            "{damaged}"
        );
        assert_eq!(
            event_line(&event("cancel_issued", json!({"at": 1}))),
            "[3] cancel_issued: {\"at\":1}",
            "a kind the runtime does not write (the demo's timeline) is shown raw"
        );
    }
}
