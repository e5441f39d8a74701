//! One list of checks, run once per connection profile: a server that issues no session
//! id and answers JSON, and one that issues a session and answers event streams.

use std::sync::Arc;
use std::time::Duration;

use runwarden_mcp::{
    ManualClock, McpCall, McpError, ProtocolPolicy, Reply, Request, SchemaStatus, ServerConfig,
    ToolOutcome, build_catalogue,
};
use runwarden_testkit::Seen;
use runwarden_vault::CancelFlag;
use runwarden_vault::audit::action;
use serde_json::json;

use crate::support::scripted::{self, HUGE_FILLER, Profile, Script, Shape, body_of, method_of};
use crate::support::{WAIT, fixture};

/// Runs a check under both profiles, as two tests.
macro_rules! conformance {
    ($($check:ident),* $(,)?) => {
        mod without_session {
            $( #[tokio::test] async fn $check() { super::$check(super::scripted::STATELESS_JSON).await } )*
        }
        mod with_session {
            $( #[tokio::test] async fn $check() { super::$check(super::scripted::SESSION_SSE).await } )*
        }
    };
}

conformance!(
    handshake_order_and_headers,
    an_older_supported_version_is_negotiated_and_sent_back,
    an_unsupported_version_is_refused,
    a_server_without_tools_is_refused,
    discovery_walks_every_page_in_order,
    discovery_stops_at_the_page_ceiling,
    schemas_off_the_wire_are_normalised_and_named_locally,
    a_tool_call_puts_the_remote_name_on_the_wire_and_honours_is_error,
    the_budget_is_spent_across_the_legs,
    an_exhausted_budget_sends_nothing_and_says_so,
    cancelling_initialize_tears_it_down,
    cancelling_initialized_tears_it_down,
    cancelling_tools_call_tears_it_down_and_tells_the_server,
    a_signal_true_on_entry_sends_nothing,
    eight_failure_shapes_are_typed,
    a_body_over_2_mib_is_refused_without_echoing_it,
    an_expired_session_is_renewed_once_for_a_list,
    an_expired_session_never_resends_a_call,
    a_refused_standalone_stream_is_not_asked_for_again,
);

fn call(tool: &str) -> McpCall {
    McpCall {
        tool: tool.into(),
        arguments: json!({"q": "x"}).as_object().unwrap().clone(),
        correlation: Some("run-1".into()),
        gate: None,
        elicitor: None,
        output_schema: None,
        notices: None,
        ..Default::default()
    }
}

async fn handshake_order_and_headers(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script::new(profile)).await;
    let client = f.client(server.url("/mcp"), None);
    assert!(
        client
            .call_tool(call("search"), None)
            .await
            .result
            .is_success()
    );
    let (gets, requests): (Vec<_>, Vec<_>) = server
        .drain_requests()
        .into_iter()
        .partition(|r| r.method == "GET");
    let methods: Vec<String> = requests.iter().map(method_of).collect();
    assert_eq!(
        methods,
        ["initialize", "notifications/initialized", "tools/call"]
    );
    // M14: a session's call opens the standalone stream (this server answers 405); a
    // server without a session gets none.
    assert_eq!(gets.len(), usize::from(profile.sessions));
    for get in &gets {
        assert_eq!(get.header("accept"), Some("text/event-stream"));
        assert_eq!(get.header("mcp-session-id"), Some("session-1"));
        assert_eq!(get.header("mcp-protocol-version"), Some("2025-11-25"));
    }
    for request in &requests {
        assert_eq!(request.header("content-type"), Some("application/json"));
        assert_eq!(
            request.header("accept"),
            Some("application/json, text/event-stream")
        );
        assert_eq!(request.method, "POST");
    }
    // Before negotiation: no session id, no protocol version.
    assert_eq!(requests[0].header("mcp-session-id"), None);
    assert_eq!(requests[0].header("mcp-protocol-version"), None);
    assert_eq!(
        body_of(&requests[0])["params"]["protocolVersion"],
        "2025-11-25"
    );
    for request in &requests[1..] {
        assert_eq!(request.header("mcp-protocol-version"), Some("2025-11-25"));
        let expected = if profile.sessions {
            Some("session-1")
        } else {
            None
        };
        assert_eq!(
            request.header("mcp-session-id"),
            expected,
            "the session id is echoed only when issued"
        );
    }
    // A second operation reuses the session: no second handshake, and no second GET
    // (the server refused the standalone stream once, for the session).
    client.call_tool(call("search"), None).await;
    assert_eq!(
        server
            .drain_requests()
            .iter()
            .map(method_of)
            .collect::<Vec<_>>(),
        ["tools/call"]
    );
}

/// M14: a server that answers the standalone GET with 405 offers none for the session;
/// many calls on one session ask for it once.
async fn a_refused_standalone_stream_is_not_asked_for_again(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script::new(profile)).await;
    let client = f.client(server.url("/mcp"), None);
    for _ in 0..20 {
        assert!(
            client
                .call_tool(call("search"), None)
                .await
                .result
                .is_success()
        );
    }
    let requests = server.drain_requests();
    let gets = requests.iter().filter(|r| r.method == "GET").count();
    assert_eq!(gets, usize::from(profile.sessions), "{requests:?}");
    let calls = requests
        .iter()
        .filter(|r| method_of(r) == "tools/call")
        .count();
    assert_eq!(calls, 20);
}

