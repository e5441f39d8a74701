//! An operator's answer to a decision: checked against the decision (the kind takes it, a
//! denial has a reason, edited arguments and content fit their schemas), then applied with
//! the store's one guarded update; and the expiry of approvals whose time is up.

use runwarden_base::StoreError;
use serde_json::Value;

use crate::decision::{
    Answer, AnswerOutcome, AnswerRefusal, Decision, DecisionAnswer, DecisionFilter, EXPIRED_REASON,
    SYSTEM_ACTOR, refusal_message,
};
use crate::schema_check;
use crate::store::RunStore;

/// An operator's answer as asked for (the API's body, the CLI's flags).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AnswerRequest {
    /// The answer; [`Answer::Expired`] is the runtime's alone.
    pub answer: Option<Answer>,
    /// Why (required to deny).
    pub reason: Option<String>,
    /// Approval: edited arguments, a JSON object that fits the tool's schema.
    pub arguments: Option<Value>,
    /// Input: the content, a JSON object that fits the requested schema.
    pub content: Option<Value>,
}

/// Why an answer was not taken. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// No decision has that id.
    #[error("no decision {0}: list them with `runwarden decisions list`")]
    NotFound(String),
    /// The answer does not fit the decision's kind.
    #[error("decision {id} is of kind {kind} and takes {allowed}, not {answer}")]
    WrongAnswer {
        /// The decision.
        id: String,
        /// Its kind.
        kind: &'static str,
        /// What was asked for.
        answer: String,
        /// What it takes.
        allowed: String,
    },
    /// The request is incomplete or malformed.
    #[error("{0}")]
    Invalid(String),
    /// A guard refused it: answered already, expired, the run cancelled or finished.
    #[error("{message}")]
    Refused {
        /// Why.
        refusal: AnswerRefusal,
        /// The sentence for people.
        message: String,
    },
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// R12: checks an operator's answer against the decision (the kind takes it, a denial has
/// a reason, edited arguments fit `tool_schema`, content fits the requested schema), then
/// applies it with the store's one guarded update. `tool_schema` is the input schema of
/// the decision's tool, for an approval with edited arguments.
pub async fn decide(
    store: &dyn RunStore,
    decision: &Decision,
    request: AnswerRequest,
    actor: &str,
    tool_schema: Option<&Value>,
    now_ms: i64,
) -> Result<Decision, DecideError> {
    let params = checked(decision, request, actor, tool_schema, now_ms)?;
    match store.decision_answer(params).await? {
        AnswerOutcome::Answered(decision) => Ok(decision),
        AnswerOutcome::NotFound => Err(DecideError::NotFound(decision.id.clone())),
        AnswerOutcome::Refused(found, refusal) => Err(DecideError::Refused {
            refusal,
            message: refusal_message(&found, refusal),
        }),
    }
}

/// The answer to store, once the request is known to fit the decision.
fn checked(
    decision: &Decision,
    request: AnswerRequest,
    actor: &str,
    tool_schema: Option<&Value>,
    now_ms: i64,
) -> Result<DecisionAnswer, DecideError> {
    let answer = allowed_answer(decision, request.answer)?;
    let reason = request
        .reason
        .map(|r| r.trim().to_string())
        .filter(|r| !r.is_empty());
    if answer == Answer::Deny && reason.is_none() {
        return Err(DecideError::Invalid(
            "a denial needs a reason: the model reads \"denied by an operator: REASON\"".into(),
        ));
    }
    check_arguments(decision, answer, request.arguments.as_ref(), tool_schema)?;
    check_content(decision, answer, request.content.as_ref())?;
    Ok(DecisionAnswer {
        id: decision.id.clone(),
        answer,
        reason,
        arguments: request.arguments,
        content: request.content,
        actor: actor.to_string(),
        now_ms,
    })
}

/// The answer asked for, when the decision's kind takes it.
fn allowed_answer(decision: &Decision, answer: Option<Answer>) -> Result<Answer, DecideError> {
    let allowed = decision.kind.answers();
    let names = || {
        allowed
            .iter()
            .map(|a| a.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(answer) = answer else {
        return Err(DecideError::Invalid(format!(
            "say which answer: decision {} ({}) takes {}",
            decision.id,
            decision.kind.as_str(),
            names()
        )));
    };
    if !allowed.contains(&answer) {
        return Err(DecideError::WrongAnswer {
            id: decision.id.clone(),
            kind: decision.kind.as_str(),
            answer: answer.as_str().to_string(),
            allowed: names(),
        });
    }
    Ok(answer)
}

/// Edited arguments go only with an approval, as a JSON object that fits the tool's schema.
fn check_arguments(
    decision: &Decision,
    answer: Answer,
    arguments: Option<&Value>,
    tool_schema: Option<&Value>,
) -> Result<(), DecideError> {
    let Some(arguments) = arguments else {
        return Ok(());
    };
    if answer != Answer::Approve {
        return Err(DecideError::Invalid(
            "arguments go only with approve (an edited call)".into(),
        ));
    }
    if !arguments.is_object() {
        return Err(DecideError::Invalid(
            "the edited arguments must be a JSON object".into(),
        ));
    }
    if let Some(schema) = tool_schema {
        schema_check::check(schema, arguments).map_err(|why| {
            DecideError::Invalid(format!(
                "the edited arguments do not fit the schema of {}: {why}",
                decision.tool
            ))
        })?;
    }
    Ok(())
}

/// Content goes with an accept, and only with it: a JSON object that fits the server's
/// requested schema.
fn check_content(
    decision: &Decision,
    answer: Answer,
    content: Option<&Value>,
) -> Result<(), DecideError> {
    if content.is_some() && answer != Answer::Accept {
        return Err(DecideError::Invalid(
            "content goes only with accept (an answer to the server's question)".into(),
        ));
    }
    if answer != Answer::Accept {
        return Ok(());
    }
    let Some(content) = content else {
        return Err(DecideError::Invalid(
            "accept needs content: a JSON object that fits the server's requested schema".into(),
        ));
    };
    if !content.is_object() {
        return Err(DecideError::Invalid(
            "the content must be a JSON object".into(),
        ));
    }
    if let Some(schema) = &decision.requested_schema {
        schema_check::check(schema, content).map_err(|why| {
            DecideError::Invalid(format!(
                "the content does not fit the server's requested schema: {why}"
            ))
        })?;
    }
    Ok(())
}

/// R12: denies every approval whose time is up (answer `expired`, actor `runwarden`), so
/// the run goes back to the queue and the model reads "denied by an operator: expired";
/// an input that expired is declined by its call on its own and only recorded here.
/// Uncertain effects never expire. Returns how many expired.
pub async fn expire_due(store: &dyn RunStore, now_ms: i64) -> Result<usize, StoreError> {
    let due = store
        .decision_list(DecisionFilter {
            due_by_ms: Some(now_ms),
            limit: 100,
            ..DecisionFilter::default()
        })
        .await?;
    let mut expired = 0;
    for decision in due {
        let params = DecisionAnswer {
            id: decision.id,
            answer: Answer::Expired,
            reason: Some(EXPIRED_REASON.to_string()),
            arguments: None,
            content: None,
            actor: SYSTEM_ACTOR.to_string(),
            now_ms,
        };
        // Another node or an operator may have won: a refusal is no error here.
        if let AnswerOutcome::Answered(_) = store.decision_answer(params).await? {
            expired += 1;
        }
    }
    Ok(expired)
}
