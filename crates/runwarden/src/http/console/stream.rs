//! The console's live streams, pushed by the store's change feed like the API's
//! event streams: each SSE message is an HTML fragment rendered by the same functions as
//! the first page load, so the script only swaps or appends server-escaped markup.
//!
//! - `/console/stream/runs`: the first page of the runs table (with the page's filters),
//!   re-rendered when a run's status changes, at most every [`ROWS_EVERY`], and sent only
//!   when it differs from the last one sent (so 200 status changes a second cost four
//!   reads a second per open page).
//! - `/console/stream/decisions`: the pending decisions, the same way.
//! - `/console/stream/runs/{id}`: one run's new timeline entries and its head.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream;
use runwarden_runtime::events::is_final_kind;
use runwarden_runtime::{Change, StopLevel, usage_of};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;

use super::pages::{PAGE_SIZE, pending_decisions, pending_list, run_filter};
use super::render::{Form, event_item, run_head, run_rows};
use super::session::Signed;
use super::{AppState, PageError};
use crate::live::{News, news_of};

/// The runs table is re-rendered at most this often, however fast runs change.
pub(crate) const ROWS_EVERY: Duration = Duration::from_millis(250);
/// A comment line every so often keeps proxies from closing an idle stream.
const KEEP_ALIVE: Duration = Duration::from_secs(10);

/// Resolves when the server starts draining (live streams end then), never if no one can
/// stop it any more.
async fn draining(state: &AppState) {
    let mut stop = state.stop.clone();
    if stop
        .wait_for(|level| *level >= StopLevel::Drain)
        .await
        .is_err()
    {
        std::future::pending::<()>().await;
    }
}

/// Waits for a change that can alter a runs table: a status (a new run is one), a resync,
/// a lag. Appended events alone do not change a row.
async fn table_news(feed: &mut broadcast::Receiver<Change>) -> News {
    loop {
        match feed.recv().await {
            Ok(Change::Status { .. } | Change::Resync) | Err(RecvError::Lagged(_)) => {
                return News::Changed;
            }
            Ok(_) => continue,
            Err(RecvError::Closed) => return News::Closed,
        }
    }
}

/// What a replacing stream renders: the runs table's first page (with the page's
/// filters) or the pending decisions (with the viewer's buttons, or none).
enum Table {
    Runs(Form),
    Decisions(Signed),
}

impl Table {
    async fn render(&self, state: &AppState) -> Result<String, runwarden_base::StoreError> {
        match self {
            Self::Runs(form) => {
                let Ok(mut filter) = run_filter(form) else {
                    return Ok(String::new());
                };
                filter.before_id = None;
                filter.limit = PAGE_SIZE;
                let list = state.runs.run_list(filter).await?;
                Ok(run_rows(&list).into_string())
            }
            Self::Decisions(signed) => {
                let pending = pending_decisions(state).await?;
                Ok(pending_list(&pending, signed).into_string())
            }
        }
    }
}

struct Replacing {
    state: AppState,
    signed: Signed,
    table: Table,
    feed: broadcast::Receiver<Change>,
    last: String,
    sent_at: Option<Instant>,
}

/// `GET /console/stream/runs`: the runs table's rows, live.
pub(super) async fn runs(
    State(state): State<AppState>,
    signed: Signed,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let form = Form::parse(raw.unwrap_or_default().as_bytes());
    run_filter(&form)?; // a bad filter is a 400 now, not a silent stream
    Ok(replacing(state, signed, Table::Runs(form)))
}

/// `GET /console/stream/decisions`: the pending decisions, live (a run asking parks it,
/// which is a status change).
pub(super) async fn decisions(State(state): State<AppState>, signed: Signed) -> Response {
    replacing(state, signed.clone(), Table::Decisions(signed))
}

