//! Printing: concise lines for people, one JSON document for machines (`--json`).

use std::io::Write;

use serde::Serialize;

/// Writes one line to stdout. When the reader has gone away (`runwarden events | head`),
/// the command ends quietly instead of panicking on the broken pipe.
pub(crate) fn line(text: impl std::fmt::Display) {
    let mut stdout = std::io::stdout().lock();
    if let Err(error) = writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        if error.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: could not write to standard output: {error}");
        std::process::exit(1);
    }
}

/// Writes one line to stdout and says whether it got there, for a caller that must act
/// on a reader going away (`run` cancels its run) instead of exiting.
pub(crate) fn try_line(text: impl std::fmt::Display) -> std::io::Result<()> {
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}").and_then(|()| stdout.flush())
}

/// Prints `value` as JSON, or `human` as text.
pub(crate) fn emit<T: Serialize>(json: bool, value: &T, human: impl FnOnce() -> String) {
    if json {
        line(serde_json::to_string(value).expect("output values always serialize"));
    } else {
        let text = human();
        if !text.is_empty() {
            line(text);
        }
    }
}

/// Whether stderr may carry ANSI colour: only on a terminal, and never when `NO_COLOR`
/// is set to anything but the empty string (no-color.org).
pub(crate) fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty())
        && std::io::stderr().is_terminal()
}

/// Prints an error with its chain of causes, to stderr (or as JSON on stdout).
pub(crate) fn error(json: bool, error: &anyhow::Error) {
    if json {
        line(serde_json::json!({ "error": { "message": one_line(error) } }));
    } else {
        eprintln!("error: {}", for_people(error));
    }
}

/// An error and its causes on one line, each said once: a library error often repeats
/// its source's text in its own message, and the chain would then say it again.
pub(crate) fn one_line(error: &anyhow::Error) -> String {
    let mut message = String::new();
    for cause in error.chain() {
        let text = on_one_line(&cause.to_string());
        if text.is_empty() || message.contains(&text) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&text);
    }
    message
}

/// `text` with every run of white space, line breaks included, made one space.
pub(crate) fn on_one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// [`one_line`], except that a cause written over several lines keeps them: a TOML
/// error's first line (its line and column) joins the chain and the offending text with
/// its marker follows below, as the parser laid it out.
pub(crate) fn for_people(error: &anyhow::Error) -> String {
    let mut message = String::new();
    let mut below = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        let text = text.trim_end();
        let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
        let first = on_one_line(first);
        if first.is_empty() || message.contains(&first) {
            continue;
        }
        if !message.is_empty() {
            message.push_str(": ");
        }
        message.push_str(&first);
        if !rest.trim().is_empty() && below.is_empty() {
            below = format!("\n{rest}");
        }
    }
    message + &below
}

/// `1 leg`, `2 legs`: a count with its noun agreeing (`one` and `many` are the noun's
/// two forms, so irregular plurals read right too).
pub(crate) fn count(n: impl Into<u64>, one: &str, many: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds.
pub(crate) fn time(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_else(|| ms.to_string())
}

/// The rule numbers of the original requirements (`R12`, `M18`, `V4`, `O3`, `L2`) and the
/// word SPEC in `text`: words for the code's authors, never for the people who read our text.
#[cfg(test)]
pub(crate) fn rule_numbers(text: &str) -> Vec<&str> {
    text.split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            *w == "SPEC"
                || (matches!(w.len(), 2 | 3)
                    && matches!(w.as_bytes()[0], b'R' | b'M' | b'V' | b'O' | b'L')
                    && w[1..].bytes().all(|b| b.is_ascii_digit()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("no secret named \"t\": store it with `runwarden secret put t`")]
    struct Missing;

    #[derive(Debug, thiserror::Error)]
    #[error("while preparing the credential: {0}")]
    struct Preparing(#[source] Missing);

    #[test]
    fn a_count_agrees_with_its_noun() {
        assert_eq!(count(1u32, "leg", "legs"), "1 leg");
        assert_eq!(count(2u32, "leg", "legs"), "2 legs");
        assert_eq!(count(0u32, "worker slot", "worker slots"), "0 worker slots");
        assert_eq!(count(1u64, "call has", "calls have"), "1 call has");
    }

    #[test]
    fn an_error_chain_says_each_thing_once_on_one_line() {
        let error =
            anyhow::Error::new(Preparing(Missing)).context("while importing\nthe catalogue");
        let message = one_line(&error);
        assert_eq!(
            message,
            "while importing the catalogue: while preparing the credential: no secret named \"t\": store it with `runwarden secret put t`"
        );
        assert_eq!(message.matches("no secret named").count(), 1);
    }
}
