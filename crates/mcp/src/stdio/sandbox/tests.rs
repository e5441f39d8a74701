//! The sandbox against the real kernel: real processes, real namespaces, real sockets on
//! loopback. A few tests run this test binary again as a helper process (a parent to kill,
//! a process inside a namespace where the kernel refuses another one).

use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::*;

/// How long a test waits for an event before it fails.
const PATIENCE: Duration = Duration::from_secs(30);

/// The environment the test children get.
fn path_only() -> Vec<(String, String)> {
    vec![("PATH".into(), "/usr/bin:/bin".into())]
}

fn plan<'a>(program: &'a str, args: &'a [String], sandbox: SandboxMode) -> SpawnPlan<'a> {
    SpawnPlan {
        program,
        args,
        env: path_only(),
        cwd: None,
        sandbox,
        limits: ChildLimits::default(),
        proxy_port: 3128,
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

/// The python3 found on the test's own PATH, as an absolute path (the children's PATH is
/// minimal, and a shim such as pyenv's needs an environment they do not get).
fn python() -> &'static str {
    static PYTHON: OnceLock<String> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let output = std::process::Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("these tests need python3 on PATH");
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    })
}

async fn ended(exited: oneshot::Receiver<ExitReason>) -> ExitReason {
    tokio::time::timeout(PATIENCE, exited)
        .await
        .expect("the child did not end in time")
        .expect("the waiting thread went away")
}

async fn all_of(mut stream: pipe::Receiver) -> String {
    let mut text = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut text))
        .await
        .expect("the child did not close its output in time")
        .unwrap();
    text
}

