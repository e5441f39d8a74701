//! `runwarden egress test`: one guarded request against a real server on 127.0.0.1.

use base64::Engine;

use crate::support::{SIGIL, Sandbox, TestServer, header, target};

/// A sandbox with the loopback allowlisted and the sigil stored as `api` (and as the
/// password of `login`, for basic auth).
fn sandbox_with_secrets() -> Sandbox {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.put("api", SIGIL);
    sandbox.put("login", &format!("svc:{SIGIL}"));
    sandbox
}

/// The request with the one place the secret belongs cut out: what is left must not
/// carry the secret in any form.
#[track_caller]
fn assert_nowhere_else(request: &str, placed: &str) {
    let rest = request.replacen(placed, "<placed>", 1);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("svc:{SIGIL}"));
    assert!(
        !rest.contains(SIGIL) && !rest.contains(&basic),
        "the secret appears outside its placement: {request}"
    );
}

#[test]
fn a_bearer_secret_goes_in_the_authorization_header_and_the_output_shows_status_and_audit_row() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    let out = sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/v1/ping"),
            "--secret",
            "api",
            "--placement",
            "bearer",
        ])
        .ok()
        .says("HTTP 200")
        .says("http_call ok GET 127.0.0.1")
        .says("secret=api");
    assert!(!out.all().contains(SIGIL), "{out:#?}");

    let request = server.only_request();
    let expected = format!("Bearer {SIGIL}");
    assert_eq!(
        header(&request, "authorization").as_deref(),
        Some(&*expected)
    );
    assert_eq!(target(&request), "/v1/ping");
    assert_nowhere_else(&request, &expected);
}

#[test]
fn a_basic_secret_goes_base64_encoded_in_the_authorization_header() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    let out = sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "login",
            "--placement",
            "basic",
        ])
        .ok();
    let request = server.only_request();
    let expected = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("svc:{SIGIL}"))
    );
    assert_eq!(
        header(&request, "authorization").as_deref(),
        Some(&*expected)
    );
    assert_nowhere_else(&request, &expected);
    assert!(!out.all().contains(SIGIL) && !out.all().contains(&expected[6..]));
}

#[test]
fn a_header_secret_goes_in_the_named_header_with_its_prefix() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "api",
            "--placement",
            "header",
            "--header",
            "X-Api-Key",
            "--prefix",
            "Token ",
        ])
        .ok();
    let request = server.only_request();
    let expected = format!("Token {SIGIL}");
    assert_eq!(header(&request, "x-api-key").as_deref(), Some(&*expected));
    assert_eq!(header(&request, "authorization"), None);
    assert_nowhere_else(&request, &expected);
}

#[test]
fn a_query_secret_goes_in_the_named_parameter_and_the_audit_path_has_no_query() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    let out = sandbox
        .run(&[
            "--json",
            "egress",
            "test",
            &server.url("/search?q=1"),
            "--secret",
            "api",
            "--placement",
            "query",
            "--param",
            "key",
        ])
        .ok();
    let request = server.only_request();
    let expected = format!("key={SIGIL}");
    assert!(
        target(&request).starts_with("/search?") && target(&request).contains(&expected),
        "{request}"
    );
    assert_eq!(header(&request, "authorization"), None);
    assert_nowhere_else(&request, &expected);
    assert_eq!(out.json()["audit"]["path"], "/search");
}

#[test]
fn a_header_placement_without_a_header_name_is_a_usage_error_and_sends_nothing() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "api",
            "--placement",
            "header",
        ])
        .fails()
        .says("--header NAME");
    assert!(server.requests().is_empty());
}

#[test]
fn egress_test_json_has_the_status_and_an_http_call_audit_row() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    let out = sandbox
        .run(&[
            "--json",
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "api",
            "--placement",
            "bearer",
        ])
        .ok();
    let json = out.json();
    assert_eq!(json["status"], 200);
    assert_eq!(json["audit"]["action"], "http_call");
    assert_eq!(json["audit"]["status"], 200);
    assert_eq!(json["audit"]["success"], true);
    assert_eq!(json["audit"]["secret"], "api");
    assert_eq!(json["audit"]["actor"], "cli");
}

#[test]
fn the_cloud_metadata_address_is_refused_naming_the_range_with_a_refused_audit_row() {
    let sandbox = Sandbox::initialised();
    sandbox
        .run(&["egress", "test", "http://169.254.169.254/"])
        .fails()
        .says("refused")
        .says("169.254.0.0/16")
        .says("http_call_refused");

    let json = sandbox
        .run(&["--json", "egress", "test", "http://169.254.169.254/latest"])
        .fails()
        .json();
    assert_eq!(json["status"], 0);
    assert_eq!(json["audit"]["action"], "http_call_refused");
    assert_eq!(json["audit"]["success"], false);
}

#[test]
fn a_legacy_numeric_ipv4_spelling_is_refused() {
    let sandbox = Sandbox::initialised();
    let out = sandbox
        .run(&["--json", "egress", "test", "http://2130706433/"])
        .fails();
    let json = out.json();
    let error = json["error"].as_str().unwrap();
    assert!(
        error.contains("refused") && error.contains("legacy numeric"),
        "{error}"
    );
    assert_eq!(json["audit"]["action"], "http_call_refused");
}

#[test]
fn a_loopback_server_is_refused_without_an_allowlist_and_receives_nothing() {
    let sandbox = Sandbox::initialised();
    sandbox.put("api", SIGIL);
    let server = TestServer::start();
    sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "api",
            "--placement",
            "bearer",
        ])
        .fails()
        .says("refused")
        .says("loopback");
    // A request the vault had sent would have been recorded before its answer came back.
    assert!(server.requests().is_empty());
}

#[test]
fn an_unknown_secret_fails_naming_it_and_sends_nothing() {
    let sandbox = sandbox_with_secrets();
    let server = TestServer::start();
    sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "missing",
            "--placement",
            "bearer",
        ])
        .fails()
        .says("missing");
    assert!(server.requests().is_empty());
}
