//! The listener (O6): one dedicated connection (not from the pool) that `LISTEN`s on
//! `runwarden_changes` and turns every node's notifications into [`Change`]s on this
//! process's feed. PostgreSQL delivers a notification only when its transaction commits,
//! so nothing is heard before it is durable. When the connection is lost it reconnects
//! with backoff and publishes [`Change::Resync`], since notifications sent meanwhile are
//! gone.

use std::time::Duration;

use futures_util::StreamExt;
use runwarden_runtime::{Change, ChangeFeed, RunState};
use tokio::task::JoinHandle;
use tokio_postgres::{AsyncMessage, Client, Config, NoTls};

use crate::failure::Failure;

/// The channel the triggers of migration 0007 notify on.
pub(crate) const CHANNEL: &str = "runwarden_changes";
/// The first wait before reconnecting; it doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The running listener; dropping it stops the task and closes its connection.
pub(crate) struct Listener {
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Connects and listens before answering (so a change committed after this returns is
    /// heard), then keeps the connection alive in a background task.
    pub(crate) async fn start(mut config: Config, feed: ChangeFeed) -> Result<Self, Failure> {
        // The listener only reads, so a silently dead peer (a partition with no reset)
        // would go unnoticed for the kernel's default two hours: TCP keepalives find it
        // within about half a minute, and the reconnection resyncs.
        crate::keepalive::keepalives(&mut config);
        let live = listen(&config, &feed).await?;
        let task = tokio::spawn(supervise(config, feed, live));
        Ok(Self { task })
    }
}

/// A listening connection: the client (dropping it ends the session) and the task that
/// reads the connection's messages, which ends when the connection is lost.
struct Live {
    _client: Client,
    reader: AbortOnDrop,
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn listen(config: &Config, feed: &ChangeFeed) -> Result<Live, Failure> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let feed = feed.clone();
    let reader = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(note)) if note.channel() == CHANNEL => {
                    match parse(note.payload()) {
                        Some(changes) => changes.into_iter().for_each(|c| feed.publish(c)),
                        // A payload this build cannot read still says something changed.
                        None => feed.publish(Change::Resync),
                    }
                }
                Ok(_) => {}
                Err(error) => {
                    tracing::warn!(%error, "the change listener's connection failed");
                    break;
                }
            }
        }
    });
    let reader = AbortOnDrop(reader);
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    Ok(Live {
        _client: client,
        reader,
    })
}

/// Waits for the connection to end, then reconnects with backoff; each reconnection
/// publishes [`Change::Resync`] so receivers re-read what they watch.
async fn supervise(config: Config, feed: ChangeFeed, mut live: Live) {
    loop {
        let _ = (&mut live.reader.0).await;
        tracing::warn!("lost the change listener's connection; reconnecting");
        let mut backoff = FIRST_BACKOFF;
        live = loop {
            tokio::time::sleep(backoff).await;
            match listen(&config, &feed).await {
                Ok(live) => break live,
                Err(error) => {
                    tracing::debug!(error = %error.into_store_error("listening for changes"), "reconnecting the change listener failed");
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        feed.publish(Change::Resync);
    }
}

/// The changes one notification announces; `None` for a payload this build cannot read.
pub(crate) fn parse(payload: &str) -> Option<Vec<Change>> {
    let value: serde_json::Value = serde_json::from_str(payload).ok()?;
    let run_id = || value.get("id")?.as_str().map(str::to_owned);
    match value.get("k")?.as_str()? {
        "status" => {
            let status = RunState::parse(value.get("status")?.as_str()?)?;
            Some(vec![Change::Status {
                run_id: run_id()?,
                status,
            }])
        }
        "ready" => Some(vec![Change::Ready]),
        "appended" => Some(vec![Change::Appended {
            run_id: run_id()?,
            seq: value.get("seq")?.as_i64()?,
        }]),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_of_the_triggers_parse_into_changes() {
        assert_eq!(
            parse(r#"{"k" : "status", "id" : "r1", "status" : "cancelled"}"#),
            Some(vec![Change::Status {
                run_id: "r1".into(),
                status: RunState::Cancelled
            }])
        );
        assert_eq!(parse(r#"{"k":"ready"}"#), Some(vec![Change::Ready]));
        assert_eq!(
            parse(r#"{"k" : "appended", "id" : "r1", "seq" : 7}"#),
            Some(vec![Change::Appended {
                run_id: "r1".into(),
                seq: 7
            }])
        );
    }

    #[test]
    fn an_unreadable_payload_is_none() {
        assert_eq!(parse("not json"), None);
        assert_eq!(
            parse(r#"{"k":"status","id":"r1","status":"exploded"}"#),
            None
        );
        assert_eq!(parse(r#"{"k":"future_kind"}"#), None);
    }
}