/// The rest of the next line of `lines` that holds `marker`, after it. (A helper's lines
/// may follow libtest's "test NAME ... " on the same line.)
async fn line_after<R: tokio::io::AsyncBufRead + Unpin>(
    lines: &mut tokio::io::Lines<R>,
    marker: &str,
) -> String {
    tokio::time::timeout(PATIENCE, async {
        loop {
            let line = lines.next_line().await.unwrap().expect("output ended");
            if let Some(at) = line.find(marker) {
                return line[at + marker.len()..].to_owned();
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no line with {marker:?} in time"))
}

/// Whether process `pid` is gone: no entry in /proc, or ended and waiting to be reaped
/// (in a container, whoever inherits it may never reap it).
fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => {
            let state = stat[stat.rfind(')').unwrap() + 1..]
                .split_whitespace()
                .next();
            matches!(state, Some("Z" | "X"))
        }
    }
}

/// Waits until `pid` is gone, looking every 20 ms, for at most `PATIENCE`.
async fn wait_gone(pid: i32) {
    let start = Instant::now();
    while !gone(pid) {
        assert!(start.elapsed() < PATIENCE, "process {pid} is still there");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn group_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(2)?
        .parse()
        .ok()
}

/// Runs this test binary again as the helper `name`, which acts when the environment
/// variable RUNWARDEN_SANDBOX_HELPER says `role`.
fn helper_command(name: &str) -> (String, Vec<String>) {
    let exe = std::env::current_exe().unwrap();
    let test = format!("stdio::sandbox::tests::{name}");
    let args = [
        "--exact",
        &test,
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ];
    (exe.to_str().unwrap().to_owned(), strings(&args))
}

fn helper_role() -> Option<String> {
    std::env::var("RUNWARDEN_SANDBOX_HELPER").ok()
}

#[tokio::test]
async fn the_child_leads_its_own_group_and_one_signal_ends_every_descendant() {
    // Unsandboxed, so the pid the shell prints is the host's (in a sandbox it is the one
    // of the server's own PID namespace).
    let args = strings(&["-c", "sleep 600 & echo $!; wait"]);
    let spawned = spawn(plan("sh", &args, SandboxMode::Unsandboxed))
        .await
        .unwrap();
    let mut lines = BufReader::new(spawned.stdout).lines();
    let grandchild: i32 = line_after(&mut lines, "").await.parse().unwrap();
    assert_eq!(group_of(spawned.pid), Some(spawned.pid));
    assert_eq!(group_of(grandchild), Some(spawned.pid));
    kill_group(spawned.pid, Signal::Term);
    assert_eq!(
        ended(spawned.exited).await,
        ExitReason::Signalled(libc::SIGTERM)
    );
    wait_gone(grandchild).await;
}

/// The host pids of the processes whose command line is exactly `words`.
fn pids_running(words: &[&str]) -> Vec<i32> {
    let wanted: Vec<u8> = words
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted))
        .collect()
}

#[tokio::test]
async fn in_a_sandbox_what_the_server_starts_dies_with_the_process_runwarden_started() {
    // A descendant that leaves the process group (setsid) is still in the server's PID
    // namespace: when the process runwarden started dies (as it does when runwarden
    // dies), the server dies, and the kernel kills everything else in the namespace.
    let marker = "6017";
    let args = strings(&["-c", &format!("setsid sleep {marker} & echo started; wait")]);
    let spawned = spawn(plan("sh", &args, SandboxMode::Namespace))
        .await
        .unwrap();
    let mut lines = BufReader::new(spawned.stdout).lines();
    line_after(&mut lines, "").await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let sleeper = loop {
        if let [pid] = pids_running(&["sleep", marker])[..] {
            break pid;
        }
        assert!(Instant::now() < deadline, "the sleeper never showed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_ne!(group_of(sleeper), Some(spawned.pid), "it left the group");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &spawned.pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_gone(sleeper).await;
    let _ = ended(spawned.exited).await;
}

/// The helper of `a_child_dies_with_runwarden_even_by_kill_9`: starts one child in a
/// namespace and one without, prints their pids and waits to be killed.
#[tokio::test]
#[ignore = "a helper the sandbox tests run as a subprocess"]
async fn helper_parent() {
    if helper_role().as_deref() != Some("parent") {
        return;
    }
    let args = strings(&["600"]);
    let inside = spawn(plan("sleep", &args, SandboxMode::Namespace))
        .await
        .unwrap();
    let outside = spawn(plan("sleep", &args, SandboxMode::Unsandboxed))
        .await
        .unwrap();
    println!("PIDS {} {}", inside.pid, outside.pid);
    std::future::pending::<()>().await;
}

/// A helper process, killed (SIGKILL) and reaped when dropped, also when a test fails.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn a_child_dies_with_runwarden_even_by_kill_9() {
    let (exe, args) = helper_command("helper_parent");
    let mut parent = KilledOnDrop(
        std::process::Command::new(exe)
            .args(args)
            .env("RUNWARDEN_SANDBOX_HELPER", "parent")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = pipe::Receiver::from_owned_fd(parent.0.stdout.take().unwrap().into()).unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let pids: Vec<i32> = line_after(&mut lines, "PIDS ")
        .await
        .split(' ')
        .map(|pid| pid.parse().unwrap())
        .collect();
    assert!(pids.iter().all(|pid| !gone(*pid)), "{pids:?}");
    // SIGKILL: the parent gets no chance to stop its children itself.
    drop(parent);
    for pid in pids {
        wait_gone(pid).await;
    }
}

#[tokio::test]
async fn the_pipes_carry_standard_input_output_and_error() {
    let args = strings(&[
        "-c",
        "read line; echo \"out $line\"; echo \"err $line\" >&2; exit 3",
    ]);
    let mut spawned = spawn(plan("sh", &args, SandboxMode::Namespace))
        .await
        .unwrap();
    spawned.stdin.write_all(b"hello\n").await.unwrap();
    assert_eq!(all_of(spawned.stdout).await, "out hello\n");
    assert_eq!(all_of(spawned.stderr).await, "err hello\n");
    let reason = ended(spawned.exited).await;
    assert_eq!(reason, ExitReason::Exited(3));
    assert_eq!(reason.to_string(), "exited with status 3");
}

/// Whether a process runs whose command line holds `argument`.
fn running_with(argument: &str) -> bool {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return false;
    };
    entries.flatten().any(|entry| {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        cmdline
            .split(|byte| *byte == 0)
            .any(|arg| arg == argument.as_bytes())
    })
}

#[tokio::test]
async fn a_process_started_for_a_caller_that_has_gone_is_killed() {
    // A duration no other test sleeps, to find this process by.
    let marker = format!("600.{}", std::process::id());
    let args = strings(&[&marker]);
    // The first poll hands the job to the spawner; then the deadline drops the future,
    // unless the spawner answered before that first poll ended (on a busy machine): then
    // that process is ours to kill, and we try again.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let job = spawn(plan("sleep", &args, SandboxMode::Namespace));
        match tokio::time::timeout(Duration::ZERO, job).await {
            Err(_) => break,
            Ok(started) => kill_group(started.unwrap().pid, Signal::Kill),
        }
        assert!(
            attempts < 100,
            "the spawner always answered within the first poll"
        );
    }
    // The spawner takes jobs in order: once a later one is done, the first one is too.
    let later = spawn(plan("true", &[], SandboxMode::Unsandboxed))
        .await
        .unwrap();
    assert_eq!(ended(later.exited).await, ExitReason::Exited(0));
    let start = Instant::now();
    while running_with(&marker) {
        assert!(
            start.elapsed() < PATIENCE,
            "the abandoned process still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn open_files_and_cpu_time_are_limited_soft_and_hard() {
    let args = strings(&["-c", "ulimit -Sn; ulimit -Hn; ulimit -St; ulimit -Ht"]);
    let mut plan = plan("sh", &args, SandboxMode::Namespace);
    plan.limits.open_files = 77;
    plan.limits.cpu_seconds = Some(5);
    let spawned = spawn(plan).await.unwrap();
    assert_eq!(all_of(spawned.stdout).await, "77\n77\n5\n6\n");
    assert_eq!(ended(spawned.exited).await, ExitReason::Exited(0));
}

#[tokio::test]
async fn a_busy_child_is_stopped_at_its_cpu_time_limit_even_when_it_ignores_sigxcpu() {
    for script in ["while :; do :; done", "trap '' XCPU; while :; do :; done"] {
        let args = strings(&["-c", script]);
        let mut plan = plan("sh", &args, SandboxMode::Unsandboxed);
        plan.limits.cpu_seconds = Some(1);
        let spawned = spawn(plan).await.unwrap();
        let reason = ended(spawned.exited).await;
        assert_eq!(reason, ExitReason::CpuLimit(1), "{script}");
        assert_eq!(reason.to_string(), "over its CPU time limit of 1 second");
    }
}

#[tokio::test]
async fn the_memory_of_every_process_in_the_group_is_counted() {
    // The shell stays as the group's leader; python, its child, holds the memory.
    let script = "import sys; b = b'x' * (100 << 20); print('ready', flush=True); sys.stdin.read()";
    let args = strings(&["-c", "\"$0\" -c \"$1\"; :", python(), script]);
    let spawned = spawn(plan("sh", &args, SandboxMode::Namespace))
        .await
        .unwrap();
    let mut lines = BufReader::new(spawned.stdout).lines();
    line_after(&mut lines, "ready").await;
    let bytes = group_rss_bytes(spawned.pid, true);
    println!("group resident memory: {} MiB", bytes >> 20);
    assert!(bytes > 90 << 20, "{bytes}");
    // The leader outside the namespace is a fork of this test process: not the server's.
    let with_leader = group_rss_bytes(spawned.pid, false);
    assert!(with_leader > bytes, "{with_leader} against {bytes}");
    kill_group(spawned.pid, Signal::Kill);
    assert_eq!(
        ended(spawned.exited).await,
        ExitReason::Signalled(libc::SIGKILL)
    );
}

#[tokio::test]
async fn the_child_sees_only_the_environment_it_is_given() {
    for sandbox in [SandboxMode::Namespace, SandboxMode::Unsandboxed] {
        let mut plan = plan("env", &[], sandbox);
        plan.env.push(("ONLY".into(), "this".into()));
        let spawned = spawn(plan).await.unwrap();
        let mut seen: Vec<String> = all_of(spawned.stdout)
            .await
            .lines()
            .map(Into::into)
            .collect();
        seen.sort();
        assert_eq!(seen, ["ONLY=this", "PATH=/usr/bin:/bin"], "{sandbox:?}");
        assert_eq!(ended(spawned.exited).await, ExitReason::Exited(0));
    }
}

/// What the network tests run in the child: three connects that report their errno
/// name, then a byte through the proxy's port and the answer, then the interfaces.
const NETWORK_SCRIPT: &str = r#"
import errno, socket, sys
def attempt(host, port):
    s = socket.socket()
    s.settimeout(10)
    try:
        s.connect((host, port))
        return "connected"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e))
    finally:
        s.close()
print("HOST", attempt("127.0.0.1", int(sys.argv[1])))
print("PRIVATE", attempt("10.0.0.1", 80))
print("METADATA", attempt("169.254.169.254", 80))
if sys.argv[2] != "none":
    s = socket.create_connection(("127.0.0.1", int(sys.argv[2])), timeout=10)
    s.sendall(b"x")
    print("PROXY", s.recv(1).decode())
print("INTERFACES", " ".join(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:])))
"#;

