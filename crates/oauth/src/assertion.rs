//! Where the JWT of an assertion grant comes from: a file, re-read for every token request
//! because workload identity files rotate, or a command run with a time limit whose
//! standard output is the JWT. What is read is a secret: no error here ever quotes it.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use zeroize::Zeroizing;

use runwarden_vault::CancellationSignal;

/// How long an assertion command may run before it is killed.
pub(crate) const ASSERTION_COMMAND_TIMEOUT: Duration = Duration::from_secs(15);

/// The largest JWT read from a file or a command; real ones are a few KiB.
const MAX_ASSERTION: usize = 64 * 1024;

/// Where the JWT of the `jwt_bearer` grant (the assertion) or of the `cross_app_access`
/// grant (the ID token) comes from. Names a path or a program, never the JWT itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AssertionSource {
    /// A file, read afresh for every token request.
    File(PathBuf),
    /// A program and its arguments (no shell), run for every token request; its standard
    /// output is the JWT.
    Command(Vec<String>),
}

impl AssertionSource {
    /// How `mcp auth status` names the source: `file PATH` or `command PROGRAM`.
    pub fn describe(&self) -> String {
        match self {
            Self::File(path) => format!("file {}", path.display()),
            Self::Command(argv) => format!("command {}", argv.first().map_or("", String::as_str)),
        }
    }

    /// The JWT, trimmed. `what` names it in errors ("assertion", "ID token"); an error
    /// says what failed and where, never what was read.
    pub(crate) async fn read(
        &self,
        what: &str,
        limit: Duration,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Zeroizing<String>, Problem> {
        if signal.is_some_and(|s| s.is_cancelled()) {
            return Err(Problem::Cancelled);
        }
        let (bytes, from) = match self {
            Self::File(path) => (
                read_file(path).await?,
                format!("the {what} file {}", path.display()),
            ),
            Self::Command(argv) => {
                let from = format!(
                    "the {what} command {}",
                    argv.first().map_or("", String::as_str)
                );
                let bytes = tokio::select! {
                    read = run(argv, limit) => read.map_err(|p| Problem::Unreadable(format!("{from} {p}")))?,
                    _ = cancelled(signal) => return Err(Problem::Cancelled),
                };
                (bytes, from)
            }
        };
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| Problem::Unreadable(format!("{from} is not UTF-8 text")))?;
        let jwt = Zeroizing::new(text.trim().to_string());
        if !looks_like_jwt(&jwt) {
            return Err(Problem::Unreadable(format!(
                "{from} holds no JWT (expected one compact JWT: base64url parts joined by dots)"
            )));
        }
        Ok(jwt)
    }
}

/// Why no JWT could be had.
#[derive(Debug)]
pub(crate) enum Problem {
    /// The caller's signal stopped the read.
    Cancelled,
    /// What failed and where; never the content.
    Unreadable(String),
}

async fn read_file(path: &std::path::Path) -> Result<Zeroizing<Vec<u8>>, Problem> {
    let unreadable = |e: std::io::Error| {
        Problem::Unreadable(format!("cannot read the file {}: {e}", path.display()))
    };
    let file = tokio::fs::File::open(path).await.map_err(unreadable)?;
    let mut bytes = Zeroizing::new(Vec::new());
    file.take(MAX_ASSERTION as u64 + 1)
        .read_to_end(&mut bytes)
        .await
        .map_err(unreadable)?;
    if bytes.len() > MAX_ASSERTION {
        return Err(Problem::Unreadable(format!(
            "the file {} is larger than {} KiB, too large for a JWT",
            path.display(),
            MAX_ASSERTION / 1024
        )));
    }
    Ok(bytes)
}

/// Runs `argv` with nothing on its standard input and its error output dropped (a helper
/// that printed its token there would leak it into logs); answers its standard output.
/// The child gets none of runwarden's own `RUNWARDEN_*` variables: one may hold the
/// master key. It is killed when this future is dropped (timeout, cancel, too much output).
async fn run(argv: &[String], limit: Duration) -> Result<Zeroizing<Vec<u8>>, String> {
    let Some((program, args)) = argv.split_first() else {
        return Err("is empty".into());
    };
    let mut command = tokio::process::Command::new(program);
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("RUNWARDEN_") {
            command.env_remove(name);
        }
    }
    let mut child = command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("could not start: {e}"))?;
    let Some(stdout) = child.stdout.take() else {
        return Err("has no standard output".into());
    };
    let work = async {
        let mut out = Zeroizing::new(Vec::new());
        stdout
            .take(MAX_ASSERTION as u64 + 1)
            .read_to_end(&mut out)
            .await
            .map_err(|e| format!("could not be read: {e}"))?;
        if out.len() > MAX_ASSERTION {
            return Err(format!(
                "wrote more than {} KiB, too much for a JWT",
                MAX_ASSERTION / 1024
            ));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| format!("could not be waited for: {e}"))?;
        if !status.success() {
            return Err(format!(
                "failed ({status}); run it by hand to see its messages"
            ));
        }
        Ok(out)
    };
    match tokio::time::timeout(limit, work).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!(
            "gave no answer within {} s and was stopped",
            limit.as_secs_f64()
        )),
    }
}

