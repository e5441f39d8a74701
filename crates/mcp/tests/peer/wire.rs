//! The wire against the real peer (the official Python SDK, tests/peer/wire_tools.py) in
//! its three modes: sessions, the server's requests inside a call, standalone streams,
//! notices, resumption and progress. The same against scripted servers is in the fast
//! target's `wire`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use runwarden_mcp::{
    ElicitationAnswer, ElicitationFuture, ElicitationPolicy, ElicitationRequest, Elicitor,
    ElicitorHandle, McpCall, McpClient, Notice, NoticeSink, ProtocolPolicy, Reply, Request,
    ServerConfig, ToolOutcome, USER_AGENT,
};
use runwarden_testkit::Peer;
use runwarden_vault::Delivery;
use serde_json::{Value, json};

use crate::support::{Fixture, call, fixture};

const STATEFUL_SSE: &[&str] = &[];
const JSON_RESPONSE: &[&str] = &["--json-response"];
const STATELESS: &[&str] = &["--stateless"];

async fn start(flags: &'static [&'static str]) -> Peer {
    tokio::task::spawn_blocking(move || Peer::start(flags))
        .await
        .unwrap()
}

fn wire_stats(peer: &Peer) -> Value {
    serde_json::from_str(&peer.get("/wire-stats")).expect("the peer's wire stats are JSON")
}

fn client(f: &Fixture, peer: &Peer, configure: impl FnOnce(&mut ServerConfig)) -> McpClient {
    let mut server = ServerConfig::new("peer", peer.url()).with_protocol(ProtocolPolicy::Handshake);
    configure(&mut server);
    McpClient::new(server, f.egress.clone())
}

/// The milliseconds a peer tool reports as "... in N ms".
fn millis(text: &str) -> u64 {
    text.rsplit(" in ")
        .next()
        .and_then(|t| t.strip_suffix(" ms"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no duration in {text:?}"))
}

#[tokio::test]
async fn every_mode_reuses_one_session_ends_it_with_delete_and_names_runwarden() {
    for (flags, issues_session) in [
        (STATEFUL_SSE, true),
        (JSON_RESPONSE, true),
        (STATELESS, false),
    ] {
        let peer = start(flags).await;
        let f = fixture().await;
        let client = client(&f, &peer, |_| {});
        assert!(matches!(
            client.send_request(Request::ListTools, None).await,
            Ok(Reply::Tools(_))
        ));
        for _ in 0..3 {
            let echoed = client
                .call_tool(call("echo", json!({"text": "hi"})), None)
                .await;
            assert_eq!(echoed.result.text, "hi", "{flags:?}");
        }
        client.close().await.unwrap();
        let stats = wire_stats(&peer);
        // M13: one handshake for four operations, so one initialize POST.
        let posts = stats["methods"]["POST"].as_u64().unwrap();
        assert_eq!(
            posts,
            1 + 1 + 1 + 3,
            "initialize, initialized, list, 3 calls: {stats}"
        );
        assert_eq!(
            stats["deletes"].as_u64().unwrap(),
            u64::from(issues_session),
            "{flags:?}: {stats}"
        );
        if issues_session {
            assert_eq!(stats["delete_statuses"]["200"], 1, "{stats}");
        }
        // M17: every request named us.
        let agents = stats["user_agents"].as_object().unwrap();
        assert_eq!(agents.keys().collect::<Vec<_>>(), [USER_AGENT], "{stats}");
        assert!(USER_AGENT.starts_with("runwarden/"));
    }
}

#[tokio::test]
async fn a_ping_from_the_server_inside_a_call_is_answered_at_once() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let client = client(&f, &peer, |_| {});
    let outcome = client.call_tool(call("ping_client", json!({})), None).await;
    assert_eq!(
        outcome.result.outcome,
        ToolOutcome::Succeeded,
        "{}",
        outcome.result.text
    );
    assert!(
        outcome.result.text.starts_with("pong"),
        "{}",
        outcome.result.text
    );
    assert!(
        millis(&outcome.result.text) < 1_000,
        "{}",
        outcome.result.text
    );
    let legs: Vec<&str> = outcome.legs.iter().map(|l| l.method.as_str()).collect();
    assert!(legs.contains(&"ping answer"), "{legs:?}");
}

#[tokio::test]
async fn sampling_and_roots_are_refused_at_once_with_an_error() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let client = client(&f, &peer, |_| {});
    for tool in ["ask_sampling", "ask_roots"] {
        let outcome = client.call_tool(call(tool, json!({})), None).await;
        let text = &outcome.result.text;
        assert!(text.starts_with("refused"), "{tool}: {text}");
        assert!(text.contains("not declared"), "{tool}: {text}");
        assert!(millis(text) < 1_000, "{tool}: {text}");
    }
}

