//! `runwarden demo`, the README's first command: with no configuration it cancels a run
//! whose non-idempotent tool call is on the wire, shows the transfer torn down within
//! milliseconds, the run cancelled with its write fence, the audit rows, and leaves
//! nothing behind unless asked to.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

use crate::support::{Output, Sandbox};

/// A generous bound: the demo's own figure is about a millisecond (in-process wake-up).
const TEARDOWN_BOUND_MS: f64 = 1000.0;

/// The binary's `demo` with its temporary directories under `<sandbox>/tmp`, so the test
/// sees exactly what it leaves behind.
fn demo(sandbox: &Sandbox, args: &[&str]) -> Output {
    let tmp = tmp(sandbox);
    std::fs::create_dir_all(&tmp).unwrap();
    let mut command = sandbox.command(&[&["demo"], args].concat());
    command.env("TMPDIR", &tmp);
    sandbox.run_command(command)
}

fn tmp(sandbox: &Sandbox) -> PathBuf {
    sandbox.path().join("tmp")
}

fn leftovers(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect()
}

#[test]
fn the_demo_needs_no_setup_and_its_timeline_shows_the_cancelled_transfer() {
    let sandbox = Sandbox::empty();
    let out = demo(&sandbox, &[]).ok();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines.iter().any(|l| l.contains("cancel issued")),
        "{out:#?}"
    );
    let teardown = lines
        .iter()
        .find(|l| l.contains("torn down"))
        .unwrap_or_else(|| panic!("no torn-down transfer in {out:#?}"));
    let ms: f64 = teardown
        .split("(+")
        .nth(1)
        .and_then(|rest| rest.split(" ms after the cancel").next())
        .and_then(|figure| figure.parse().ok())
        .unwrap_or_else(|| panic!("no ms figure in {teardown:?}"));
    assert!(ms < TEARDOWN_BOUND_MS, "{teardown}");
    let out = out
        .says("status    cancelled")
        .says("pending_effect: non_idempotent_write")
        .says("never retried")
        .says("http_call_cancelled")
        .says("verify    intact")
        // R12: the second act, a write that waits for an operator.
        .says("needs an operator; the run waits (waiting_for_approval), the server saw 0 calls")
        .says("approved by demo; the run resumed: completed, the server saw 1 call");
    assert!(out.stdout.lines().count() <= 35, "too long: {out:#?}");
    // One status vocabulary, the one `status`, the API and the console use; every
    // server it names is introduced first.
    for word in [
        "AWAITING_APPROVAL",
        "WAITING_FOR_APPROVAL",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
    ] {
        assert!(!out.stdout.contains(word), "{word} in {out:#?}");
    }
    let intro = out.stdout.find("\ndesk at http://127.0.0.1:");
    assert!(
        intro.is_some_and(|at| out.stdout.find("desk__create_ticket needs an operator") > Some(at)),
        "{out:#?}"
    );
    assert_eq!(
        out.stdout.matches("may have reached the server").count(),
        1,
        "{out:#?}"
    );
    // It wrote nothing where it was run: no config, no data directory.
    assert!(!sandbox.config().exists() && !sandbox.data_dir().exists());
    assert!(leftovers(&tmp(&sandbox)).is_empty(), "left behind");
}

#[test]
fn the_demo_json_reports_a_cancelled_run_its_fence_and_a_fast_teardown() {
    let sandbox = Sandbox::empty();
    let out = demo(&sandbox, &["--json"]).ok();
    let report = out.json();
    assert_eq!(report["ok"], true, "{report:#}");
    assert_eq!(report["status"], "cancelled", "{report:#}");
    let approval = &report["approval"];
    assert_eq!(approval["parked"], "waiting_for_approval", "{report:#}");
    assert_eq!(
        approval["calls_while_waiting"], 0,
        "R12: nothing sent while it waits"
    );
    assert_eq!(approval["outcome"], "completed", "{report:#}");
    assert_eq!(
        approval["calls_after"], 1,
        "approved: the call is made once"
    );
    assert_eq!(
        report["pending_effect"], "non_idempotent_write",
        "{report:#}"
    );
    let ms = report["cancel_to_close_ms"]
        .as_f64()
        .unwrap_or_else(|| panic!("cancel_to_close_ms is not a number: {report:#}"));
    assert!((0.0..TEARDOWN_BOUND_MS).contains(&ms), "{report:#}");
    let actions: Vec<&str> = report["audit"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|row| row["action"].as_str())
        .collect();
    assert!(actions.contains(&"http_call_cancelled"), "{actions:?}");
    assert_eq!(report["audit_verify"]["intact"], true, "{report:#}");
    let kinds: Vec<&str> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|event| event["kind"].as_str())
        .collect();
    for kind in ["cancel_issued", "transfer_torn_down", "run_stopped"] {
        assert!(kinds.contains(&kind), "{kind} missing from {kinds:?}");
    }
    let data_dir = PathBuf::from(report["data_dir"].as_str().unwrap());
    assert!(data_dir.starts_with(tmp(&sandbox)), "{data_dir:?}");
    assert!(
        !data_dir.exists(),
        "the temporary directory outlived the demo"
    );
    assert!(leftovers(&tmp(&sandbox)).is_empty(), "left behind");
}

#[test]
fn the_demo_keeps_a_working_installation_only_when_asked() {
    let sandbox = Sandbox::empty();
    let out = demo(&sandbox, &["--json", "--keep"]).ok();
    let report = out.json();
    assert_eq!(report["kept"], true, "{report:#}");
    let kept = PathBuf::from(report["data_dir"].as_str().unwrap());
    let config = kept.join("runwarden.toml");
    assert!(config.exists(), "{report:#}");
    // The kept installation is a real one: the audit chain verifies from another process.
    let mut command = Command::new(env!("CARGO_BIN_EXE_runwarden"));
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RUNWARDEN_") {
            command.env_remove(name);
        }
    }
    command
        .arg("--config")
        .arg(&config)
        .args(["--json", "audit", "verify"])
        .stdin(Stdio::null());
    let verify: Value = sandbox.run_command(command).ok().json();
    assert_eq!(verify["intact"], true, "{verify:#}");

    let human = demo(&sandbox, &["--keep"]).ok();
    let line = human
        .stdout
        .lines()
        .find(|l| l.starts_with("kept "))
        .unwrap_or_else(|| panic!("the kept path is not printed: {human:#?}"));
    let path = line["kept ".len()..].split(' ').next().unwrap();
    assert!(Path::new(path).join("runwarden.toml").exists(), "{line}");
}
