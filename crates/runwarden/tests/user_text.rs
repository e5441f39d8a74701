//! The words people read: the `init` template, every `--help`, the configuration
//! reference, the API description and every operator document under docs/, error text and log lines carry no rule numbers (`R12`, `M18`, "SPEC") and no
//! ANSI colour when not on a terminal; a TOML mistake is shown with its line, column and
//! text, as the parser lays it out.

use std::path::Path;
use std::process::Command;

use crate::support::{Live, Sandbox};

/// Whether `word` has the shape of a rule number of docs/requirements.md (`R12`, `M18`, `V4`).
pub(crate) fn is_rule_number(word: &str) -> bool {
    matches!(word.len(), 2 | 3)
        && matches!(word.as_bytes()[0], b'R' | b'M' | b'V' | b'O' | b'L')
        && word[1..].bytes().all(|b| b.is_ascii_digit())
}

/// The rule numbers of the requirements and the word SPEC in `text`.
fn rule_numbers(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| *w == "SPEC" || is_rule_number(w))
        .collect()
}

fn plain(what: &str, text: &str) {
    assert!(
        rule_numbers(text).is_empty(),
        "{what}: {:?} in\n{text}",
        rule_numbers(text)
    );
    assert!(!text.contains('\u{1b}'), "{what} carries ANSI:\n{text}");
}

/// The subcommands a `--help` text lists under "Commands:".
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_init_template_and_the_configuration_reference_speak_plainly() {
    let sandbox = Sandbox::empty();
    sandbox.run(&["init"]).ok();
    plain(
        "the init template",
        &std::fs::read_to_string(sandbox.config()).unwrap(),
    );
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md");
    plain(
        "docs/configuration.md",
        &std::fs::read_to_string(reference).unwrap(),
    );
}

#[test]
fn the_api_description_speaks_plainly() {
    // Served as is at /v1/openapi.json; generated clients carry its words into their docs.
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/openapi.json");
    plain("docs/openapi.json", &std::fs::read_to_string(doc).unwrap());
}

#[test]
fn every_document_under_docs_speaks_plainly() {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else {
                out.push(path);
            }
        }
    }
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let mut files = Vec::new();
    walk(&docs, &mut files);
    let mut read = 0;
    for path in files {
        let name = path
            .strip_prefix(&docs)
            .unwrap()
            .to_string_lossy()
            .into_owned();
        // Written for the engineers who carry the project on, not for operators:
        // requirements.md defines the rule numbers that code comments cite, and the notes
        // under design/ name them where a design meets a rule.
        if name == "requirements.md" || name.starts_with("design/") {
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(&path) {
            plain(&format!("docs/{name}"), &text);
            read += 1;
        }
    }
    assert!(
        read >= 4,
        "only {read} documents under docs/: the walk missed them"
    );
}

#[test]
fn every_help_speaks_plainly() {
    let sandbox = Sandbox::empty();
    let mut pending: Vec<Vec<String>> = vec![vec![]];
    let mut seen = 0;
    while let Some(path) = pending.pop() {
        let mut args: Vec<&str> = path.iter().map(String::as_str).collect();
        args.push("--help");
        let out = sandbox.run(&args).ok();
        plain(&format!("runwarden {}", args.join(" ")), &out.all());
        for name in subcommands(&out.stdout) {
            let mut next = path.clone();
            next.push(name);
            pending.push(next);
        }
        seen += 1;
    }
    assert!(
        seen > 20,
        "only {seen} help texts: the walk missed the subcommands"
    );
}