#[tokio::test]
async fn in_a_namespace_only_the_proxy_port_on_loopback_is_reachable() {
    let host = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    host.set_nonblocking(true).unwrap();
    let host_port = host.local_addr().unwrap().port().to_string();
    let args = strings(&["-u", "-c", NETWORK_SCRIPT, &host_port, "3128"]);
    let spawned = spawn(plan(python(), &args, SandboxMode::Namespace))
        .await
        .unwrap();
    let listener = spawned.listener.expect("a listener in a namespace");
    assert_eq!(
        listener.local_addr().unwrap(),
        (Ipv4Addr::LOCALHOST, 3128).into()
    );
    let mut lines = BufReader::new(spawned.stdout).lines();
    assert_eq!(line_after(&mut lines, "HOST ").await, "ECONNREFUSED");
    assert_eq!(line_after(&mut lines, "PRIVATE ").await, "ENETUNREACH");
    assert_eq!(line_after(&mut lines, "METADATA ").await, "ENETUNREACH");
    // The child's connection to its own loopback is accepted here, outside.
    let (mut connection, _) = tokio::time::timeout(PATIENCE, listener.accept())
        .await
        .expect("the child's connection did not arrive")
        .unwrap();
    let mut byte = [0_u8];
    connection.read_exact(&mut byte).await.unwrap();
    assert_eq!(&byte, b"x");
    connection.write_all(b"y").await.unwrap();
    assert_eq!(line_after(&mut lines, "PROXY ").await, "y");
    assert_eq!(line_after(&mut lines, "INTERFACES ").await, "lo");
    assert_eq!(ended(spawned.exited).await, ExitReason::Exited(0));
    let refused = host.accept().map(|_| ()).unwrap_err();
    assert_eq!(
        refused.kind(),
        io::ErrorKind::WouldBlock,
        "the host's port saw a connection"
    );
}

