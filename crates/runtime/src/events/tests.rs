//! The events' round trips through their payloads, and what a payload that cannot be read
//! is told.

use std::collections::BTreeSet;

use runwarden_mcp::Effect;
use runwarden_models::{FinishReason, ToolCallRequest, Usage};
use runwarden_vault::Delivery;
use serde_json::json;

use super::*;
use crate::decision::{Answer, DecisionKind};
use crate::state::Outcome;

/// A run's start, resumption, requeue and ends.
fn lifecycle() -> Vec<EventBody> {
    vec![
        EventBody::RunStarted(RunStarted {
            agent: "helper".into(),
            prompt: "go".into(),
            owner: "w-1".into(),
        }),
        EventBody::RunResumed(RunResumed {
            owner: "w-2".into(),
            from_round: 2,
            attempt: 3,
        }),
        EventBody::RunRequeued(RunRequeued {
            reason: "503".into(),
            counts: true,
            retry_in_ms: 1_500,
        }),
        EventBody::RunCompleted(RunEnded {
            reason: "done".into(),
        }),
        EventBody::RunFailed(RunEnded {
            reason: "no".into(),
        }),
        EventBody::RunStopped(RunStopped {
            outcome: Outcome::Cancelled,
            reason: None,
        }),
        EventBody::RunStopped(RunStopped {
            outcome: Outcome::Cancelled,
            reason: Some("cancelled by an operator while queued".into()),
        }),
    ]
}

/// The model's steps, a cut answer with its usage among them.
fn model_steps() -> Vec<EventBody> {
    vec![
        EventBody::ModelResponse(ModelResponse {
            round: 1,
            text: None,
            tool_calls: vec![ToolCallRequest {
                id: "c1".into(),
                name: "srv__create".into(),
                arguments: json!({"q": "printer"}),
                invalid_arguments: None,
            }],
            finish: None,
            usage: None,
        }),
        EventBody::ModelResponse(ModelResponse {
            round: 2,
            text: Some("half an ans".into()),
            tool_calls: Vec::new(),
            finish: Some(FinishReason::Length),
            usage: Some(Usage {
                input_tokens: 120,
                output_tokens: 10,
            }),
        }),
        EventBody::ModelCancelled(ModelCancelled {
            round: 1,
            error: "cancelled".into(),
        }),
        EventBody::ModelFailed(ModelFailed {
            round: 2,
            error: "503".into(),
            retryable: true,
            delivery: Delivery::Answered,
        }),
    ]
}

/// A refused call and an uncertain write with its legs.
fn tool_steps() -> Vec<EventBody> {
    vec![
        EventBody::ToolExecuted(ToolExecuted {
            round: 1,
            call_id: "c1".into(),
            tool: "srv__nope".into(),
            remote: None,
            server: None,
            effect: None,
            outcome: StepOutcome::Refused,
            delivery: None,
            sent: None,
            text: "no tool".into(),
            policy: None,
        }),
        EventBody::EffectUncertain(EffectUncertain {
            round: 1,
            call_id: "c1".into(),
            tool: "srv__create".into(),
            remote: "create".into(),
            server: "srv".into(),
            effect: Effect::NonIdempotentWrite,
            outcome: StepOutcome::Failed,
            delivery: Delivery::MaybeDelivered,
            sent: true,
            text: "no answer".into(),
            request_id: None,
            legs: vec![Leg {
                method: "tools/call".into(),
                answered: false,
                audit_id: Some(5),
                millis: 2,
            }],
        }),
    ]
}

/// Progress reports of the model and of a tool.
fn reports() -> Vec<EventBody> {
    vec![
        EventBody::ModelProgress(ModelProgress {
            round: 2,
            tokens: 40,
        }),
        EventBody::ToolProgress(ToolProgress {
            round: 2,
            call_id: "c2".into(),
            tool: "srv__slow".into(),
            progress: 3.0,
            total: Some(10.0),
            message: Some("copying".into()),
        }),
        EventBody::ToolLog(ToolLog {
            round: 2,
            call_id: "c2".into(),
            tool: "srv__slow".into(),
            level: "info".into(),
            logger: None,
            data: serde_json::json!("step 3"),
        }),
        EventBody::LimitWait(LimitWait {
            round: 2,
            call_id: Some("c2".into()),
            call: "srv__slow".into(),
            limit: "concurrency limit of server srv (2 at once)".into(),
        }),
        EventBody::LimitWaited(LimitWaited {
            round: 2,
            call_id: None,
            call: "model".into(),
            limit: "rate limit of model small (1 per second)".into(),
            outcome: "taken".into(),
            waited_ms: 480,
        }),
    ]
}

/// Both kinds of question asked, and an answer with edited arguments.
fn decisions() -> Vec<EventBody> {
    vec![
        EventBody::DecisionAsked(DecisionAsked {
            decision_id: "d1".into(),
            kind: DecisionKind::Approval,
            round: 1,
            call_id: "c1".into(),
            tool: "srv__create".into(),
            arguments_hash: "ab".repeat(32),
            expires_ms: 1_700_000_000_000,
            reissue: false,
        }),
        EventBody::DecisionAsked(DecisionAsked {
            decision_id: "d2".into(),
            kind: DecisionKind::Input,
            round: 1,
            call_id: "c1".into(),
            tool: "srv__create".into(),
            arguments_hash: "ab".repeat(32),
            expires_ms: 1_700_000_000_000,
            reissue: true,
        }),
        EventBody::DecisionAnswered(DecisionAnswered {
            decision_id: "d1".into(),
            kind: DecisionKind::Approval,
            call_id: "c1".into(),
            arguments_hash: "ab".repeat(32),
            answer: Answer::Approve,
            actor: "cli".into(),
            reason: None,
            arguments: Some(serde_json::json!({"title": "edited"})),
        }),
    ]
}