async fn an_older_supported_version_is_negotiated_and_sent_back(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script {
        version: "2025-06-18".into(),
        ..Script::new(profile)
    })
    .await;
    let client = f.client(server.url("/mcp"), None);
    assert!(matches!(
        client.send_request(Request::Ping, None).await,
        Ok(Reply::Pong)
    ));
    let requests = server.drain_requests();
    assert_eq!(
        requests.last().unwrap().header("mcp-protocol-version"),
        Some("2025-06-18")
    );
}

async fn an_unsupported_version_is_refused(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script {
        version: "2024-11-05".into(),
        ..Script::new(profile)
    })
    .await;
    let client = f.client(server.url("/mcp"), None);
    let err = client
        .send_request(Request::ListTools, None)
        .await
        .unwrap_err();
    assert!(matches!(err, McpError::Protocol { .. }), "{err}");
    assert!(err.to_string().contains("2024-11-05"), "{err}");
    assert_eq!(
        server.drain_requests().len(),
        1,
        "nothing after a failed negotiation"
    );
}

async fn a_server_without_tools_is_refused(profile: Profile) {
    let f = fixture().await;
    let server = scripted::start(Script {
        offers_tools: false,
        ..Script::new(profile)
    })
    .await;
    let err = f
        .client(server.url("/mcp"), None)
        .send_request(Request::ListTools, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, runwarden_mcp::McpError::NoTools { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("offers no tools"), "{err}");
}

async fn discovery_walks_every_page_in_order(profile: Profile) {
    let f = fixture().await;
    let pages = vec![
        vec![scripted::tool("a"), scripted::tool("b")],
        vec![scripted::tool("c")],
        vec![scripted::tool("d")],
    ];
    let mut server = scripted::start(Script {
        pages,
        ..Script::new(profile)
    })
    .await;
    let Ok(Reply::Tools(tools)) = f
        .client(server.url("/mcp"), None)
        .send_request(Request::ListTools, None)
        .await
    else {
        panic!("discovery failed")
    };
    assert_eq!(
        tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        ["a", "b", "c", "d"]
    );
    assert_eq!(
        tools[0].input_schema["type"], "object",
        "the schema comes off the wire as sent"
    );
    let cursors: Vec<_> = server
        .drain_requests()
        .iter()
        .filter(|r| method_of(r) == "tools/list")
        .map(|r| body_of(r)["params"]["cursor"].clone())
        .collect();
    assert_eq!(cursors, [json!(null), json!("page-1"), json!("page-2")]);
}

async fn discovery_stops_at_the_page_ceiling(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script {
        endless_pages: true,
        ..Script::new(profile)
    })
    .await;
    let err = f
        .client(server.url("/mcp"), None)
        .send_request(Request::ListTools, None)
        .await
        .unwrap_err();
    assert!(
        matches!(err, McpError::TooManyPages { pages: 50, .. }),
        "{err}"
    );
    let pages = server
        .drain_requests()
        .iter()
        .filter(|r| method_of(r) == "tools/list")
        .count();
    assert_eq!(pages, 50);
}

