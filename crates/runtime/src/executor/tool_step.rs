//! The tool step: one tool call the model asked for, checked (is the tool offered, are the
//! arguments an object, did an operator approve), made through the MCP client with the
//! run's signal and the write fence, and recorded before the model reads its result.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use runwarden_mcp::{
    Effect, ElicitorHandle, InputResume, McpCall, NoticeSink, ToolCall, ToolOutcome,
};
use runwarden_models::{Message, ToolCallRequest};
use runwarden_vault::Delivery;
use serde_json::{Map, Value};
use tracing::Instrument as _;

use super::decision_step::{Approval, Question};
use super::policy_step::Gate;
use super::record::Recorded;
use super::replay::uncertain_reason;
use super::{Executor, Segment};
use crate::agent::BoundTool;
use crate::decision::DecisionKind;
use crate::elicitor::RunElicitor;
use crate::events::{EffectUncertain, EventBody, Leg, PolicyNote, StepOutcome, ToolExecuted};
use crate::signal::RunSignal;
use crate::state::Outcome;
use crate::tool_notices::{CallLabel, ToolNotices};

/// Whether a call the model asked for can be made.
pub(super) enum Callable<'t> {
    /// The tool it names, and the arguments to send.
    Ready(&'t BoundTool, Map<String, Value>),
    /// Refused unsent, its step recorded: what the model reads.
    Refused(String),
}

/// How one call is made beyond what every call shares.
pub(super) struct CallOptions {
    /// M19: the operator's answer to re-issue the call with.
    pub(super) resume: Option<InputResume>,
    /// Stops this call alone (a gateway client's cancel); whoever sets it wakes the run.
    pub(super) stop: Option<Arc<AtomicBool>>,
    /// Also receives the call's progress and logs (a gateway client).
    pub(super) forward: Option<NoticeSink>,
    /// Answers the server's questions instead of an operator (a gateway client that can).
    pub(super) elicitor: Option<ElicitorHandle>,
    /// Answers the server's sampling requests (a gateway client that can).
    pub(super) sampler: Option<runwarden_mcp::SamplerHandle>,
    /// M19, R12: a server's `input_required` parks the run on an `input` decision.
    pub(super) park_on_input: bool,
    /// The signal taken at the boundary before the step, when nothing waited since (R6:
    /// its read was made after it asked); without one the call takes its own.
    pub(super) signal: Option<RunSignal>,
}

impl Default for CallOptions {
    fn default() -> Self {
        Self {
            resume: None,
            stop: None,
            forward: None,
            elicitor: None,
            sampler: None,
            park_on_input: true,
            signal: None,
        }
    }
}

/// A call that was made: what came back, and when.
pub(super) struct Made {
    pub(super) call: ToolCall,
    pub(super) returned: Instant,
    /// The call's signal, kept until its step is recorded: while it lives, the hub keeps
    /// when a cancel woke the call, which the cancel's latency is measured from.
    pub(super) _signal: RunSignal,
    /// P3: which policies allowed it, for its step.
    pub(super) policy: Option<PolicyNote>,
}

impl Executor {
    /// One tool execution as a step, `signal` taken at the boundary before it. `Err` is
    /// the segment's outcome when it must stop.
    pub(super) async fn tool_step(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        signal: RunSignal,
    ) -> Result<Message, Outcome> {
        let answer = |content: String, is_error: bool| Message::Tool {
            call_id: call.id.clone(),
            name: call.name.clone(),
            content,
            is_error,
        };
        let (tool, mut arguments) = match self.callable(segment, round, call).await? {
            Callable::Ready(tool, arguments) => (tool, arguments),
            Callable::Refused(text) => return Ok(answer(text, true)),
        };
        // P2: the policies decide before an approval, the fence or any byte.
        let (mut note, asked_by_policy) = match self
            .policy_gate(segment, round, call, tool, &arguments)
            .await?
        {
            Gate::Pass(note) => (note, None),
            Gate::Denied(text) => return Ok(answer(text, true)),
            Gate::Approval(note, message) => (Some(note), Some(message)),
        };
        let mut edited_note = String::new();
        let mut signal = Some(signal);
        if tool.approval.is_some() || asked_by_policy.is_some() {
            // An approval may wait for hours: the call takes a signal of its own after it.
            signal = None;
            match self
                .approval(segment, round, call, tool, asked_by_policy)
                .await?
            {
                Approval::Denied(text) => return Ok(answer(text, true)),
                Approval::Given(Some(edited)) => {
                    // P2: edited arguments are decided again: an approval never outweighs a
                    // forbid. The approval itself is given, so it is not asked again.
                    if note.is_some() {
                        match self
                            .policy_gate(segment, round, call, tool, &edited)
                            .await?
                        {
                            Gate::Denied(text) => return Ok(answer(text, true)),
                            Gate::Pass(again) => note = again,
                            Gate::Approval(again, _) => note = Some(again),
                        }
                    }
                    // The model is told what the operator changed, so it knows what was sent.
                    let shown = Value::Object(edited.clone());
                    edited_note = format!("an operator changed the arguments to {shown}; ");
                    arguments = edited;
                }
                Approval::Given(None) => {}
            }
        }
        let resume = self.input_resume(segment, call).await?;
        // R14: the call's limits, after its approval and before its fence and first byte.
        let hold = match self.tool_limits(segment, round, call, tool).await? {
            Ok(hold) => hold,
            Err(text) => return Ok(answer(text, true)),
        };
        if !self.take_tool_call(segment) {
            // R13: counted before the call; the budget's stop settles the run.
            return Err(self.must_stop(segment).await.unwrap_or(Outcome::Failed));
        }
        // A limit's wait, if any, ended with a guarded append: a cancel during it stops
        // the step there, so the boundary's signal still serves.
        let options = CallOptions {
            resume,
            signal,
            ..CallOptions::default()
        };
        let made = self
            .make_call(segment, round, call, tool, arguments, options)
            .await;
        hold.release().await;
        let mut made = made?;
        made.policy = note;
        let (text, is_error) = self
            .record_result(segment, round, call, tool, made, &edited_note)
            .await?;
        Ok(answer(text, is_error))
    }