#[tokio::test]
async fn without_a_namespace_the_child_has_the_hosts_network_and_no_listener() {
    let host = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let host_port = host.local_addr().unwrap().port().to_string();
    let args = strings(&["-u", "-c", NETWORK_SCRIPT, &host_port, "none"]);
    let spawned = spawn(plan(python(), &args, SandboxMode::Unsandboxed))
        .await
        .unwrap();
    assert!(spawned.listener.is_none());
    let mut lines = BufReader::new(spawned.stdout).lines();
    assert_eq!(line_after(&mut lines, "HOST ").await, "connected");
    assert_ne!(line_after(&mut lines, "INTERFACES ").await, "lo");
    assert_eq!(ended(spawned.exited).await, ExitReason::Exited(0));
}

#[test]
fn this_kernel_gives_namespaces() {
    probe().unwrap();
    probe().unwrap();
}

/// The helper of `a_kernel_that_refuses_namespaces_is_named_with_the_way_out`: it runs in
/// a namespace of its own, where it forbids any further user namespace, then reports what
/// the probe and a start say.
#[tokio::test]
#[ignore = "a helper the sandbox tests run as a subprocess"]
async fn helper_refused() {
    if helper_role().as_deref() != Some("refused") {
        return;
    }
    std::fs::write("/proc/sys/user/max_user_namespaces", "0").unwrap();
    println!("PROBE {}", probe().unwrap_err());
    let args = strings(&["-c", "exit 4"]);
    match spawn(plan("sh", &args, SandboxMode::Namespace)).await {
        Ok(_) => println!("SPAWN started"),
        Err(error) => {
            let step = Step::Unshare;
            let refused = SandboxError::Namespace {
                step,
                errno: libc::ENOSPC,
            };
            assert_eq!(format!("{error:?}"), format!("{refused:?}"));
            println!("SPAWN {error}");
        }
    }
    let spawned = spawn(plan("sh", &args, SandboxMode::Unsandboxed))
        .await
        .unwrap();
    println!("NONE {}", ended(spawned.exited).await);
}