/// Resolves once `signal` says cancelled; never without one.
async fn cancelled(signal: Option<&dyn CancellationSignal>) {
    let Some(signal) = signal else {
        return std::future::pending().await;
    };
    loop {
        if signal.is_cancelled() {
            return;
        }
        tokio::select! {
            _ = signal.woken() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// A compact JWS (three parts) or JWE (five), each part base64url: enough to refuse a file
/// that holds something else before it is sent anywhere.
pub(crate) fn looks_like_jwt(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    matches!(parts.len(), 3 | 5)
        && !parts[0].is_empty()
        && parts.iter().all(|p| {
            p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIGIL_JWT: &str = "eyJhbGciOiJFUzI1NiJ9.c2lnaWwtYXNzZXJ0aW9uLTdlMWY.c2ln";

    fn text(problem: Problem) -> String {
        match problem {
            Problem::Cancelled => "cancelled".into(),
            Problem::Unreadable(text) => text,
        }
    }

    #[tokio::test]
    async fn a_file_is_read_afresh_for_every_request_so_a_rotated_assertion_is_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        let source = AssertionSource::File(path.clone());
        std::fs::write(&path, format!("{SIGIL_JWT}\n")).unwrap();
        let first = source
            .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
            .await
            .unwrap();
        assert_eq!(first.as_str(), SIGIL_JWT, "trimmed");
        std::fs::write(&path, "a.b.c").unwrap();
        let second = source
            .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
            .await
            .unwrap();
        assert_eq!(second.as_str(), "a.b.c");
    }

    #[tokio::test]
    async fn a_file_without_a_jwt_is_refused_without_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "sigil-not-a-jwt-5c2e secret words").unwrap();
        let source = AssertionSource::File(path.clone());
        let error = text(
            source
                .read("ID token", ASSERTION_COMMAND_TIMEOUT, None)
                .await
                .unwrap_err(),
        );
        assert!(error.contains("holds no JWT"), "{error}");
        assert!(error.contains(&path.display().to_string()), "{error}");
        assert!(!error.contains("sigil"), "{error}");
        let missing = AssertionSource::File(dir.path().join("absent"));
        let error = text(
            missing
                .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
                .await
                .unwrap_err(),
        );
        assert!(
            error.contains("cannot read the file") && error.contains("absent"),
            "{error}"
        );
        std::fs::write(&path, vec![b'a'; MAX_ASSERTION + 1]).unwrap();
        let error = text(
            source
                .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
                .await
                .unwrap_err(),
        );
        assert!(error.contains("too large"), "{error}");
    }

    #[tokio::test]
    async fn a_command_gives_its_standard_output_and_a_failing_one_is_named_without_it() {
        let ok = AssertionSource::Command(vec!["printf".into(), format!("{SIGIL_JWT}\n")]);
        let jwt = ok
            .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
            .await
            .unwrap();
        assert_eq!(jwt.as_str(), SIGIL_JWT);
        let failing = AssertionSource::Command(vec![
            "sh".into(),
            "-c".into(),
            format!("echo {SIGIL_JWT}; echo {SIGIL_JWT} >&2; exit 3"),
        ]);
        let error = text(
            failing
                .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
                .await
                .unwrap_err(),
        );
        assert!(
            error.contains("the assertion command sh failed") && error.contains('3'),
            "{error}"
        );
        assert!(!error.contains("c2ln"), "{error}");
        let absent = AssertionSource::Command(vec!["/nonexistent/get-token".into()]);
        let error = text(
            absent
                .read("assertion", ASSERTION_COMMAND_TIMEOUT, None)
                .await
                .unwrap_err(),
        );
        assert!(error.contains("could not start"), "{error}");
    }

    #[tokio::test]
    async fn a_command_that_hangs_is_stopped_at_its_limit_and_a_cancel_stops_it_at_once() {
        let hang = AssertionSource::Command(vec!["sleep".into(), "30".into()]);
        let started = std::time::Instant::now();
        let error = text(
            hang.read("assertion", Duration::from_millis(300), None)
                .await
                .unwrap_err(),
        );
        assert!(error.contains("no answer within 0.3 s"), "{error}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );

        let flag = runwarden_vault::CancelFlag::new();
        let cancel = flag.clone();
        let started = std::time::Instant::now();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            cancel.cancel();
        });
        let outcome = hang
            .read("assertion", Duration::from_secs(30), Some(&flag))
            .await;
        assert!(matches!(outcome, Err(Problem::Cancelled)));
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn only_compact_jwts_pass_the_shape_check() {
        assert!(looks_like_jwt("a.b.c"));
        assert!(looks_like_jwt("a.b.c.d.e"));
        assert!(looks_like_jwt("eyJ.eyJ."));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt(".b.c"));
        assert!(!looks_like_jwt("a b.c.d"));
        assert!(!looks_like_jwt("a.b+/.c"));
    }
}
