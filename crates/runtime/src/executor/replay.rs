//! Where a run stands, rebuilt from its log: a resumed segment does only the work the
//! log does not show, so a write that was recorded is never made twice.

use std::collections::{HashMap, HashSet};

use runwarden_mcp::Effect;
use runwarden_models::{Message, ToolCallRequest};

use super::Spent;
use super::model_step::unusable_turn;
use crate::decision::{Answer, DecisionKind};
use crate::events::{
    DecisionAnswered, DecisionAsked, EffectUncertain, EventBody, EventDecodeError, ModelResponse,
    StepOutcome,
};
use crate::state::{EFFECT_UNCERTAIN, RunState};
use crate::store::RunEvent;

/// Where a run stands, rebuilt from its stored events.
pub(super) struct Replayed {
    /// The conversation so far.
    pub(super) messages: Vec<Message>,
    /// The last model round that was recorded (0 for a fresh run).
    pub(super) round: u32,
    /// Tool calls of that round with no recorded result.
    pub(super) unanswered: Vec<ToolCallRequest>,
    /// The model's final answer, when its step is stored (R8: settle without the model).
    pub(super) final_answer: Option<String>,
    /// A non-idempotent write whose effect is unknown and that no person has resolved
    /// yet (R11, R12).
    pub(super) uncertain_write: Option<UncertainWrite>,
    /// R12: answered approvals, by the model's call id.
    pub(super) approvals: HashMap<String, DecisionAnswered>,
    /// M19: answered `input` decisions whose call is re-issued, by call id (decision id).
    pub(super) inputs: HashMap<String, String>,
    /// M19: the ids of `input` decisions asked by an `input_required` result.
    pub(super) reissue_asked: HashSet<String>,
    /// Why the run must fail: its last model turn was cut or empty (L4).
    pub(super) unusable_turn: Option<String>,
    /// What the run spent so far (R13).
    pub(super) spent: Spent,
    /// The run's end, when its terminal step is stored.
    pub(super) terminal: Option<(RunState, String)>,
    /// Whether the log holds any event: the segment resumes the run rather than start it.
    pub(super) resumed: bool,
}

impl Replayed {
    /// Rebuilds where the run stands. An event that cannot be read is an error naming the
    /// run and its sequence: nothing is guessed (a guess could repeat a write).
    pub(super) fn replay(
        prompt: &str,
        history: &[RunEvent],
        max_tokens: Option<u32>,
    ) -> Result<Self, EventDecodeError> {
        let user = Message::User {
            text: prompt.to_string(),
        };
        let mut replayed = Self {
            messages: vec![user],
            round: 0,
            unanswered: Vec::new(),
            final_answer: None,
            uncertain_write: None,
            unusable_turn: None,
            terminal: None,
            spent: Spent::default(),
            approvals: HashMap::new(),
            inputs: HashMap::new(),
            reissue_asked: HashSet::new(),
            resumed: !history.is_empty(),
        };
        for event in history {
            let body = EventBody::decode(&event.run_id, event.seq, &event.kind, &event.payload)?;
            replayed.apply(body, max_tokens);
        }
        Ok(replayed)
    }

    /// One event of the log, in order.
    fn apply(&mut self, body: EventBody, max_tokens: Option<u32>) {
        match body {
            EventBody::ModelResponse(step) => self.model_responded(step, max_tokens),
            EventBody::ToolExecuted(step) => {
                if !matches!(step.outcome, StepOutcome::Refused | StepOutcome::Denied) {
                    self.spent.tool_calls = self.spent.tool_calls.saturating_add(1);
                }
                self.answered(&step.call_id, step.tool, step.text, step.outcome);
            }
            EventBody::EffectUncertain(step) => self.effect_uncertain(step),
            EventBody::DecisionAsked(asked) => self.asked(&asked),
            EventBody::DecisionAnswered(answered) => self.decided(answered),
            EventBody::RunCompleted(end) => {
                self.terminal = Some((RunState::Completed, end.reason));
            }
            EventBody::RunFailed(end) => {
                self.terminal = Some((RunState::Failed, end.reason));
            }
            EventBody::RunStarted(_)
            | EventBody::RunResumed(_)
            | EventBody::ModelCancelled(_)
            | EventBody::ModelFailed(_)
            | EventBody::RunRequeued(_)
            | EventBody::RunStopped(_)
            // Progress reports tell the operator, never the resumed run.
            | EventBody::ModelProgress(_)
            | EventBody::ToolProgress(_)
            | EventBody::ToolLog(_)
            | EventBody::LimitWait(_)
            | EventBody::LimitWaited(_) => {}
        }
    }

