//! O4 in a real browser: Debian's chromium driven by Playwright (`playwright-core`, see
//! `scripts/browser.sh`) against a real `runwarden serve` with the real Python MCP peer.
//! The scenarios live in `tests/console/scenarios.mjs`: sign in; a run started through the
//! API appears on the runs page without a reload; its timeline fills live; Cancel tears
//! down the tool call in flight (the peer sees it within 1 s) and the page shows
//! `cancelled` with the fence; a required approval appears in the queue and Approve makes
//! the call once; a hostile tool result is shown as text; a forged POST without the CSRF
//! token is refused; a viewer sees no buttons and is refused anyway; nothing is blocked by
//! the CSP. This test then checks the peer's own counters and that no saved page holds the
//! MCP server's secret. Screenshots and pages are kept in `target/tmp/console-screenshots`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use runwarden_testkit::Peer;
use serde_json::{Value, json};

use crate::support::serve::{Serve, token};
use crate::support::{SIGIL, Sandbox, runwarden};

/// Where `scripts/browser.sh` installed playwright-core, `$RUNWARDEN_BROWSER_DIR`; without it
/// the test fails at once with the command that provides it, never skips.
pub(crate) fn browser_dir() -> PathBuf {
    runwarden_testkit::required_path(
        "RUNWARDEN_BROWSER_DIR",
        "the browser (Debian's chromium and playwright-core)",
        "scripts/browser.sh",
    )
}

/// The machine's Node (20 or newer), else the Node 22 of the conformance cache.
pub(crate) fn node() -> PathBuf {
    let system = PathBuf::from("/usr/bin/node");
    if system.exists() {
        return system;
    }
    let conformance = std::env::var_os("RUNWARDEN_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default())
                .join(".cache/runwarden-conformance")
        });
    let node = conformance.join("node/bin/node");
    assert!(
        node.exists(),
        "no Node to drive the browser: apt-get install -y -q nodejs, or run `bash scripts/conformance.sh`"
    );
    node
}

/// Where the screenshots go: `target/tmp/console-screenshots/NAME`, emptied first.
pub(crate) fn screenshots(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("console-screenshots")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("the screenshot directory");
    dir
}

/// How often the peer ran each counted thing, by its own count.
fn counter(peer: &Peer, name: &str) -> u64 {
    let stats: Value = serde_json::from_str(&peer.stats()).expect("the peer's stats are JSON");
    stats[name].as_u64().unwrap_or(0)
}

/// An initialised sandbox with the peer imported as `peer` (a bearer secret holding
/// [`SIGIL`]; `create_ticket` needs an approval) and three agents: `slowpoke` (a 1.5 s
/// `slow` call, then a 30 s one), `ticket` (`create_ticket`), `hostile` (echoes markup).
pub(crate) async fn install(peer: &Peer) -> Arc<Sandbox> {
    let sandbox = Sandbox::initialised();
    sandbox.allow_loopback();
    sandbox.put("peer-token", SIGIL);
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(&format!(
        "\n[mcp.servers.peer]\nurl = \"{}\"\nauth = {{ secret = \"peer-token\", placement = \"bearer\" }}\n\n[mcp.servers.peer.tools.create_ticket]\napproval = \"required\"\n",
        peer.url()
    ));
    let plans = [
        (
            "slowpoke",
            "peer__slow",
            json!([
                {"tool_calls": [{"name": "peer__slow", "arguments": {"seconds": 1.5}}]},
                {"tool_calls": [{"name": "peer__slow", "arguments": {"seconds": 30}}]},
                {"text": "done"}
            ]),
        ),
        (
            "ticket",
            "peer__create_ticket",
            json!([
                {"tool_calls": [{"name": "peer__create_ticket", "arguments": {"title": "printer on fire"}}]},
                {"text": "done"}
            ]),
        ),
        (
            "hostile",
            "peer__echo",
            json!([
                {"tool_calls": [{"name": "peer__echo", "arguments": {"text": "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"}}]},
                {"text": "done"}
            ]),
        ),
    ];
    for (agent, tool, plan) in plans {
        text.push_str(&format!(
            "\n[agents.{agent}]\nprovider = \"scripted\"\nscript = \"{agent}.json\"\ntools = [\"{tool}\"]\n"
        ));
        std::fs::write(
            sandbox.path().join(format!("{agent}.json")),
            plan.to_string(),
        )
        .unwrap();
    }
    std::fs::write(sandbox.config(), text).unwrap();
    let sandbox = Arc::new(sandbox);
    runwarden(&sandbox, &["mcp", "import", "peer"]).await.ok();
    sandbox
}

/// Runs one Playwright script with the console's address and tokens; answers its JSON
/// lines, failing with all of its output when it failed.
pub(crate) async fn drive(script: &str, envs: Vec<(&'static str, String)>) -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/console")
        .join(script);
    let mut command = Command::new(node());
    command
        .arg(&path)
        .env("RUNWARDEN_BROWSER_DIR", browser_dir())
        .envs(envs);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .expect("node runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed:\n{stdout}\n{stderr}"
    );
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser_signs_in_follows_runs_live_cancels_approves_and_escapes() {
    let peer = Peer::start(&[]);
    let sandbox = install(&peer).await;
    let operator = token(&sandbox, "operator").await;
    let viewer = token(&sandbox, "viewer").await;
    let serve = Serve::start(&sandbox, 2).await;
    let out = screenshots("scenarios");
    let steps = drive(
        "scenarios.mjs",
        vec![
            ("RW_BASE", serve.url()),
            ("RW_OPERATOR", operator),
            ("RW_VIEWER", viewer),
            ("RW_PEER", format!("http://127.0.0.1:{}", peer.port)),
            ("RW_OUT", out.display().to_string()),
        ],
    )
    .await;
    let names: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    assert_eq!(
        names,
        [
            "sign_in",
            "runs_live",
            "timeline_live",
            "cancel",
            "approval",
            "hostile_result",
            "audit_mcp_metrics",
            "forged_post",
            "viewer",
            "csp",
            "done"
        ],
        "{steps:#?}"
    );
    let done = steps.last().unwrap();
    let cancel_ms = done["figures"]["cancel_to_peer_ms"].as_u64().unwrap();
    assert!(
        cancel_ms < 1000,
        "the peer saw the cancel after {cancel_ms} ms"
    );
    // The peer's own counters: one call cancelled in flight, one approved ticket (the
    // second ticket run still waits), and the cancelled call was never completed.
    assert_eq!(counter(&peer, "slow_cancelled"), 1);
    assert_eq!(
        counter(&peer, "slow_completed"),
        1,
        "only the 1.5 s call finished"
    );
    assert_eq!(counter(&peer, "create_ticket_calls"), 1);
    // Nothing the console rendered holds the MCP server's secret.
    let mut pages = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "html") {
            pages += 1;
            let html = std::fs::read_to_string(&path).unwrap();
            assert!(!html.contains(SIGIL), "{} holds the secret", path.display());
        }
    }
    assert!(pages >= 9, "every page was saved ({pages})");
    println!(
        "console screenshots in {} ; figures {}",
        out.display(),
        done["figures"]
    );
    drop(serve);
}