async fn schemas_off_the_wire_are_normalised_and_named_locally(profile: Profile) {
    let f = fixture().await;
    let messy = json!({"name": "files.read", "inputSchema": {"type": "object", "title": "dropped", "$schema": "x",
        "properties": {"path": {"type": "string", "format": "uri", "description": "where"}}, "required": ["path"]}});
    let recursive = json!({"name": "tree", "inputSchema": {"type": "object", "$defs": {"n": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}},
        "properties": {"node": {"$ref": "#/$defs/n"}}}});
    let server = scripted::start(Script {
        pages: vec![vec![messy, recursive]],
        ..Script::new(profile)
    })
    .await;
    let Ok(Reply::Tools(tools)) = f
        .client(server.url("/mcp"), None)
        .send_request(Request::ListTools, None)
        .await
    else {
        panic!("discovery failed")
    };
    let catalogue = build_catalogue(
        &ServerConfig::new("tickets", server.url("/mcp")).with_protocol(ProtocolPolicy::Handshake),
        &tools,
        0,
    );
    assert_eq!(catalogue[0].local_name, "tickets__files_read");
    assert_eq!(catalogue[0].remote_name, "files.read");
    assert_eq!(
        catalogue[0].schema,
        SchemaStatus::Usable(
            // M8 (amended): `title` and `format` narrow or explain; `$schema` says nothing.
            json!({"type": "object", "title": "dropped", "properties": {"path": {"type": "string", "format": "uri", "description": "where"}}, "required": ["path"]})
        )
    );
    assert!(
        matches!(&catalogue[1].schema, SchemaStatus::Refused(reason) if reason.contains("the schema is recursive")),
        "{:?}",
        catalogue[1].schema
    );
}

async fn a_tool_call_puts_the_remote_name_on_the_wire_and_honours_is_error(profile: Profile) {
    let f = fixture().await;
    let result = json!({"content": [{"type": "text", "text": "quota exceeded"}], "isError": true});
    let mut server = scripted::start(Script {
        call_result: result,
        ..Script::new(profile)
    })
    .await;
    let outcome = f
        .client(server.url("/mcp"), None)
        .call_tool(call("create.ticket"), None)
        .await;
    assert_eq!(
        outcome.result.outcome,
        ToolOutcome::ToolError,
        "isError is a failed tool result"
    );
    assert_eq!(outcome.result.text, "quota exceeded");
    let wire = server
        .drain_requests()
        .into_iter()
        .find(|r| method_of(r) == "tools/call")
        .unwrap();
    assert_eq!(body_of(&wire)["params"]["name"], "create.ticket");
    assert_eq!(body_of(&wire)["params"]["arguments"], json!({"q": "x"}));
}

async fn the_budget_is_spent_across_the_legs(profile: Profile) {
    let f = fixture().await;
    let clock = Arc::new(ManualClock::default());
    let advance = [
        ("initialize", Duration::from_secs(4)),
        ("notifications/initialized", Duration::from_secs(2)),
    ]
    .into();
    let server = scripted::start(Script {
        clock: Some(clock.clone()),
        advance,
        ..Script::new(profile)
    })
    .await;
    let outcome = f
        .client(server.url("/mcp"), Some(clock))
        .call_tool(call("search"), None)
        .await;
    assert!(outcome.result.is_success(), "{}", outcome.result.text);
    let granted: Vec<(String, u64)> = outcome
        .legs
        .iter()
        .map(|l| (l.method.clone(), l.granted.as_secs()))
        .collect();
    let mut expected = vec![
        ("initialize".to_string(), 20),
        ("notifications/initialized".to_string(), 16),
        ("tools/call".to_string(), 14),
    ];
    if profile.sessions {
        // M14: the call's standalone stream gets no more than the call.
        expected.insert(2, ("standalone stream".to_string(), 14));
    }
    assert_eq!(
        granted, expected,
        "a 4 s initialize and a 2 s notification leave the call 14 s of a 20 s budget"
    );
}

