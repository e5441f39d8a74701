//! A request's body, read in full before its handler runs: at most its route's limit (a
//! sign-in form a few KiB, the API's JSON 64 KiB) and within the body-read timeout, so a
//! handler never waits on a slow client. A body declared larger than the limit is
//! answered 413 before a byte of it is read; the connection then lingers to drain what
//! the client still sends (see `listener`), so a client that writes its whole body before
//! reading still reads the 413.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, header};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt as _;
use hyper::body::{Body as _, Incoming};

use super::error::{ApiError, body_limit};

/// Why a request's body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyRefusal {
    /// Larger than the route's limit (in bytes).
    TooLarge(usize),
    /// Not all there within the body-read timeout.
    TooSlow,
    /// The client went away or broke the framing mid-body.
    Broken,
}

impl BodyRefusal {
    /// Whether the connection should drain the rest of the body before it closes: only
    /// a client refused for its size is still sending it and waiting for the answer.
    pub(crate) fn lingers(self) -> bool {
        matches!(self, Self::TooLarge(_))
    }
}

impl IntoResponse for BodyRefusal {
    fn into_response(self) -> Response {
        let error = match self {
            Self::TooLarge(limit) => ApiError::BodyTooLarge(limit),
            Self::TooSlow => ApiError::RequestTimeout,
            Self::Broken => ApiError::InvalidRequest("the request body could not be read".into()),
        };
        let mut response = error.into_response();
        // The rest of the body is never read: this connection ends with the answer.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    }
}

/// The request with its body read into memory, or why it was not.
pub(crate) async fn read_body(
    request: Request<Incoming>,
    timeout: Duration,
) -> Result<Request<Body>, BodyRefusal> {
    let limit = body_limit(request.uri().path());
    let (parts, body) = request.into_parts();
    if declared_length(&parts.headers).is_some_and(|length| length > limit as u64) {
        return Err(BodyRefusal::TooLarge(limit));
    }
    if body.is_end_stream() {
        return Ok(Request::from_parts(parts, Body::empty()));
    }
    let read = async {
        let mut chunks = Body::new(body).into_data_stream();
        let mut buffer = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.map_err(|_| BodyRefusal::Broken)?;
            if buffer.len() + chunk.len() > limit {
                return Err(BodyRefusal::TooLarge(limit));
            }
            buffer.extend_from_slice(&chunk);
        }
        Ok(buffer)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(buffer)) => Ok(Request::from_parts(parts, Body::from(buffer))),
        Ok(Err(refusal)) => Err(refusal),
        Err(_) => Err(BodyRefusal::TooSlow),
    }
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()
}
