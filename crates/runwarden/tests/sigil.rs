//! V2: a secret's value never leaves the vault except on the wire, in its placement.

use base64::Engine;

use crate::support::{Output, SIGIL, Sandbox, TestServer};

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

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}
