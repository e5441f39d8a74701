//! The HTTP API: JSON under `/v1`, bearer tokens with roles, live run events as
//! Server-Sent Events, and one error shape. `runwarden serve` binds it; tests drive
//! [`router`] with `tower::ServiceExt::oneshot` or over a real socket.
//!
//! The [`ROUTES`] table is the router: every route is built from it, and a test checks
//! that the checked-in OpenAPI document (`docs/openapi.json`) describes exactly these
//! paths.

mod admission;
mod audit;
mod auth;
mod catalogue;
mod console;
mod decisions;
mod error;
mod events;
pub(crate) mod gateway;
mod health;
mod intake;
pub(crate) mod listener;
mod metrics;
mod runs;

pub(crate) use health::until_open;

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, header};
use axum::response::IntoResponse;
use axum::routing::{MethodFilter, MethodRouter, on};
use runwarden_mcp::CatalogueStore;
use runwarden_runtime::{Executor, QueueStore, StopLevel};
use runwarden_vault::Role;
use runwarden_vault::Vault;
use runwarden_vault::store::{TokenStore, VaultStore};
use tokio::sync::watch;

use crate::agents::AgentBuilder;
use crate::config::Config;
use crate::root::Root;

pub(crate) use crate::metrics::Metrics;
pub(crate) use error::ApiError;

/// The OpenAPI 3.1 document, hand-written and checked in; served as is.
pub(crate) const OPENAPI: &str = include_str!("../../../../docs/openapi.json");

/// Everything a handler needs; cheap to clone. Every store handle is a seam of the
/// process's one backend, built by the composition root.
#[derive(Clone)]
pub(crate) struct AppState {
    /// The process's composition root (the backend's readiness probe).
    pub(crate) root: Arc<Root>,
    /// Runs, their events, counts and the queue; its change feed drives live streams.
    pub(crate) runs: Arc<dyn QueueStore>,
    /// The imported MCP catalogue and server liveness.
    pub(crate) catalogue: Arc<dyn CatalogueStore>,
    /// API tokens (only their hashes).
    pub(crate) tokens: Arc<dyn TokenStore>,
    /// Console sessions (O4; only their ids' hashes).
    pub(crate) sessions: Arc<dyn runwarden_vault::SessionStore>,
    /// Audit counts for the metrics.
    pub(crate) audit: Arc<dyn VaultStore>,
    /// The process's one executor: its cancel hub is the one the workers' and the sync
    /// API runs' signals listen to, so an API cancel wakes them at once.
    pub(crate) executor: Arc<Executor>,
    /// Agents from the configuration, bound to the imported catalogue.
    pub(crate) agents: Arc<AgentBuilder>,
    /// The audit log.
    pub(crate) vault: Arc<Vault>,
    /// The configuration (agents, MCP servers).
    pub(crate) config: Arc<Config>,
    /// The cancel-latency histogram.
    pub(crate) metrics: Arc<Metrics>,
    /// The server's stop level: live event streams end when it drains.
    pub(crate) stop: watch::Receiver<StopLevel>,
    /// G1: the MCP gateway's live sessions.
    pub(crate) gateway: Arc<gateway::Sessions>,
}

impl AppState {
    /// The state of a serving process, all from its one root: one backend, one executor
    /// (with the queue, so its workers share it) whose cancel hub every run of this
    /// process listens to, and the cancel-latency histogram fed by that executor.
    pub(crate) async fn new(
        root: Arc<Root>,
        stop: watch::Receiver<StopLevel>,
    ) -> anyhow::Result<Self> {
        let metrics = root.metrics().clone();
        let executor = root
            .executor("serve", true, Some(metrics.observer()))
            .await?;
        Ok(Self {
            runs: root.queue().await?,
            catalogue: root.catalogue().await?,
            tokens: root.tokens().await?,
            sessions: root.sessions().await?,
            audit: root.vault_store().await?,
            executor,
            agents: root.agents("serve").await?,
            vault: root.vault().await?,
            config: Arc::new(root.config().clone()),
            metrics,
            stop,
            root,
            gateway: Arc::default(),
        })
    }
}

/// One route: method, path (axum's and OpenAPI's `{param}` syntax), the role it needs
/// (`None`: no token), and its handler for that method.
pub(crate) struct Route {
    pub(crate) method: Method,
    pub(crate) path: &'static str,
    pub(crate) role: Option<Role>,
    handler: fn(MethodFilter) -> MethodRouter<AppState>,
}

