//! A run's events: sequences, paging, the owner guard, the boundary step after a cancel, the fence cleared by a recorded write, rounds.

use super::*;
use runwarden_runtime::store::{EarlierEvent, RunEnd};

pub(super) async fn event_sequences_are_strictly_increasing_and_never_duplicated(
    store: &Arc<dyn RunStore>,
) {
    const TASKS: i64 = 8;
    const APPENDS_PER_TASK: i64 = 10;
    let s = &**store;
    create(s, running("events-1")).await;
    create(s, running("events-2")).await;
    for expected in 1..=3 {
        assert_eq!(
            append(s, event("events-1", OWNER, "model_response")).await,
            Some(expected)
        );
    }
    assert_eq!(
        append(s, event("events-2", OWNER, "model_response")).await,
        Some(1),
        "each run counts its own events from 1"
    );

    create(s, running("events-concurrent")).await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = Arc::clone(store);
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..APPENDS_PER_TASK {
                let seq = append(&*store, event("events-concurrent", OWNER, "tool_executed")).await;
                got.push(seq.expect("the owner may append"));
            }
            got
        }));
    }
    let mut answered = Vec::new();
    for task in tasks {
        let got = task.await.expect("an appending task panicked");
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "one appender sees its sequences increase: {got:?}"
        );
        answered.extend(got);
    }
    answered.sort_unstable();
    let all: Vec<i64> = (1..=TASKS * APPENDS_PER_TASK).collect();
    assert_eq!(
        answered, all,
        "R1: concurrent appends answer 1..=N, each once"
    );
    assert_eq!(
        seqs(s, "events-concurrent").await,
        all,
        "R1: and store exactly those"
    );
    assert_eq!(seqs(s, "events-1").await, [1, 2, 3]);
}

pub(super) async fn events_round_trip_and_page_by_sequence(store: &dyn RunStore) {
    create(store, running("page-1")).await;
    let payloads: Vec<Value> = vec![
        json!({"text": "ünïcode \"quoted\"\nline", "n": 1}),
        json!([1, 2.5, null, true]),
        json!("a bare string"),
        json!({"nested": {"deep": [{"x": -1}]}}),
    ];
    for (n, payload) in payloads.iter().enumerate() {
        let params = EventAppend {
            payload: payload.clone(),
            kind: format!("kind_{n}"),
            now_ms: T0 + 10 + i64::try_from(n).unwrap(),
            ..event("page-1", OWNER, "")
        };
        append(store, params).await.expect("the owner may append");
    }
    let all = store.run_events("page-1", 0, 0).await.unwrap();
    assert_eq!(all.len(), payloads.len(), "limit 0 returns every event");
    for (n, (got, payload)) in all.iter().zip(&payloads).enumerate() {
        let n64 = i64::try_from(n).unwrap();
        assert_eq!(got.run_id, "page-1");
        assert_eq!(got.seq, n64 + 1);
        assert_eq!(got.kind, format!("kind_{n}"));
        assert_eq!(
            &got.payload, payload,
            "every payload comes back as it was stored"
        );
        assert_eq!(got.time_ms, T0 + 10 + n64);
    }
    let page: Vec<i64> = store
        .run_events("page-1", 1, 2)
        .await
        .unwrap()
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(
        page,
        [2, 3],
        "after_seq is exclusive, limit caps, oldest first"
    );
    assert!(store.run_events("page-1", 4, 0).await.unwrap().is_empty());
}

pub(super) async fn an_event_from_a_lost_owner_is_refused_and_not_stored(store: &dyn RunStore) {
    create(store, running("lost-1")).await;
    append(store, event("lost-1", OWNER, "model_response")).await;
    let before = get(store, "lost-1").await;
    let refused = EventAppend {
        round: Some(9),
        ..event("lost-1", OTHER, "tool_executed")
    };
    assert_eq!(
        append(store, refused).await,
        None,
        "R3: a segment without the lease is refused"
    );
    assert_eq!(
        seqs(store, "lost-1").await,
        [1],
        "a refused event is not stored"
    );
    assert_eq!(
        get(store, "lost-1").await,
        before,
        "a refused event changes nothing"
    );

    create(store, queued("lost-queued")).await;
    assert_eq!(
        append(store, event("lost-queued", OWNER, "model_response")).await,
        None
    );
    create(store, running("lost-settled")).await;
    settled(store, settle("lost-settled", OWNER, RunState::Completed)).await;
    assert_eq!(
        append(store, event("lost-settled", OWNER, "model_response")).await,
        None
    );
    assert!(seqs(store, "lost-settled").await.is_empty());
    assert_eq!(
        append(store, event("no-such-run", OWNER, "model_response")).await,
        None
    );
}

pub(super) async fn the_owner_can_record_its_boundary_step_after_a_cancel(store: &dyn RunStore) {
    create(store, running("boundary-1")).await;
    append(store, event("boundary-1", OWNER, "model_response")).await;
    cancel(store, "boundary-1", T0 + 2).await;
    assert_eq!(
        append(store, event("boundary-1", OWNER, "tool_executed")).await,
        Some(2),
        "R5: the owner persists the boundary step of a cancelled run"
    );
    assert_eq!(
        append(store, event("boundary-1", OTHER, "tool_executed")).await,
        None,
        "but nobody else may"
    );
    assert_eq!(get(store, "boundary-1").await.status, RunState::Cancelled);
}

