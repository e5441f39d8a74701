//! `GET /v1/runs/{id}/events`: a run's events as Server-Sent Events (resumable with
//! `Last-Event-ID`, the event sequence) or, without the event-stream Accept header, as
//! one JSON document. A live stream is pushed by the store's change feed: it reads
//! only when its run changed, so an idle stream costs no reads. A live stream ends within
//! [`TOKEN_RECHECK`] of its token being revoked: the token is checked again before each
//! read and on that timer.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::time::Duration;

use axum::Extension;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::http::header::ACCEPT;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream};
use runwarden_runtime::events::is_final_kind;
use runwarden_runtime::{Change, RunEvent, StopLevel};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::AppState;
use super::auth::Presented;
use super::error::{ApiError, Path, Query};
use crate::live::{News, news_of};
use crate::views::event_json;

/// After a run is terminal with no final event yet, how long its segment may still
/// write one before the stream ends anyway.
const TERMINAL_GRACE: Duration = Duration::from_secs(3);
/// A comment line every so often keeps proxies from closing an idle stream.
const KEEP_ALIVE: Duration = Duration::from_secs(10);
/// How often an idle live stream asks again whether its token is still live.
const TOKEN_RECHECK: Duration = Duration::from_secs(2);

/// The query of the JSON form.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventsQuery {
    after: Option<i64>,
}

fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("text/event-stream"))
}

fn last_event_id(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    let Some(value) = headers.get("last-event-id") else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or_default().trim();
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<i64>() {
        Ok(seq) if seq >= 0 => Ok(Some(seq)),
        _ => Err(ApiError::InvalidRequest(format!(
            "Last-Event-ID must be an event sequence number, not {text:?}"
        ))),
    }
}

pub(super) async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(query): Query<EventsQuery>,
    presented: Option<Extension<Presented>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // O6: subscribed before the first read, so no change after that read is missed.
    let feed = state.runs.change_feed().subscribe();
    if state.runs.run_get(&id).await?.is_none() {
        return Err(ApiError::RunNotFound(id));
    }
    let after = last_event_id(&headers)?.or(query.after).unwrap_or(0).max(0);
    if wants_event_stream(&headers) {
        let stream = tail(state, feed, id, after, presented.map(|p| p.0));
        return Ok(Sse::new(stream)
            .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
            .into_response());
    }
    let events = state.runs.run_events(&id, after, 0).await?;
    let views: Vec<Value> = events.iter().map(event_json).collect();
    Ok(axum::Json(json!({ "events": views })).into_response())
}

/// Where a live stream stands.
struct Tail {
    state: AppState,
    run_id: String,
    /// The last sequence sent: the next read asks for events after it, so a resumed
    /// stream has no gap and no duplicate.
    after: i64,
    pending: VecDeque<RunEvent>,
    /// When the run was first seen terminal with nothing left to send.
    terminal_since: Option<Instant>,
    /// The final event was sent, or the server is stopping: end after `pending`.
    finished: bool,
    /// The store's changes; the stream reads only when one concerns its run.
    feed: broadcast::Receiver<Change>,
    /// The feed said something changed (or nothing was read yet).
    stale: bool,
    /// The token the stream was opened with, checked again before each read and every
    /// [`TOKEN_RECHECK`]; `None` for a route without a token.
    presented: Option<Presented>,
}

/// One SSE event: `id` is the sequence, `event` the kind, `data` the event as the CLI's
/// `--json` prints it.
fn sse_event(event: &RunEvent) -> Event {
    // An event name may not hold a line break (axum would refuse it); kinds never do, but
    // a stored row is input like any other.
    let kind: String = event
        .kind
        .chars()
        .filter(|c| !matches!(c, '\n' | '\r'))
        .collect();
    Event::default()
        .id(event.seq.to_string())
        .event(kind)
        .data(event_json(event).to_string())
}

/// A live stream: it reads the store once at the start and then only when the change
/// feed says its run changed (an event, a status, a resync or a lag). Idle, it costs no
/// reads and no timer beyond the keep-alive.
fn tail(
    state: AppState,
    feed: broadcast::Receiver<Change>,
    run_id: String,
    after: i64,
    presented: Option<Presented>,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let start = Tail {
        state,
        run_id,
        after,
        pending: VecDeque::new(),
        terminal_since: None,
        finished: false,
        feed,
        stale: true,
        presented,
    };
    stream::unfold(start, |mut tail| async move {
        loop {
            if let Some(event) = tail.pending.pop_front() {
                tail.after = event.seq;
                if is_final_kind(&event.kind) {
                    tail.finished = true;
                    tail.pending.clear(); // a run writes nothing after its final event
                }
                return Some((Ok(sse_event(&event)), tail));
            }
            if tail.finished {
                return None;
            }
            if tail.stale {
                tail.stale = false;
                if !tail.token_live().await || !tail.read().await {
                    return None;
                }
                if !tail.pending.is_empty() {
                    continue;
                }
            }
            let mut stop = tail.state.stop.clone();
            let stopping = async move {
                if stop
                    .wait_for(|level| *level >= StopLevel::Drain)
                    .await
                    .is_err()
                {
                    // No one can stop the server any more: only the run ends this stream.
                    std::future::pending::<()>().await;
                }
            };
            // A run seen terminal without its final event gets a grace period for it.
            let terminal_since = tail.terminal_since;
            let grace_over = async move {
                match terminal_since {
                    Some(since) => tokio::time::sleep_until(since + TERMINAL_GRACE).await,
                    None => std::future::pending().await,
                }
            };
            let news = tokio::select! {
                news = news_of(&mut tail.feed, &tail.run_id) => Some(news),
                _ = stopping => return None,
                _ = grace_over => return None,
                _ = tokio::time::sleep(TOKEN_RECHECK) => None,
            };
            match news {
                Some(News::Changed) => tail.stale = true,
                Some(News::Closed) => return None,
                None if !tail.token_live().await => return None,
                None => {}
            }
        }
    })
}

impl Tail {
    /// Whether the stream's token is still live (a revoked token ends the stream).
    async fn token_live(&self) -> bool {
        match &self.presented {
            Some(presented) => presented.still_live(&self.state).await,
            None => true,
        }
    }

    /// Reads the events after the last one sent and, when there are none, the run's
    /// status. False when the stream must end (the run is gone, the store failed, or the
    /// run has been terminal for the whole grace period).
    async fn read(&mut self) -> bool {
        match self
            .state
            .runs
            .run_events(&self.run_id, self.after, 0)
            .await
        {
            Ok(events) => self.pending.extend(events),
            Err(error) => {
                tracing::warn!(run = %self.run_id, %error, "could not read a run's events; ending its stream");
                return false;
            }
        }
        if !self.pending.is_empty() {
            return true;
        }
        match self.state.runs.run_get(&self.run_id).await {
            Ok(Some(run)) if run.status.is_terminal() => {
                let since = *self.terminal_since.get_or_insert_with(Instant::now);
                since.elapsed() < TERMINAL_GRACE
            }
            Ok(Some(_)) => true,
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(run = %self.run_id, %error, "could not read a run; ending its stream");
                false
            }
        }
    }
}