/// Every route of the API. The router is built from this table alone.
pub(crate) static ROUTES: &[Route] = &[
    Route {
        method: Method::GET,
        path: "/healthz",
        role: None,
        handler: |m| on(m, health::healthz),
    },
    Route {
        method: Method::GET,
        path: "/readyz",
        role: None,
        handler: |m| on(m, health::readyz),
    },
    Route {
        method: Method::GET,
        path: "/metrics",
        role: Some(Role::Viewer),
        handler: |m| on(m, metrics::metrics),
    },
    Route {
        method: Method::GET,
        path: "/v1/openapi.json",
        role: Some(Role::Viewer),
        handler: |m| on(m, openapi),
    },
    Route {
        method: Method::POST,
        path: "/v1/runs",
        role: Some(Role::Operator),
        handler: |m| on(m, runs::create),
    },
    Route {
        method: Method::GET,
        path: "/v1/runs",
        role: Some(Role::Viewer),
        handler: |m| on(m, runs::list),
    },
    Route {
        method: Method::GET,
        path: "/v1/runs/{id}",
        role: Some(Role::Viewer),
        handler: |m| on(m, runs::get),
    },
    Route {
        method: Method::GET,
        path: "/v1/runs/{id}/events",
        role: Some(Role::Viewer),
        handler: |m| on(m, events::events),
    },
    Route {
        method: Method::POST,
        path: "/v1/runs/{id}/cancel",
        role: Some(Role::Operator),
        handler: |m| on(m, runs::cancel),
    },
    Route {
        method: Method::GET,
        path: "/v1/runs/{id}/calls",
        role: Some(Role::Viewer),
        handler: |m| on(m, gateway::calls::open_calls),
    },
    Route {
        method: Method::POST,
        path: "/v1/runs/{id}/calls/{call_id}/cancel",
        role: Some(Role::Operator),
        handler: |m| on(m, gateway::calls::cancel_call),
    },
    Route {
        method: Method::GET,
        path: "/v1/decisions",
        role: Some(Role::Viewer),
        handler: |m| on(m, decisions::list),
    },
    Route {
        method: Method::GET,
        path: "/v1/decisions/{id}",
        role: Some(Role::Viewer),
        handler: |m| on(m, decisions::get),
    },
    Route {
        method: Method::POST,
        path: "/v1/decisions/{id}",
        role: Some(Role::Operator),
        handler: |m| on(m, decisions::answer),
    },
    Route {
        method: Method::GET,
        path: "/v1/mcp/servers",
        role: Some(Role::Viewer),
        handler: |m| on(m, catalogue::servers),
    },
    Route {
        method: Method::GET,
        path: "/v1/audit",
        role: Some(Role::Viewer),
        handler: |m| on(m, audit::list),
    },
    Route {
        method: Method::GET,
        path: "/v1/audit/verify",
        role: Some(Role::Viewer),
        handler: |m| on(m, audit::verify),
    },
];

/// The API: every route of [`ROUTES`] behind its role, a 64 KiB body limit, and our error
/// shape for unknown routes and methods.
pub(crate) fn router(state: AppState) -> Router {
    let mut router = Router::new();
    for route in ROUTES {
        let Ok(filter) = MethodFilter::try_from(route.method.clone()) else {
            tracing::error!(method = %route.method, path = route.path, "a route's method is not routable; it is left out");
            continue;
        };
        let mut method_router = (route.handler)(filter);
        // O5: `[metrics] require_token = false` lets a scraper without a token read it.
        let open_metrics = route.path == "/metrics" && !state.config.metrics.require_token;
        if let Some(role) = route.role.filter(|_| !open_metrics) {
            let guard = auth::Guard {
                state: state.clone(),
                role,
            };
            method_router = method_router
                .route_layer(axum::middleware::from_fn_with_state(guard, auth::require));
        }
        router = router.route(route.path, method_router);
    }
    // O4: the web console's pages, streams and assets beside the API.
    router
        .merge(console::router(state.clone()))
        // G1: the MCP gateway at `/mcp`, with its own token check (an MCP client needs the
        // `WWW-Authenticate` that points at the resource metadata).
        .merge(gateway::router())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(error::BODY_LIMIT))
        .layer(axum::middleware::from_fn_with_state(
            state.metrics.clone(),
            observe_request,
        ))
        .with_state(state)
}

/// One log line per API request, at info, and this process's request metrics: the
/// method, the route's template (never the concrete path, which may hold ids a dashboard
/// would explode on, nor the query), the status, the duration and the token's name.
async fn observe_request(
    axum::extract::State(metrics): axum::extract::State<Arc<Metrics>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let started = std::time::Instant::now();
    let method = request.method().clone();
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    // O5: one span per request, continuing the caller's trace when it sent `traceparent`.
    let span = tracing::info_span!(
        "http_request",
        otel.name = %format!("{method} {route}"),
        http.request.method = %method,
        http.route = %route,
        http.response.status_code = tracing::field::Empty,
    );
    if let Some(parent) = crate::telemetry::parent_of(request.headers()) {
        use tracing_opentelemetry::OpenTelemetrySpanExt as _;
        let _ = span.set_parent(parent);
    }
    let response = tracing::Instrument::instrument(next.run(request), span.clone()).await;
    span.record("http.response.status_code", response.status().as_u16());
    let token = response
        .extensions()
        .get::<auth::TokenName>()
        .map(|t| t.0.as_str());
    let took = started.elapsed();
    metrics.observe_request(&route, method.as_str(), response.status().as_u16(), took);
    tracing::info!(
        target: "runwarden::http",
        method = %method,
        route = %route,
        status = response.status().as_u16(),
        duration_ms = took.as_secs_f64() * 1000.0,
        token = token.unwrap_or("-"),
        "request"
    );
    response
}

/// `[metrics] listen`: `/metrics` alone, without a token, for a listener only the
/// scraper reaches. Counted like the API's own requests.
pub(crate) fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", axum::routing::get(metrics::metrics))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.metrics.clone(),
            observe_request,
        ))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::NotFound
}

async fn method_not_allowed() -> ApiError {
    ApiError::MethodNotAllowed
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

#[cfg(test)]
mod push_tests;
#[cfg(test)]
mod tests;
