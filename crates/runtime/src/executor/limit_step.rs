//! R14: a call takes its limits after its approval and before its fence and its first
//! byte; when one is full it waits, with the wait's start and end on the run's log, until
//! the limit frees, the run is cancelled, or the wait's bound (then nothing is sent).

use std::sync::Arc;

use runwarden_models::ToolCallRequest;
use runwarden_vault::Delivery;

use super::{Executor, Segment};
use crate::agent::BoundTool;
use crate::events::{EventBody, LimitWait, LimitWaited, ModelFailed, ToolExecuted};
use crate::limits::{Hold, LimitPlan, LimitStop, Limiter, TakeAttempt, WaitEnd};
use crate::state::Outcome;

/// The word a model call's limit events use in place of a tool's name.
const MODEL_CALL: &str = "model";

/// Which call waits, as its events name it.
struct Waiter<'a> {
    round: u32,
    call_id: Option<&'a str>,
    call: &'a str,
}

impl Executor {
    /// Puts limits on every tool and model call of this executor's runs.
    pub fn with_limiter(mut self, limiter: Arc<Limiter>) -> Self {
        self.limiter = Some(limiter);
        self
    }

    /// The limits of a tool call, taken. `Ok(Err(text))`: the call is refused unsent, its
    /// step recorded, and the model reads `text`. `Err`: the segment must stop.
    pub(super) async fn tool_limits(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        tool: &BoundTool,
    ) -> Result<Result<Hold, String>, Outcome> {
        let Some(limiter) = &self.limiter else {
            return Ok(Ok(Hold::nothing()));
        };
        let server = &tool.client.server().name;
        let token = segment.run.origin.started_by.as_deref();
        let plan = limiter.for_tool(&segment.agent.name, token, server, &tool.spec.name);
        let waiter = Waiter {
            round,
            call_id: Some(&call.id),
            call: &call.name,
        };
        match self.take_limits(segment, limiter, &plan, waiter).await? {
            Ok(hold) => Ok(Ok(hold)),
            Err(stop) => {
                let text = stop.to_string();
                let body = EventBody::ToolExecuted(ToolExecuted::refused(round, call, &text));
                self.record_soft(segment, body, None)
                    .await
                    .ok_or(Outcome::LeaseLost)?;
                Ok(Err(text))
            }
        }
    }

    /// The limits of a model call, taken. `Err`: the segment's outcome; a wait that ran
    /// out fails the run as retryable, nothing sent.
    pub(super) async fn model_limits(
        &self,
        segment: &Segment<'_>,
        round: u32,
    ) -> Result<Hold, Outcome> {
        let Some(limiter) = &self.limiter else {
            return Ok(Hold::nothing());
        };
        let token = segment.run.origin.started_by.as_deref();
        let plan = limiter.for_model(&segment.agent.name, token);
        let waiter = Waiter {
            round,
            call_id: None,
            call: MODEL_CALL,
        };
        let stop = match self.take_limits(segment, limiter, &plan, waiter).await? {
            Ok(hold) => return Ok(hold),
            Err(stop) => stop,
        };
        let body = EventBody::ModelFailed(ModelFailed {
            round,
            error: stop.to_string(),
            retryable: true,
            delivery: Delivery::NotSent,
        });
        if self.record_soft(segment, body, Some(round)).await.is_none() {
            return Err(Outcome::LeaseLost);
        }
        let reason = format!("the model call was not made: {stop}");
        Err(self.fail(segment, reason, true).await)
    }

    /// Takes `plan`, waiting when a limit is full. `Ok(Err)`: the wait ran out or the
    /// store could not be asked. `Err`: the run was cancelled (or must stop) meanwhile.
    async fn take_limits(
        &self,
        segment: &Segment<'_>,
        limiter: &Limiter,
        plan: &LimitPlan,
        waiter: Waiter<'_>,
    ) -> Result<Result<Hold, LimitStop>, Outcome> {
        if plan.is_empty() {
            return Ok(Ok(Hold::nothing()));
        }
        let full = match limiter.try_take(plan).await {
            Ok(TakeAttempt::Taken(hold)) => return Ok(Ok(hold)),
            Ok(TakeAttempt::Full(full)) => full,
            Err(stop) => return Ok(Err(stop)),
        };
        let limit = full.describe();
        let began = EventBody::LimitWait(LimitWait {
            round: waiter.round,
            call_id: waiter.call_id.map(str::to_string),
            call: waiter.call.to_string(),
            limit: limit.clone(),
        });
        self.record_soft(segment, began, None)
            .await
            .ok_or(Outcome::LeaseLost)?;
        let signal = self.signal(segment).await;
        let started = std::time::Instant::now();
        let result = limiter.wait(plan, full, &signal).await;
        let end = match &result {
            Ok(_) => WaitEnd::Taken,
            Err(LimitStop::TimedOut { .. }) => WaitEnd::TimedOut,
            Err(LimitStop::Cancelled(_)) => WaitEnd::Cancelled,
            Err(LimitStop::Unavailable(_)) => WaitEnd::Unavailable,
        };
        let ended = EventBody::LimitWaited(LimitWaited {
            round: waiter.round,
            call_id: waiter.call_id.map(str::to_string),
            call: waiter.call.to_string(),
            limit,
            outcome: end.as_str().to_string(),
            waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        });
        self.record_soft(segment, ended, None)
            .await
            .ok_or(Outcome::LeaseLost)?;
        match result {
            Err(LimitStop::Cancelled(_)) => {
                Err(self.must_stop(segment).await.unwrap_or(Outcome::Cancelled))
            }
            other => Ok(other),
        }
    }
}