#[test]
fn every_kind_round_trips_through_its_payload() {
    let bodies = [
        lifecycle(),
        model_steps(),
        tool_steps(),
        reports(),
        decisions(),
    ]
    .concat();
    let kinds: BTreeSet<&str> = bodies.iter().map(EventBody::kind).collect();
    let all: BTreeSet<&str> = EVENT_KINDS.into_iter().collect();
    assert_eq!(kinds, all, "one variant per kind, none forgotten");
    assert_eq!(all.len(), EVENT_KINDS.len(), "each kind listed once");
    for body in bodies {
        let payload = body.to_payload();
        assert_eq!(
            payload.get(VERSION_FIELD),
            None,
            "version 1 writes no field"
        );
        let back = EventBody::decode("r", 1, body.kind(), &payload).unwrap();
        assert_eq!(back, body);
    }
}

#[test]
fn a_model_step_names_its_finish_reason_and_usage_only_when_known() {
    let step = ModelResponse {
        round: 1,
        text: Some("cut".into()),
        tool_calls: Vec::new(),
        finish: Some(FinishReason::Length),
        usage: Some(Usage {
            input_tokens: 7,
            output_tokens: 10,
        }),
    };
    let payload = EventBody::ModelResponse(step.clone()).to_payload();
    assert_eq!(payload["finish"], json!("length"));
    assert_eq!(
        payload["usage"],
        json!({"input_tokens": 7, "output_tokens": 10})
    );
    assert!(step.is_truncated());
    let filtered = EventBody::ModelResponse(ModelResponse {
        finish: Some(FinishReason::ContentFilter),
        ..step
    })
    .to_payload();
    assert_eq!(filtered["finish"], json!("content_filter"));
    let unknown = EventBody::decode(
        "r",
        1,
        "model_response",
        &json!({"round": 1, "text": null, "tool_calls": [], "finish": "pause_turn"}),
    )
    .unwrap();
    let EventBody::ModelResponse(unknown) = unknown else {
        panic!("a model step decodes as one");
    };
    assert_eq!(
        unknown.finish,
        Some(FinishReason::Other("pause_turn".into()))
    );
}

#[test]
fn an_unknown_kind_is_an_error_naming_the_run_and_the_sequence() {
    let error = EventBody::decode("run-7", 4, "tool_exploded", &json!({})).unwrap_err();
    assert!(matches!(
        error,
        EventDecodeError::UnknownKind { seq: 4, .. }
    ));
    let text = error.to_string();
    assert!(text.contains("run-7") && text.contains("event 4"), "{text}");
    assert!(text.contains("tool_exploded"), "{text}");
}

#[test]
fn a_missing_or_mistyped_field_is_malformed_never_a_default() {
    let missing = EventBody::decode("r", 2, "model_response", &json!({"round": 1}));
    let error = missing.unwrap_err();
    assert!(matches!(error, EventDecodeError::Malformed { seq: 2, .. }));
    assert!(error.to_string().contains("tool_calls"), "{error}");

    let secret = "the-prompt-text-that-must-not-travel";
    let mistyped = json!({"round": secret, "text": null, "tool_calls": []});
    let error = EventBody::decode("r", 3, "model_response", &mistyped).unwrap_err();
    assert!(matches!(error, EventDecodeError::Malformed { .. }));
    let text = error.to_string();
    assert!(
        !text.contains(secret),
        "stored values stay out of errors: {text}"
    );
    assert!(text.contains("expected u32"), "{text}");

    let not_an_object = EventBody::decode("r", 5, "run_failed", &json!("failed"));
    assert!(matches!(
        not_an_object,
        Err(EventDecodeError::Malformed { .. })
    ));
    let bad_delivery = json!({"round": 1, "error": "e", "retryable": true, "delivery": "perhaps"});
    assert!(matches!(
        EventBody::decode("r", 6, "model_failed", &bad_delivery),
        Err(EventDecodeError::Malformed { .. })
    ));
}

#[test]
fn a_version_this_binary_does_not_read_is_refused() {
    let v2 = json!({"v": 2, "reason": "done"});
    let error = EventBody::decode("r", 9, "run_completed", &v2).unwrap_err();
    assert!(
        matches!(&error, EventDecodeError::UnsupportedVersion { version, .. } if version == "2"),
        "{error:?}"
    );
    let v1 = json!({"v": 1, "reason": "done"});
    assert_eq!(
        EventBody::decode("r", 9, "run_completed", &v1).unwrap(),
        EventBody::RunCompleted(RunEnded {
            reason: "done".into()
        })
    );
}

#[test]
fn the_final_kinds_are_the_ends_of_a_log() {
    assert!(is_final_kind("run_completed") && is_final_kind("run_failed"));
    assert!(is_final_kind("run_stopped"));
    assert!(!is_final_kind("run_requeued") && !is_final_kind("effect_uncertain"));
}