#[test]
fn a_toml_mistake_is_shown_with_its_line_column_and_text() {
    let sandbox = Sandbox::empty();
    std::fs::write(sandbox.config(), "[worker]\nconcurrency = \"four\n").unwrap();
    let out = sandbox.run(&["secret", "list"]).fails();
    let stderr = &out.stderr;
    assert!(stderr.contains("line 2, column"), "{stderr}");
    assert!(
        stderr.contains("\n2 | concurrency = \"four"),
        "the offending text on its own line: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.trim_start().starts_with('|') && l.contains('^')),
        "{stderr}"
    );
    assert!(
        !stderr.contains(" | 2 | "),
        "squashed onto one line: {stderr}"
    );
    plain("a TOML error", stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_log_lines_written_to_a_pipe_carry_no_ansi() {
    let sandbox = Sandbox::initialised();
    let mut command = sandbox.command(&[
        "--json",
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--concurrency",
        "0",
    ]);
    // stderr is a pipe here, as it is for `serve 2>file`; only a terminal gets colour.
    command.env("RUNWARDEN_LOG", "info").env_remove("NO_COLOR");
    let mut serve = Live::spawn(command);
    let ready = serve.json().await;
    let base = ready["url"].as_str().unwrap().to_string();
    let answer = reqwest::get(format!("{base}/v1/runs")).await.unwrap();
    assert_eq!(answer.status(), 401);
    let line = serve.err_line().await;
    assert!(
        line.contains("INFO") || line.contains("WARN"),
        "a log line: {line:?}"
    );
    plain("a serve log line", &line);
    serve.signal("TERM");
}

#[test]
fn a_lost_key_says_where_the_backup_was_and_the_two_ways_on() {
    let sandbox = Sandbox::initialised();
    sandbox.put("t", "v").ok();
    // One audited call (refused by the guard) for the history to keep.
    sandbox.run(&["egress", "test", "http://10.0.0.1/"]).fails();
    std::fs::remove_file(sandbox.key_file()).unwrap();
    let out = sandbox.run(&["secret", "list"]).fails();
    out.says("no master key at")
        .says("restore the key from the backup made after `runwarden init`")
        .says("runwarden init --new-key");
    // A wrong key says the same.
    std::fs::write(sandbox.key_file(), format!("{}\n", "ab".repeat(32))).unwrap();
    let mut perms = std::fs::metadata(sandbox.key_file()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o600);
    std::fs::set_permissions(sandbox.key_file(), perms).unwrap();
    sandbox
        .run(&["audit", "verify"])
        .fails()
        .says("runwarden init --new-key");
    std::fs::remove_file(sandbox.key_file()).unwrap();

    // Not without a confirmation: nothing moves.
    sandbox
        .run(&["init", "--new-key"])
        .fails()
        .says("confirm with --yes");
    assert!(sandbox.database().exists());

    let out = sandbox.run(&["init", "--new-key", "--yes"]).ok();
    out.says("closed the old history")
        .says("created master key");
    let closed: Vec<_> = std::fs::read_dir(sandbox.data_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".closed-") || n.starts_with("CLOSED-"))
        .collect();
    assert!(
        closed.iter().any(|n| n.starts_with("runwarden.db.closed-")),
        "{closed:?}"
    );
    assert!(
        closed.iter().any(|n| n.starts_with("audit.anchor.closed-")),
        "{closed:?}"
    );
    assert!(
        closed.iter().any(|n| n.starts_with("CLOSED-")),
        "{closed:?}"
    );
    // The old audit log is still there to read, as plain rows.
    let old = closed
        .iter()
        .find(|n| n.starts_with("runwarden.db.closed-") && n.ends_with('Z'))
        .map(|n| sandbox.data_dir().join(n))
        .unwrap();
    let rows = Command::new("python3")
        .arg("-c")
        .arg("import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('select count(*) from audit_log').fetchone()[0])")
        .arg(&old)
        .output()
        .unwrap();
    let rows: u64 = String::from_utf8_lossy(&rows.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(rows > 0, "the closed history has its audit rows");
    // The new installation works: a new vault (the old secret is not in it) and a new chain.
    let list = sandbox.run(&["secret", "list"]).ok();
    assert!(
        !list
            .stdout
            .lines()
            .any(|l| l.split_whitespace().next() == Some("t")),
        "{list:#?}"
    );
    sandbox.run(&["audit", "verify"]).ok().says("intact");
    // With the key back in place, --new-key has nothing to do.
    sandbox
        .run(&["init", "--new-key", "--yes"])
        .fails()
        .says("nothing is lost");
}