    /// The tool the call names and its arguments, or the refusal the model reads (its
    /// step recorded). `Err` when the segment lost the run.
    pub(super) async fn callable<'t>(
        &self,
        segment: &Segment<'t>,
        round: u32,
        call: &ToolCallRequest,
    ) -> Result<Callable<'t>, Outcome> {
        let tool = segment
            .agent
            .tools
            .iter()
            .find(|t| t.spec.name == call.name);
        let text = match (tool, &call.arguments) {
            (Some(tool), Value::Object(arguments)) => {
                return Ok(Callable::Ready(tool, arguments.clone()));
            }
            (None, _) => format!("no tool named {:?} is offered to this agent", call.name),
            // L4: arguments the model wrote badly reach it as the tool's error, never `{}`.
            (Some(_), _) => match &call.invalid_arguments {
                // The vault refused arguments that carry a secret's value: its words.
                Some(why) if why.contains("(secret_exfiltration)") => why.clone(),
                Some(why) => format!("arguments were not valid JSON: {why}"),
                None => "the tool's arguments must be a JSON object".to_string(),
            },
        };
        let body = EventBody::ToolExecuted(ToolExecuted::refused(round, call, &text));
        self.record_soft(segment, body, None)
            .await
            .ok_or(Outcome::LeaseLost)?;
        Ok(Callable::Refused(text))
    }

    /// Makes the call on the wire, carrying the run's signal; a write is fenced right
    /// before it leaves. `Err` is the segment's outcome when the call was refused unsent
    /// (the fence could not be stamped, this side's store failed).
    pub(super) async fn make_call(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        arguments: Map<String, Value>,
        options: CallOptions,
    ) -> Result<Made, Outcome> {
        let fence_failure = Arc::new(Mutex::new(None));
        let mut signal = match options.signal {
            Some(signal) => signal,
            None => self.signal(segment).await,
        };
        if let Some(stop) = options.stop {
            signal = signal.with_stop(stop);
        }
        // M15: the server's progress and logs become throttled, bounded run events.
        let label = CallLabel {
            round,
            call_id: call.id.clone(),
            tool: tool.spec.name.clone(),
        };
        let target = self.progress_target(segment);
        let notices = ToolNotices::start(target, self.config.progress_interval, label);
        let sink = match options.forward {
            Some(forward) => notices.sink().and(forward),
            None => notices.sink(),
        };
        let mcp_call = McpCall {
            tool: tool.remote_name.clone(),
            arguments,
            correlation: Some(segment.run.correlation.clone()),
            // R11: the fence is stamped after the session is ready, right before the first
            // byte of tools/call, so a crash in the handshake never fences the run.
            gate: (tool.effect.is_write())
                .then(|| self.fence_gate(segment, tool, fence_failure.clone())),
            elicitor: Some(
                options
                    .elicitor
                    .unwrap_or_else(|| self.elicitor(segment, round, call)),
            ),
            // M7 (amended): the structured result is checked against what the tool declared.
            output_schema: tool.output_schema.clone(),
            notices: Some(sink),
            sampler: options.sampler,
            // M19, R12: a server's `input_required` parks the run on an `input` decision.
            park_on_input: options.park_on_input,
            resume: options.resume,
            forced: false,
        };
        let span = tracing::info_span!(
            "tool_call",
            round,
            tool = %call.name,
            server = %tool.client.server().name,
            arguments = tracing::field::Empty,
        );
        if self.config.record_arguments {
            span.record("arguments", call.arguments.to_string());
        }
        let outcome = tool
            .client
            .call_tool(mcp_call, Some(&signal))
            .instrument(span)
            .await;
        let returned = Instant::now();
        // No progress or log event may follow the step that ends the call.
        notices.finish().await;
        let failure = fence_failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(failure) = failure {
            return Err(self.fence_failed(segment, failure).await);
        }
        if let Some(fault) = outcome.result.error.as_ref().filter(|e| e.is_store_fault()) {
            let problem = fault.to_string();
            return Err(self
                .store_refused(segment, round, &call.id, &call.name, problem)
                .await);
        }
        Ok(Made {
            call: outcome,
            returned,
            _signal: signal,
            policy: None,
        })
    }

    /// M14, R12: a server's question during the call becomes an `input` decision of this
    /// run; the client consults it only when the server's policy is "operator".
    fn elicitor(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
    ) -> ElicitorHandle {
        ElicitorHandle(Arc::new(RunElicitor::new(
            self.store.clone(),
            &segment.run.id,
            &self.config.owner,
            segment.run.claim_epoch,
            round,
            &call.id,
            &call.name,
            call.arguments.clone(),
        )))
    }

    /// Records what the call did and says what the model reads (its text, and whether it
    /// is an error). `Err` is the segment's outcome: the server asked for input, the run
    /// was cancelled, a non-idempotent write's effect is unknown, or its step was lost.
    async fn record_result(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        made: Made,
        edited_note: &str,
    ) -> Result<(String, bool), Outcome> {
        let Made {
            call: made,
            returned,
            _signal,
            policy: note,
        } = made;
        if let Some(asked) = made.input_required {
            return Err(self.input_required(segment, round, call, tool, asked).await);
        }
        let result = &made.result;
        let is_write = tool.effect.is_write();
        // R11: a write that may have reached the server without an answer keeps its fence
        // and its step says so; nothing guesses that it did not run.
        let uncertain = is_write && result.delivery == Delivery::MaybeDelivered;
        let body = step_body(round, call, tool, &made, uncertain, edited_note, note);
        // R7: recording an answered (or unsent) write clears the fence in the same update.
        let clear_fence = is_write && !uncertain;
        match self.record(segment, body, clear_fence, None).await {
            Recorded::Stored => {}
            Recorded::LostRun => return Err(Outcome::LeaseLost),
            Recorded::Failed(error) if is_write => {
                // R8: a write step that cannot be recorded stops the run; its fence stays.
                let reason = format!("a write step could not be recorded: {error}");
                return Err(self.unrecorded_write(segment, tool.effect, reason).await);
            }
            Recorded::Failed(error) => {
                tracing::warn!(run = %segment.run.id, %error, "could not record a read-only tool step; going on");
            }
        }
        if result.outcome == ToolOutcome::Cancelled {
            // M12: the model would read this, but the run itself is what was cancelled.
            let stop = self.must_stop(segment).await.unwrap_or(Outcome::Cancelled);
            self.observe_cancel(segment, returned, stop);
            return Err(stop);
        }
        if uncertain && tool.effect == Effect::NonIdempotentWrite {
            // R11, R12: nothing re-sends it; the run parks until a person says what it did.
            let question = Question::said(uncertain_reason(&call.name, &result.text));
            let kind = DecisionKind::EffectUncertain;
            return Err(self.ask(segment, kind, round, call, question).await);
        }
        Ok((
            format!("{edited_note}{}", result.text),
            !result.is_success(),
        ))
    }
}

