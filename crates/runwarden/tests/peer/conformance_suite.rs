//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, versions 0.1.16
//! and 0.2.0-alpha.12, installed by `scripts/conformance.sh`) drives runwarden's CLI through
//! `tests/conformance/client.sh` in each of its client scenarios. Every scenario must pass,
//! OAuth (`auth/*`, M18, with its extensions: DPoP, workload identity, cross-app access)
//! and the 2026-07-28 revision (M19, with `tools_call` run again with `--spec-version
//! 2026-07-28`) included, but for the few listed in [`EXPECTED_FAILURES`] with the reason;
//! a listed one that passes fails the test, so the list never goes stale.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The suite versions the issue was measured with.
const VERSIONS: [&str; 2] = ["0.1.16", "0.2.0-alpha.12"];

/// M19: scenarios run a second time at the 2026-07-28 revision (`--spec-version`), shown
/// as `NAME@2026-07-28`, each required.
const AT_2026: &[&str] = &["tools_call"];

/// The suffix of a scenario run at the 2026-07-28 revision.
const AT_2026_SUFFIX: &str = "@2026-07-28";

/// Required scenarios known to fail, with why. Each must still fail.
const EXPECTED_FAILURES: &[(&str, &str)] = &[];

/// How many scenarios run at once: each is a Node process plus a few short CLI runs.
const WORKERS: usize = 3;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The suite's cache directory, `$RUNWARDEN_CONFORMANCE_DIR` (what `scripts/conformance.sh`
/// prints last; `.ci/run` sets it); without it the test fails at once, never skips.
fn suite_dir() -> PathBuf {
    runwarden_testkit::required_path(
        "RUNWARDEN_CONFORMANCE_DIR",
        "the official MCP conformance suite (with Node 22)",
        "scripts/conformance.sh",
    )
}

struct Suite {
    version: &'static str,
    node: PathBuf,
    entry: PathBuf,
}

impl Suite {
    fn new(dir: &Path, version: &'static str) -> Self {
        let entry = dir.join(format!(
            "suite-{version}/node_modules/@modelcontextprotocol/conformance/dist/index.js"
        ));
        assert!(entry.exists(), "{} is missing", entry.display());
        Self {
            version,
            node: dir.join("node/bin/node"),
            entry,
        }
    }

    /// A suite command with none of the developer's `RUNWARDEN_*` variables, so each CLI
    /// run uses only the home client.sh gives it.
    fn command(&self) -> Command {
        let mut command = Command::new(&self.node);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("RUNWARDEN_") {
                command.env_remove(name);
            }
        }
        command.arg(&self.entry).stdin(Stdio::null());
        command
    }

    /// Every client scenario with its spec-version tags, as `list` prints them.
    fn client_scenarios(&self) -> Vec<(String, String)> {
        let output = self.command().arg("list").output().expect("run the suite");
        assert!(output.status.success(), "conformance list failed");
        let text = String::from_utf8_lossy(&output.stdout);
        text.split("Client scenarios")
            .nth(1)
            .expect("a client section")
            .lines()
            .skip(1)
            .take_while(|line| line.starts_with("  - "))
            .map(|line| {
                let line = line.trim_start_matches("  - ");
                let (name, tags) = line.split_once(" [").unwrap_or((line, ""));
                (name.to_string(), tags.trim_end_matches(']').to_string())
            })
            .collect()
    }

    /// Runs one scenario against the CLI; `Ok` when the suite says it passed, else the
    /// suite's failing lines.
    fn run(&self, scenario: &str, results: &Path) -> Result<(), String> {
        let client = repo_root().join("tests/conformance/client.sh");
        let mut command = self.command();
        command.arg("client");
        // M19: `NAME@2026-07-28` is NAME at the 2026-07-28 revision.
        let scenario = match scenario.strip_suffix(AT_2026_SUFFIX) {
            Some(name) => {
                command.args(["--spec-version", "2026-07-28"]);
                name
            }
            None => scenario,
        };
        let output = command
            .args(["--scenario", scenario, "--timeout", "30000"])
            .arg("--command")
            .arg(format!("bash {}", client.display()))
            .arg("-o")
            .arg(results)
            .env("RUNWARDEN_BIN", env!("CARGO_BIN_EXE_runwarden"))
            .output()
            .expect("run the suite");
        let text = String::from_utf8_lossy(&output.stdout).to_string()
            + &String::from_utf8_lossy(&output.stderr);
        if output.status.success() && text.contains("OVERALL: PASSED") {
            return Ok(());
        }
        let failing: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("FAILURE") || l.contains("Error") || l.contains("error"))
            .take(6)
            .collect();
        Err(failing.join("\n"))
    }
}

#[test]
fn the_official_conformance_suite_passes_every_client_scenario() {
    let dir = suite_dir();
    let results = tempfile::tempdir().expect("a results directory");
    let suites: Vec<Suite> = VERSIONS.iter().map(|v| Suite::new(&dir, v)).collect();
    let mut queue = VecDeque::new();
    for (index, suite) in suites.iter().enumerate() {
        for (name, tags) in suite.client_scenarios() {
            if AT_2026.contains(&name.as_str()) && suite.version != VERSIONS[0] {
                queue.push_back((index, format!("{name}{AT_2026_SUFFIX}"), tags.clone()));
            }
            queue.push_back((index, name, tags));
        }
    }
    let queue = Mutex::new(queue);
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                loop {
                    let Some((index, name, tags)) = queue.lock().unwrap().pop_front() else {
                        return;
                    };
                    let suite = &suites[index];
                    let out = results.path().join(format!(
                        "{}-{}",
                        suite.version,
                        name.replace('/', "_")
                    ));
                    let outcome = suite.run(&name, &out);
                    outcomes.lock().unwrap().push((index, name, tags, outcome));
                }
            });
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap();
    outcomes.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));

    let mut problems = Vec::new();
    for (index, suite) in suites.iter().enumerate() {
        let mine: Vec<_> = outcomes.iter().filter(|o| o.0 == index).collect();
        let passed = mine.iter().filter(|o| o.3.is_ok()).count();
        println!(
            "conformance {}: {passed} of {} client scenarios passed",
            suite.version,
            mine.len(),
        );
        for (_, name, tags, outcome) in &mine {
            let mark = if outcome.is_ok() { "pass" } else { "FAIL" };
            println!("  {mark:<6} {name} [{tags}]");
        }
        for (_, name, _, outcome) in mine {
            let expected = EXPECTED_FAILURES.iter().find(|(n, _)| n == name);
            match (outcome, expected) {
                (Ok(()), None) | (Err(_), Some(_)) => {}
                (Ok(()), Some(_)) => problems.push(format!(
                    "{} {name} passes now: remove it from EXPECTED_FAILURES",
                    suite.version
                )),
                (Err(why), None) => {
                    problems.push(format!("{} {name} failed:\n{why}", suite.version))
                }
            }
        }
    }
    for (name, why) in EXPECTED_FAILURES {
        println!("expected to fail: {name}: {why}");
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}
