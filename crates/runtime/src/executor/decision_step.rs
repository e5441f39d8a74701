//! The decision step: a tool call that needs a person. Asking parks the run on a decision
//! (an approval, an uncertain write, the server's question); on resume the answer in the
//! log lets the call go, denies it, or re-issues it with the operator's input.

use runwarden_mcp::{InputRequired, InputResume};
use runwarden_models::ToolCallRequest;
use serde_json::{Map, Value};

use super::{Executor, Segment};
use crate::agent::BoundTool;
use crate::decision::{
    Answer, DEFAULT_APPROVAL_TIMEOUT, Decision, DecisionAsk, DecisionKind, DecisionStatus, Reissue,
    arguments_hash,
};
use crate::events::{DecisionAsked, EventBody, StepOutcome, ToolExecuted};
use crate::state::Outcome;
use crate::store::RunEvent;
use crate::time::{ms, now_ms};

/// What a decision asks beyond its call (R12).
#[derive(Default)]
pub(super) struct Question {
    /// For people: what went wrong, or the server's question.
    pub(super) message: Option<String>,
    /// Input: the schema the answer's content must match.
    pub(super) requested_schema: Option<Value>,
    /// M19: how to re-issue the call once answered (an `input_required` result).
    pub(super) reissue: Option<Reissue>,
}

impl Question {
    pub(super) fn said(message: String) -> Self {
        Self {
            message: Some(message),
            ..Self::default()
        }
    }
}

/// What an operator's answer in the log lets a call that needs approval do.
pub(super) enum Approval {
    /// Approved; with the operator's edit of the arguments when there is one.
    Given(Option<Map<String, Value>>),
    /// Denied, or approved for other arguments: the step is recorded, and this is what
    /// the model reads.
    Denied(String),
}

