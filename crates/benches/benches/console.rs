//! The console's figures (O4): the runs page's weight on the wire and its time to first
//! render in headless chromium, and with 200 run status changes a second made through the
//! API, that the runs page stays live and what `serve`'s CPU costs, against the same churn
//! with no console open (the baseline measured in the same run). The browser side is
//! `tests/console/bench.mjs`, driven with playwright-core (`bash scripts/browser.sh`).
//!
//! Run: `cargo bench -p runwarden-benches --bench console` (add `-- --json` for the JSON line,
//! `-- --seconds 10` for a longer churn).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use runwarden_benches as _;
use serde_json::Value;

use common::runwarden;

fn browser_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("RUNWARDEN_BROWSER_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/browser.sh");
    let output = Command::new("bash")
        .arg(script)
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "run `bash scripts/browser.sh` first: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    )
}

fn main() {
    let json_output = std::env::args().any(|a| a == "--json");
    let seconds = std::env::args()
        .skip_while(|a| a != "--seconds")
        .nth(1)
        .unwrap_or_else(|| "5".into());
    let dir = tempfile::tempdir().unwrap();
    runwarden(dir.path(), &["init"]);
    let config = dir.path().join("runwarden.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(&config, text).unwrap();
    std::fs::write(dir.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    let token = common::token(dir.path(), "operator");
    // No worker slots: runs change status only by the bench's creates and cancels.
    let (serve, url) = common::serve(
        common::command(&config, &[]),
        &["--listen", "127.0.0.1:0", "--concurrency", "0"],
        Stdio::null(),
    );
    let node = if Path::new("/usr/bin/node").exists() {
        PathBuf::from("/usr/bin/node")
    } else {
        PathBuf::from(std::env::var("RUNWARDEN_CONFORMANCE_DIR").unwrap_or_default())
            .join("node/bin/node")
    };
    let output = Command::new(node)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../runwarden/tests/console/bench.mjs"))
        .env("RUNWARDEN_BROWSER_DIR", browser_dir())
        .env("RW_BASE", &url)
        .env("RW_OPERATOR", &token)
        .env("RW_SERVE_PID", serve.0.id().to_string())
        .env("RW_SECONDS", &seconds)
        .output()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench.mjs failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line = stdout.lines().last().unwrap_or_default();
    if json_output {
        println!("{line}");
        return;
    }
    let f: Value = serde_json::from_str(line).expect("bench.mjs prints JSON");
    println!(
        "the console against runwarden serve on 127.0.0.1, headless chromium ({seconds} s of churn)"
    );
    println!("| figure | value |");
    println!("| --- | --- |");
    println!(
        "| runs page on the wire (document + script + stylesheet, 50 rows, no cache) | {} bytes |",
        f["runs_page_bytes"]
    );
    println!(
        "| of which the HTML document | {} bytes |",
        f["runs_document_bytes"]
    );
    println!(
        "| first contentful paint, p50 / max of 5 loads | {:.0} ms / {:.0} ms |",
        f["first_contentful_paint_ms"]["p50"]
            .as_f64()
            .unwrap_or(f64::NAN),
        f["first_contentful_paint_ms"]["max"]
            .as_f64()
            .unwrap_or(f64::NAN)
    );
    println!(
        "| status changes reached, baseline / with the page open | {:.0}/s / {:.0}/s |",
        f["churn_changes_per_second"]["baseline"]
            .as_f64()
            .unwrap_or(0.0),
        f["churn_changes_per_second"]["live"]
            .as_f64()
            .unwrap_or(0.0)
    );
    println!(
        "| serve CPU, baseline (no console) / runs page open | {:.3} / {:.3} cores |",
        f["serve_cores"]["baseline"].as_f64().unwrap_or(0.0),
        f["serve_cores"]["live"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| rows updates pushed to the page | {} ({:.1}/s) |",
        f["rows_updates"],
        f["rows_updates_per_second"].as_f64().unwrap_or(0.0)
    );
    println!(
        "| longest gap between two updates | {:.0} ms |",
        f["longest_gap_ms"].as_f64().unwrap_or(f64::NAN)
    );
    println!(
        "| newest run shown as cancelled, after the churn ended | {} ms |",
        f["newest_run_shown_after_churn_ms"]
    );
}