/// An elicitor that answers every question with the same name and remembers the questions.
struct Answers {
    asked: Mutex<Vec<ElicitationRequest>>,
}

impl Elicitor for Answers {
    fn elicit(&self, request: ElicitationRequest) -> ElicitationFuture {
        self.asked.lock().unwrap().push(request);
        let mut content = serde_json::Map::new();
        content.insert("name".into(), json!("Ada"));
        Box::pin(async move { ElicitationAnswer::Accept(content) })
    }
}

#[tokio::test]
async fn an_elicitation_is_answered_by_the_elicitor_only_with_the_operator_policy() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let answers = Arc::new(Answers {
        asked: Mutex::new(Vec::new()),
    });
    let ask = || McpCall {
        elicitor: Some(ElicitorHandle(answers.clone())),
        ..call("ask_name", json!({}))
    };

    let declining = client(&f, &peer, |_| {});
    let declined = declining.call_tool(ask(), None).await;
    assert_eq!(
        declined.result.text, "decline",
        "the default policy declines"
    );
    assert!(answers.asked.lock().unwrap().is_empty(), "nobody was asked");

    let operator = client(&f, &peer, |s| s.elicitation = ElicitationPolicy::Operator);
    let accepted = operator.call_tool(ask(), None).await;
    assert_eq!(accepted.result.text, "accepted: Ada");
    let asked = answers.asked.lock().unwrap();
    assert_eq!(asked.len(), 1);
    assert_eq!(
        (asked[0].server.as_str(), asked[0].tool.as_str()),
        ("peer", "ask_name")
    );
    assert!(asked[0].message.contains("name"), "{:?}", asked[0].message);
    assert!(asked[0].timeout > Duration::ZERO && asked[0].timeout < Duration::from_secs(20));
}

/// Waits (bounded) until the peer counted the standalone streams closed as they opened.
async fn standalone_streams_closed(peer: &Peer) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let stats = wire_stats(peer);
        if stats["standalone_closed"] == stats["standalone_opened"]
            || tokio::time::Instant::now() > deadline
        {
            return stats;
        }
        // The peer is another process whose only news of a closed stream is this
        // counter endpoint: a short, bounded look again (nothing here can be awaited).
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_question_on_the_standalone_get_stream_is_answered_and_the_stream_closes_with_the_call() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let answers = Arc::new(Answers {
        asked: Mutex::new(Vec::new()),
    });
    let client = client(&f, &peer, |s| s.elicitation = ElicitationPolicy::Operator);
    let outcome = client
        .call_tool(
            McpCall {
                elicitor: Some(ElicitorHandle(answers.clone())),
                ..call("ask_name_on_get_stream", json!({}))
            },
            None,
        )
        .await;
    // M14: the question came on the GET stream, not in the call's response stream.
    assert_eq!(outcome.result.text, "accepted: Ada");
    assert_eq!(
        answers.asked.lock().unwrap()[0].tool,
        "ask_name_on_get_stream"
    );
    let legs: Vec<&str> = outcome.legs.iter().map(|l| l.method.as_str()).collect();
    assert!(legs.contains(&"standalone stream"), "{legs:?}");
    assert!(legs.contains(&"elicitation answer"), "{legs:?}");
    // The GET lives only as long as the call: closed once it answered.
    let stats = standalone_streams_closed(&peer).await;
    assert_eq!(stats["standalone_opened"], 1, "{stats}");
    assert_eq!(stats["standalone_closed"], 1, "{stats}");
    // Outside a tools/call no standalone stream is opened.
    assert!(matches!(
        client.send_request(Request::ListTools, None).await,
        Ok(Reply::Tools(_))
    ));
    client.close().await.unwrap();
    assert_eq!(wire_stats(&peer)["standalone_opened"], 1);
}

#[tokio::test]
async fn a_server_without_a_session_gets_no_standalone_stream() {
    let peer = start(STATELESS).await;
    let f = fixture().await;
    let client = client(&f, &peer, |_| {});
    let echoed = client
        .call_tool(call("echo", json!({"text": "hi"})), None)
        .await;
    assert_eq!(echoed.result.text, "hi");
    let stats = wire_stats(&peer);
    assert_eq!(stats["standalone_opened"], 0, "{stats}");
    assert!(stats["methods"].get("GET").is_none(), "{stats}");
}