    /// A model turn in the log: the next round, unless it cannot be acted upon.
    fn model_responded(&mut self, step: ModelResponse, max_tokens: Option<u32>) {
        self.round = step.round;
        self.spent.output_tokens = self
            .spent
            .output_tokens
            .saturating_add(step.usage.map_or(0, |u| u.output_tokens));
        if let Some(reason) = unusable_turn(&step, max_tokens) {
            // L4: neither an answer nor tool calls to finish.
            self.unusable_turn = Some(reason);
            self.unanswered = Vec::new();
            return;
        }
        if step.tool_calls.is_empty() {
            self.final_answer = Some(step.text.clone().unwrap_or_default());
        }
        self.messages.push(Message::Assistant {
            text: step.text,
            tool_calls: step.tool_calls.clone(),
        });
        self.unanswered = step.tool_calls;
    }

    /// A call whose effect is unknown: a non-idempotent write of it stops the run until a
    /// person says what it did.
    fn effect_uncertain(&mut self, step: EffectUncertain) {
        self.spent.tool_calls = self.spent.tool_calls.saturating_add(1);
        let call = self.unanswered.iter().find(|c| c.id == step.call_id);
        if let (Effect::NonIdempotentWrite, Some(call)) = (step.effect, call) {
            self.uncertain_write = Some(UncertainWrite {
                call: call.clone(),
                round: step.round,
                reason: uncertain_reason(&step.tool, &step.text),
                asked: false,
            });
        }
        self.answered(&step.call_id, step.tool, step.text, step.outcome);
    }

    /// A decision asked in the log.
    fn asked(&mut self, asked: &DecisionAsked) {
        if asked.reissue {
            self.reissue_asked.insert(asked.decision_id.clone());
        }
        if let Some(uncertain) = self.uncertain_write.as_mut()
            && asked.kind == DecisionKind::EffectUncertain
            && uncertain.call.id == asked.call_id
        {
            uncertain.asked = true;
        }
    }

    /// R12: an answer in the log. An approval's answer waits for its call; an uncertain
    /// write's answer becomes what the model reads about that call, and the run goes on.
    fn decided(&mut self, answered: DecisionAnswered) {
        match answered.kind {
            DecisionKind::Approval => {
                self.approvals.insert(answered.call_id.clone(), answered);
            }
            DecisionKind::EffectUncertain => {
                let text = match answered.answer {
                    Answer::Applied => {
                        "an operator confirmed that this call took effect; its result is unknown"
                    }
                    Answer::NotApplied => {
                        "an operator confirmed that this call did not take effect; nothing changed, so you may decide whether to make it again"
                    }
                    // A cancel ended the run in the answer's own transaction.
                    _ => return,
                };
                let is_error = answered.answer == Answer::NotApplied;
                for message in self.messages.iter_mut().rev() {
                    if let Message::Tool {
                        call_id,
                        content,
                        is_error: error,
                        ..
                    } = message
                        && *call_id == answered.call_id
                    {
                        *content = text.to_string();
                        *error = is_error;
                        break;
                    }
                }
                if self
                    .uncertain_write
                    .as_ref()
                    .is_some_and(|u| u.call.id == answered.call_id)
                {
                    self.uncertain_write = None;
                }
            }
            // M19: an answer to an `input_required` result waits for its call's re-issue;
            // an elicitation's answer went back to the server during its call.
            DecisionKind::Input => {
                if self.reissue_asked.contains(&answered.decision_id) {
                    self.inputs
                        .insert(answered.call_id.clone(), answered.decision_id.clone());
                }
            }
        }
    }

    /// A tool call of the last turn has its result in the log.
    fn answered(&mut self, call_id: &str, tool: String, text: String, outcome: StepOutcome) {
        self.unanswered.retain(|c| c.id != call_id);
        self.messages.push(Message::Tool {
            call_id: call_id.to_string(),
            name: tool,
            content: text,
            is_error: outcome != StepOutcome::Succeeded,
        });
    }
}

/// A non-idempotent write of the log whose effect is unknown (R11).
#[derive(Clone)]
pub(super) struct UncertainWrite {
    /// The model's call, as it asked for it.
    pub(super) call: ToolCallRequest,
    /// Its round.
    pub(super) round: u32,
    /// Why the run stops, for people (and the decision's message).
    pub(super) reason: String,
    /// Whether a decision about it was asked (R12).
    pub(super) asked: bool,
}

/// The termination reason of a run stopped by an uncertain write (R11).
pub(super) fn uncertain_reason(tool: &str, text: &str) -> String {
    format!(
        "{EFFECT_UNCERTAIN}: the non-idempotent write {tool} may have reached the server and no answer came back, so it will not be retried; check the server, then start a new run if needed ({text})"
    )
}
