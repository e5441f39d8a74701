//! V2: a secret's value never leaves the vault except on the wire, in its placement; V9:
//! not even when the server it was sent to echoes it back.

use std::sync::{Arc, Mutex};

use base64::Engine;
use runwarden_testkit::{
    Channel, Spelling, echo_handler_spelt, find_decoded_form, find_form, forms_of, json_decoded,
    received_credential, tool,
};
use serde_json::Value;

use crate::support::serve::{Api, Serve, token};
use crate::support::{Output, SIGIL, Sandbox, TestServer, runwarden};

#[test]
fn a_sigil_secret_never_appears_in_any_output_log_or_the_database_file() {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let server = TestServer::start();
    let url = server.url("/call?x=1");
    let mut outputs: Vec<Output> = Vec::new();

    outputs.push(sandbox.put("api", SIGIL));
    outputs.push(sandbox.put("login", &format!("svc:{SIGIL}")));
    outputs.push(sandbox.run(&["secret", "list"]).ok());
    outputs.push(sandbox.run(&["--json", "secret", "list"]).ok());

    let placements: &[&[&str]] = &[
        &["--secret", "api", "--placement", "bearer"],
        &["--secret", "login", "--placement", "basic"],
        &[
            "--secret",
            "api",
            "--placement",
            "header",
            "--header",
            "X-Key",
            "--prefix",
            "Token ",
        ],
        &["--secret", "api", "--placement", "query", "--param", "key"],
    ];
    for placement in placements {
        for json in [false, true] {
            let mut args = vec!["egress", "test", &url];
            if json {
                args.insert(0, "--json");
            }
            args.extend_from_slice(placement);
            let mut command = sandbox.command(&args);
            // Every log line at every level must be clean too.
            command.env("RUNWARDEN_LOG", "trace");
            outputs.push(sandbox.run_command(command).ok());
        }
    }
    // A refused call with the secret named, logged at trace as well.
    let mut command = sandbox.command(&[
        "egress",
        "test",
        "http://169.254.169.254/",
        "--secret",
        "api",
        "--placement",
        "query",
        "--param",
        "key",
    ]);
    command.env("RUNWARDEN_LOG", "trace");
    outputs.push(sandbox.run_command(command).fails());

    outputs.push(sandbox.run(&["audit", "list"]).ok());
    outputs.push(sandbox.run(&["--json", "audit", "list"]).ok());
    outputs.push(sandbox.run(&["audit", "verify"]).ok());
    outputs.push(sandbox.run(&["--json", "audit", "verify"]).ok());
    let new_key = sandbox.path().join("new.key");
    outputs.push(
        sandbox
            .run(&[
                "secret",
                "rotate-master-key",
                "--new-key-file",
                new_key.to_str().unwrap(),
            ])
            .ok(),
    );
    outputs.push(sandbox.run(&["--json", "secret", "list"]).ok());

    // The calls reached the server with the secret: the check below is not vacuous.
    assert_eq!(server.requests().len(), 8);
    assert!(server.requests().iter().all(|r| r.contains(SIGIL)
        || r.contains(&base64::engine::general_purpose::STANDARD.encode(format!("svc:{SIGIL}")))));

    let basic = base64::engine::general_purpose::STANDARD.encode(format!("svc:{SIGIL}"));
    for out in &outputs {
        let all = out.all();
        assert!(
            !all.contains(SIGIL) && !all.contains(&basic),
            "the secret was printed by {out:#?}"
        );
    }
    // The trace runs did log something, so the logs were really looked at.
    assert!(
        outputs
            .iter()
            .any(|o| o.stderr.contains("TRACE") || o.stderr.contains("DEBUG"))
    );

    // V1: encrypted at rest. Checkpoint-free reads: the file and any WAL beside it.
    for entry in std::fs::read_dir(sandbox.data_dir()).unwrap() {
        let path = entry.unwrap().path();
        let bytes = std::fs::read(&path).unwrap();
        assert!(
            !contains(&bytes, SIGIL.as_bytes()),
            "{} holds the secret in clear",
            path.display()
        );
    }
}