#[tokio::test]
async fn a_kernel_that_refuses_namespaces_is_named_with_the_way_out() {
    let (exe, args) = helper_command("helper_refused");
    let mut plan = plan(&exe, &args, SandboxMode::Namespace);
    plan.env
        .push(("RUNWARDEN_SANDBOX_HELPER".into(), "refused".into()));
    let spawned = spawn(plan).await.unwrap();
    let mut lines = BufReader::new(spawned.stdout).lines();
    let refused = "the kernel refused a network namespace (unshare: No space left on device): \
                   allow unprivileged user namespaces (sysctl \
                   kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0), or \
                   set sandbox = \"none\" for this server to run it without one";
    assert_eq!(line_after(&mut lines, "PROBE ").await, refused);
    assert_eq!(line_after(&mut lines, "SPAWN ").await, refused);
    assert_eq!(
        line_after(&mut lines, "NONE ").await,
        "exited with status 4"
    );
    assert_eq!(ended(spawned.exited).await, ExitReason::Exited(0));
}

/// The helper of `an_unprivileged_non_dumpable_process_gets_its_namespace`: made
/// non-dumpable as runwarden makes itself, it probes and starts a child in a namespace.
#[tokio::test]
#[ignore = "a helper the sandbox tests run as a subprocess"]
async fn helper_unprivileged() {
    if helper_role().as_deref() != Some("unprivileged") {
        return;
    }
    sys::make_not_dumpable();
    probe().unwrap();
    let args = strings(&["-c", "id -u; cat /proc/self/uid_map; ulimit -n"]);
    let spawned = spawn(plan("sh", &args, SandboxMode::Namespace))
        .await
        .unwrap();
    assert!(spawned.listener.is_some());
    let seen = all_of(spawned.stdout).await;
    let seen: Vec<&str> = seen.split_whitespace().collect();
    println!("SEEN {}", seen.join(" "));
    assert_eq!(ended(spawned.exited).await, ExitReason::Exited(0));
}

