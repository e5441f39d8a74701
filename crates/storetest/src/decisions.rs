//! The decision conformance checks (R12): asking parks the run (no lease, its request
//! and fence kept), an answer is one guarded update that queues the run again, two answers
//! racing leave exactly one, a cancel wins over a waiting decision, an answer on a
//! cancelled or finished run is refused, and expiry.
//!
//! Each check retires the runs it leaves behind (a cancel), so a claim in a later check
//! only finds its own run.

use std::sync::Arc;

use runwarden_runtime::RunState;
use runwarden_runtime::decision::{
    Answer, AnswerOutcome, AnswerRefusal, Decision, DecisionAnswer, DecisionAsk, DecisionFilter,
    DecisionKind, DecisionStatus, Reissue, arguments_hash,
};
use runwarden_runtime::queue::{Claim, QueueStore};
use runwarden_runtime::store::{FenceMark, NewRunStatus, RunCreate, RunSettle, SettleAnswer};
use serde_json::{Value, json};

const OWNER: &str = "worker-a";
const OTHER: &str = "worker-b";
const T0: i64 = 1_700_000_000_000;
const LEASE: i64 = 30_000;
/// An approval's lifetime in these checks.
const EXPIRY: i64 = 60_000;

/// Runs every check against `store`, which must be fresh and empty. Panics on the first
/// property that does not hold.
pub async fn exercise_decision_store(store: Arc<dyn QueueStore>) {
    let s = &*store;
    asking_an_approval_parks_the_run_without_a_lease_and_keeps_its_request(s).await;
    a_segment_that_lost_the_run_cannot_ask(s).await;
    an_answer_queues_the_run_again_and_is_in_its_log(s).await;
    two_answers_racing_leave_exactly_one(&store).await;
    a_cancel_while_waiting_drops_the_decision_and_refuses_the_answer(s).await;
    an_operator_answer_after_the_expiry_is_refused_and_the_expiry_denies(s).await;
    an_uncertain_write_keeps_its_fence_until_answered_and_a_cancel_answer_cancels(s).await;
    an_input_leaves_the_run_running_and_is_refused_once_the_run_finished(s).await;
    an_approval_asked_in_call_leaves_the_run_running_and_its_answer_reaches_the_call(s).await;
    an_input_required_parks_the_run_clears_its_fence_and_keeps_the_request_state_exactly(s).await;
    the_list_filters_by_run_and_status(s).await;
}

fn arguments() -> Value {
    json!({"title": "printer on fire", "priority": 1})
}

async fn running_run(store: &dyn QueueStore, id: &str) {
    store
        .run_create(RunCreate {
            id: id.into(),
            agent: "helpdesk".into(),
            correlation: id.into(),
            request: Some(json!({"prompt": "file a ticket"})),
            status: NewRunStatus::Running {
                owner: OWNER.into(),
                lease_until_ms: T0 + LEASE,
            },
            now_ms: T0,
            origin: Default::default(),
        })
        .await
        .expect("run_create");
}

fn decision(id: &str, run_id: &str, kind: DecisionKind) -> Decision {
    Decision {
        id: id.into(),
        run_id: run_id.into(),
        kind,
        round: 1,
        call_id: format!("call-{id}"),
        tool: "tickets__create".into(),
        arguments: arguments(),
        arguments_hash: arguments_hash(&arguments()),
        message: None,
        requested_schema: None,
        asked_ms: T0 + 10,
        expires_ms: T0 + EXPIRY,
        status: DecisionStatus::Pending,
        answer: None,
        reason: None,
        answer_arguments: None,
        content: None,
        actor: None,
        answered_ms: None,
        reissue: None,
        in_call: false,
    }
}

async fn ask(store: &dyn QueueStore, d: Decision, owner: &str) -> Option<i64> {
    let payload = json!({"decision_id": d.id, "kind": d.kind.as_str()});
    let epoch = crate::epoch_of(store, &d.run_id).await;
    store
        .decision_ask(DecisionAsk {
            decision: d,
            owner: owner.into(),
            epoch,
            event_payload: payload,
        })
        .await
        .expect("decision_ask")
}

fn answer(id: &str, answer: Answer, now_ms: i64) -> DecisionAnswer {
    DecisionAnswer {
        id: id.into(),
        answer,
        reason: None,
        arguments: None,
        content: None,
        actor: "cli".into(),
        now_ms,
    }
}

async fn answered(store: &dyn QueueStore, params: DecisionAnswer) -> AnswerOutcome {
    store
        .decision_answer(params)
        .await
        .expect("decision_answer")
}