pub(super) async fn recording_a_write_step_clears_the_fence_but_not_on_a_cancelled_run(
    store: &dyn RunStore,
) {
    create(store, running("write-1")).await;
    assert!(mark(store, "write-1", OWNER, T0 + 2 * LEASE).await);
    append(store, event("write-1", OWNER, "model_response")).await;
    assert_eq!(
        get(store, "write-1").await.pending_effect.as_deref(),
        Some(WRITE),
        "an event recorded without clear_fence keeps the mark"
    );
    let lost = EventAppend {
        clear_fence: true,
        ..event("write-1", OTHER, "tool_executed")
    };
    assert_eq!(append(store, lost).await, None);
    assert_eq!(
        get(store, "write-1").await.pending_effect.as_deref(),
        Some(WRITE),
        "a refused append clears nothing"
    );
    let recorded = EventAppend {
        clear_fence: true,
        ..event("write-1", OWNER, "tool_executed")
    };
    assert_eq!(append(store, recorded).await, Some(2));
    assert_eq!(
        get(store, "write-1").await.pending_effect,
        None,
        "R7: recording the write step clears the fence"
    );

    create(store, running("write-cancelled")).await;
    assert!(mark(store, "write-cancelled", OWNER, T0 + 2 * LEASE).await);
    cancel(store, "write-cancelled", T0 + 3).await;
    let boundary = EventAppend {
        clear_fence: true,
        ..event("write-cancelled", OWNER, "tool_executed")
    };
    assert_eq!(
        append(store, boundary).await,
        Some(1),
        "the boundary step is recorded"
    );
    assert_eq!(
        get(store, "write-cancelled")
            .await
            .pending_effect
            .as_deref(),
        Some(WRITE),
        "R7: a cancelled mid-write run keeps its mark"
    );
}

pub(super) async fn rounds_only_grow(store: &dyn RunStore) {
    create(store, running("rounds-1")).await;
    for (round, expected) in [(Some(3), 3), (Some(1), 3), (None, 3), (Some(5), 5)] {
        let params = EventAppend {
            round,
            ..event("rounds-1", OWNER, "model_response")
        };
        append(store, params).await.expect("the owner may append");
        assert_eq!(
            get(store, "rounds-1").await.rounds,
            expected,
            "after round {round:?}"
        );
    }
}

/// A final event appended with the run's end moves it to completed or failed only: any
/// other status is refused, and nothing is stored (a cancel goes through `run_cancel`).
pub(super) async fn a_final_event_ends_a_run_only_as_completed_or_failed(store: &dyn RunStore) {
    create(store, running("end-only-final")).await;
    for status in [
        RunState::Queued,
        RunState::Running,
        RunState::WaitingForApproval,
        RunState::Cancelled,
    ] {
        let params = EventAppend {
            end: Some(RunEnd {
                status,
                reason: "ended".into(),
            }),
            ..event("end-only-final", OWNER, "run_completed")
        };
        let error = store
            .run_event_append(params)
            .await
            .expect_err("a final event that ends a run as neither completed nor failed");
        assert!(error.to_string().contains("run_cancel"), "{error}");
    }
    let run = get(store, "end-only-final").await;
    assert_eq!(
        run.status,
        RunState::Running,
        "the refused ends changed nothing"
    );
    assert!(seqs(store, "end-only-final").await.is_empty());
}

/// A final answer's step and the run's end in one append: both stored, in order, with the
/// run ended; or, when the guard refuses it (a cancel won the row), neither. A final event
/// is never the one before.
pub(super) async fn an_answer_and_the_runs_end_are_stored_together_or_not_at_all(
    store: &dyn RunStore,
) {
    let answered = |id: &str, before: &str| EventAppend {
        end: Some(RunEnd {
            status: RunState::Completed,
            reason: "done".into(),
        }),
        before: Some(EarlierEvent {
            kind: before.into(),
            payload: json!({"text": "done"}),
        }),
        ..event(id, OWNER, "run_completed")
    };
    create(store, running("answer-1")).await;
    assert_eq!(
        append(store, event("answer-1", OWNER, "tool_executed")).await,
        Some(1)
    );
    assert_eq!(
        append(store, answered("answer-1", "model_response")).await,
        Some(3),
        "the answer is the end's sequence number"
    );
    let events = store.run_events("answer-1", 0, 0).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["tool_executed", "model_response", "run_completed"]);
    assert_eq!(events[1].payload, json!({"text": "done"}));
    assert_eq!(get(store, "answer-1").await.status, RunState::Completed);

    create(store, running("answer-cancelled")).await;
    cancel(store, "answer-cancelled", T0 + 2).await;
    assert_eq!(
        append(store, answered("answer-cancelled", "model_response")).await,
        None
    );
    assert!(
        seqs(store, "answer-cancelled").await.is_empty(),
        "nothing of it"
    );

    create(store, running("answer-final-first")).await;
    let error = store
        .run_event_append(answered("answer-final-first", "run_failed"))
        .await
        .expect_err("a final event before another");
    assert!(
        error.to_string().contains("run_failed is a final event"),
        "{error}"
    );
    assert!(seqs(store, "answer-final-first").await.is_empty());
    assert_eq!(
        get(store, "answer-final-first").await.status,
        RunState::Running
    );
}
