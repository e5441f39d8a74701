//! What a stored row must hold to be read back: a run's or a decision's columns as a
//! store read them, checked and turned into the runtime's values. A value this build
//! cannot have written (an unknown status, a count out of range, text that is not JSON)
//! is damage, reported as the problem in words, never a panic; each store adds what to do.

use serde_json::Value;

use crate::decision::{Answer, Decision, DecisionKind, DecisionStatus, Reissue};
use crate::state::RunState;
use crate::store::Run;

/// A run's columns as stored, before they are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRun {
    /// `id`.
    pub id: String,
    /// `agent`.
    pub agent: String,
    /// `status`, as text.
    pub status: String,
    /// `termination_reason`.
    pub termination_reason: Option<String>,
    /// `request`, as JSON text.
    pub request: Option<String>,
    /// `claimed_by`.
    pub claimed_by: Option<String>,
    /// `lease_expires_ms`.
    pub lease_expires_ms: Option<i64>,
    /// `pending_effect`.
    pub pending_effect: Option<String>,
    /// `requeue_count`.
    pub requeue_count: i64,
    /// `rounds`.
    pub rounds: i64,
    /// `correlation`.
    pub correlation: String,
    /// `created_ms`.
    pub created_ms: i64,
    /// `updated_ms`.
    pub updated_ms: i64,
    /// `claim_epoch`.
    pub claim_epoch: i64,
    /// `started_by`.
    pub started_by: Option<String>,
    /// `tags`, as a JSON array of strings.
    pub tags: String,
}

/// The status stored for run `id`; an unknown one is damage.
pub fn run_status(id: &str, text: &str) -> Result<RunState, String> {
    RunState::parse(text).ok_or_else(|| format!("run {id} has unknown status {text:?}"))
}

/// A run read back from its columns.
pub fn run(c: StoredRun) -> Result<Run, String> {
    let corrupt = |what: String| format!("run {} {what}", c.id);
    let status = run_status(&c.id, &c.status)?;
    let request = c
        .request
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(|e| corrupt(format!("has a stored request that is not JSON ({e})")))?;
    let tags: Vec<String> = serde_json::from_str(&c.tags).map_err(|e| {
        corrupt(format!(
            "has stored tags that are not a list of strings ({e})"
        ))
    })?;
    let count = |value: i64, what: &str| {
        u32::try_from(value).map_err(|_| corrupt(format!("has {what} {value}, out of range")))
    };
    Ok(Run {
        status,
        request,
        requeue_count: count(c.requeue_count, "a requeue count")?,
        rounds: count(c.rounds, "a round count")?,
        id: c.id,
        agent: c.agent,
        termination_reason: c.termination_reason,
        claimed_by: c.claimed_by,
        claim_epoch: c.claim_epoch,
        lease_expires_ms: c.lease_expires_ms,
        pending_effect: c.pending_effect,
        correlation: c.correlation,
        created_ms: c.created_ms,
        updated_ms: c.updated_ms,
        origin: crate::store::RunOrigin {
            started_by: c.started_by,
            tags,
        },
    })
}

/// A decision's columns as stored, before they are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDecision {
    /// `id`.
    pub id: String,
    /// `run_id`.
    pub run_id: String,
    /// `kind`, as text.
    pub kind: String,
    /// `round`.
    pub round: i64,
    /// `call_id`.
    pub call_id: String,
    /// `tool`.
    pub tool: String,
    /// `arguments`, as JSON text.
    pub arguments: String,
    /// `arguments_hash`.
    pub arguments_hash: String,
    /// `message`.
    pub message: Option<String>,
    /// `requested_schema`, as JSON text.
    pub requested_schema: Option<String>,
    /// `asked_ms`.
    pub asked_ms: i64,
    /// `expires_ms`.
    pub expires_ms: i64,
    /// `status`, as text.
    pub status: String,
    /// `answer`, as text.
    pub answer: Option<String>,
    /// `reason`.
    pub reason: Option<String>,
    /// `answer_arguments`, as JSON text.
    pub answer_arguments: Option<String>,
    /// `content`, as JSON text.
    pub content: Option<String>,
    /// `actor`.
    pub actor: Option<String>,
    /// `answered_ms`.
    pub answered_ms: Option<i64>,
    /// `input_key`.
    pub input_key: Option<String>,
    /// `request_state`.
    pub request_state: Option<String>,
    /// `in_call`.
    pub in_call: bool,
}

