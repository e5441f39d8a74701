//! The process and its files against a hostile neighbourhood: files private to the owner,
//! no core dumps, read commands that never wait for the write lock, and an API that slow
//! or idle clients cannot take down.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::{Live, Sandbox, runwarden};

/// A bound on a step that should take milliseconds; it only fails a hung test.
const WAIT: Duration = Duration::from_secs(10);

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

fn sibling(path: &std::path::Path, suffix: &str) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    name.into()
}

/// An initialised sandbox with `[serve]` limits appended and a viewer token.
async fn serving_sandbox(serve_section: &str) -> (Arc<Sandbox>, String) {
    let sandbox = Arc::new(Sandbox::initialised());
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str(serve_section);
    std::fs::write(sandbox.config(), text).unwrap();
    let created = runwarden(&sandbox, &["--json", "token", "create", "--role", "viewer"])
        .await
        .ok()
        .json();
    (sandbox, created["token"].as_str().unwrap().to_string())
}

/// `runwarden serve` on a free port with no workers; answers the process and its URL.
async fn serve(sandbox: &Sandbox) -> (Live, String) {
    let (live, ready) = crate::support::serve_api(sandbox).await;
    let url = ready["url"].as_str().unwrap_or_default().to_string();
    (live, url)
}

fn address(url: &str) -> String {
    url.trim_start_matches("http://").to_string()
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_creates_a_private_data_directory_database_and_key_and_serve_keeps_wal_and_shm_private()
 {
    let (sandbox, _) = serving_sandbox("").await;
    assert_eq!(mode(&sandbox.data_dir()), 0o700);
    assert_eq!(mode(&sandbox.database()), 0o600);
    assert_eq!(mode(&sandbox.key_file()), 0o600);
    let (live, _) = serve(&sandbox).await;
    for file in [
        sandbox.database(),
        sibling(&sandbox.database(), "-wal"),
        sibling(&sandbox.database(), "-shm"),
    ] {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    live.signal("KILL");
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_installation_open_to_other_users_is_tightened_with_a_warning() {
    use std::os::unix::fs::PermissionsExt as _;
    let sandbox = Arc::new(Sandbox::initialised());
    let loose = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    loose(&sandbox.data_dir(), 0o755);
    loose(&sandbox.database(), 0o644);
    let listed = runwarden(&sandbox, &["token", "list"]).await.ok();
    assert_eq!(mode(&sandbox.data_dir()), 0o700);
    assert_eq!(mode(&sandbox.database()), 0o600);
    assert!(
        listed
            .stderr
            .contains("was mode 0755, open to other users: tightened it to 0700"),
        "{listed:?}"
    );
    assert!(
        listed
            .stderr
            .contains("was mode 0644, readable by other users: tightened it to 0600"),
        "{listed:?}"
    );
    let again = runwarden(&sandbox, &["token", "list"]).await.ok();
    assert!(!again.stderr.contains("warning"), "{again:?}");
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_runs_without_core_dumps_and_with_its_open_file_limit_raised() {
    let (sandbox, _) = serving_sandbox("").await;
    let (live, _) = serve(&sandbox).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", live.pid)).unwrap();
    let row = |name: &str| -> Vec<String> {
        let line = limits
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in\n{limits}"));
        line[name.len()..]
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let core = row("Max core file size");
    assert_eq!(
        &core[..2],
        ["0", "0"],
        "soft and hard core limits: {core:?}"
    );
    let files = row("Max open files");
    assert_eq!(
        files[0], files[1],
        "the soft open-file limit is raised to the hard one"
    );
    live.signal("KILL");
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_and_run_run_without_core_dumps() {
    let sandbox = Arc::new(Sandbox::initialised());
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(sandbox.config(), text).unwrap();
    std::fs::write(sandbox.path().join("plan.json"), r#"[{"text": "done"}]"#).unwrap();
    let mut worker = Live::start(&sandbox, &["worker"]);
    let announced = worker.err_line().await; // the ready line: hardening is done by then
    assert!(announced.contains("claiming queued runs"), "{announced}");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", worker.pid)).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    assert_eq!(
        core.split_whitespace().skip(4).take(2).collect::<Vec<_>>(),
        ["0", "0"],
        "{core}"
    );
    worker.signal("KILL");
    // `run` ends at once with this plan; the hardening happens before any work, and a
    // failure to harden would refuse to start, so a successful run is the proof here.
    runwarden(&sandbox, &["run", "--agent", "a", "hello"])
        .await
        .ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_commands_work_while_another_process_holds_the_write_lock() {
    let sandbox = Arc::new(Sandbox::initialised());
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(sandbox.config(), text).unwrap();
    let queued = runwarden(&sandbox, &["--json", "enqueue", "--agent", "a", "hi"])
        .await
        .ok()
        .json();
    let id = queued["run_id"].as_str().unwrap().to_string();

    let holder = rusqlite::Connection::open(sandbox.database()).unwrap();
    holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
    let commands: [&[&str]; 7] = [
        &["status", &id],
        &["events", &id],
        &["audit", "list"],
        &["audit", "verify"],
        &["mcp", "list"],
        &["secret", "list"],
        &["token", "list"],
    ];
    for args in commands {
        let started = Instant::now();
        let output = runwarden(&sandbox, args).await.ok();
        // A command that needed the write lock would wait out the five-second busy
        // timeout and then fail.
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{args:?} took {:?}: {output:?}",
            started.elapsed()
        );
    }
    // A write in the meantime fails with a message that says what is going on.
    let refused = runwarden(&sandbox, &["enqueue", "--agent", "a", "hi"])
        .await
        .fails();
    assert!(
        refused
            .stderr
            .contains("another process holds the write lock"),
        "{refused:?}"
    );
    holder.execute_batch("ROLLBACK").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keep_alive_connection_is_closed_after_the_idle_timeout_and_a_live_stream_is_not() {
    let (sandbox, viewer) = serving_sandbox(
        "\n[serve]\nheader_read_timeout_seconds = 1\nidle_timeout_seconds = 2\n\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n",
    )
    .await;
    let queued = runwarden(&sandbox, &["--json", "enqueue", "--agent", "a", "hi"])
        .await
        .ok()
        .json();
    let id = queued["run_id"].as_str().unwrap().to_string();
    let (live, url) = serve(&sandbox).await;
    let addr = address(&url);

    let idle = tokio::task::spawn_blocking({
        let addr = addr.clone();
        move || {
            let mut stream = TcpStream::connect(&addr).unwrap();
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
                .unwrap();
            stream.set_read_timeout(Some(WAIT)).unwrap();
            let mut seen = Vec::new();
            let mut chunk = [0u8; 1024];
            let answered = loop {
                let n = stream.read(&mut chunk).unwrap();
                seen.extend_from_slice(&chunk[..n]);
                if seen.windows(4).any(|w| w == b"\r\n\r\n") && seen.ends_with(b"}") {
                    break Instant::now();
                }
                assert!(n > 0, "closed before the answer");
            };
            // Kept alive, no request: the server closes it after the idle timeout.
            let n = stream
                .read(&mut chunk)
                .expect("closed, not timed out on our side");
            (n, answered.elapsed())
        }
    });

    // A live event stream of a queued run (no worker): it stays open past the idle
    // timeout, because a response is in flight.
    let mut stream = reqwest::Client::new()
        .get(format!("{url}/v1/runs/{id}/events"))
        .header("accept", "text/event-stream")
        .bearer_auth(&viewer)
        .send()
        .await
        .unwrap();
    let opened = Instant::now();
    assert_eq!(stream.status(), 200);
    let (closed_after, idle_for) = idle.await.unwrap();
    assert_eq!(
        closed_after, 0,
        "the idle connection was closed by the server"
    );
    assert!(
        idle_for >= Duration::from_millis(1500) && idle_for < Duration::from_secs(6),
        "closed after {idle_for:?} of idleness; the idle timeout is 2 s"
    );
    // The stream stays open until twice the idle timeout has passed since it opened
    // (whatever it sends in the meantime).
    let until = opened + Duration::from_secs(4);
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.chunk()).await {
            Err(_) => break, // still open at the end of the window
            Ok(Ok(Some(_))) => continue,
            Ok(other) => panic!(
                "the live stream ended after {:?}: {other:?}",
                opened.elapsed()
            ),
        }
    }
    live.signal("KILL");
}

/// `command` as an unprivileged user when the tests run as root (root ignores file
/// permissions); as it is otherwise.
#[cfg(target_os = "linux")]
fn unprivileged(command: std::process::Command) -> std::process::Command {
    let is_root = std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"));
    if !is_root {
        return command;
    }
    let mut wrapped = std::process::Command::new("setpriv");
    wrapped
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(command.get_program())
        .args(command.get_args());
    if let Some(dir) = command.get_current_dir() {
        wrapped.current_dir(dir);
    }
    for (name, value) in command.get_envs() {
        match value {
            Some(value) => wrapped.env(name, value),
            None => wrapped.env_remove(name),
        };
    }
    wrapped.stdin(std::process::Stdio::null());
    wrapped
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_its_user_cannot_write_is_a_read_only_fault_that_says_to_check_permissions() {
    use std::os::unix::fs::PermissionsExt as _;
    let sandbox = Arc::new(Sandbox::initialised());
    let mut text = std::fs::read_to_string(sandbox.config()).unwrap();
    text.push_str("\n[agents.a]\nprovider = \"scripted\"\nscript = \"plan.json\"\n");
    std::fs::write(sandbox.config(), text).unwrap();
    // Readable by everyone, writable by its owner only: another user meets a read-only
    // database in a directory it cannot write.
    for (path, mode) in [
        (sandbox.path().to_path_buf(), 0o755),
        (sandbox.data_dir(), 0o755),
        (sandbox.config(), 0o644),
        (sandbox.database(), 0o644),
    ] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    let command = unprivileged(sandbox.command(&["enqueue", "--agent", "a", "hi"]));
    let refused = tokio::task::spawn_blocking(move || sandbox.run_command(command))
        .await
        .unwrap()
        .fails();
    assert!(
        refused
            .stderr
            .contains("check the file's and the directory's permissions"),
        "{refused:?}"
    );
    assert!(!refused.stderr.contains("disk I/O error"), "{refused:?}");
}