async fn an_exhausted_budget_sends_nothing_and_says_so(profile: Profile) {
    let f = fixture().await;
    let clock = Arc::new(ManualClock::default());
    let advance = [("initialize", Duration::from_millis(19_500))].into();
    let mut server = scripted::start(Script {
        clock: Some(clock.clone()),
        advance,
        ..Script::new(profile)
    })
    .await;
    let outcome = f
        .client(server.url("/mcp"), Some(clock))
        .call_tool(call("search"), None)
        .await;
    assert_eq!(outcome.result.outcome, ToolOutcome::Failed);
    assert!(matches!(
        outcome.result.error,
        Some(McpError::NotSent { .. })
    ));
    assert!(
        outcome
            .result
            .text
            .contains("not sent: the 20 s budget for this operation is spent"),
        "{}",
        outcome.result.text
    );
    assert_eq!(
        server
            .drain_requests()
            .iter()
            .map(method_of)
            .collect::<Vec<_>>(),
        ["initialize"]
    );
}

/// Starts a call whose `stalled` leg never answers, cancels it once the server holds that
/// leg, and checks the teardown and its audit row.
async fn cancel_while_stalled(
    profile: Profile,
    stalled: &'static str,
) -> (Vec<String>, Vec<String>) {
    let f = fixture().await;
    let mut server = scripted::start(Script {
        stall: Some(stalled),
        ..Script::new(profile)
    })
    .await;
    let client = Arc::new(f.client(server.url("/mcp"), None));
    let flag = CancelFlag::new();
    let (task_client, task_flag) = (client.clone(), flag.clone());
    let task = tokio::spawn(async move {
        task_client
            .call_tool(call("search"), Some(&task_flag))
            .await
    });
    let mut seen = Vec::new();
    loop {
        if let Seen::Request(_, request) = server.next(WAIT).await
            && request.method != "GET"
        {
            seen.push(method_of(&request));
            if seen.last().map(String::as_str) == Some(stalled) {
                break;
            }
        }
    }
    flag.cancel();
    server.next_close(WAIT).await;
    let outcome = tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert_eq!(outcome.result.outcome, ToolOutcome::Cancelled);
    assert!(
        outcome.result.text.contains("cancelled") && !outcome.result.text.contains("failed"),
        "{}",
        outcome.result.text
    );
    assert!(matches!(
        outcome.result.error,
        Some(McpError::Cancelled {
            in_flight: true,
            ..
        })
    ));
    seen.extend(
        server
            .drain_requests()
            .iter()
            .filter(|r| r.method != "GET")
            .map(method_of),
    );
    (seen, f.audit_actions().await)
}

async fn cancelling_initialize_tears_it_down(profile: Profile) {
    let (seen, actions) = cancel_while_stalled(profile, "initialize").await;
    assert_eq!(seen, ["initialize"]);
    assert_eq!(actions, [action::HTTP_CALL_CANCELLED]);
}

async fn cancelling_initialized_tears_it_down(profile: Profile) {
    let (seen, actions) = cancel_while_stalled(profile, "notifications/initialized").await;
    assert_eq!(seen, ["initialize", "notifications/initialized"]);
    assert_eq!(actions, [action::HTTP_CALL, action::HTTP_CALL_CANCELLED]);
}

async fn cancelling_tools_call_tears_it_down_and_tells_the_server(profile: Profile) {
    let (seen, actions) = cancel_while_stalled(profile, "tools/call").await;
    assert_eq!(
        seen,
        [
            "initialize",
            "notifications/initialized",
            "tools/call",
            "notifications/cancelled"
        ]
    );
    let mut expected = vec![
        action::HTTP_CALL,
        action::HTTP_CALL,
        action::HTTP_CALL_CANCELLED,
        action::HTTP_CALL,
    ];
    let mut actions = actions;
    if profile.sessions {
        // M14: the standalone GET (answered 405 here) is audited like every leg; its row
        // may land on either side of the call's, so compare as sets.
        expected.push(action::HTTP_CALL);
        expected.sort_unstable();
        actions.sort_unstable();
    }
    assert_eq!(actions, expected);
}

async fn a_signal_true_on_entry_sends_nothing(profile: Profile) {
    let f = fixture().await;
    let server = scripted::start(Script::new(profile)).await;
    let flag = CancelFlag::new();
    flag.cancel();
    let outcome = f
        .client(server.url("/mcp"), None)
        .call_tool(call("search"), Some(&flag))
        .await;
    assert_eq!(outcome.result.outcome, ToolOutcome::Cancelled);
    assert!(!outcome.result.sent(), "nothing went out");
    assert_eq!(server.connection_count(), 0);
    assert_eq!(
        f.audit_actions().await,
        [action::HTTP_CALL_CANCELLED_BEFORE_SEND]
    );
}

