//! G1: an approval a gateway call waits for within the call. The client is waiting on its
//! request, so the run does not park: the decision is asked `in_call` (the run stays
//! running, its lease renewed), the client hears progress while a person decides, and the
//! answer (or the approval's expiry, or a cancel) lets the call go or refuses it.

use std::time::Duration;

use runwarden_mcp::{Notice, NoticeSink};
use runwarden_models::ToolCallRequest;
use runwarden_vault::CancellationSignal as _;
use serde_json::Value;

use super::decision_step::{Approval, Question, decision_for};
use super::{Executor, Segment, TaskGuard};
use crate::agent::BoundTool;
use crate::decision::{
    Answer, Decision, DecisionAnswer, DecisionAsk, DecisionKind, DecisionStatus, EXPIRED_REASON,
    SYSTEM_ACTOR,
};
use crate::elicitor::answered;
use crate::events::{DecisionAsked, EventBody};
use crate::signal::RunSignal;
use crate::state::Outcome;
use crate::time::now_ms;

/// How often a waiting client hears that the call still waits.
const WAITING_NOTICE: Duration = Duration::from_secs(10);

impl Executor {
    /// Asks an operator about a gateway call and waits for the answer within the call.
    /// `Err` is the run's end (a cancel, a lost lease); `signal` also carries the client's
    /// own cancel of this call, which withdraws the question.
    pub(super) async fn approval_in_call(
        &self,
        segment: &Segment<'_>,
        (round, call, tool): (u32, &ToolCallRequest, &BoundTool),
        message: Option<String>,
        notices: Option<&NoticeSink>,
        signal: &RunSignal,
    ) -> Result<Approval, Outcome> {
        let now = now_ms();
        let question = Question {
            message,
            ..Question::default()
        };
        let mut decision =
            decision_for(segment, DecisionKind::Approval, round, call, question, now);
        decision.in_call = true;
        let (id, expires_ms) = (decision.id.clone(), decision.expires_ms);
        // Subscribed before the ask, so an answer that comes at once is not missed.
        let mut feed = self.store.change_feed().subscribe();
        if let Err(refused) = self.ask_in_call(segment, round, call, decision).await {
            let text = refused?;
            return self.denied(segment, round, call, tool, text).await;
        }
        let _ticker = notices.map(|sink| waiting_notices(sink.clone(), &id));
        let wait = answered(
            &*self.store,
            &segment.run.id,
            &id,
            &mut feed,
            deadline(expires_ms),
        );
        let answer = tokio::select! {
            answer = wait => answer,
            () = stopped(signal) => None,
        };
        let decision = match answer {
            Some(decision) => decision,
            None if signal.is_cancelled() => {
                if let Some(stop) = self.must_stop(segment).await {
                    return Err(stop);
                }
                let text = "cancelled by the client while it waited for an operator's approval";
                self.withdraw(&id, Answer::Cancel, text).await;
                return self
                    .denied(segment, round, call, tool, text.to_string())
                    .await;
            }
            None => match self.withdraw(&id, Answer::Expired, EXPIRED_REASON).await {
                Some(decision) => decision,
                None => {
                    let text = "denied: the approval expired before anyone answered";
                    return self
                        .denied(segment, round, call, tool, text.to_string())
                        .await;
                }
            },
        };
        self.read_answer(segment, (round, call, tool), decision)
            .await
    }

    /// Stores the in-call decision and its `decision_asked` step. `Err(Ok(text))`: it
    /// could not be stored, and the call is refused with `text`; `Err(Err(outcome))`: the
    /// run is no longer this segment's.
    async fn ask_in_call(
        &self,
        segment: &Segment<'_>,
        round: u32,
        call: &ToolCallRequest,
        decision: Decision,
    ) -> Result<(), Result<String, Outcome>> {
        let body = EventBody::DecisionAsked(DecisionAsked {
            decision_id: decision.id.clone(),
            kind: DecisionKind::Approval,
            round,
            call_id: call.id.clone(),
            tool: call.name.clone(),
            arguments_hash: decision.arguments_hash.clone(),
            expires_ms: decision.expires_ms,
            reissue: false,
        });
        let ask = DecisionAsk {
            decision,
            owner: self.config.owner.clone(),
            epoch: segment.run.claim_epoch,
            event_payload: body.to_payload(),
        };
        match self.store.decision_ask(ask).await {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Err(self
                .must_stop(segment)
                .await
                .unwrap_or(Outcome::LeaseLost))),
            Err(error) => Err(Ok(format!(
                "refused: the operator's approval could not be asked ({error}); nothing was sent"
            ))),
        }
    }

    /// What an answered (or expired) decision lets the call do.
    async fn read_answer(
        &self,
        segment: &Segment<'_>,
        (round, call, tool): (u32, &ToolCallRequest, &BoundTool),
        decision: Decision,
    ) -> Result<Approval, Outcome> {
        let text = match (decision.status, decision.answer) {
            (DecisionStatus::Answered, Some(Answer::Approve)) => {
                let edited = match decision.answer_arguments {
                    Some(Value::Object(edited)) => Some(edited),
                    _ => None,
                };
                return Ok(Approval::Given(edited));
            }
            (DecisionStatus::Dropped, _) => {
                return Err(self.must_stop(segment).await.unwrap_or(Outcome::Cancelled));
            }
            (DecisionStatus::Expired, _) => {
                "denied: the approval expired before anyone answered".to_string()
            }
            (_, Some(Answer::Cancel)) => "denied: an operator cancelled the call".to_string(),
            _ => format!(
                "denied by an operator: {}",
                decision.reason.as_deref().unwrap_or("deny")
            ),
        };
        self.denied(segment, round, call, tool, text).await
    }

    /// Answers a pending decision for the runtime (its expiry, or the client's cancel);
    /// an operator's answer that won the race is returned instead.
    async fn withdraw(&self, id: &str, answer: Answer, reason: &str) -> Option<Decision> {
        let expiry = DecisionAnswer {
            id: id.to_string(),
            answer,
            reason: Some(reason.to_string()),
            arguments: None,
            content: None,
            actor: SYSTEM_ACTOR.to_string(),
            now_ms: now_ms(),
        };
        match self.store.decision_answer(expiry).await {
            Ok(crate::decision::AnswerOutcome::Refused(d, _))
                if d.status == DecisionStatus::Answered =>
            {
                Some(d)
            }
            _ => None,
        }
    }
}

/// The instant `expires_ms` (Unix milliseconds) falls at, on tokio's clock.
fn deadline(expires_ms: i64) -> tokio::time::Instant {
    let left = u64::try_from(expires_ms.saturating_sub(now_ms())).unwrap_or(0);
    tokio::time::Instant::now() + Duration::from_millis(left)
}

/// Resolves once the signal says stop (the run's cancel, a lost lease, the client's cancel).
async fn stopped(signal: &RunSignal) {
    while !signal.is_cancelled() {
        signal.woken().await;
    }
}

/// Tells the client, now and every [`WAITING_NOTICE`], that its call waits for a person.
fn waiting_notices(sink: NoticeSink, decision: &str) -> TaskGuard {
    let message = format!("waiting for an operator's approval (decision {decision})");
    TaskGuard(tokio::spawn(async move {
        let mut beat = 0u32;
        loop {
            beat += 1;
            sink.send(Notice::progress(
                f64::from(beat),
                None,
                Some(message.clone()),
            ));
            tokio::time::sleep(WAITING_NOTICE).await;
        }
    }))
}
