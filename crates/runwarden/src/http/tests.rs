//! The router driven with `tower::ServiceExt::oneshot` over a real store in a temporary
//! directory: routes against the OpenAPI document, auth, and every rejection in our shape.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use runwarden_vault::{Role, token_create};
use serde_json::{Value, json};
use tokio::sync::watch;
use tower::ServiceExt as _;

use super::*;

/// A fresh installation, its API state, one operator and one viewer token.
struct Fixture {
    _dir: tempfile::TempDir,
    _stop: watch::Sender<StopLevel>,
    state: AppState,
    operator: String,
    viewer: String,
}

async fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(
        &path,
        "[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    let config = Config::load(&path).unwrap();
    crate::installation::create_installation(&config)
        .await
        .unwrap();
    let root = Arc::new(Root::new(config));
    let (stop_tx, stop) = watch::channel(StopLevel::Run);
    let state = AppState::new(root, stop).await.unwrap();
    let (operator, _) = token_create(&*state.tokens, "op", Role::Operator, 0)
        .await
        .unwrap();
    let (viewer, _) = token_create(&*state.tokens, "view", Role::Viewer, 0)
        .await
        .unwrap();
    Fixture {
        _dir: dir,
        _stop: stop_tx,
        state,
        operator: operator.expose().to_string(),
        viewer: viewer.expose().to_string(),
    }
}

impl Fixture {
    async fn send(&self, request: Request<Body>) -> (StatusCode, String) {
        let response = router(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// A request, with a bearer token when one is given and a JSON body when one is given.
    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(path);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let body = match body {
            Some(text) => {
                request = request.header("content-type", "application/json");
                Body::from(text.to_string())
            }
            None => Body::empty(),
        };
        let (status, text) = self.send(request.body(body).unwrap()).await;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }
}

fn code(body: &Value) -> &str {
    body["error"]["code"].as_str().unwrap_or_default()
}

#[test]
fn the_openapi_document_lists_exactly_the_event_kinds_the_runtime_writes() {
    let doc: Value = serde_json::from_str(OPENAPI).expect("docs/openapi.json is JSON");
    let kinds = &doc["components"]["schemas"]["Event"]["properties"]["kind"]["enum"];
    assert_eq!(
        kinds,
        &json!(runwarden_runtime::events::EVENT_KINDS),
        "docs/openapi.json's Event.kind enum is the runtime's list"
    );
}

#[test]
fn the_openapi_document_describes_exactly_the_routes_of_the_router() {
    let doc: Value = serde_json::from_str(OPENAPI).expect("docs/openapi.json is JSON");
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let mut documented: Vec<(String, String)> = paths
        .iter()
        .flat_map(|(path, item)| {
            let methods: Vec<String> = item.as_object().unwrap().keys().cloned().collect();
            methods.into_iter().map(move |m| (m, path.clone()))
        })
        .collect();
    let mut routed: Vec<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.as_str().to_ascii_lowercase(), r.path.to_string()))
        .collect();
    documented.sort();
    routed.sort();
    assert_eq!(documented, routed);
    for route in ROUTES {
        let operation = &paths[route.path][route.method.as_str().to_ascii_lowercase()];
        let open = operation["security"] == json!([]);
        assert_eq!(
            open,
            route.role.is_none(),
            "{} {}: the document's security matches the route's role",
            route.method,
            route.path
        );
    }
}

#[tokio::test]
async fn the_served_document_is_the_checked_in_file() {
    let f = fixture().await;
    let request = Request::get("/v1/openapi.json")
        .header("authorization", format!("Bearer {}", f.viewer))
        .body(Body::empty())
        .unwrap();
    let (status, text) = f.send(request).await;
    assert_eq!(status, StatusCode::OK);
    let file = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json"),
    )
    .unwrap();
    assert_eq!(text, file);
}

#[tokio::test]
async fn every_route_but_health_refuses_a_request_without_a_live_token() {
    let f = fixture().await;
    for route in ROUTES {
        let path = route.path.replace("{id}", "r1");
        let (status, body) = f.call(route.method.as_str(), &path, None, None).await;
        if route.role.is_none() {
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
        } else {
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}: {body}");
            assert_eq!(code(&body), "unauthorized");
            let (status, _) = f
                .call(route.method.as_str(), &path, Some("rwt_not-a-token"), None)
                .await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
        }
    }
}

#[tokio::test]
async fn a_viewer_may_read_and_may_not_start_or_cancel() {
    let f = fixture().await;
    let (status, _) = f.call("GET", "/v1/runs", Some(&f.viewer), None).await;
    assert_eq!(status, StatusCode::OK);
    let body = r#"{"agent": "a", "prompt": "hi"}"#;
    let (status, answer) = f
        .call("POST", "/v1/runs", Some(&f.viewer), Some(body))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(code(&answer), "forbidden");
    let (status, _) = f
        .call("POST", "/v1/runs/r1/cancel", Some(&f.viewer), None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, run) = f
        .call("POST", "/v1/runs", Some(&f.operator), Some(body))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    assert_eq!(run["status"], "queued");
}

/// One rejected request: method, path, body, and the status and code it is answered.
type Rejection<'a> = (&'a str, &'a str, Option<&'a str>, StatusCode, &'a str);

