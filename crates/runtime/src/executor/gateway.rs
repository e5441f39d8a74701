//! The gateway segment (G1): a client's MCP session held as one running run. Its calls
//! come in over a channel and run side by side, each through the tool step's own parts
//! (the tool offered, the policies, the limits, the fence, the vault, the step recorded);
//! writes go one at a time, so the run's one write fence always names the write in
//! flight. The segment ends when the client ends the session, an operator cancels the
//! run, or the run is lost.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use futures_util::StreamExt as _;
use futures_util::stream::FuturesUnordered;
use runwarden_base::StoreError;
use runwarden_mcp::Effect;
use runwarden_models::ToolCallRequest;
use runwarden_vault::{CancellationSignal as _, Delivery};
use serde_json::{Map, Value};
use tokio::sync::{mpsc, watch};

use super::decision_step::Approval;
use super::policy_step::Gate;
use super::record::Recorded;
use super::tool_step::{CallOptions, Callable, Made, step_body};
use super::{Executor, Segment, SegmentOptions};
use crate::agent::{AgentSpec, BoundTool};
use crate::events::{EventBody, PolicyNote, RunStarted, RunStopped};
use crate::gateway::{
    FENCED_SESSION, GATEWAY_AGENT, GatewayCall, GatewayReply, GatewayRequest, uncertain_text,
};
use crate::state::{Outcome, RunState};
use crate::store::{Run, RunOrigin};

/// What the session shares across its calls.
struct Session {
    /// What the client may call now.
    tools: watch::Receiver<Arc<AgentSpec>>,
    /// The step number of the next call (each call is a round of its own).
    next_round: AtomicU32,
    /// Writes go one at a time: the run's fence names one write.
    writes: tokio::sync::Mutex<()>,
    /// R11: a non-idempotent write of the session may have taken effect; no more writes.
    fenced: AtomicBool,
    /// The run ended under a call (a write that could not be recorded): no more calls.
    ended: Mutex<Option<Outcome>>,
}

impl Executor {
    /// G1: the run of a new gateway session, running and held by this executor. It has no
    /// stored request, so a crash never requeues it: the reaper fails it once its lease
    /// runs out (the client's session is gone with the process).
    pub async fn open_gateway(&self, origin: RunOrigin) -> Result<Run, StoreError> {
        self.create_running(GATEWAY_AGENT, None, origin).await
    }

    /// G1: holds a gateway run while its client's session lasts: records its start
    /// (`about` says who the client is), makes each call that comes in, and settles the run
    /// when the channel closes. Returns how the run ended. `tools` is what the client may
    /// call, as it stands when each call starts (a reload may change it, G2).
    pub async fn serve_gateway(
        &self,
        run: &Run,
        tools: watch::Receiver<Arc<AgentSpec>>,
        about: &str,
        mut requests: mpsc::Receiver<GatewayRequest>,
    ) -> Outcome {
        let lease_lost = Arc::new(AtomicBool::new(false));
        let _heartbeat = self.heartbeat(run, lease_lost.clone());
        let options = SegmentOptions::default();
        let agent = tools.borrow().clone();
        let segment = Segment {
            run,
            agent: &agent,
            observer: None,
            lease_lost,
            options: &options,
            budgets: agent.budgets,
            budget: Arc::default(),
            spent: Mutex::default(),
            approvals: Mutex::default(),
            ended: AtomicBool::new(false),
            inputs: Mutex::default(),
        };
        let started = EventBody::RunStarted(RunStarted {
            agent: agent.name.clone(),
            prompt: about.to_string(),
            owner: self.config.owner.clone(),
        });
        if self.record_soft(&segment, started, None).await.is_none() {
            return Outcome::LeaseLost;
        }
        let session = Session {
            tools,
            next_round: AtomicU32::new(1),
            writes: tokio::sync::Mutex::new(()),
            fenced: AtomicBool::new(false),
            ended: Mutex::new(None),
        };
        // Held for the session: the watcher reads the run's status while it lives, and it
        // wakes when an operator cancels the run or the lease is lost.
        let watch = self.signal(&segment).await;
        let mut calls = FuturesUnordered::new();
        let mut open = true;
        let stop = loop {
            if let Some(outcome) = *session.ended.lock().unwrap_or_else(|p| p.into_inner()) {
                break Some(outcome);
            }
            if watch.is_cancelled() {
                break None;
            }
            if !open && calls.is_empty() {
                break Some(Outcome::Completed);
            }
            tokio::select! {
                request = requests.recv(), if open => match request {
                    Some(request) => calls.push(self.gateway_call(&segment, &session, request)),
                    None => open = false,
                },
                Some(()) = calls.next(), if !calls.is_empty() => {}
                () = watch.woken() => {}
            }
        };
        // The calls in flight see the same signal: they end at once on a cancel.
        while calls.next().await.is_some() {}
        drop(watch);
        match stop {
            Some(Outcome::Completed) => self.end_gateway(&segment, &session).await,
            Some(outcome) => outcome,
            None => {
                let outcome = self.must_stop(&segment).await.unwrap_or(Outcome::Cancelled);
                let stopped = EventBody::RunStopped(RunStopped {
                    outcome,
                    reason: None,
                });
                let _ = self.record(&segment, stopped, false, None).await;
                outcome
            }
        }
    }