/// Signs in to the console with `token` through its form and reads every page:
/// runs, each run, MCP servers, audit, decisions, charts. None holds a form of the secret,
/// as written or with HTML references, JSON escapes and percent-encoding undone.
async fn console_pages_hold_no_form(
    serve: &Serve,
    token: &str,
    run_ids: &[String],
    forms: &[String],
) {
    // The search sees through each encoding: every character an HTML reference, or
    // percent-encoded inside a JSON escape.
    let secret = &forms[0];
    let entities: String = secret.chars().map(|c| format!("&#{};", c as u32)).collect();
    let percent: String = secret.bytes().map(|b| format!("%{b:02X}")).collect();
    assert!(find_decoded_form(&entities, forms).is_some());
    assert!(find_decoded_form(&percent.replace('%', "\\u0025"), forms).is_some());

    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = serve.url();
    let signed_in = http
        .post(format!("{base}/console/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status().as_u16(), 303, "the sign-in is accepted");
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_string();

    let mut paths: Vec<String> = ["/runs", "/mcp", "/audit", "/decisions", "/charts"]
        .map(String::from)
        .to_vec();
    paths.extend(run_ids.iter().map(|id| format!("/runs/{id}")));
    let mut pages = Vec::new();
    for path in &paths {
        let answer = http
            .get(format!("{base}{path}"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200, "GET {path}");
        let page = answer.text().await.unwrap();
        assert_eq!(
            find_decoded_form(&page, forms),
            None,
            "the console's {path}: {page}"
        );
        pages.push((path.clone(), page));
    }
    // The pages showed the echoes, redacted: the first run's tool result and the MCP
    // server's last error.
    let shown = |path: &str| &pages.iter().find(|(p, _)| p == path).unwrap().1;
    assert!(shown(&format!("/runs/{}", run_ids[0])).contains("[redacted]"));
    assert!(shown("/mcp").contains("[redacted]"), "{}", shown("/mcp"));
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// The id a `run` printed: in its banner, or in each JSON line with `--json`.
fn run_id(out: &Output) -> String {
    out.stderr
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.strip_suffix(" (Ctrl-C cancels it)"))
        .map(str::to_string)
        .or_else(|| {
            let line = out.stdout.lines().next()?;
            let first: Value = serde_json::from_str(line).ok()?;
            Some(first["run_id"].as_str()?.to_string())
        })
        .unwrap_or_else(|| panic!("the output names the run: {out:#?}"))
}

/// Runs agent `a` with every log line at trace level, whatever the outcome.
async fn traced_run(sandbox: &Arc<Sandbox>, json: bool, prompt: &str) -> Output {
    let mut args = vec!["run", "--agent", "a", prompt];
    if json {
        args.insert(0, "--json");
    }
    let mut command = sandbox.command(&args);
    command.env("RUNWARDEN_LOG", "trace");
    let sandbox = sandbox.clone();
    tokio::task::spawn_blocking(move || sandbox.run_command(command))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_echoed_by_the_mcp_server_and_the_model_reach_no_output_api_answer_or_database_byte()
 {
    let mcp_channel = Arc::new(Mutex::new(Channel::Body));
    // Both servers spell the echo as this says: raw, or with one or every character a
    // `\u` escape inside their JSON strings.
    let spelling = Arc::new(Mutex::new(Spelling::Raw));
    let mut mcp = runwarden_testkit::TestServer::start(echo_handler_spelt(
        mcp_channel.clone(),
        spelling.clone(),
        vec![tool("create")],
    ))
    .await;
    let model_channel = Arc::new(Mutex::new(Channel::Body));
    let mut model = runwarden_testkit::TestServer::start(echo_handler_spelt(
        model_channel.clone(),
        spelling.clone(),
        vec![],
    ))
    .await;

    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\nauth = {{ secret = \"srv-login\", placement = \"basic\" }}\n\n[agents.a]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\napi_key_secret = \"model-key\"\ntools = [\"srv__*\"]\n",
        mcp.url("/mcp"),
        model.url("/v1"),
    ));
    std::fs::write(sandbox.config(), text).unwrap();
    let sandbox = Arc::new(sandbox);
    let mut outputs = vec![
        sandbox.put("srv-login", &format!("svc:{SIGIL}")),
        sandbox.put("model-key", SIGIL),
    ];
    outputs.push(runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok());

    // Each run meets the echo in other channels: in the tool result and the model's text
    // and tool arguments; in a JSON-RPC error of the tool call; in headers and the content
    // type; in the model's OpenAI and Anthropic error bodies; in a model's redirect.
    let raw = Spelling::Raw;
    let runs: &[(Channel, Channel, bool, Spelling)] = &[
        (Channel::Body, Channel::Body, true, raw),
        (Channel::JsonRpcError, Channel::Body, true, raw),
        (Channel::Header, Channel::Header, true, raw),
        (Channel::ContentType, Channel::ContentType, true, raw),
        (Channel::Body, Channel::OpenAiError, false, raw),
        (Channel::Body, Channel::AnthropicError, false, raw),
        (Channel::Body, Channel::Redirect, false, raw),
        (Channel::Body, Channel::Body, true, Spelling::OneEscape),
        (
            Channel::JsonRpcError,
            Channel::Body,
            true,
            Spelling::AllEscape,
        ),
        (
            Channel::Body,
            Channel::OpenAiError,
            false,
            Spelling::AllEscape,
        ),
    ];
    let mut run_ids = Vec::new();
    for (i, &(at_mcp, at_model, completes, spelt)) in runs.iter().enumerate() {
        *mcp_channel.lock().unwrap() = at_mcp;
        *model_channel.lock().unwrap() = at_model;
        *spelling.lock().unwrap() = spelt;
        let out = traced_run(&sandbox, i % 2 == 1, "open a ticket").await;
        let expected = if completes { Some(0) } else { Some(1) };
        assert_eq!(out.code, expected, "{at_mcp:?} / {at_model:?}: {out:#?}");
        run_ids.push(run_id(&out));
        outputs.push(out);
    }
    // The echoes reached us, so the checks below are not vacuous: a redacted echo is in
    // the first run's tool result and in the failed runs' reasons.
    let first = runwarden(&sandbox, &["--json", "events", &run_ids[0]])
        .await
        .ok();
    assert!(
        first.stdout.contains("done; you sent Basic [redacted]"),
        "{first:#?}"
    );
    let failed = runwarden(&sandbox, &["--json", "status", &run_ids[4]])
        .await
        .ok();
    assert!(
        failed.json()["termination_reason"]
            .as_str()
            .is_some_and(|r| r.contains("[redacted]")),
        "{failed:#?}"
    );
    outputs.extend([first, failed]);

    for id in &run_ids {
        for args in [
            vec!["events", id.as_str()],
            vec!["--json", "events", id.as_str()],
            vec!["status", id.as_str()],
            vec!["--json", "status", id.as_str()],
        ] {
            outputs.push(runwarden(&sandbox, &args).await.ok());
        }
    }

    // A handshake that fails on an echoed protocol version becomes the last error.
    *mcp_channel.lock().unwrap() = Channel::ProtocolVersion;
    *spelling.lock().unwrap() = Spelling::AllEscape;
    outputs.push(runwarden(&sandbox, &["mcp", "health"]).await);
    let listed = runwarden(&sandbox, &["--json", "mcp", "list"]).await.ok();
    assert!(
        listed.stdout.contains("[redacted]"),
        "the last error: {listed:#?}"
    );
    outputs.push(listed);
    outputs.push(runwarden(&sandbox, &["mcp", "list"]).await.ok());
    outputs.push(runwarden(&sandbox, &["--json", "audit", "list"]).await.ok());
    outputs.push(runwarden(&sandbox, &["audit", "list"]).await.ok());

    // Both servers received the credentials, in their placements.
    let mcp_seen = mcp.drain_requests();
    let model_seen = model.drain_requests();
    assert!(mcp_seen.iter().all(|r| {
        received_credential(r)
            .iter()
            .any(|f| f == &format!("svc:{SIGIL}"))
    }));
    assert!(
        model_seen
            .iter()
            .all(|r| r.header("authorization") == Some(format!("Bearer {SIGIL}").as_str()))
    );
    assert!(!mcp_seen.is_empty() && !model_seen.is_empty());

    let forms = forms_of(&format!("svc:{SIGIL}"));
    for out in &outputs {
        assert_eq!(
            find_form(&json_decoded(&out.all()), &forms),
            None,
            "a form of the secret was printed by {out:#?}"
        );
    }

    // The API, to a viewer; the database and its WAL while the server holds them open.
    let viewer = token(&sandbox, "viewer").await;
    let serve = Serve::start(&sandbox, 0).await;
    let api = Api::new(&serve);
    let runs_page = api.get("/v1/runs", &viewer).await;
    assert!(runs_page.to_string().contains("[redacted]"), "{runs_page}");
    for id in &run_ids {
        api.get(&format!("/v1/runs/{id}"), &viewer).await;
        api.get(&format!("/v1/runs/{id}/events"), &viewer).await;
    }
    let servers: Value = api.get("/v1/mcp/servers", &viewer).await;
    assert!(servers.to_string().contains("[redacted]"), "{servers}");
    api.get("/v1/audit", &viewer).await;
    for body in api.bodies() {
        assert_eq!(
            find_form(&json_decoded(&body), &forms),
            None,
            "an API answer: {body}"
        );
    }
    console_pages_hold_no_form(&serve, &viewer, &run_ids, &forms).await;
    let database = sandbox.database();
    let wal = database.with_extension("db-wal");
    assert!(
        wal.exists(),
        "the server holds the database open in WAL mode"
    );
    for path in [&database, &wal] {
        let bytes = std::fs::read(path).unwrap();
        let text = json_decoded(&String::from_utf8_lossy(&bytes));
        assert_eq!(
            find_form(&text, &forms),
            None,
            "{} holds a form of the secret",
            path.display()
        );
    }
    // The first run's tool result reached the database, redacted: the scan saw real rows.
    let bytes = std::fs::read(&database).unwrap();
    let wal_bytes = std::fs::read(&wal).unwrap();
    assert!(
        contains(&bytes, b"you sent Basic [redacted]")
            || contains(&wal_bytes, b"you sent Basic [redacted]")
    );
    drop(serve);
}

/// G1: a gateway client reads what the server answered, scrubbed like a run's step: a
/// credential the server echoes, in any spelling, never reaches the client's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_echoed_by_the_mcp_server_never_reach_a_gateway_client() {
    let channel = Arc::new(Mutex::new(Channel::Body));
    let spelling = Arc::new(Mutex::new(Spelling::Raw));
    let mcp = runwarden_testkit::TestServer::start(echo_handler_spelt(
        channel.clone(),
        spelling.clone(),
        vec![tool("create")],
    ))
    .await;
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.append_config(&format!(
        "\n[mcp.servers.srv]\nurl = \"{}\"\nauth = {{ secret = \"srv-login\", placement = \"basic\" }}\n\n[gateway.tokens.operator]\ntools = [\"srv__*\"]\n",
        mcp.url("/mcp"),
    ));
    let sandbox = Arc::new(sandbox);
    sandbox.put("srv-login", &format!("svc:{SIGIL}"));
    runwarden(&sandbox, &["mcp", "import", "srv"]).await.ok();
    let token = token(&sandbox, "operator").await;
    let serve = Serve::start(&sandbox, 1).await;
    let http = reqwest::Client::new();
    let post = |session: Option<String>, body: Value| {
        let mut request = http
            .post(format!("{}/mcp", serve.url()))
            .bearer_auth(&token)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(session) = session {
            request = request.header("mcp-session-id", session);
        }
        request.send()
    };
    let forms = forms_of(&format!("svc:{SIGIL}"));
    let mut answers = Vec::new();
    for (at, spelt) in [
        (Channel::Body, Spelling::Raw),
        (Channel::Body, Spelling::OneEscape),
        (Channel::JsonRpcError, Spelling::AllEscape),
        (Channel::Header, Spelling::Raw),
    ] {
        *channel.lock().unwrap() = at;
        *spelling.lock().unwrap() = spelt;
        let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                       "clientInfo": {"name": "sigil", "version": "1"}}});
        let opened = post(None, initialize).await.unwrap();
        let session = opened.headers()["mcp-session-id"]
            .to_str()
            .unwrap()
            .to_string();
        answers.push(opened.text().await.unwrap());
        let call = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "srv__create", "arguments": {}}});
        let called = post(Some(session), call).await.unwrap();
        let headers = format!("{:?}", called.headers());
        answers.push(format!("{headers}\n{}", called.text().await.unwrap()));
    }
    // The echo reached the client, redacted, so the check below is not vacuous.
    assert!(answers[1].contains("[redacted]"), "{}", answers[1]);
    for answer in &answers {
        assert_eq!(
            find_decoded_form(answer, &forms),
            None,
            "a gateway answer holds the secret: {answer}"
        );
    }
}