/// This process's effective user id, from /proc.
fn effective_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[tokio::test]
async fn an_unprivileged_non_dumpable_process_gets_its_namespace() {
    let (exe, args) = helper_command("helper_unprivileged");
    // As root, the helper runs as nobody (setpriv, of util-linux) from a copy of this
    // binary that nobody may read.
    let dir = tempfile::tempdir().unwrap();
    let mut command = if effective_uid() == 0 {
        use std::os::unix::fs::PermissionsExt;
        let copy = dir.path().join("helper");
        std::fs::copy(&exe, &copy).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut command = std::process::Command::new("setpriv");
        command.args(["--reuid=65534", "--regid=65534", "--clear-groups"]);
        command.arg(copy).args(&args);
        command
    } else {
        let mut command = std::process::Command::new(exe);
        command.args(&args);
        command
    };
    let mut helper = KilledOnDrop(
        command
            .current_dir(dir.path())
            .env("RUNWARDEN_SANDBOX_HELPER", "unprivileged")
            .stdout(Stdio::piped())
            .spawn()
            .expect("as root this test needs setpriv (util-linux) on PATH"),
    );
    let stdout = pipe::Receiver::from_owned_fd(helper.0.stdout.take().unwrap().into()).unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let uid = if effective_uid() == 0 {
        65534
    } else {
        effective_uid()
    };
    let expected = format!("{uid} {uid} {uid} 1 1024");
    assert_eq!(line_after(&mut lines, "SEEN ").await, expected);
    let status = tokio::task::spawn_blocking(move || helper.0.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status}");
}

#[tokio::test]
async fn a_missing_program_or_directory_is_named() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let error = spawn(plan("no-such-mcp-server", &[], SandboxMode::Namespace))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "could not start no-such-mcp-server: No such file or directory; check the command \
         and the PATH it is looked up in"
    );
    let in_dir = |dir| SpawnPlan {
        cwd: Some(dir),
        ..plan("pwd", &[], SandboxMode::Unsandboxed)
    };
    let error = spawn(in_dir(Path::new("/no/such/dir"))).await.unwrap_err();
    assert_eq!(
        error.to_string(),
        "could not enter the server's working directory /no/such/dir: No such file or \
         directory; check cwd"
    );
    let error = spawn(in_dir(file.path())).await.unwrap_err();
    assert!(
        error.to_string().ends_with(": Not a directory; check cwd"),
        "{error}"
    );
    let spawned = spawn(in_dir(Path::new("/usr"))).await.unwrap();
    assert_eq!(all_of(spawned.stdout).await, "/usr\n");
}

/// A value no text may carry.
const SIGIL: &str = "sigil-5f3a9c-never-shown";

#[tokio::test]
async fn no_error_or_debug_text_carries_the_environment() {
    let mut too_many_files = plan("env", &[], SandboxMode::Namespace);
    too_many_files.env.push(("TOKEN".into(), SIGIL.into()));
    too_many_files.limits.open_files = 1 << 40;
    assert!(!format!("{too_many_files:?}").contains(SIGIL));
    let error = spawn(too_many_files).await.unwrap_err();
    assert!(matches!(error, SandboxError::Limit { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .starts_with("could not limit the server's open files"),
        "{error}"
    );
    let mut nul = plan("env", &[], SandboxMode::Unsandboxed);
    nul.env.push(("TOKEN".into(), format!("{SIGIL}\0")));
    let nul_error = spawn(nul).await.unwrap_err();
    for text in [
        error.to_string(),
        format!("{error:?}"),
        nul_error.to_string(),
        format!("{nul_error:?}"),
    ] {
        assert!(!text.contains(SIGIL), "{text}");
    }
}

#[test]
fn unsafe_code_lives_only_in_the_sandboxs_system_calls() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let allowed = src.join("stdio/sandbox/sys.rs");
    let mut pending = vec![src];
    let mut offenders = Vec::new();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path != allowed && path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).unwrap();
                // Spelled in pieces, so that this file does not match itself.
                let word = "unsafe";
                let marks = [
                    format!("{word} {{"),
                    format!("{word} fn"),
                    format!("{word} impl"),
                    format!("allow({word}_code)"),
                ];
                if marks.iter().any(|mark| text.contains(mark.as_str())) {
                    offenders.push(path);
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "unsafe code outside sandbox/sys.rs: {offenders:?}"
    );
}
