//! The web console: server-rendered HTML pages for runs, one run's live timeline,
//! decisions, the audit log, MCP servers and the cancel-latency chart, with one small
//! script and one stylesheet embedded in the binary.
//!
//! Why server-rendered: every value reaches the page through maud's `html!`, which escapes
//! what it interpolates, so a tool result or an error holding markup is text by
//! construction (no client-side templating to get wrong, no build step, no Node at run
//! time). The script only opens the live streams (`/console/stream/...`), whose data are
//! HTML fragments rendered by the same Rust functions as the first page load.
//!
//! Sign-in trades an API token for a session cookie ([`session`]); every state-changing
//! request carries the session's CSRF token; every answer carries a strict
//! Content-Security-Policy ([`security_headers`]).

mod actions;
mod assets;
mod pages;
mod render;
mod session;
mod session_id;
mod stream;

use axum::Router;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use maud::html;
use runwarden_base::StoreError;

use super::AppState;

/// The policy every console answer carries: scripts and styles only from this
/// origin, no inline script or style, no framing, forms post only here.
pub(crate) const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// The console's routes, with their security headers.
pub(super) fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/", get(pages::home))
        .route("/runs", get(pages::runs))
        .route("/runs/{id}", get(pages::run))
        .route("/decisions", get(pages::decisions))
        .route("/audit", get(pages::audit))
        // The console's page of MCP servers shares its path with the MCP gateway: an MCP
        // client's GET (it asks for an event stream) is the gateway's to answer.
        .route(
            "/mcp",
            get(pages::mcp).route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                super::gateway::standing_stream,
            )),
        )
        .route("/charts", get(pages::charts))
        // The sign-in form is read only up to its own limit; the listener enforces it on
        // the wire too, within the body-read timeout.
        .route(
            "/console/login",
            post(session::login).layer(axum::extract::DefaultBodyLimit::max(
                super::error::LOGIN_BODY_LIMIT,
            )),
        )
        .route("/console/logout", post(session::logout))
        .route("/console/runs/{id}/cancel", post(actions::cancel))
        .route("/console/decisions/{id}", post(actions::answer))
        .route("/console/stream/runs", get(stream::runs))
        .route("/console/stream/decisions", get(stream::decisions))
        .route("/console/stream/runs/{id}", get(stream::run))
        .route("/console/assets/{name}", get(assets::serve))
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(state)
}

/// The headers of every console answer. Pages are never cached (they show live state
/// and carry the CSRF token); assets set their own long cache (their names hold a hash).
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    if !headers.contains_key(header::CACHE_CONTROL) {
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

/// Why a console request failed, answered as a small HTML page with the status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PageError {
    /// Not signed in, or the session ended.
    #[error("sign in first: your session is missing, expired or its token was revoked")]
    SignedOut,
    /// The CSRF token is missing or wrong, or the request came from another origin.
    #[error("{0}")]
    Csrf(String),
    /// The signed-in token's role may not do this.
    #[error("{0}")]
    Forbidden(String),
    /// The request is malformed; the message says how to fix it.
    #[error("{0}")]
    BadRequest(String),
    /// What was asked for does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A state change was refused (already answered, already finished).
    #[error("{0}")]
    Conflict(String),
    /// The store could not be reached; the detail goes to the log only.
    #[error("the store is unavailable; try again shortly")]
    Unavailable,
    /// Anything else; the detail goes to the log only.
    #[error("the server failed to answer; the log has the details")]
    Internal,
}

impl PageError {
    fn status(&self) -> StatusCode {
        match self {
            Self::SignedOut => StatusCode::UNAUTHORIZED,
            Self::Csrf(_) | Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<StoreError> for PageError {
    fn from(error: StoreError) -> Self {
        tracing::error!(%error, "the console could not read the store");
        Self::Unavailable
    }
}

impl From<runwarden_vault::VaultError> for PageError {
    fn from(error: runwarden_vault::VaultError) -> Self {
        tracing::error!(%error, "the console could not read the audit log");
        Self::Unavailable
    }
}

impl From<anyhow::Error> for PageError {
    fn from(error: anyhow::Error) -> Self {
        tracing::error!(error = format!("{error:#}"), "a console page failed");
        Self::Internal
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.status();
        let title = status.canonical_reason().unwrap_or("Error");
        let body = html! {
            section.error {
                h1 { (status.as_u16()) " " (title) }
                p.message { (self.to_string()) }
                p { a href="/" { "Sign in" } " · " a href="/runs" { "Runs" } }
            }
        };
        let page = render::layout(title, None, "error", body);
        (status, Html(page.into_string())).into_response()
    }
}

#[cfg(test)]
mod tests;