impl Executor {
    /// R12: the call waits for an operator; the answer is in the log once given. `Err` is
    /// the segment's outcome: the run parked on an approval, or the segment lost the run.
    /// `message` is the question's text for people (the policy that asked, P2).
    pub(super) async fn approval(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        message: Option<String>,
    ) -> Result<Approval, Outcome> {
        let answered = segment
            .approvals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&call.id)
            .cloned();
        let Some(answered) = answered else {
            // P2: a policy that asks says which one it is.
            let question = Question {
                message,
                ..Question::default()
            };
            return Err(self
                .ask(segment, DecisionKind::Approval, round, call, question)
                .await);
        };
        let denial = if answered.arguments_hash != arguments_hash(&call.arguments) {
            // R12: an answer is bound to the exact arguments it was asked about.
            Some("the approval was given for other arguments".to_string())
        } else if answered.answer == Answer::Approve {
            None
        } else {
            Some(
                answered
                    .reason
                    .clone()
                    .unwrap_or_else(|| answered.answer.as_str().to_string()),
            )
        };
        let Some(reason) = denial else {
            // R12: the operator's edit was checked against the tool's schema when it was
            // given; both are recorded (the model's in its step, the edit in the answer).
            let edited = match answered.arguments {
                Some(Value::Object(edited)) => Some(edited),
                _ => None,
            };
            return Ok(Approval::Given(edited));
        };
        let text = format!("denied by an operator: {reason}");
        self.denied(segment, round, call, tool, text).await
    }

    /// Records a call refused unsent (denied, expired, not askable) and says so.
    pub(super) async fn denied(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        text: String,
    ) -> Result<Approval, Outcome> {
        let mut step = ToolExecuted::refused(round, call, &text);
        step.outcome = StepOutcome::Denied;
        step.remote = Some(tool.remote_name.clone());
        step.server = Some(tool.client.server().name.clone());
        step.effect = Some(tool.effect);
        step.sent = Some(false);
        self.record_soft(segment, EventBody::ToolExecuted(step), None)
            .await
            .ok_or(Outcome::LeaseLost)?;
        Ok(Approval::Denied(text))
    }

    /// M19, R12: the server asked for input and an operator answered: the call is
    /// re-issued with the answer and the server's `requestState`, exactly as stored.
    /// `None` when the call is not a re-issue; `Err` is the segment's outcome.
    pub(super) async fn input_resume(
        &self,
        segment: &Segment<'_>,
        call: &ToolCallRequest,
    ) -> Result<Option<InputResume>, Outcome> {
        let taken = segment
            .inputs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&call.id);
        let Some(decision_id) = taken else {
            return Ok(None);
        };
        match self.store.decision_get(&decision_id).await {
            Ok(Some(decision)) => Ok(decision.reissue.as_ref().map(|reissue| {
                let mut responses = Map::new();
                responses.insert(reissue.input_key.clone(), decision.elicitation_result());
                InputResume {
                    responses,
                    request_state: reissue.request_state.clone(),
                }
            })),
            Ok(None) => Ok(None),
            Err(error) => {
                // Nothing was sent: a retry reads it again.
                let reason = format!("the operator's answer could not be read: {error}");
                Err(self.fail(segment, reason, true).await)
            }
        }
    }

    /// M19, R12: the server asked for input instead of doing the tool's work. The run
    /// parks on an `input` decision holding the server's `requestState`, and whichever
    /// worker resumes it re-issues the call with the answer. The fence is cleared with the
    /// park.
    pub(super) async fn input_required(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        asked: InputRequired,
    ) -> Outcome {
        let Some(question) = asked.requests.first() else {
            let reason = "the server asked for input but named no question".to_string();
            return self.fail(segment, reason, false).await;
        };
        let message = question
            .params
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("")
            .chars()
            .take(2_000)
            .collect::<String>();
        let question = Question {
            message: Some(format!("{} asks: {message}", tool.client.server().name)),
            requested_schema: question.params.get("requestedSchema").cloned(),
            reissue: Some(Reissue {
                input_key: question.key.clone(),
                request_state: asked.request_state.clone(),
            }),
        };
        self.ask(segment, DecisionKind::Input, round, call, question)
            .await
    }

    /// R12: asks an operator about one tool call. The decision, its `decision_asked` step
    /// and (for the kinds that park) the run's move to `waiting_for_approval` with its
    /// lease released are one guarded transaction; the segment then ends
    /// `waiting_for_approval`, holding no slot.
    pub(super) async fn ask(
        &self,
        segment: &Segment<'_>,
        kind: DecisionKind,
        round: u32,
        call: &ToolCallRequest,
        question: Question,
    ) -> Outcome {
        let now = now_ms();
        let decision = decision_for(segment, kind, round, call, question, now);
        let body = EventBody::DecisionAsked(DecisionAsked {
            decision_id: decision.id.clone(),
            kind,
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments_hash: decision.arguments_hash.clone(),
            expires_ms: decision.expires_ms,
            reissue: decision.reissue.is_some(),
        });
        let payload = body.to_payload();
        let ask = DecisionAsk {
            decision,
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            event_payload: payload.clone(),
        };
        let decision_id = ask.decision.id.clone();
        match self.store.decision_ask(ask).await {
            Ok(Some(seq)) => {
                // O5: the question as an event of the run's span, and a log line.
                tracing::info!(run = %segment.run.id, decision = %decision_id, kind = kind.as_str(), tool = %call.name, "run parked for an operator decision");
                if let Some(observer) = &segment.observer {
                    observer(&RunEvent {
                        run_id: segment.run.id.clone(),
                        seq,
                        kind: body.kind().to_string(),
                        payload,
                        time_ms: now,
                    });
                }
                Outcome::WaitingForApproval
            }
            Ok(None) => self.must_stop(segment).await.unwrap_or(Outcome::LeaseLost),
            Err(error) => {
                // Nothing was asked. For an approval nothing was sent, so a retry is safe;
                // an uncertain write keeps its fence, so a retry dead-letters it (R9).
                let reason = format!("the operator decision could not be stored: {error}");
                self.fail(segment, reason, true).await
            }
        }
    }
}

/// The pending decision about one call, asked at `now`. Approvals expire after the tool's
/// timeout; an uncertain effect waits for a person however long it takes (nothing else
/// may say what it did).
pub(super) fn decision_for(
    segment: &Segment<'_>,
    kind: DecisionKind,
    round: u32,
    call: &ToolCallRequest,
    question: Question,
    now: i64,
) -> Decision {
    let Question {
        message,
        requested_schema,
        reissue,
    } = question;
    let timeout = segment
        .agent
        .tools
        .iter()
        .find(|t| t.spec.name == call.name)
        .and_then(|t| t.approval)
        .unwrap_or(DEFAULT_APPROVAL_TIMEOUT);
    let expires_ms = match kind {
        DecisionKind::EffectUncertain => i64::MAX,
        _ => now.saturating_add(ms(timeout)),
    };
    Decision {
        id: uuid::Uuid::now_v7().to_string(),
        run_id: segment.run.id.clone(),
        kind,
        round,
        call_id: call.id.clone(),
        tool: call.name.clone(),
        arguments: call.arguments.clone(),
        arguments_hash: arguments_hash(&call.arguments),
        message,
        requested_schema,
        asked_ms: now,
        expires_ms,
        status: DecisionStatus::Pending,
        answer: None,
        reason: None,
        answer_arguments: None,
        content: None,
        actor: None,
        answered_ms: None,
        reissue,
        in_call: false,
    }
}
