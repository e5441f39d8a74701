//! `scripts/llama-server.sh` picks the model server build the CPU can run, each build
//! answers a real completion (or, where the CPU cannot run it, is refused by the signal's
//! name), and a server that dies by a signal is reported with that signal and what to do.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use runwarden_testkit::LlamaServer;

/// Every flag the prebuilt build executes (the script's PREBUILT_FLAGS) and the rest of a
/// recent CPU's list.
const RECENT_CPU: &str = "fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512bw avx512vl \
                          avx512_vnni avx512_bf16 avx_vnni";
/// An AMD EPYC (Zen 4): AVX-512 VNNI but not AVX-VNNI, where the prebuilt dies by SIGILL.
const ZEN4_CPU: &str = "fpu sse4_2 avx avx2 fma f16c bmi2 avx512f avx512bw avx512vl \
                        avx512_vnni avx512_bf16";
/// A CPU from before x86-64-v3.
const OLD_CPU: &str = "fpu sse4_2 avx";

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/llama-server.sh")
}

/// `scripts/llama-server.sh ARGS` with RUNWARDEN_LLAMA_BUILD set to `build` (or unset).
fn run_script(args: &[&str], build: Option<&str>, cpuinfo: Option<&Path>) -> Output {
    let mut command = Command::new("bash");
    command.arg(script()).args(args);
    match build {
        Some(build) => command.env("RUNWARDEN_LLAMA_BUILD", build),
        None => command.env_remove("RUNWARDEN_LLAMA_BUILD"),
    };
    if let Some(cpuinfo) = cpuinfo {
        command.env("RUNWARDEN_CPUINFO", cpuinfo);
    }
    command.output().expect("run scripts/llama-server.sh")
}

/// What `--choose` says for a CPU listing `flags`: Ok(build) or Err(stderr).
fn choice(flags: &str, build: Option<&str>) -> Result<String, String> {
    let dir = tempfile::tempdir().expect("temp dir");
    let cpuinfo = dir.path().join("cpuinfo");
    std::fs::write(&cpuinfo, format!("processor\t: 0\nflags\t\t: {flags}\n")).expect("write");
    let output = run_script(&["--choose"], build, Some(&cpuinfo));
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).trim().to_owned();
    if output.status.success() {
        Ok(text(&output.stdout))
    } else {
        Err(text(&output.stderr))
    }
}

/// The install directory of `build` (installed, and proved by one completion, when missing).
fn install(build: &str) -> PathBuf {
    let output = run_script(&[], Some(build), None);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "installing the {build} build failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(stdout.lines().last().expect("the install directory").trim())
}

/// One token from `/completion`, as the prepare step asks for it.
async fn one_token(server: &LlamaServer) -> serde_json::Value {
    reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/completion", server.port()))
        .json(&serde_json::json!({ "prompt": "Hello", "n_predict": 1 }))
        .send()
        .await
        .expect("POST /completion")
        .json()
        .await
        .expect("a JSON answer")
}

/// The panic text of `f`, which must panic.
fn panic_text(f: impl FnOnce() -> LlamaServer) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f))
        .err()
        .expect("the start must fail");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

#[test]
fn the_build_follows_the_cpu_flags() {
    assert_eq!(choice(RECENT_CPU, None).as_deref(), Ok("prebuilt"));
    assert_eq!(choice(ZEN4_CPU, None).as_deref(), Ok("portable"));
    assert_eq!(choice(ZEN4_CPU, Some("auto")).as_deref(), Ok("portable"));
    let refused = choice(OLD_CPU, None).expect_err("no build runs there");
    assert!(
        refused.contains("lacks avx2 fma f16c bmi2") && refused.contains("x86-64-v3"),
        "{refused}"
    );
    // The override wins over the flags, both ways.
    assert_eq!(
        choice(RECENT_CPU, Some("portable")).as_deref(),
        Ok("portable")
    );
    assert_eq!(
        choice(ZEN4_CPU, Some("prebuilt")).as_deref(),
        Ok("prebuilt")
    );
    let unknown = choice(RECENT_CPU, Some("fast")).expect_err("an unknown build");
    assert!(
        unknown.contains("use auto, prebuilt or portable"),
        "{unknown}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_portable_build_answers_a_completion() {
    let dir = install("portable");
    assert_eq!(
        std::fs::read_to_string(dir.join("build")).unwrap().trim(),
        "portable"
    );
    let server = LlamaServer::start_in(&dir, &[], &[]);
    let answer = one_token(&server).await;
    assert_eq!(answer["tokens_predicted"], 1, "{answer}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_prebuilt_build_answers_or_is_refused_by_its_signal() {
    let runs_here = run_script(&["--choose"], Some("auto"), None).stdout == b"prebuilt\n";
    if runs_here {
        let server = LlamaServer::start_in(&install("prebuilt"), &[], &[]);
        let answer = one_token(&server).await;
        assert_eq!(answer["tokens_predicted"], 1, "{answer}");
        return;
    }
    // This CPU lacks the prebuilt's instructions: the install's own proof refuses it.
    let output = run_script(&[], Some("prebuilt"), None);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("died by SIGILL") && stderr.contains("RUNWARDEN_LLAMA_BUILD=portable"),
        "{stderr}"
    );
}

#[test]
fn a_server_killed_by_a_signal_is_reported_by_name() {
    let chosen = run_script(&["--choose"], Some("auto"), None).stdout;
    let dir = install(String::from_utf8_lossy(&chosen).trim());
    let model = dir.join("model.gguf");
    let model = model.to_str().expect("a UTF-8 path");
    // strace delivers SIGILL when the server opens its model: what a CPU without the
    // build's instructions does to it a moment later.
    let wrapper = [
        "strace",
        "-f",
        "-qq",
        "-o",
        "/dev/null",
        "-e",
        "trace=openat,open",
    ];
    let wrapper = [
        &wrapper[..],
        &["-P", model, "-e", "inject=openat,open:signal=SIGILL"],
    ]
    .concat();
    let text = panic_text(|| LlamaServer::start_in(&dir, &wrapper, &[]));
    assert!(
        text.contains("died by SIGILL (illegal instruction), signal 4"),
        "{text}"
    );
    assert!(
        text.contains("RUNWARDEN_LLAMA_BUILD=portable bash scripts/llama-server.sh"),
        "{text}"
    );
}
