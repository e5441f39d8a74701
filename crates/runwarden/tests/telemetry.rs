//! O5: with `[telemetry] otlp_endpoint`, a run that calls an MCP tool exports one trace to a
//! real OTLP/HTTP receiver: the run, its steps and each outbound call, parent by parent; the
//! MCP server received the same trace id in `traceparent`; no span holds the secret.

use std::time::Duration;

use runwarden_testkit::{OtlpReceiver, TestServer, mcp_handler, tool};
use serde_json::{Value, json};

use crate::support::serve::install;
use crate::support::{SIGIL, runwarden};

const WAIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_calls_a_tool_is_one_trace_that_reaches_the_mcp_server() {
    let mut receiver = OtlpReceiver::start().await;
    let mut mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(
        &mcp,
        json!([
            {"tool_calls": [{"name": "srv__create", "arguments": {"title": "printer"}}]},
            {"text": "done"}
        ]),
    )
    .await;
    sandbox.append_config(&format!(
        "[telemetry]\notlp_endpoint = \"{}\"\n",
        receiver.endpoint()
    ));
    mcp.drain_requests();

    runwarden(&sandbox, &["run", "--agent", "a", "file it"])
        .await
        .ok()
        .says("completed");

    // The process flushes its spans before it exits.
    let run = receiver.wait_for("run", WAIT).await;
    let tool_call = receiver.wait_for("tool_call", WAIT).await;
    let model_call = receiver.wait_for("model_call", WAIT).await;
    let spans = receiver.spans().to_vec();
    let outbound: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "outbound_call" && s.parent_span_id == tool_call.span_id)
        .collect();
    assert!(
        !outbound.is_empty(),
        "the tool call's HTTP legs: {spans:#?}"
    );
    assert_eq!(tool_call.parent_span_id, run.span_id);
    assert_eq!(model_call.parent_span_id, run.span_id);
    for span in [&tool_call, &model_call] {
        assert_eq!(span.trace_id, run.trace_id, "one trace: {span:?}");
    }
    assert_eq!(tool_call.attributes["tool"], "srv__create");
    assert_eq!(run.attributes["outcome"], "completed");
    for leg in &outbound {
        assert_eq!(leg.trace_id, run.trace_id);
        assert_eq!(leg.attributes["delivery"], "answered", "{leg:?}");
    }

    // The MCP server got the trace in `traceparent` on the tools/call leg.
    let calls: Vec<_> = mcp
        .drain_requests()
        .into_iter()
        .filter(|r| {
            serde_json::from_slice::<Value>(&r.body).is_ok_and(|m| m["method"] == "tools/call")
        })
        .collect();
    assert_eq!(calls.len(), 1);
    let traceparent = calls[0].header("traceparent").expect("traceparent sent");
    let body: Value = serde_json::from_slice(&calls[0].body).unwrap();
    // `_meta` names the tool call's span; the header names the HTTP leg's.
    let in_meta = body["params"]["_meta"]["traceparent"]
        .as_str()
        .unwrap_or_default();
    assert!(
        in_meta.starts_with(&format!("00-{}-{}-", run.trace_id, tool_call.span_id)),
        "the MCP request's _meta carries the tool call's context: {in_meta}"
    );
    assert!(
        traceparent.starts_with(&format!("00-{}-", run.trace_id)),
        "{traceparent} in trace {}",
        run.trace_id
    );

    // The bearer secret placed on every MCP leg is in no span.
    let everything = format!("{spans:?}");
    assert!(!everything.contains(SIGIL), "a span holds the secret");
    assert!(
        !everything.contains("printer"),
        "a span holds an argument value"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_request_continues_the_callers_trace() {
    let mut receiver = OtlpReceiver::start().await;
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(&mcp, json!([{"text": "done"}])).await;
    sandbox.append_config(&format!(
        "[telemetry]\notlp_endpoint = \"{}\"\n",
        receiver.endpoint()
    ));
    let (serve, ready) = crate::support::serve_api(&sandbox).await;
    let url = ready["url"].as_str().unwrap().to_string();
    let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let answer = reqwest::Client::new()
        .get(format!("{url}/healthz"))
        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    serve.signal("TERM");
    let request = receiver.wait_for("GET /healthz", WAIT).await;
    assert_eq!(request.trace_id, trace);
    assert_eq!(request.parent_span_id, "00f067aa0ba902b7");
    assert_eq!(request.attributes["http.route"], "/healthz");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn record_arguments_puts_the_arguments_on_the_tool_call_span_and_never_the_secret() {
    let mut receiver = OtlpReceiver::start().await;
    let mcp = TestServer::start(mcp_handler(vec![tool("create")], &[])).await;
    let sandbox = install(
        &mcp,
        json!([
            {"tool_calls": [{"name": "srv__create", "arguments": {"title": "printer"}}]},
            {"text": "done"}
        ]),
    )
    .await;
    sandbox.append_config(&format!(
        "[telemetry]\notlp_endpoint = \"{}\"\nrecord_arguments = true\n",
        receiver.endpoint()
    ));

    runwarden(&sandbox, &["run", "--agent", "a", "file it"])
        .await
        .ok()
        .says("completed");

    let tool_call = receiver.wait_for("tool_call", WAIT).await;
    let recorded = tool_call.attributes.get("arguments").expect("recorded");
    let arguments: Value = serde_json::from_str(recorded).unwrap();
    assert_eq!(arguments, json!({"title": "printer"}));
    let everything = format!("{:?}", receiver.spans());
    assert!(!everything.contains(SIGIL), "a span holds the secret");
}