async fn status(store: &dyn QueueStore, id: &str) -> RunState {
    store
        .run_get(id)
        .await
        .expect("run_get")
        .expect("run")
        .status
}

async fn kinds(store: &dyn QueueStore, id: &str) -> Vec<String> {
    store
        .run_events(id, 0, 0)
        .await
        .expect("run_events")
        .into_iter()
        .map(|e| e.kind)
        .collect()
}

async fn retire(store: &dyn QueueStore, id: &str) {
    store.run_cancel(id, T0 + 1).await.expect("run_cancel");
}

async fn asking_an_approval_parks_the_run_without_a_lease_and_keeps_its_request(
    store: &dyn QueueStore,
) {
    running_run(store, "dr-park").await;
    let seq = ask(
        store,
        decision("d-park", "dr-park", DecisionKind::Approval),
        OWNER,
    )
    .await;
    assert_eq!(seq, Some(1), "the ask appends decision_asked to the log");
    let run = store.run_get("dr-park").await.unwrap().unwrap();
    assert_eq!(run.status, RunState::WaitingForApproval);
    assert_eq!(
        run.lease_expires_ms, None,
        "R12: a parked run holds no lease"
    );
    assert!(
        run.request.is_some(),
        "the request stays: a worker resumes the run"
    );
    assert_eq!(kinds(store, "dr-park").await, ["decision_asked"]);
    let stored = store.decision_get("d-park").await.unwrap().unwrap();
    assert_eq!(
        stored,
        decision("d-park", "dr-park", DecisionKind::Approval),
        "a decision reads back as asked"
    );
    let claim = Claim {
        owner: OTHER.into(),
        lease_until_ms: T0 + 100 + LEASE,
        now_ms: T0 + 100,
        agents: None,
        start: false,
    };
    assert!(
        store.run_claim(claim).await.unwrap().is_none(),
        "a waiting run is not claimable"
    );
    retire(store, "dr-park").await;
}

async fn a_segment_that_lost_the_run_cannot_ask(store: &dyn QueueStore) {
    running_run(store, "dr-lost").await;
    let seq = ask(
        store,
        decision("d-lost", "dr-lost", DecisionKind::Approval),
        OTHER,
    )
    .await;
    assert_eq!(seq, None, "only the lease holder asks");
    assert_eq!(status(store, "dr-lost").await, RunState::Running);
    assert!(store.decision_get("d-lost").await.unwrap().is_none());
    assert!(
        kinds(store, "dr-lost").await.is_empty(),
        "nothing was stored"
    );
    retire(store, "dr-lost").await;
}

async fn an_answer_queues_the_run_again_and_is_in_its_log(store: &dyn QueueStore) {
    running_run(store, "dr-ok").await;
    ask(
        store,
        decision("d-ok", "dr-ok", DecisionKind::Approval),
        OWNER,
    )
    .await;
    let mut params = answer("d-ok", Answer::Approve, T0 + 500);
    params.arguments = Some(json!({"title": "printer smoking", "priority": 1}));
    let AnswerOutcome::Answered(d) = answered(store, params).await else {
        panic!("a pending decision takes an answer");
    };
    assert_eq!(d.status, DecisionStatus::Answered);
    assert_eq!(d.answer, Some(Answer::Approve));
    assert_eq!(d.actor.as_deref(), Some("cli"));
    assert_eq!(d.answered_ms, Some(T0 + 500));
    assert_eq!(d.arguments, arguments(), "the model's arguments are kept");
    assert_eq!(
        d.answer_arguments,
        Some(json!({"title": "printer smoking", "priority": 1})),
        "and the operator's edit beside them"
    );
    assert_eq!(
        kinds(store, "dr-ok").await,
        ["decision_asked", "decision_answered"]
    );
    let events = store.run_events("dr-ok", 1, 0).await.unwrap();
    assert_eq!(events[0].payload["answer"], json!("approve"));
    assert_eq!(events[0].payload["actor"], json!("cli"));
    assert_eq!(status(store, "dr-ok").await, RunState::Queued);
    let claim = Claim {
        owner: OTHER.into(),
        lease_until_ms: T0 + 600 + LEASE,
        now_ms: T0 + 600,
        agents: None,
        start: false,
    };
    let claimed = store.run_claim(claim).await.unwrap();
    assert_eq!(
        claimed.map(|r| r.id),
        Some("dr-ok".to_string()),
        "any worker claims an answered run"
    );
    retire(store, "dr-ok").await;
}