/// The step that records a call that was made: `effect_uncertain` for a write that may
/// have reached the server with no answer, `tool_executed` otherwise.
pub(super) fn step_body(
    round: u32,
    call: &ToolCallRequest,
    tool: &BoundTool,
    made: &ToolCall,
    uncertain: bool,
    edited_note: &str,
    policy: Option<PolicyNote>,
) -> EventBody {
    let result = &made.result;
    let label = match result.outcome {
        ToolOutcome::Succeeded => StepOutcome::Succeeded,
        ToolOutcome::ToolError => StepOutcome::ToolError,
        ToolOutcome::Failed => StepOutcome::Failed,
        ToolOutcome::Cancelled => StepOutcome::Cancelled,
    };
    if !uncertain {
        return EventBody::ToolExecuted(ToolExecuted {
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            remote: Some(tool.remote_name.clone()),
            server: Some(tool.client.server().name.clone()),
            effect: Some(tool.effect),
            outcome: label,
            delivery: Some(result.delivery),
            sent: Some(result.sent()),
            text: format!("{edited_note}{}", result.text),
            policy: policy.map(Box::new),
        });
    }
    let legs = made
        .legs
        .iter()
        .map(|l| Leg {
            method: l.method.clone(),
            answered: l.answered,
            audit_id: l.audit_id,
            millis: u64::try_from(l.elapsed.as_millis()).unwrap_or(u64::MAX),
        })
        .collect();
    EventBody::EffectUncertain(EffectUncertain {
        round,
        call_id: call.id.clone(),
        tool: call.name.clone(),
        remote: tool.remote_name.clone(),
        server: tool.client.server().name.clone(),
        effect: tool.effect,
        outcome: label,
        delivery: result.delivery,
        sent: result.sent(),
        text: result.text.clone(),
        request_id: made.request_id,
        legs,
    })
}