    /// The client ended its session: the run completes, or fails when a write of it may
    /// have taken effect unanswered (its fence stays for a person to see).
    async fn end_gateway(&self, segment: &Segment<'_>, session: &Session) -> Outcome {
        if let Some(stop) = self.must_stop(segment).await {
            return stop;
        }
        let calls = session.next_round.load(Ordering::SeqCst).saturating_sub(1);
        if session.fenced.load(Ordering::SeqCst) {
            let reason = format!(
                "{}: a write of the session may have taken effect without an answer",
                crate::retry::DeadLetter::FencedWrite.as_str()
            );
            return self.settle(segment, RunState::Failed, reason).await;
        }
        let reason = match calls {
            1 => "the client ended its session after 1 tool call".to_string(),
            n => format!("the client ended its session after {n} tool calls"),
        };
        self.settle(segment, RunState::Completed, reason).await
    }

    /// One call of the session, answered on its channel.
    async fn gateway_call(
        &self,
        segment: &Segment<'_>,
        session: &Session,
        request: GatewayRequest,
    ) {
        let GatewayRequest { call, reply } = request;
        let round = session.next_round.fetch_add(1, Ordering::SeqCst);
        // The call sees the tools as they stand when it starts; the rest is the session's.
        let agent = session.tools.borrow().clone();
        let segment = Segment {
            run: segment.run,
            agent: &agent,
            observer: None,
            lease_lost: segment.lease_lost.clone(),
            options: segment.options,
            budgets: agent.budgets,
            budget: segment.budget.clone(),
            spent: Mutex::default(),
            approvals: Mutex::default(),
            ended: AtomicBool::new(false),
            inputs: Mutex::default(),
        };
        let answer = self.gateway_step(&segment, session, round, call).await;
        if let GatewayReply::Ended { outcome, .. } = &answer {
            let mut ended = session.ended.lock().unwrap_or_else(|p| p.into_inner());
            ended.get_or_insert(*outcome);
        }
        let _ = reply.send(answer);
    }

    /// The tool step of one gateway call: the same checks and recording as an agent's,
    /// but it never parks the run (the client is waiting) and the answer goes back to the
    /// client instead of a model.
    async fn gateway_step(
        &self,
        segment: &Segment<'_>,
        session: &Session,
        round: u32,
        gateway: GatewayCall,
    ) -> GatewayReply {
        let call = ToolCallRequest {
            id: gateway.call_id.clone(),
            name: gateway.tool.clone(),
            arguments: gateway.arguments.clone(),
            invalid_arguments: None,
        };
        let ended = |outcome| GatewayReply::Ended {
            outcome,
            uncertain: false,
        };
        let (tool, arguments) = match self.callable(segment, round, &call).await {
            Ok(Callable::Ready(tool, arguments)) => (tool, arguments),
            Ok(Callable::Refused(text)) => return GatewayReply::error(text),
            Err(outcome) => return ended(outcome),
        };
        let (note, arguments) = match self
            .gateway_gate(segment, (round, &call, tool), arguments, &gateway)
            .await
        {
            Ok(Ok(passed)) => passed,
            Ok(Err(text)) => return GatewayReply::error(text),
            Err(outcome) => return ended(outcome),
        };
        let write = tool.effect.is_write();
        // G2: held until the step is recorded, so the run's fence names this write alone.
        let _turn = match write {
            true => Some(session.writes.lock().await),
            false => None,
        };
        if write && session.fenced.load(Ordering::SeqCst) {
            let body = EventBody::ToolExecuted(crate::events::ToolExecuted::refused(
                round,
                &call,
                FENCED_SESSION,
            ));
            if self.record_soft(segment, body, None).await.is_none() {
                return ended(Outcome::LeaseLost);
            }
            return GatewayReply::error(FENCED_SESSION);
        }
        let hold = match self.tool_limits(segment, round, &call, tool).await {
            Ok(Ok(hold)) => hold,
            Ok(Err(text)) => return GatewayReply::error(text),
            Err(outcome) => return ended(outcome),
        };
        if !self.take_tool_call(segment) {
            let outcome = self.must_stop(segment).await.unwrap_or(Outcome::Failed);
            return ended(outcome);
        }
        let options = CallOptions {
            resume: None,
            stop: Some(gateway.stop.clone()),
            forward: gateway.notices.clone(),
            elicitor: gateway.elicitor.clone(),
            sampler: gateway.sampler.clone(),
            // The client is waiting: a server's question is answered within the call.
            park_on_input: false,
            signal: None,
        };
        let made = self
            .make_call(segment, round, &call, tool, arguments, options)
            .await;
        hold.release().await;
        match made {
            Ok(mut made) => {
                made.policy = note;
                self.gateway_result(segment, session, round, &call, tool, made)
                    .await
            }
            Err(outcome) => ended(outcome),
        }
    }