async fn two_answers_racing_leave_exactly_one(store: &Arc<dyn QueueStore>) {
    running_run(&**store, "dr-race").await;
    ask(
        &**store,
        decision("d-race", "dr-race", DecisionKind::Approval),
        OWNER,
    )
    .await;
    let mut tasks = Vec::new();
    for i in 0..8 {
        let store = store.clone();
        let which = if i % 2 == 0 {
            Answer::Approve
        } else {
            Answer::Deny
        };
        tasks.push(tokio::spawn(async move {
            let mut params = answer("d-race", which, T0 + 700);
            params.actor = format!("operator-{i}");
            store
                .decision_answer(params)
                .await
                .expect("decision_answer")
        }));
    }
    let mut won = 0;
    for task in tasks {
        match task.await.expect("answer task") {
            AnswerOutcome::Answered(_) => won += 1,
            AnswerOutcome::Refused(_, refusal) => {
                assert_eq!(refusal, AnswerRefusal::AlreadyAnswered)
            }
            AnswerOutcome::NotFound => panic!("the decision exists"),
        }
    }
    assert_eq!(won, 1, "R12: exactly one answer wins");
    let answers = kinds(&**store, "dr-race")
        .await
        .into_iter()
        .filter(|k| k == "decision_answered")
        .count();
    assert_eq!(answers, 1, "and the log holds exactly one answer");
    retire(&**store, "dr-race").await;
}

async fn a_cancel_while_waiting_drops_the_decision_and_refuses_the_answer(store: &dyn QueueStore) {
    running_run(store, "dr-cancel").await;
    ask(
        store,
        decision("d-cancel", "dr-cancel", DecisionKind::Approval),
        OWNER,
    )
    .await;
    store.run_cancel("dr-cancel", T0 + 20).await.unwrap();
    let dropped = store.decision_get("d-cancel").await.unwrap().unwrap();
    assert_eq!(
        dropped.status,
        DecisionStatus::Dropped,
        "R4: the cancel wins and drops the decision"
    );
    let outcome = answered(store, answer("d-cancel", Answer::Approve, T0 + 30)).await;
    assert!(
        matches!(
            outcome,
            AnswerOutcome::Refused(_, AnswerRefusal::RunCancelled)
        ),
        "{outcome:?}"
    );
    assert_eq!(status(store, "dr-cancel").await, RunState::Cancelled);
    assert!(
        !kinds(store, "dr-cancel")
            .await
            .contains(&"decision_answered".to_string())
    );
    assert!(matches!(
        answered(store, answer("d-none", Answer::Approve, T0)).await,
        AnswerOutcome::NotFound
    ));
}

