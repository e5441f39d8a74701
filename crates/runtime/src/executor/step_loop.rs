//! The step loop: a segment rebuilds where its run stands from the log, then runs model
//! rounds, each followed by the tool calls the model asked for, until the run ends or a
//! boundary stops it (a cancel, a lost lease, a spent budget, a draining worker).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use runwarden_models::Message;

use super::decision_step::Question;
use super::replay::Replayed;
use super::{Executor, Observer, Segment, SegmentOptions};
use crate::agent::AgentSpec;
use crate::budget::Budgets;
use crate::decision::DecisionKind;
use crate::events::{EventBody, RunResumed, RunStarted, RunStopped};
use crate::state::{MODEL_TRUNCATED, Outcome, RunState};
use crate::store::Run;

impl Executor {
    /// A segment of `run`, from its start or its log to an outcome.
    pub(super) async fn execute_in_span(
        &self,
        run: &Run,
        agent: &AgentSpec,
        prompt: &str,
        observer: Option<Observer>,
        options: &SegmentOptions,
    ) -> Outcome {
        let lease_lost = Arc::new(AtomicBool::new(false));
        let _heartbeat = self.heartbeat(run, lease_lost.clone());
        // R13: the request's budgets were checked against the agent's when it was taken;
        // the lower of the two applies, so a request stored before an agent lowered its
        // own cannot raise it.
        let budgets = agent
            .budgets
            .lowered_by(&Budgets::from_request(run.request.as_ref()));
        let segment = Segment {
            run,
            agent,
            observer,
            lease_lost,
            options,
            budgets,
            budget: Arc::default(),
            spent: Mutex::default(),
            approvals: Mutex::default(),
            ended: AtomicBool::new(false),
            inputs: Mutex::default(),
        };
        let replayed = match self.replay(&segment, prompt).await {
            Ok(replayed) => replayed,
            Err(outcome) => return outcome,
        };
        if let Some((status, reason)) = replayed.terminal.clone() {
            // R8: the run's end is in the log but the row was not settled (a crash in
            // between): settle from the log, call nothing, write no second terminal step.
            return self.settle_row(&segment, status, reason).await;
        }
        if self
            .record_start(&segment, prompt, &replayed)
            .await
            .is_none()
        {
            return Outcome::LeaseLost;
        }
        let _wall = self.wall_timer(&segment);
        let outcome = self.rounds(&segment, replayed).await;
        if matches!(outcome, Outcome::Cancelled) && !segment.ended.load(Ordering::SeqCst) {
            // The cancel already won the row: mark the stop for readers, settle nothing.
            // R8: unless this segment's end is in the log already (a cancel that won the
            // row between the final step and the settle): never two terminal events.
            let stopped = EventBody::RunStopped(RunStopped {
                outcome,
                reason: None,
            });
            let _ = self.record(&segment, stopped, false, None).await;
        }
        outcome
    }

    /// Reads the run's log and rebuilds where it stands. `Err` is the segment's outcome
    /// when the log cannot be read.
    async fn replay(&self, segment: &Segment<'_>, prompt: &str) -> Result<Replayed, Outcome> {
        let run = segment.run;
        let read;
        let history = match &segment.options.history {
            // Read with the claim, in the same trip to the store.
            Some(history) => history.as_slice(),
            None => match self.store.run_events(&run.id, 0, 0).await {
                Ok(history) => {
                    read = history;
                    read.as_slice()
                }
                Err(error) => {
                    // Without its history a resumed run could repeat recorded work: stop here
                    // and let the lease run out (the reaper decides).
                    tracing::error!(run = %run.id, %error, "could not read the run's history; not executing it, its lease will run out");
                    return Err(Outcome::LeaseLost);
                }
            },
        };
        match Replayed::replay(prompt, history, segment.agent.max_tokens) {
            Ok(replayed) => Ok(replayed),
            Err(error) => {
                // An event this binary cannot read: resuming on a guess could repeat a
                // write or drop a step, so the run fails with the event named. A damaged
                // log does not heal on retry.
                tracing::error!(run = %run.id, %error, "could not read the run's history");
                let reason = format!("the run's history could not be read: {error}");
                Err(self.fail(segment, reason, false).await)
            }
        }
    }

    /// The segment's first step, `run_started` or `run_resumed`, and what the log says the
    /// run has spent and been answered. `None` when the segment lost the run.
    async fn record_start(
        &self,
        segment: &Segment<'_>,
        prompt: &str,
        replayed: &Replayed,
    ) -> Option<()> {
        match (&segment.options.started, replayed.resumed) {
            // The claim recorded the start in its own transaction.
            (Some(started), false) => {
                if let Some(observer) = &segment.observer {
                    observer(started);
                }
            }
            (_, true) => {
                let resumed = EventBody::RunResumed(RunResumed {
                    owner: self.config.owner.clone(),
                    from_round: replayed.round,
                    attempt: segment.run.requeue_count + 1,
                });
                self.record_soft(segment, resumed, None).await?;
            }
            (None, false) => {
                let started = EventBody::RunStarted(RunStarted {
                    agent: segment.agent.name.clone(),
                    prompt: prompt.to_string(),
                    owner: self.config.owner.clone(),
                });
                self.record_soft(segment, started, None).await?;
            }
        }
        *segment.spent.lock().unwrap_or_else(|p| p.into_inner()) = replayed.spent;
        *segment.approvals.lock().unwrap_or_else(|p| p.into_inner()) = replayed.approvals.clone();
        *segment.inputs.lock().unwrap_or_else(|p| p.into_inner()) = replayed.inputs.clone();
        Some(())
    }