#[tokio::test]
async fn progress_and_log_notices_reach_the_caller_in_order() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let client = client(&f, &peer, |_| {});
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let outcome = client
        .call_tool(
            McpCall {
                notices: Some(NoticeSink::new(move |n| sink_seen.lock().unwrap().push(n))),
                ..call("progress", json!({"steps": 3, "delay": 0.01}))
            },
            None,
        )
        .await;
    assert_eq!(outcome.result.text, "done after 3 steps");
    let seen = seen.lock().unwrap();
    let progress: Vec<f64> = seen
        .iter()
        .filter_map(|n| match n {
            Notice::Progress {
                progress, total, ..
            } => {
                assert_eq!(*total, Some(3.0));
                Some(*progress)
            }
            _ => None,
        })
        .collect();
    assert_eq!(progress, [1.0, 2.0, 3.0]);
    let logs: Vec<&Value> = seen
        .iter()
        .filter_map(|n| match n {
            Notice::Log { data, .. } => Some(data),
            _ => None,
        })
        .collect();
    assert_eq!(
        logs,
        [
            &json!("log line 1"),
            &json!("log line 2"),
            &json!("log line 3")
        ]
    );
}

#[tokio::test]
async fn a_stream_closed_early_is_resumed_with_last_event_id_and_the_call_is_not_re_sent() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let client = client(&f, &peer, |_| {});
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink_seen = seen.clone();
    let outcome = client
        .call_tool(
            McpCall {
                notices: Some(NoticeSink::new(move |n| sink_seen.lock().unwrap().push(n))),
                ..call("resumable", json!({"delay": 0.3}))
            },
            None,
        )
        .await;
    assert_eq!(
        outcome.result.outcome,
        ToolOutcome::Succeeded,
        "{}",
        outcome.result.text
    );
    assert_eq!(outcome.result.text, "resumed result #1");
    let stats = wire_stats(&peer);
    assert_eq!(stats["resumable_started"], 1, "the call ran once: {stats}");
    assert!(stats["get_resumptions"].as_u64().unwrap() >= 1, "{stats}");
    let legs: Vec<&str> = outcome.legs.iter().map(|l| l.method.as_str()).collect();
    assert_eq!(
        legs.iter().filter(|m| **m == "tools/call").count(),
        1 + stats["get_resumptions"].as_u64().unwrap() as usize,
        "one POST, the rest GETs: {legs:?}"
    );
    let progress = seen
        .lock()
        .unwrap()
        .iter()
        .filter(|n| matches!(n, Notice::Progress { .. }))
        .count();
    assert_eq!(
        progress, 2,
        "the progress sent after the close came on the resumed stream"
    );
}

#[tokio::test]
async fn progress_extends_the_budget_only_when_the_server_is_configured_so() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    // Six steps 0.5 s apart: about 3 s in all, over a 2 s budget, never 2 s without progress.
    let long = || call("progress", json!({"steps": 6, "delay": 0.5}));
    let fixed = client(&f, &peer, |s| s.timeout = Duration::from_secs(2));
    let cut = fixed.call_tool(long(), None).await;
    assert_eq!(
        cut.result.outcome,
        ToolOutcome::Failed,
        "{}",
        cut.result.text
    );
    assert_eq!(cut.result.delivery, Delivery::MaybeDelivered);

    let stretched = client(&f, &peer, |s| {
        s.timeout = Duration::from_secs(2);
        s.progress_extends_deadline = true;
    });
    let done = stretched.call_tool(long(), None).await;
    assert_eq!(done.result.text, "done after 6 steps");
}

#[tokio::test]
async fn a_call_without_progress_stalls_at_its_budget_even_when_progress_could_extend_it() {
    let peer = start(STATEFUL_SSE).await;
    let f = fixture().await;
    let client = client(&f, &peer, |s| {
        s.timeout = Duration::from_secs(2);
        s.progress_extends_deadline = true;
    });
    let started = std::time::Instant::now();
    let outcome = client
        .call_tool(call("slow", json!({"seconds": 30.0})), None)
        .await;
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "{took:?}"
    );
    assert_eq!(outcome.result.outcome, ToolOutcome::Failed);
    assert!(
        outcome.result.text.contains("no answer and no progress"),
        "{}",
        outcome.result.text
    );
    assert_eq!(outcome.result.delivery, Delivery::MaybeDelivered);
}

#[tokio::test]
async fn without_a_response_stream_a_servers_request_fails_the_call_at_once_never_hangs() {
    // A JSON-response or stateless peer has no stream to send its ping in (runwarden opens
    // no GET stream): the SDK refuses at once, and the call fails with its words.
    for flags in [JSON_RESPONSE, STATELESS] {
        let peer = start(flags).await;
        let f = fixture().await;
        let client = client(&f, &peer, |_| {});
        let started = std::time::Instant::now();
        let outcome = client.call_tool(call("ping_client", json!({})), None).await;
        assert!(started.elapsed() < Duration::from_secs(2), "{flags:?}");
        assert_eq!(outcome.result.outcome, ToolOutcome::Failed, "{flags:?}");
        assert!(
            outcome.result.text.contains("back-channel"),
            "{flags:?}: {}",
            outcome.result.text
        );
    }
}
