//! The console driven with `tower::ServiceExt::oneshot` over a real SQLite store in a
//! temporary directory: sign-in and its cookie, sessions ending (sign-out, expiry, a
//! revoked token), CSRF, the security headers, a viewer's refusal, escaping, the chart.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use runwarden_runtime::StopLevel;
use runwarden_runtime::store::{EventAppend, NewRunStatus, RunCreate};
use runwarden_vault::{Role, token_create};
use tokio::sync::watch;
use tower::ServiceExt as _;

use super::CONTENT_SECURITY_POLICY;
use super::session_id::{session_create, session_lookup};
use crate::config::Config;
use crate::http::{AppState, router};
use crate::root::Root;

struct Fixture {
    _dir: tempfile::TempDir,
    _stop: watch::Sender<StopLevel>,
    state: AppState,
    operator: String,
    viewer: String,
}

/// What one request answered.
struct PageReply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn fixture() -> Fixture {
    fixture_with("").await
}

/// A fixture whose configuration file starts with `extra`.
async fn fixture_with(extra: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(
        &path,
        format!("{extra}\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n"),
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

/// A signed-in browser: its cookie and the CSRF token its pages carry.
struct Browser {
    cookie: String,
    csrf: String,
}

impl Fixture {
    async fn send(&self, request: Request<Body>) -> PageReply {
        let response = router(self.state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = axum::body::to_bytes(response.into_body(), 4 << 20)
            .await
            .unwrap();
        PageReply {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    async fn get(&self, path: &str, browser: Option<&Browser>) -> PageReply {
        let mut request = Request::get(path);
        if let Some(b) = browser {
            request = request.header(header::COOKIE, &b.cookie);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    async fn post(&self, path: &str, browser: Option<&Browser>, form: &str) -> PageReply {
        let mut request = Request::post(path)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::HOST, "console.test");
        if let Some(b) = browser {
            request = request.header(header::COOKIE, &b.cookie);
        }
        self.send(request.body(Body::from(form.to_string())).unwrap())
            .await
    }

    /// Signs in with `token` through the form and reads the CSRF token off the runs page.
    async fn sign_in(&self, token: &str) -> Browser {
        let answer = self
            .post("/console/login", None, &format!("token={token}"))
            .await;
        assert_eq!(answer.status, StatusCode::SEE_OTHER, "{}", answer.body);
        let set = answer.headers[header::SET_COOKIE].to_str().unwrap();
        let cookie = set.split(';').next().unwrap().to_string();
        let mut browser = Browser {
            cookie,
            csrf: String::new(),
        };
        let page = self.get("/runs", Some(&browser)).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let marker = "name=\"csrf\" value=\"";
        let start = page
            .body
            .find(marker)
            .expect("the page carries the CSRF token")
            + marker.len();
        let end = start + page.body[start..].find('"').unwrap();
        browser.csrf = page.body[start..end].to_string();
        browser
    }

    /// The run's status as stored.
    async fn status_of(&self, run: &str) -> String {
        let stored = self.state.runs.run_get(run).await.unwrap().unwrap();
        stored.status.as_str().to_string()
    }

    async fn queued_run(&self, agent: &str) -> String {
        let id = uuid::Uuid::now_v7().to_string();
        self.state
            .runs
            .run_create(RunCreate {
                id: id.clone(),
                agent: agent.into(),
                correlation: id.clone(),
                request: None,
                status: NewRunStatus::Queued,
                now_ms: 1,
                origin: Default::default(),
            })
            .await
            .unwrap();
        id
    }
}

#[tokio::test]
async fn signing_in_sets_an_httponly_samesite_strict_cookie_without_secure_over_plain_http() {
    let f = fixture().await;
    let answer = f
        .post("/console/login", None, &format!("token={}", f.operator))
        .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(answer.headers[header::LOCATION], "/runs");
    let cookie = answer.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.starts_with("rw_session="), "{cookie}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=43200"] {
        assert!(cookie.contains(attribute), "{attribute} missing: {cookie}");
    }
    assert!(
        !cookie.contains("Secure"),
        "plain HTTP cannot carry a Secure cookie: {cookie}"
    );
    assert!(
        !cookie.contains(&f.operator),
        "the cookie holds a session id, never the API token"
    );
}

#[tokio::test]
async fn over_tls_the_session_cookie_is_secure_and_lasts_the_configured_hours() {
    // Only the paths are read here; the listener loads the files.
    let f = fixture_with(
        "[serve]\ntls_cert = \"cert.pem\"\ntls_key = \"key.pem\"\n\n[console]\nsession_hours = 2\n",
    )
    .await;
    let answer = f
        .post("/console/login", None, &format!("token={}", f.operator))
        .await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    let cookie = answer.headers[header::SET_COOKIE].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
    assert!(cookie.contains("Max-Age=7200"), "{cookie}");
}

#[tokio::test]
async fn a_wrong_token_is_refused_with_the_sign_in_form_and_no_cookie() {
    let f = fixture().await;
    let answer = f.post("/console/login", None, "token=rwt_nonsense").await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    assert!(answer.headers.get(header::SET_COOKIE).is_none());
    assert!(
        answer.body.contains("not a live API token"),
        "{}",
        answer.body
    );
}

#[tokio::test]
async fn every_console_answer_carries_the_content_security_policy_and_nosniff() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    for path in [
        "/",
        "/runs",
        "/decisions",
        "/audit",
        "/mcp",
        "/charts",
        "/runs/nope",
    ] {
        let answer = f.get(path, Some(&browser)).await;
        assert_eq!(
            answer.headers[header::CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY,
            "{path}"
        );
        assert_eq!(
            answer.headers[header::X_CONTENT_TYPE_OPTIONS],
            "nosniff",
            "{path}"
        );
        assert_eq!(
            answer.headers[header::REFERRER_POLICY],
            "no-referrer",
            "{path}"
        );
        // CSP without 'unsafe-inline': no inline script or style attribute anywhere.
        assert!(
            !answer.body.contains(" style=\""),
            "{path} has an inline style"
        );
        assert!(
            !answer.body.contains("<script>"),
            "{path} has an inline script"
        );
    }
    assert!(CONTENT_SECURITY_POLICY.contains("script-src 'self'"));
    assert!(!CONTENT_SECURITY_POLICY.contains("unsafe-inline"));
}

#[tokio::test]
async fn pages_without_a_session_answer_401_and_the_api_still_wants_its_bearer_token() {
    let f = fixture().await;
    for path in [
        "/runs",
        "/decisions",
        "/audit",
        "/mcp",
        "/charts",
        "/console/stream/runs",
    ] {
        assert_eq!(
            f.get(path, None).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    let browser = f.sign_in(&f.operator).await;
    // The cookie is the console's only: the API ignores it.
    assert_eq!(
        f.get("/v1/runs", Some(&browser)).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn a_cancel_without_or_with_a_wrong_csrf_token_is_refused_and_with_it_cancels() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    let run = f.queued_run("a").await;
    let path = format!("/console/runs/{run}/cancel");
    let missing = f.post(&path, Some(&browser), "").await;
    assert_eq!(missing.status, StatusCode::FORBIDDEN);
    assert!(missing.body.contains("no CSRF token"), "{}", missing.body);
    let wrong = f.post(&path, Some(&browser), "csrf=AAAA").await;
    assert_eq!(wrong.status, StatusCode::FORBIDDEN);
    assert_eq!(
        f.status_of(&run).await,
        "queued",
        "a refused request changed nothing"
    );
    let by_header = Request::post(&path)
        .header(header::COOKIE, &browser.cookie)
        .header("x-csrf-token", &browser.csrf)
        .body(Body::empty())
        .unwrap();
    let done = f.send(by_header).await;
    assert_eq!(done.status, StatusCode::SEE_OTHER, "{}", done.body);
    assert_eq!(f.status_of(&run).await, "cancelled");
}

#[tokio::test]
async fn a_post_from_another_origin_is_refused_even_with_the_csrf_token() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    let run = f.queued_run("a").await;
    let request = Request::post(format!("/console/runs/{run}/cancel"))
        .header(header::COOKIE, &browser.cookie)
        .header(header::HOST, "console.test")
        .header(header::ORIGIN, "https://evil.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(format!("csrf={}", browser.csrf)))
        .unwrap();
    let answer = f.send(request).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(answer.body.contains("another origin"), "{}", answer.body);
    let cross_site = Request::post(format!("/console/runs/{run}/cancel"))
        .header(header::COOKIE, &browser.cookie)
        .header(header::ORIGIN, "null")
        .header("sec-fetch-site", "cross-site")
        .body(Body::from(format!("csrf={}", browser.csrf)))
        .unwrap();
    let answer = f.send(cross_site).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(answer.body.contains("another site"), "{}", answer.body);
    assert_eq!(f.status_of(&run).await, "queued");
}

#[tokio::test]
async fn a_viewer_sees_no_buttons_and_its_posts_are_refused_with_a_valid_csrf_token() {
    let f = fixture().await;
    let browser = f.sign_in(&f.viewer).await;
    let run = f.queued_run("a").await;
    let page = f.get(&format!("/runs/{run}"), Some(&browser)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        !page.body.contains("Cancel run"),
        "a viewer sees no Cancel button"
    );
    let answer = f
        .post(
            &format!("/console/runs/{run}/cancel"),
            Some(&browser),
            &format!("csrf={}", browser.csrf),
        )
        .await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN);
    assert!(answer.body.contains("is a viewer"), "{}", answer.body);
    assert_eq!(f.status_of(&run).await, "queued");
    let operator = f.sign_in(&f.operator).await;
    let page = f.get(&format!("/runs/{run}"), Some(&operator)).await;
    assert!(page.body.contains("Cancel run"), "an operator does see it");
}

#[tokio::test]
async fn server_written_text_is_escaped_on_every_page_that_shows_it() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    let hostile = "<script>window.__pwned=1</script>";
    let id = uuid::Uuid::now_v7().to_string();
    f.state
        .runs
        .run_create(RunCreate {
            id: id.clone(),
            agent: hostile.into(),
            correlation: id.clone(),
            request: None,
            status: NewRunStatus::Running {
                owner: "seg".into(),
                lease_until_ms: i64::MAX,
            },
            now_ms: 1,
            origin: Default::default(),
        })
        .await
        .unwrap();
    f.state
        .runs
        .run_event_append(EventAppend {
            id: id.clone(),
            owner: "seg".into(),
            epoch: 1, // a run claimed at birth
            kind: "tool_log".into(),
            payload: serde_json::json!({ "data": hostile, "level": "info" }),
            clear_fence: false,
            round: None,
            end: None,
            now_ms: 2,
            before: None,
        })
        .await
        .unwrap();
    for path in ["/runs".to_string(), format!("/runs/{id}")] {
        let page = f.get(&path, Some(&browser)).await;
        assert!(
            !page.body.contains(hostile),
            "{path} rendered markup: {}",
            page.body
        );
        assert!(
            page.body
                .contains("&lt;script&gt;window.__pwned=1&lt;/script&gt;"),
            "{path} shows the text escaped"
        );
    }
}

#[tokio::test]
async fn sign_out_deletes_the_session_so_its_cookie_no_longer_works() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    let refused = f.post("/console/logout", Some(&browser), "").await;
    assert_eq!(
        refused.status,
        StatusCode::FORBIDDEN,
        "sign-out needs the CSRF token too"
    );
    let out = f
        .post(
            "/console/logout",
            Some(&browser),
            &format!("csrf={}", browser.csrf),
        )
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert!(
        out.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    assert_eq!(
        f.get("/runs", Some(&browser)).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn an_expired_session_and_one_whose_token_was_revoked_are_signed_out() {
    let f = fixture().await;
    let token = runwarden_vault::token_verify(&*f.state.tokens, &f.operator)
        .await
        .unwrap()
        .unwrap();
    let long_ago = chrono::Utc::now().timestamp_millis() - 13 * 3_600_000;
    let (old, _) = session_create(&*f.state.sessions, &token, long_ago, 12 * 3_600_000)
        .await
        .unwrap();
    let expired = Browser {
        cookie: format!("rw_session={}", old.expose()),
        csrf: String::new(),
    };
    assert_eq!(
        f.get("/runs", Some(&expired)).await.status,
        StatusCode::UNAUTHORIZED
    );

    let browser = f.sign_in(&f.viewer).await;
    let viewer = runwarden_vault::token_verify(&*f.state.tokens, &f.viewer)
        .await
        .unwrap()
        .unwrap();
    assert!(f.state.tokens.token_revoke(&viewer.id).await.unwrap());
    assert_eq!(
        f.get("/runs", Some(&browser)).await.status,
        StatusCode::UNAUTHORIZED,
        "revoking the token ends its sessions at the next request"
    );
}

#[tokio::test]
async fn a_session_is_found_by_its_whole_id_and_by_nothing_shorter_or_longer() {
    let f = fixture().await;
    let token = runwarden_vault::token_verify(&*f.state.tokens, &f.operator)
        .await
        .unwrap()
        .unwrap();
    let now = chrono::Utc::now().timestamp_millis();
    let (id, _) = session_create(&*f.state.sessions, &token, now, 3_600_000)
        .await
        .unwrap();
    let lookup = |presented: String| {
        let sessions = f.state.sessions.clone();
        async move { session_lookup(&*sessions, &presented, now).await.unwrap() }
    };
    let found = lookup(id.expose().to_owned())
        .await
        .expect("the real id finds its session");
    assert_eq!(found.token.id, token.id);
    for wrong in [
        format!("{}A", id.expose()),
        id.expose()[..42].to_owned(),
        String::new(),
    ] {
        assert!(
            lookup(wrong).await.is_none(),
            "only a 43-character id is ours"
        );
    }
}

#[tokio::test]
async fn the_assets_are_served_under_their_hash_with_a_long_cache_and_others_are_404() {
    let f = fixture().await;
    let js = f.get(&super::assets::js_path(), None).await;
    assert_eq!(js.status, StatusCode::OK);
    assert!(
        js.headers[header::CACHE_CONTROL]
            .to_str()
            .unwrap()
            .contains("immutable")
    );
    assert!(
        js.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/javascript")
    );
    let css = f.get(&super::assets::css_path(), None).await;
    assert!(
        css.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("text/css")
    );
    assert_eq!(
        f.get("/console/assets/console.0000.js", None).await.status,
        StatusCode::NOT_FOUND
    );
    let page = f.get("/runs", None).await;
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-store");
}

#[test]
fn the_cancel_histogram_is_read_per_bucket_from_the_cumulative_exposition() {
    let text = "runwarden_cancel_latency_seconds_sum 0.02\n\
        runwarden_cancel_latency_seconds_count 4\n\
        runwarden_cancel_latency_seconds_bucket{le=\"0.001\"} 1\n\
        runwarden_cancel_latency_seconds_bucket{le=\"0.005\"} 3\n\
        runwarden_cancel_latency_seconds_bucket{le=\"+Inf\"} 4\n\
        runwarden_http_requests_total{route=\"/\"} 9\n";
    let buckets = super::pages::cancel_buckets(text);
    assert_eq!(
        buckets,
        [
            ("≤1 ms".to_string(), 1),
            ("≤5 ms".to_string(), 2),
            ("more".to_string(), 1)
        ]
    );
}

#[tokio::test]
async fn the_metrics_page_draws_the_cancel_histogram_as_an_svg() {
    let f = fixture().await;
    f.state
        .metrics
        .observe_cancel(std::time::Duration::from_millis(3));
    let browser = f.sign_in(&f.viewer).await;
    let page = f.get("/charts", Some(&browser)).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(
        page.body.contains("<svg id=\"cancel-histogram\""),
        "{}",
        page.body
    );
    assert!(page.body.contains("1 cancel observed"), "{}", page.body);
}

#[test]
fn console_session_hours_default_to_12_and_out_of_range_values_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runwarden.toml");
    std::fs::write(&path, "").unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(
        config.console.session,
        std::time::Duration::from_secs(12 * 3600)
    );
    std::fs::write(&path, "[console]\nsession_hours = 2\n").unwrap();
    let config = Config::load(&path).unwrap();
    assert_eq!(
        config.console.session,
        std::time::Duration::from_secs(2 * 3600)
    );
    for bad in ["0", "721"] {
        std::fs::write(&path, format!("[console]\nsession_hours = {bad}\n")).unwrap();
        let error = format!("{:#}", Config::load(&path).unwrap_err());
        assert!(
            error.contains("[console] session_hours must be between 1 and 720"),
            "{error}"
        );
    }
}

#[tokio::test]
async fn a_live_stream_ends_at_the_next_change_once_its_token_is_revoked() {
    use futures_util::StreamExt as _;
    let f = fixture().await;
    let browser = f.sign_in(&f.viewer).await;
    let request = Request::get("/console/stream/runs")
        .header(header::COOKIE, &browser.cookie)
        .body(Body::empty())
        .unwrap();
    let response = router(f.state.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body().into_data_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), body.next())
        .await
        .expect("the first rows in time")
        .expect("a frame")
        .unwrap();
    assert!(String::from_utf8_lossy(&first).contains("event: rows"));
    let viewer = runwarden_vault::token_verify(&*f.state.tokens, &f.viewer)
        .await
        .unwrap()
        .unwrap();
    assert!(f.state.tokens.token_revoke(&viewer.id).await.unwrap());
    f.queued_run("a").await; // a change: the stream looks again, and finds no session
    let end = tokio::time::timeout(std::time::Duration::from_secs(5), body.next())
        .await
        .expect("the stream ends in time");
    assert!(end.is_none(), "the stream ended instead of sending {end:?}");
}

#[tokio::test]
async fn every_page_speaks_plainly_with_no_rule_numbers_and_no_ansi() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    let run = f.queued_run("a").await;
    let signed_out = f.get("/", None).await;
    let hint = crate::hints::TOKEN_HINT;
    assert!(signed_out.body.contains(hint), "{}", signed_out.body);
    let pages = ["/runs", "/decisions", "/audit?verify=1", "/mcp", "/charts"];
    let run_page = format!("/runs/{run}");
    for path in pages.into_iter().chain([run_page.as_str()]) {
        let page = f.get(path, Some(&browser)).await;
        assert_eq!(page.status, StatusCode::OK, "{path}: {}", page.body);
        assert!(
            crate::output::rule_numbers(&page.body).is_empty(),
            "{path}: {:?}",
            crate::output::rule_numbers(&page.body)
        );
        assert!(!page.body.contains('\u{1b}'), "{path} carries ANSI");
    }
    // Counts agree with their nouns.
    let charts = f.get("/charts", Some(&browser)).await.body;
    assert!(charts.contains("0 cancels observed"), "{charts}");
    let audit = f.get("/audit?verify=1", Some(&browser)).await.body;
    assert!(
        !audit.contains(" 1 calls") && !audit.contains(" 1 rows"),
        "{audit}"
    );
}

#[tokio::test]
async fn the_fence_is_a_quiet_guard_while_the_write_runs_and_red_once_it_needs_a_person() {
    let f = fixture().await;
    let browser = f.sign_in(&f.operator).await;
    let id = uuid::Uuid::now_v7().to_string();
    let running = NewRunStatus::Running {
        owner: "seg".into(),
        lease_until_ms: i64::MAX,
    };
    let create = RunCreate {
        id: id.clone(),
        agent: "a".into(),
        correlation: id.clone(),
        request: None,
        status: running,
        now_ms: 1,
        origin: Default::default(),
    };
    let run = f.state.runs.run_create(create).await.unwrap();
    let mark = runwarden_runtime::store::FenceMark {
        id: id.clone(),
        owner: "seg".into(),
        epoch: run.claim_epoch,
        effect: "non_idempotent_write".into(),
        lease_until_ms: i64::MAX,
        now_ms: 2,
    };
    assert!(f.state.runs.run_fence_mark(mark).await.unwrap());
    let page = f.get(&format!("/runs/{id}"), Some(&browser)).await.body;
    assert!(page.contains("non_idempotent_write in flight"), "{page}");
    assert!(
        !page.contains("needs-person"),
        "red while the write runs: {page}"
    );
    f.state.runs.run_cancel(&id, 3).await.unwrap();
    let page = f.get(&format!("/runs/{id}"), Some(&browser)).await.body;
    assert!(page.contains("class=\"fence needs-person\""), "{page}");
    assert!(page.contains("may or may not have happened"), "{page}");
}