/// Each case is answered with its status and code, a message, no rule number and no ANSI.
async fn assert_our_error_shape(f: &Fixture, cases: Vec<Rejection<'_>>) {
    let op = Some(f.operator.as_str());
    for (method, path, body, status, expected) in cases {
        let (got, answer) = f.call(method, path, op, body).await;
        assert_eq!(got, status, "{method} {path}: {answer}");
        assert_eq!(code(&answer), expected, "{method} {path}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "{answer}"
        );
        let text = answer.to_string();
        assert!(crate::output::rule_numbers(&text).is_empty(), "{answer}");
        assert!(!text.contains('\u{1b}'), "ANSI in {answer}");
    }
}

#[tokio::test]
async fn every_rejected_run_request_comes_back_in_our_error_shape() {
    let f = fixture().await;
    let big = format!(r#"{{"agent": "a", "prompt": "{}"}}"#, "x".repeat(70 * 1024));
    let cases: Vec<Rejection<'_>> = vec![
        (
            "POST",
            "/v1/runs",
            Some("{not json"),
            StatusCode::BAD_REQUEST,
            "invalid_json",
        ),
        (
            "POST",
            "/v1/runs",
            Some(r#"{"agent": "a", "prompt": "p", "colour": "red"}"#),
            StatusCode::BAD_REQUEST,
            "unknown_field",
        ),
        (
            "POST",
            "/v1/runs",
            Some(r#"{"agent": "a"}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/runs",
            Some(r#"{"agent": "a", "prompt": "p", "mode": "later"}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "POST",
            "/v1/runs",
            Some(r#"{"agent": "nobody", "prompt": "p"}"#),
            StatusCode::NOT_FOUND,
            "agent_not_found",
        ),
        (
            "POST",
            "/v1/runs",
            Some(&big),
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
        ),
    ];
    assert_our_error_shape(&f, cases).await;
    // Without a JSON content type the body is not read as JSON.
    let request = Request::post("/v1/runs")
        .header("authorization", format!("Bearer {}", f.operator))
        .body(Body::from(r#"{"agent": "a", "prompt": "p"}"#))
        .unwrap();
    let (status, text) = f.send(request).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
}

#[tokio::test]
async fn every_rejected_query_and_route_comes_back_in_our_error_shape() {
    let f = fixture().await;
    let cases: Vec<Rejection<'_>> = vec![
        (
            "GET",
            "/v1/runs?status=sleeping",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "GET",
            "/v1/runs?limit=0",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "GET",
            "/v1/runs?limit=many",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
        (
            "GET",
            "/v1/runs?colour=red",
            None,
            StatusCode::BAD_REQUEST,
            "unknown_field",
        ),
        (
            "GET",
            "/v1/runs/nope",
            None,
            StatusCode::NOT_FOUND,
            "run_not_found",
        ),
        (
            "GET",
            "/v1/runs/nope/events",
            None,
            StatusCode::NOT_FOUND,
            "run_not_found",
        ),
        (
            "POST",
            "/v1/runs/nope/cancel",
            None,
            StatusCode::NOT_FOUND,
            "run_not_found",
        ),
        (
            "GET",
            "/v1/nothing-here",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            "DELETE",
            "/v1/runs",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "GET",
            "/v1/runs/x/cancel",
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            "GET",
            "/v1/audit?limit=-1",
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        ),
    ];
    assert_our_error_shape(&f, cases).await;
}

#[tokio::test]
async fn a_finished_run_cannot_be_cancelled_and_the_answer_names_its_state() {
    let f = fixture().await;
    let body = r#"{"agent": "a", "prompt": "hi", "mode": "sync"}"#;
    let (status, run) = f
        .call("POST", "/v1/runs", Some(&f.operator), Some(body))
        .await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["status"], "completed");
    let id = run["run_id"].as_str().unwrap();
    let (status, answer) = f
        .call(
            "POST",
            &format!("/v1/runs/{id}/cancel"),
            Some(&f.operator),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(code(&answer), "run_already_terminal");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("completed"),
        "{answer}"
    );
    let (status, events) = f
        .call(
            "GET",
            &format!("/v1/runs/{id}/events?after=1"),
            Some(&f.viewer),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["model_response", "run_completed"]);
}

#[tokio::test]
async fn health_needs_no_token_and_readiness_asks_the_store() {
    let f = fixture().await;
    let (status, body) = f.call("GET", "/healthz", None, None).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "status": "ok" })));
    let (status, body) = f.call("GET", "/readyz", None, None).await;
    assert_eq!(
        (status, body),
        (StatusCode::OK, json!({ "status": "ready" }))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn while_another_process_holds_the_write_lock_writes_answer_503_store_unavailable_and_readyz_is_not_ready()
 {
    let f = fixture().await;
    let holder = rusqlite::Connection::open(f.state.config.store.sqlite_path().unwrap()).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();

    let (status, body) = f.call("GET", "/readyz", None, None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(code(&body), "not_ready");

    let request = Request::post("/v1/runs")
        .header("authorization", format!("Bearer {}", f.operator))
        .header("content-type", "application/json")
        .body(Body::from(r#"{"agent": "a", "prompt": "hi"}"#))
        .unwrap();
    let response = router(f.state.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "5");
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    let body: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(code(&body), "store_unavailable", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(busy)"),
        "{body}"
    );

    holder.execute_batch("ROLLBACK").unwrap();
    let (status, _) = f.call("GET", "/readyz", None, None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "ready again once the lock is released"
    );
}
