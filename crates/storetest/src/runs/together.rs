//! Appends sent side by side, which a store may commit together: each keeps its own
//! guard and its own answer.

use super::*;
use runwarden_runtime::store::{EarlierEvent, RunEnd};

/// Many runs append at once. A stale claim is refused alone; a recorded write clears its
/// own run's fence and raises its rounds; a final answer ends its own run with both of
/// its events; a cancelled run takes its boundary step and refuses its end; and every
/// run's sequences are 1..=N, each answered once and stored once (R1, R5, R7).
pub(super) async fn appends_side_by_side_keep_each_guard_and_each_answer(
    store: &Arc<dyn RunStore>,
) {
    const RUNS: usize = 8;
    const APPENDS: usize = 6;
    let s = &**store;
    for r in 0..RUNS {
        create(s, running(&format!("side-{r}"))).await;
    }
    create(s, running("side-fenced")).await;
    assert!(mark(s, "side-fenced", OWNER, T0 + 2 * LEASE).await);
    create(s, running("side-ending")).await;
    create(s, running("side-cancelled")).await;
    cancel(s, "side-cancelled", T0 + 2).await;

    let wave = wave(RUNS, APPENDS);
    let tasks: Vec<_> = wave
        .into_iter()
        .map(|(name, params)| {
            let store = Arc::clone(store);
            tokio::spawn(async move { (name, store.run_event_append(params).await) })
        })
        .collect();
    let mut answers = std::collections::BTreeMap::new();
    for task in tasks {
        let (name, answer) = task.await.expect("an appending task panicked");
        answers.insert(name, answer.expect("run_event_append"));
    }

    for r in 0..RUNS {
        let mut got: Vec<i64> = (0..APPENDS)
            .filter_map(|a| answers[&format!("side-{r}/{a}")])
            .collect();
        got.sort_unstable();
        let stale = if r == 0 { APPENDS.div_ceil(3) } else { 0 };
        let want: Vec<i64> = (1..=(APPENDS - stale) as i64).collect();
        assert_eq!(got, want, "side-{r}: each sequence answered once");
        assert_eq!(seqs(s, &format!("side-{r}")).await, want, "and stored once");
    }
    for a in (0..APPENDS).step_by(3) {
        assert_eq!(
            answers[&format!("side-0/{a}")],
            None,
            "a stale claim is refused"
        );
    }

    for r in 0..RUNS {
        let run = get(s, &format!("side-{r}")).await;
        assert_eq!((run.status, run.rounds), (RunState::Running, 0), "side-{r}");
    }
    the_others_kept_their_own_guards(s, &answers).await;
}

/// Every run's appends (run 0's every third with a stale claim epoch), then one append
/// each for a fenced run, a run that ends, and a cancelled run (its end and its boundary
/// step), each named.
fn wave(runs: usize, appends: usize) -> Vec<(String, EventAppend)> {
    let answered = |id: &str| EventAppend {
        end: Some(RunEnd {
            status: RunState::Completed,
            reason: "done".into(),
        }),
        before: Some(EarlierEvent {
            kind: "model_response".into(),
            payload: json!({"text": "done"}),
        }),
        ..event(id, OWNER, "run_completed")
    };
    let mut wave: Vec<(String, EventAppend)> = Vec::new();
    for a in 0..appends {
        for r in 0..runs {
            let mut append = event(&format!("side-{r}"), OWNER, "tool_executed");
            append.payload = json!({"n": a});
            if r == 0 && a % 3 == 0 {
                append.epoch = 7;
            }
            wave.push((format!("side-{r}/{a}"), append));
        }
    }
    let recorded = EventAppend {
        clear_fence: true,
        round: Some(3),
        ..event("side-fenced", OWNER, "tool_executed")
    };
    wave.push(("fenced".into(), recorded));
    wave.push(("ending".into(), answered("side-ending")));
    wave.push(("cancelled end".into(), answered("side-cancelled")));
    let boundary = event("side-cancelled", OWNER, "tool_executed");
    wave.push(("cancelled boundary".into(), boundary));

    wave
}

/// The fenced, ending and cancelled runs' answers and rows.
async fn the_others_kept_their_own_guards(
    s: &dyn RunStore,
    answers: &std::collections::BTreeMap<String, Option<i64>>,
) {
    assert_eq!(answers["fenced"], Some(1));
    let fenced = get(s, "side-fenced").await;
    assert_eq!(
        fenced.pending_effect, None,
        "its write step clears the fence"
    );
    assert_eq!(fenced.rounds, 3);

    assert_eq!(answers["ending"], Some(2), "the answer is the end's number");
    let events = s.run_events("side-ending", 0, 0).await.unwrap();
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["model_response", "run_completed"]);
    assert_eq!(events[0].payload, json!({"text": "done"}));
    assert_eq!(get(s, "side-ending").await.status, RunState::Completed);

    assert_eq!(
        answers["cancelled end"], None,
        "a cancel that won refuses the end"
    );
    assert_eq!(
        answers["cancelled boundary"],
        Some(1),
        "the boundary step is stored"
    );
    assert_eq!(seqs(s, "side-cancelled").await, [1]);
    assert_eq!(get(s, "side-cancelled").await.status, RunState::Cancelled);
}