async fn an_operator_answer_after_the_expiry_is_refused_and_the_expiry_denies(
    store: &dyn QueueStore,
) {
    running_run(store, "dr-exp").await;
    ask(
        store,
        decision("d-exp", "dr-exp", DecisionKind::Approval),
        OWNER,
    )
    .await;
    let early = answered(store, answer("d-exp", Answer::Expired, T0 + EXPIRY - 1)).await;
    assert!(
        matches!(early, AnswerOutcome::Refused(_, AnswerRefusal::NotDue)),
        "an expiry waits for its time: {early:?}"
    );
    let due = store
        .decision_list(DecisionFilter {
            due_by_ms: Some(T0 + EXPIRY),
            ..DecisionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        due.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        ["d-exp"],
        "the sweep finds the due decision"
    );
    let late = answered(store, answer("d-exp", Answer::Approve, T0 + EXPIRY)).await;
    assert!(
        matches!(late, AnswerOutcome::Refused(_, AnswerRefusal::Expired)),
        "an operator is too late at the expiry: {late:?}"
    );
    let mut expiry = answer("d-exp", Answer::Expired, T0 + EXPIRY);
    expiry.actor = "runwarden".into();
    let AnswerOutcome::Answered(d) = answered(store, expiry).await else {
        panic!("a due decision expires");
    };
    assert_eq!(d.status, DecisionStatus::Expired);
    assert_eq!(d.reason.as_deref(), Some("expired"));
    assert_eq!(
        status(store, "dr-exp").await,
        RunState::Queued,
        "an expired approval queues the run to be denied"
    );
    retire(store, "dr-exp").await;
}

async fn an_uncertain_write_keeps_its_fence_until_answered_and_a_cancel_answer_cancels(
    store: &dyn QueueStore,
) {
    for (run, id, reply) in [
        ("dr-unc-a", "d-unc-a", Answer::Applied),
        ("dr-unc-c", "d-unc-c", Answer::Cancel),
    ] {
        running_run(store, run).await;
        let fenced = store
            .run_fence_mark(FenceMark {
                id: run.into(),
                owner: OWNER.into(),
                epoch: crate::epoch_of(store, &run).await,
                effect: "non_idempotent_write".into(),
                lease_until_ms: T0 + LEASE,
                now_ms: T0 + 5,
            })
            .await
            .unwrap();
        assert!(fenced);
        ask(
            store,
            decision(id, run, DecisionKind::EffectUncertain),
            OWNER,
        )
        .await;
        let parked = store.run_get(run).await.unwrap().unwrap();
        assert_eq!(parked.status, RunState::WaitingForApproval);
        assert_eq!(
            parked.pending_effect.as_deref(),
            Some("non_idempotent_write"),
            "R11: the fence stays while a person decides"
        );
        let AnswerOutcome::Answered(_) = answered(store, answer(id, reply, T0 + 40)).await else {
            panic!("the uncertain write takes {reply:?}");
        };
        let after = store.run_get(run).await.unwrap().unwrap();
        if reply == Answer::Cancel {
            assert_eq!(after.status, RunState::Cancelled, "cancel cancels the run");
            assert_eq!(after.request, None, "R4: its request is dropped");
            assert_eq!(
                after.termination_reason.as_deref(),
                Some(runwarden_runtime::rules::decisions::CANCEL_BY_ANSWER_REASON),
                "a cancel by answer says so, in the same words on every backend"
            );
            assert_eq!(
                after.pending_effect.as_deref(),
                Some("non_idempotent_write")
            );
            // R8: no segment holds a parked run, so the answer's transaction writes its
            // final event, after the answer, and only one.
            let log = store.run_events(run, 0, 0).await.unwrap();
            let kinds: Vec<&str> = log.iter().map(|e| e.kind.as_str()).collect();
            assert_eq!(
                kinds[kinds.len() - 2..],
                ["decision_answered", "run_stopped"],
                "{kinds:?}"
            );
            let reason = log[log.len() - 1].payload["reason"]
                .as_str()
                .unwrap_or_default();
            assert!(
                reason.contains("waited for an operator decision"),
                "{reason}"
            );
        } else {
            assert_eq!(after.status, RunState::Queued);
            assert_eq!(
                after.pending_effect, None,
                "a person's answer clears the fence"
            );
            retire(store, run).await;
        }
    }
}

/// M19, R12: an `input` decision asked by an `input_required` result parks the run (no
/// lease), clears the write fence (the server did none of the tool's work), and keeps the
/// question's key and the server's `requestState` byte for byte, for any worker to
/// re-issue the call once it is answered; a state the server did not send stays absent.
async fn an_input_required_parks_the_run_clears_its_fence_and_keeps_the_request_state_exactly(
    store: &dyn QueueStore,
) {
    let state = "{\"nonce\": \"ü-\u{1F600}\", \"n\": 1}  \n";
    for (run, id, request_state) in [
        ("dr-mrtr-s", "d-mrtr-s", Some(state.to_string())),
        ("dr-mrtr-n", "d-mrtr-n", None),
    ] {
        running_run(store, run).await;
        assert!(
            store
                .run_fence_mark(FenceMark {
                    id: run.into(),
                    owner: OWNER.into(),
                    epoch: crate::epoch_of(store, &run).await,
                    effect: "non_idempotent_write".into(),
                    lease_until_ms: T0 + LEASE,
                    now_ms: T0 + 5,
                })
                .await
                .unwrap()
        );
        let mut asked = decision(id, run, DecisionKind::Input);
        asked.requested_schema = Some(json!({"type": "object"}));
        asked.reissue = Some(Reissue {
            input_key: "confirm".into(),
            request_state: request_state.clone(),
        });
        assert!(ask(store, asked, OWNER).await.is_some());
        let parked = store.run_get(run).await.unwrap().unwrap();
        assert_eq!(parked.status, RunState::WaitingForApproval);
        assert_eq!(parked.lease_expires_ms, None, "a parked run holds no lease");
        assert_eq!(parked.pending_effect, None, "the park clears the fence");
        let read = store.decision_get(id).await.unwrap().unwrap();
        let reissue = read.reissue.expect("the re-issue is kept");
        assert_eq!(reissue.input_key, "confirm");
        assert_eq!(reissue.request_state, request_state);
        let mut accept = answer(id, Answer::Accept, T0 + 40);
        accept.content = Some(json!({"confirmed": true}));
        let AnswerOutcome::Answered(done) = answered(store, accept).await else {
            panic!("an input takes accept");
        };
        assert_eq!(done.reissue.and_then(|r| r.request_state), request_state);
        assert_eq!(
            status(store, run).await,
            RunState::Queued,
            "any worker resumes it"
        );
        retire(store, run).await;
    }
    let plain = store
        .decision_get("d-inp")
        .await
        .unwrap()
        .map(|d| d.reissue);
    assert!(
        matches!(plain, None | Some(None)),
        "other decisions have none"
    );
}

/// G2: a gateway call's approval is asked `in_call`: the run keeps running with its lease
/// and its request, the flag is kept, and the answer is taken while the run runs.
async fn an_approval_asked_in_call_leaves_the_run_running_and_its_answer_reaches_the_call(
    store: &dyn QueueStore,
) {
    running_run(store, "dr-ic").await;
    let mut asked = decision("d-ic", "dr-ic", DecisionKind::Approval);
    asked.in_call = true;
    ask(store, asked, OWNER).await;
    let run = store.run_get("dr-ic").await.unwrap().unwrap();
    assert_eq!(
        run.status,
        RunState::Running,
        "an approval in a call does not park"
    );
    assert_eq!(run.lease_expires_ms, Some(T0 + LEASE));
    let read = store.decision_get("d-ic").await.unwrap().unwrap();
    assert!(read.in_call, "the flag is kept");
    let AnswerOutcome::Answered(d) =
        answered(store, answer("d-ic", Answer::Approve, T0 + 50)).await
    else {
        panic!("an approval in a call takes an answer while the run runs");
    };
    assert_eq!(d.answer, Some(Answer::Approve));
    assert_eq!(
        status(store, "dr-ic").await,
        RunState::Running,
        "nothing requeues it"
    );
    assert!(
        kinds(store, "dr-ic")
            .await
            .contains(&"decision_answered".to_string())
    );
}

async fn an_input_leaves_the_run_running_and_is_refused_once_the_run_finished(
    store: &dyn QueueStore,
) {
    running_run(store, "dr-in").await;
    let mut first = decision("d-in-1", "dr-in", DecisionKind::Input);
    first.requested_schema = Some(json!({"type": "object"}));
    first.message = Some("which queue?".into());
    ask(store, first, OWNER).await;
    let run = store.run_get("dr-in").await.unwrap().unwrap();
    assert_eq!(run.status, RunState::Running, "an input keeps the lease");
    assert_eq!(run.lease_expires_ms, Some(T0 + LEASE));
    let mut accept = answer("d-in-1", Answer::Accept, T0 + 50);
    accept.content = Some(json!({"queue": "hardware"}));
    let AnswerOutcome::Answered(d) = answered(store, accept).await else {
        panic!("an input takes an answer while its call waits");
    };
    assert_eq!(d.content, Some(json!({"queue": "hardware"})));
    assert_eq!(status(store, "dr-in").await, RunState::Running);

    ask(
        store,
        decision("d-in-2", "dr-in", DecisionKind::Input),
        OWNER,
    )
    .await;
    let settled = store
        .run_settle(RunSettle {
            id: "dr-in".into(),
            owner: OWNER.into(),
            epoch: crate::epoch_of(store, &"dr-in").await,
            status: RunState::Completed,
            reason: "done".into(),
            now_ms: T0 + 60,
        })
        .await
        .unwrap();
    assert_eq!(settled, SettleAnswer::Settled);
    let late = answered(store, answer("d-in-2", Answer::Decline, T0 + 70)).await;
    assert!(
        matches!(
            late,
            AnswerOutcome::Refused(_, AnswerRefusal::RunNotWaiting)
        ),
        "an answer on a finished run is refused: {late:?}"
    );
}

async fn the_list_filters_by_run_and_status(store: &dyn QueueStore) {
    let of_run = store
        .decision_list(DecisionFilter {
            run_id: Some("dr-in".into()),
            ..DecisionFilter::default()
        })
        .await
        .unwrap();
    assert_eq!(
        of_run.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(),
        ["d-in-2", "d-in-1"],
        "newest first"
    );
    let answered = store
        .decision_list(DecisionFilter {
            status: Some(DecisionStatus::Answered),
            limit: 100,
            ..DecisionFilter::default()
        })
        .await
        .unwrap();
    assert!(
        answered
            .iter()
            .all(|d| d.status == DecisionStatus::Answered)
    );
    assert!(answered.iter().any(|d| d.id == "d-ok"));
    assert!(!answered.iter().any(|d| d.id == "d-cancel"));
}