/// A stream of `rows` messages, each the whole of `table` re-rendered: at once, then after
/// a change at most every [`ROWS_EVERY`], and only when it differs from the last sent.
fn replacing(state: AppState, signed: Signed, table: Table) -> Response {
    // O6: subscribed before the first read, so no change after it is missed.
    let feed = state.runs.change_feed().subscribe();
    let start = Replacing {
        state,
        signed,
        table,
        feed,
        last: String::new(),
        sent_at: None,
    };
    let stream = stream::unfold(start, |mut r| async move {
        loop {
            // The first message is sent at once; later ones at most every ROWS_EVERY.
            if let Some(sent_at) = r.sent_at {
                let news = tokio::select! {
                    news = table_news(&mut r.feed) => news,
                    _ = draining(&r.state) => return None,
                };
                if news == News::Closed {
                    return None;
                }
                tokio::time::sleep_until(sent_at + ROWS_EVERY).await;
                // Everything that arrived meanwhile is covered by the read below.
                while r.feed.try_recv().is_ok() {}
            }
            // O4: a stream ends with its session (sign-out, expiry, a revoked token).
            if !r.signed.still_live(&r.state).await {
                return None;
            }
            let html = match r.table.render(&r.state).await {
                Ok(html) => html,
                Err(error) => {
                    tracing::warn!(%error, "could not read the store for a console stream; ending it");
                    return None;
                }
            };
            r.sent_at = Some(Instant::now());
            if html != r.last {
                r.last = html.clone();
                let event: Result<Event, Infallible> =
                    Ok(Event::default().event("rows").data(html));
                return Some((event, r));
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response()
}

struct Timeline {
    state: AppState,
    signed: Signed,
    run_id: String,
    after: i64,
    feed: broadcast::Receiver<Change>,
    pending: std::collections::VecDeque<Event>,
    stale: bool,
    finished: bool,
}

/// `GET /console/stream/runs/{id}?after=SEQ`: the run's timeline entries after `SEQ`
/// (`event: entry`) and, after each batch, its head (`event: head`), until its final
/// event.
pub(super) async fn run(
    State(state): State<AppState>,
    signed: Signed,
    Path(id): Path<String>,
    RawQuery(raw): RawQuery,
) -> Result<Response, PageError> {
    let form = Form::parse(raw.unwrap_or_default().as_bytes());
    let after = form
        .text("after")
        .map(|a| a.parse::<i64>())
        .transpose()
        .map_err(|_| PageError::BadRequest("after must be an event sequence number".into()))?
        .unwrap_or(0)
        .max(0);
    let feed = state.runs.change_feed().subscribe();
    if state.runs.run_get(&id).await?.is_none() {
        return Err(PageError::NotFound(format!("no run {id}")));
    }
    let start = Timeline {
        state,
        signed,
        run_id: id,
        after,
        feed,
        pending: std::collections::VecDeque::new(),
        stale: true,
        finished: false,
    };
    let stream = stream::unfold(start, |mut t| async move {
        loop {
            if let Some(event) = t.pending.pop_front() {
                return Some((Ok::<_, Infallible>(event), t));
            }
            if t.finished {
                return None;
            }
            if t.stale {
                t.stale = false;
                if !t.read().await {
                    return None;
                }
                continue;
            }
            let news = tokio::select! {
                news = news_of(&mut t.feed, &t.run_id) => news,
                _ = draining(&t.state) => return None,
            };
            match news {
                News::Changed => t.stale = true,
                News::Closed => return None,
            }
        }
    });
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(KEEP_ALIVE))
        .into_response())
}

impl Timeline {
    /// Queues the entries after the last one sent and the run's head; false when the
    /// stream must end (the run is gone or the store failed).
    async fn read(&mut self) -> bool {
        // O4: a stream ends with its session (sign-out, expiry, a revoked token).
        if !self.signed.still_live(&self.state).await {
            return false;
        }
        let events = match self.state.runs.run_events(&self.run_id, 0, 0).await {
            Ok(events) => events,
            Err(error) => {
                tracing::warn!(run = %self.run_id, %error, "could not read a run's events; ending its console stream");
                return false;
            }
        };
        let run = match self.state.runs.run_get(&self.run_id).await {
            Ok(Some(run)) => run,
            Ok(None) => return false,
            Err(error) => {
                tracing::warn!(run = %self.run_id, %error, "could not read a run; ending its console stream");
                return false;
            }
        };
        let after = self.after;
        for event in events.iter().filter(|e| e.seq > after) {
            self.after = event.seq;
            self.pending.push_back(
                Event::default()
                    .event("entry")
                    .id(event.seq.to_string())
                    .data(event_item(event).into_string()),
            );
            if is_final_kind(&event.kind) {
                self.finished = true;
            }
        }
        let usage = usage_of(&events);
        let head = run_head(
            &run,
            (usage.input_tokens, usage.output_tokens),
            &self.signed,
        );
        self.pending
            .push_back(Event::default().event("head").data(head.into_string()));
        true
    }
}
