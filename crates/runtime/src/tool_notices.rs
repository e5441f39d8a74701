//! M15: a tool call's progress and log notifications as run events. Progress becomes
//! `tool_progress`, throttled like model progress (the latest report at most once per
//! interval); logs become `tool_log`, each cut to [`MAX_LOG_BYTES`] and at most
//! [`MAX_LOGS_PER_CALL`] per call (the rest are dropped). Both are written
//! before the step that ends the call, never after it.

use std::sync::atomic::{AtomicUsize, Ordering};

use runwarden_mcp::{Notice, NoticeSink};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::events::{EventBody, ToolLog, ToolProgress};
use crate::progress::{ProgressEvents, ProgressTarget, append};

/// The most `tool_log` events one call writes.
pub(crate) const MAX_LOGS_PER_CALL: usize = 20;

/// The most bytes of one log's data (as JSON text) kept; longer data becomes a cut string.
pub(crate) const MAX_LOG_BYTES: usize = 1024;

/// The most bytes of a progress message kept.
const MAX_MESSAGE_BYTES: usize = 512;

/// Which call the notices belong to.
pub(crate) struct CallLabel {
    pub round: u32,
    pub call_id: String,
    pub tool: String,
}

/// The writers of one call's notices.
pub(crate) struct ToolNotices {
    progress: ProgressEvents,
    logs: JoinHandle<()>,
    sink: NoticeSink,
}

impl ToolNotices {
    pub(crate) fn start(
        target: ProgressTarget,
        every: std::time::Duration,
        label: CallLabel,
    ) -> Self {
        let progress = ProgressEvents::start(target.clone(), every);
        let reporter = progress.reporter();
        let (logs_in, mut logs_out) = mpsc::channel::<EventBody>(MAX_LOGS_PER_CALL);
        let logs = tokio::spawn(async move {
            while let Some(body) = logs_out.recv().await {
                append(&target, body).await;
            }
        });
        let logged = AtomicUsize::new(0);
        let sink = NoticeSink::new(move |notice| match notice {
            Notice::Progress {
                progress,
                total,
                message,
            } => {
                reporter.send_replace(Some(EventBody::ToolProgress(ToolProgress {
                    round: label.round,
                    call_id: label.call_id.clone(),
                    tool: label.tool.clone(),
                    progress,
                    total,
                    message: message.map(|m| cut(&m, MAX_MESSAGE_BYTES)),
                })));
            }
            Notice::Log {
                level,
                logger,
                data,
            } => {
                // Bounded: past its share, a call's logs are dropped, and a full queue
                // never makes the stream reader wait.
                if logged.fetch_add(1, Ordering::Relaxed) >= MAX_LOGS_PER_CALL {
                    return;
                }
                let _ = logs_in.try_send(EventBody::ToolLog(ToolLog {
                    round: label.round,
                    call_id: label.call_id.clone(),
                    tool: label.tool.clone(),
                    level: cut(&level, 16),
                    logger: logger.map(|l| cut(&l, 64)),
                    data: bounded(data),
                }));
            }
            _ => {}
        });
        Self {
            progress,
            logs,
            sink,
        }
    }

    /// What the MCP client hands the notices to.
    pub(crate) fn sink(&self) -> NoticeSink {
        self.sink.clone()
    }

    /// Stops both writers; the logs already queued (at most [`MAX_LOGS_PER_CALL`]) are
    /// written first, so they land before the step that ends the call.
    pub(crate) async fn finish(self) {
        // The sink (held by the client's request until the call returned) owns the only
        // sender; dropping ours ends the log writer once the queue is empty.
        drop(self.sink);
        self.progress.finish().await;
        let _ = self.logs.await;
    }
}

/// The data as is when its JSON text fits, else its text cut to the bound.
fn bounded(data: Value) -> Value {
    let text = data.to_string();
    if text.len() <= MAX_LOG_BYTES {
        data
    } else {
        Value::String(cut(&text, MAX_LOG_BYTES))
    }
}

/// At most `max` bytes of `text`, cut at a character boundary, with `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_log_data_is_cut_and_short_data_kept() {
        assert_eq!(
            bounded(serde_json::json!({"a": 1})),
            serde_json::json!({"a": 1})
        );
        let long = Value::String("é".repeat(2000));
        let Value::String(cut) = bounded(long) else {
            panic!("a cut log is a string")
        };
        assert!(cut.len() <= MAX_LOG_BYTES + "…".len(), "{}", cut.len());
        assert!(cut.ends_with('…'));
    }
}
