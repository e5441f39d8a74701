//! `runwarden secret put|list|rm`: values come from stdin and are never printed.

use crate::support::{Sandbox, TestServer, header};

#[test]
fn secret_put_reads_the_value_from_stdin_and_drops_the_trailing_newline() {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox
        .run_with_stdin(&["secret", "put", "token"], b"abc123\n")
        .ok()
        .says("stored secret token");

    // The value is only observable on the wire: a kept newline would be refused as a
    // header value, or show up before the CRLF.
    let server = TestServer::start();
    sandbox
        .run(&[
            "egress",
            "test",
            &server.url("/"),
            "--secret",
            "token",
            "--placement",
            "bearer",
        ])
        .ok();
    let request = server.only_request();
    assert_eq!(
        header(&request, "authorization").as_deref(),
        Some("Bearer abc123")
    );
}

#[test]
fn secret_put_again_updates_the_value() {
    let sandbox = Sandbox::initialised();
    sandbox.put("token", "one");
    sandbox.put("token", "two").says("updated secret token");
}

#[test]
fn secret_list_shows_names_and_times_and_never_values() {
    let sandbox = Sandbox::initialised();
    sandbox.put("alpha", "value-of-alpha-7731");
    sandbox.put("beta", "value-of-beta-7732");

    let text = sandbox.run(&["secret", "list"]).ok();
    assert!(text.stdout.contains("alpha") && text.stdout.contains("beta"));
    assert!(text.stdout.contains("CREATED") && text.stdout.contains("UPDATED"));
    assert!(!text.all().contains("value-of"), "{text:#?}");

    let json = sandbox.run(&["--json", "secret", "list"]).ok();
    assert!(!json.all().contains("value-of"), "{json:#?}");
    let listed = json.json();
    let listed = listed.as_array().expect("an array of secrets");
    let names: Vec<&str> = listed.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["alpha", "beta"]);
    for secret in listed {
        assert!(secret["created"].is_string() && secret["updated"].is_string());
        assert!(secret.get("value").is_none(), "{secret}");
    }
}

#[test]
fn secret_rm_removes_the_secret() {
    let sandbox = Sandbox::initialised();
    sandbox.put("gone", "soon");
    sandbox
        .run(&["secret", "rm", "gone"])
        .ok()
        .says("removed secret gone");
    let list = sandbox.run(&["--json", "secret", "list"]).ok().json();
    assert_eq!(list, serde_json::json!([]));
}

#[test]
fn removing_an_unknown_secret_fails_naming_it() {
    let sandbox = Sandbox::initialised();
    let out = sandbox
        .run(&["secret", "rm", "nope"])
        .fails()
        .says("no secret named \"nope\"");
    // The name is shown as the user typed it, not as a Rust value.
    assert!(!out.all().contains("SecretName"), "{out:#?}");
}

#[test]
fn an_empty_value_is_refused_and_nothing_is_stored() {
    let sandbox = Sandbox::initialised();
    sandbox
        .run_with_stdin(&["secret", "put", "blank"], b"")
        .fails()
        .says("empty");
    sandbox
        .run_with_stdin(&["secret", "put", "blank"], b"\n")
        .fails()
        .says("empty");
    let list = sandbox.run(&["--json", "secret", "list"]).ok().json();
    assert_eq!(list, serde_json::json!([]));
}

#[test]
fn an_invalid_secret_name_is_refused() {
    let sandbox = Sandbox::initialised();
    sandbox
        .run_with_stdin(&["secret", "put", "no spaces"], b"v")
        .fails();
}
