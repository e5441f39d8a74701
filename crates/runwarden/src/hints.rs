//! Hints for people: the commands that make a token, and whether any worker is there to
//! claim a queued run. A hint is a command the CLI accepts as written (NAME aside): a test
//! parses each with the CLI's own definition.

use std::time::Duration;

use runwarden_runtime::{QueueStore, WORKER_BEAT};

/// The command that makes an API token for a person or a client (`--role viewer` for one
/// that only looks).
pub(crate) const TOKEN_HINT: &str = "runwarden token create --name NAME --role operator";

/// A worker not seen for this long is taken to be gone: three missed beats.
pub(crate) const WORKER_GONE_AFTER: Duration = Duration::from_secs(3 * WORKER_BEAT.as_secs());

/// What to tell someone whose run waits in the queue when no worker has been seen for
/// [`WORKER_GONE_AFTER`]; `None` when a worker beat recently (or the store cannot say).
pub(crate) async fn no_worker_hint(queue: &dyn QueueStore) -> Option<String> {
    let last_seen = match queue.worker_last_seen().await {
        Ok(seen) => seen,
        Err(error) => {
            tracing::debug!(%error, "could not read when a worker was last seen");
            return None;
        }
    };
    let now_ms = chrono::Utc::now().timestamp_millis();
    let gone_ms = i64::try_from(WORKER_GONE_AFTER.as_millis()).unwrap_or(i64::MAX);
    if last_seen.is_some_and(|seen| now_ms - seen <= gone_ms) {
        return None;
    }
    // A worker that runs but cannot write to the store cannot record its presence
    // either: say what is known, not that none runs.
    let known = match last_seen {
        Some(seen) => format!(
            "the last one {} s ago; a worker that runs but cannot write to the store is not seen either, so look at the workers' logs",
            (now_ms - seen) / 1000
        ),
        None => "none ever was".to_string(),
    };
    Some(format!(
        "note: no worker has been seen in the last {} s ({known}), so nothing will claim this run yet: start one with `runwarden worker` or `runwarden serve`",
        WORKER_GONE_AFTER.as_secs()
    ))
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::TOKEN_HINT;
    use crate::cli::Cli;

    /// Every command a hint shows, as a person would type it (NAME filled in).
    const HINTS: &[&str] = &[
        TOKEN_HINT,
        "runwarden token create --role viewer",
        "runwarden worker",
        "runwarden serve",
        "runwarden init --new-key --yes",
    ];

    #[test]
    fn every_hint_is_a_command_the_cli_accepts() {
        for hint in HINTS {
            let words = hint.replace("NAME", "alice");
            let parsed = Cli::try_parse_from(words.split_whitespace());
            assert!(
                parsed.is_ok(),
                "`{hint}` is not a command: {}",
                parsed.unwrap_err()
            );
        }
    }
}