/// A decision read back from its columns.
pub fn decision(c: StoredDecision) -> Result<Decision, String> {
    let corrupt = |what: String| format!("decision {} {what}", c.id);
    let json = |text: &str, what: &str| -> Result<Value, String> {
        serde_json::from_str(text)
            .map_err(|e| corrupt(format!("has {what} that is not JSON ({e})")))
    };
    let optional_json =
        |text: &Option<String>, what: &str| text.as_deref().map(|t| json(t, what)).transpose();
    let kind = DecisionKind::parse(&c.kind)
        .ok_or_else(|| corrupt(format!("has unknown kind {:?}", c.kind)))?;
    let status = DecisionStatus::parse(&c.status)
        .ok_or_else(|| corrupt(format!("has unknown status {:?}", c.status)))?;
    let answer = c
        .answer
        .as_deref()
        .map(|a| Answer::parse(a).ok_or_else(|| corrupt(format!("has unknown answer {a:?}"))))
        .transpose()?;
    Ok(Decision {
        arguments: json(&c.arguments, "arguments")?,
        requested_schema: optional_json(&c.requested_schema, "a requested schema")?,
        answer_arguments: optional_json(&c.answer_arguments, "edited arguments")?,
        content: optional_json(&c.content, "content")?,
        round: u32::try_from(c.round).map_err(|_| corrupt(format!("has round {}", c.round)))?,
        kind,
        status,
        answer,
        id: c.id,
        run_id: c.run_id,
        call_id: c.call_id,
        tool: c.tool,
        arguments_hash: c.arguments_hash,
        message: c.message,
        asked_ms: c.asked_ms,
        expires_ms: c.expires_ms,
        reason: c.reason,
        actor: c.actor,
        answered_ms: c.answered_ms,
        reissue: c.input_key.map(|input_key| Reissue {
            input_key,
            request_state: c.request_state,
        }),
        in_call: c.in_call,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored_run() -> StoredRun {
        StoredRun {
            id: "r1".into(),
            agent: "a".into(),
            status: "queued".into(),
            termination_reason: None,
            request: Some("{\"input\":\"go\"}".into()),
            claimed_by: None,
            lease_expires_ms: None,
            pending_effect: None,
            requeue_count: 2,
            rounds: 3,
            correlation: "r1".into(),
            created_ms: 1,
            updated_ms: 2,
            claim_epoch: 0,
            started_by: Some("ci-bot".into()),
            tags: r#"["team:payments"]"#.into(),
        }
    }

    #[test]
    fn a_run_row_reads_back_whole() {
        let run = run(stored_run()).unwrap();
        assert_eq!(run.status, RunState::Queued);
        assert_eq!(run.request, Some(serde_json::json!({"input": "go"})));
        assert_eq!((run.requeue_count, run.rounds), (2, 3));
        assert_eq!(run.origin.started_by.as_deref(), Some("ci-bot"));
        assert_eq!(run.origin.tags, ["team:payments"]);
    }

    #[test]
    fn a_run_row_this_build_cannot_have_written_is_damage_named_in_words() {
        let unknown = StoredRun {
            status: "paused".into(),
            ..stored_run()
        };
        assert_eq!(
            run(unknown).unwrap_err(),
            "run r1 has unknown status \"paused\""
        );
        let negative = StoredRun {
            rounds: -1,
            ..stored_run()
        };
        assert!(
            run(negative)
                .unwrap_err()
                .contains("round count -1, out of range")
        );
        let not_json = StoredRun {
            request: Some("{".into()),
            ..stored_run()
        };
        assert!(run(not_json).unwrap_err().contains("not JSON"));
        let bad_tags = StoredRun {
            tags: "[1]".into(),
            ..stored_run()
        };
        assert!(
            run(bad_tags)
                .unwrap_err()
                .contains("tags that are not a list of strings")
        );
    }

    fn stored_decision() -> StoredDecision {
        StoredDecision {
            id: "d1".into(),
            run_id: "r1".into(),
            kind: "input".into(),
            round: 1,
            call_id: "c1".into(),
            tool: "t".into(),
            arguments: "{}".into(),
            arguments_hash: "h".into(),
            message: None,
            requested_schema: None,
            asked_ms: 1,
            expires_ms: 2,
            status: "answered".into(),
            answer: Some("accept".into()),
            reason: None,
            answer_arguments: None,
            content: Some("{\"ok\":true}".into()),
            actor: Some("op".into()),
            answered_ms: Some(2),
            input_key: Some("confirm".into()),
            request_state: None,
            in_call: false,
        }
    }

    #[test]
    fn a_decision_row_reads_back_with_its_reissue() {
        let d = decision(stored_decision()).unwrap();
        assert_eq!(d.kind, DecisionKind::Input);
        assert_eq!(d.answer, Some(Answer::Accept));
        assert_eq!(d.content, Some(serde_json::json!({"ok": true})));
        assert_eq!(d.reissue.map(|r| r.input_key).as_deref(), Some("confirm"));
    }

    #[test]
    fn a_decision_row_with_an_unknown_answer_is_damage() {
        let unknown = StoredDecision {
            answer: Some("maybe".into()),
            ..stored_decision()
        };
        assert_eq!(
            decision(unknown).unwrap_err(),
            "decision d1 has unknown answer \"maybe\""
        );
    }
}