    /// Records what a gateway call did and says what the client reads.
    async fn gateway_result(
        &self,
        segment: &Segment<'_>,
        session: &Session,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
        made: Made,
    ) -> GatewayReply {
        let Made {
            call: made,
            returned,
            _signal,
            policy,
        } = made;
        let result = &made.result;
        let is_write = tool.effect.is_write();
        // R11, G3: a write that may have reached the server unanswered keeps its fence, and
        // the client is told its outcome is unknown.
        let uncertain = is_write && result.delivery == Delivery::MaybeDelivered;
        let body = step_body(round, call, tool, &made, uncertain, "", policy);
        let clear_fence = is_write && !uncertain;
        match self.record(segment, body, clear_fence, None).await {
            Recorded::Stored => {}
            Recorded::LostRun => {
                let outcome = self.must_stop(segment).await.unwrap_or(Outcome::LeaseLost);
                return GatewayReply::Ended { outcome, uncertain };
            }
            Recorded::Failed(error) if is_write => {
                let reason = format!("a write step could not be recorded: {error}");
                let outcome = self.unrecorded_write(segment, tool.effect, reason).await;
                return GatewayReply::Ended {
                    outcome,
                    uncertain: true,
                };
            }
            Recorded::Failed(error) => {
                tracing::warn!(run = %segment.run.id, %error, "could not record a read-only tool step; going on");
            }
        }
        let fence = uncertain && tool.effect == Effect::NonIdempotentWrite;
        if fence {
            session.fenced.store(true, Ordering::SeqCst);
        }
        if result.outcome == runwarden_mcp::ToolOutcome::Cancelled {
            if let Some(outcome) = self.must_stop(segment).await {
                self.observe_cancel(segment, returned, outcome);
                return GatewayReply::Ended { outcome, uncertain };
            }
            return GatewayReply::CancelledByClient { uncertain };
        }
        if fence {
            return GatewayReply::error(uncertain_text(&call.name, &result.text));
        }
        GatewayReply::Result {
            text: result.text.clone(),
            structured: result.structured.clone(),
            content: result.content.clone(),
            is_error: !result.is_success(),
        }
    }

    /// P2, R12: the policies' decision and, when a policy or the server's configuration
    /// asks for one, an operator's approval, waited for within the call. `Ok(Ok)`: the
    /// note for the step and the arguments to send (an operator may have edited them);
    /// `Ok(Err(text))`: refused unsent, its step recorded.
    async fn gateway_gate(
        &self,
        segment: &Segment<'_>,
        (round, call, tool): (u32, &ToolCallRequest, &BoundTool),
        arguments: Map<String, Value>,
        gateway: &GatewayCall,
    ) -> Result<Result<(Option<PolicyNote>, Map<String, Value>), String>, Outcome> {
        let (note, asked_by_policy) = match self
            .policy_gate(segment, round, call, tool, &arguments)
            .await?
        {
            Gate::Pass(note) => (note, None),
            Gate::Denied(text) => return Ok(Err(text)),
            Gate::Approval(note, message) => (Some(note), Some(message)),
        };
        if tool.approval.is_none() && asked_by_policy.is_none() {
            return Ok(Ok((note, arguments)));
        }
        let signal = self.signal(segment).await.with_stop(gateway.stop.clone());
        let notices = gateway.notices.as_ref();
        let approval = self
            .approval_in_call(
                segment,
                (round, call, tool),
                asked_by_policy,
                notices,
                &signal,
            )
            .await?;
        let edited = match approval {
            Approval::Denied(text) => return Ok(Err(text)),
            Approval::Given(None) => return Ok(Ok((note, arguments))),
            Approval::Given(Some(edited)) => edited,
        };
        // P2: edited arguments are decided again: an approval never outweighs a forbid.
        let edited_call = ToolCallRequest {
            arguments: Value::Object(edited.clone()),
            ..call.clone()
        };
        match self
            .policy_gate(segment, round, &edited_call, tool, &edited)
            .await?
        {
            Gate::Denied(text) => Ok(Err(text)),
            Gate::Pass(again) => Ok(Ok((again.or(note), edited))),
            Gate::Approval(again, _) => Ok(Ok((Some(again), edited))),
        }
    }
}