async fn eight_failure_shapes_are_typed(profile: Profile) {
    type Expect = fn(&McpError) -> bool;
    let shapes: [(Shape, Expect); 8] = [
        (Shape::ServerError, |e| {
            matches!(e, McpError::Status { status: 503, .. })
        }),
        (Shape::Redirect, |e| {
            matches!(e, McpError::Status { status: 302, .. })
        }),
        (Shape::Unauthorized, |e| {
            matches!(e, McpError::Status { status: 401, .. })
        }),
        (
            Shape::RpcError,
            |e| matches!(e, McpError::Rpc { code: -32000, message, .. } if message == "backend exploded"),
        ),
        (Shape::HtmlPage, |e| matches!(e, McpError::Html { .. })),
        (Shape::StreamWithoutOurResponse, |e| {
            matches!(e, McpError::NoResponse { .. })
        }),
        (Shape::NeitherResultNorError, |e| {
            matches!(e, McpError::Malformed { .. })
        }),
        (Shape::EmptyBody, |e| {
            matches!(e, McpError::EmptyBody { .. })
        }),
    ];
    for (shape, expected) in shapes {
        let f = fixture().await;
        let server = scripted::start(Script {
            fail: Some(("tools/call", shape)),
            ..Script::new(profile)
        })
        .await;
        let outcome = f
            .client(server.url("/mcp"), None)
            .call_tool(call("search"), None)
            .await;
        assert_eq!(outcome.result.outcome, ToolOutcome::Failed, "{shape:?}");
        let error = outcome.result.error.as_ref().unwrap();
        assert!(expected(error), "{shape:?} gave {error}");
        assert!(
            error.to_string().contains("tickets"),
            "the error names the server: {error}"
        );
    }
}

async fn a_body_over_2_mib_is_refused_without_echoing_it(profile: Profile) {
    let f = fixture().await;
    let server = scripted::start(Script {
        fail: Some(("tools/call", Shape::Huge)),
        ..Script::new(profile)
    })
    .await;
    let outcome = f
        .client(server.url("/mcp"), None)
        .call_tool(call("search"), None)
        .await;
    let error = outcome.result.error.unwrap();
    assert!(
        matches!(error, McpError::TooLarge { limit: 2097152, .. }),
        "{error}"
    );
    assert!(!error.to_string().contains(HUGE_FILLER) && !outcome.result.text.contains(HUGE_FILLER));
}

async fn an_expired_session_is_renewed_once_for_a_list(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script {
        expire_once: Some("tools/list"),
        ..Script::new(profile)
    })
    .await;
    let result = f
        .client(server.url("/mcp"), None)
        .send_request(Request::ListTools, None)
        .await;
    let methods: Vec<String> = server.drain_requests().iter().map(method_of).collect();
    if profile.sessions {
        assert!(
            matches!(result, Ok(Reply::Tools(ref t)) if t.len() == 2),
            "{result:?}"
        );
        assert_eq!(
            methods,
            [
                "initialize",
                "notifications/initialized",
                "tools/list",
                "initialize",
                "notifications/initialized",
                "tools/list"
            ]
        );
    } else {
        // Without a session a 404 is just a 404: no renewal.
        assert!(
            matches!(result, Err(McpError::Status { status: 404, .. })) || result.is_ok(),
            "{result:?}"
        );
    }
}

async fn an_expired_session_never_resends_a_call(profile: Profile) {
    let f = fixture().await;
    let mut server = scripted::start(Script {
        expire_once: Some("tools/call"),
        ..Script::new(profile)
    })
    .await;
    let client = f.client(server.url("/mcp"), None);
    let outcome = client.call_tool(call("create"), None).await;
    let calls = server
        .drain_requests()
        .iter()
        .filter(|r| method_of(r) == "tools/call")
        .count();
    assert_eq!(calls, 1, "a tools/call is never silently re-sent");
    if profile.sessions {
        assert!(
            matches!(outcome.result.error, Some(McpError::SessionExpired { .. })),
            "{:?}",
            outcome.result.error
        );
        assert!(outcome.result.text.contains("not re-sent"));
        // The next operation starts a fresh session.
        assert!(
            client
                .call_tool(call("create"), None)
                .await
                .result
                .is_success()
        );
    }
}