    /// The rounds of the run: the tool calls its last stored turn left unanswered, then
    /// model rounds until a final answer, a stop, or the agent's last round.
    async fn rounds(&self, segment: &Segment<'_>, mut replayed: Replayed) -> Outcome {
        if let Some(ended) = self.ended_in_log(segment, &mut replayed).await {
            return ended;
        }
        let agent = segment.agent;
        let Replayed {
            mut messages,
            round: last_round,
            unanswered,
            ..
        } = replayed;
        // A resumed run first finishes the tool calls its last model turn asked for.
        for call in &unanswered {
            let signal = match self.boundary_signal(segment).await {
                Ok(signal) => signal,
                Err(stop) => return stop,
            };
            match self.tool_step(segment, last_round, call, signal).await {
                Ok(result) => messages.push(result),
                Err(outcome) => return outcome,
            }
        }
        for round in last_round + 1..=agent.max_rounds {
            if let Some(outcome) = self.round(segment, round, &mut messages).await {
                return outcome;
            }
        }
        // R5: the read after the last round's last tool step, which no model call's signal
        // made.
        if let Some(stop) = self.boundary(segment).await {
            return stop;
        }
        self.fail(
            segment,
            format!("no final answer within {} rounds", agent.max_rounds),
            false,
        )
        .await
    }

    /// One round: the model step, then each tool call it asked for, with a boundary
    /// between steps. `Some` is the segment's outcome when the round ends it.
    async fn round(
        &self,
        segment: &Segment<'_>,
        round: u32,
        messages: &mut Vec<Message>,
    ) -> Option<Outcome> {
        self.tokens_left(segment);
        // R5, R6: the model call's signal is taken at the boundary before it, so the
        // fresh read that answers its first question is also the boundary's read of the
        // row: one query, not two. It lives through the round, tool steps included.
        let signal = match self.boundary_signal(segment).await {
            Ok(signal) => signal,
            Err(stop) => return Some(stop),
        };
        let (turn, _signal) = match self.model_step(segment, round, messages, signal).await {
            Ok(step) => step,
            Err(outcome) => return Some(outcome),
        };
        // A final answer ended the segment in the model step: this turn asks for tools.
        messages.push(Message::Assistant {
            text: turn.text.clone(),
            tool_calls: turn.tool_calls.clone(),
        });
        for call in &turn.tool_calls {
            // R5: the read after the step before (the model's answer or a tool step) is
            // this call's signal read, taken at the boundary (a stop there leaves that
            // step stored and settles nothing).
            let signal = match self.boundary_signal(segment).await {
                Ok(signal) => signal,
                Err(stop) => return Some(stop),
            };
            match self.tool_step(segment, round, call, signal).await {
                Ok(result) => messages.push(result),
                Err(outcome) => return Some(outcome),
            }
        }
        // R5: the row is read after the round's last tool step by the next round's signal
        // (or, after the last round, before the run fails).
        self.boundary_probing(segment, false).await
    }

    /// What the log decides before any call: an uncertain write waits for a person, a cut
    /// last turn fails the run, a stored final answer completes it. `None`: go on.
    async fn ended_in_log(
        &self,
        segment: &Segment<'_>,
        replayed: &mut Replayed,
    ) -> Option<Outcome> {
        if let Some(uncertain) = replayed.uncertain_write.take() {
            // R11: a non-idempotent write whose effect is unknown is never re-sent. R12: a
            // person says what it did; a run stopped before it asked asks now.
            if uncertain.asked {
                return Some(
                    self.settle(segment, RunState::Failed, uncertain.reason)
                        .await,
                );
            }
            let question = Question::said(uncertain.reason.clone());
            let kind = DecisionKind::EffectUncertain;
            return Some(
                self.ask(segment, kind, uncertain.round, &uncertain.call, question)
                    .await,
            );
        }
        if let Some(reason) = replayed.unusable_turn.take() {
            // L4: the stored last turn was cut (or empty): it fails the run on resume too,
            // with the budget as the reason when the budget cut it (R13).
            self.tokens_left(segment);
            let reason = segment
                .budget
                .reason()
                .filter(|_| reason.starts_with(MODEL_TRUNCATED))
                .unwrap_or(reason);
            return Some(self.settle(segment, RunState::Failed, reason).await);
        }
        if let Some(text) = replayed.final_answer.take() {
            // R8: the final answer is stored; the model is not asked again.
            return Some(self.settle(segment, RunState::Completed, text).await);
        }
        None
    }
}
