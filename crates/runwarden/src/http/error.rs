//! The API's one error shape, `{"error": {"code", "message"}}`, and the extractors that
//! turn axum's rejections into it.

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use runwarden_base::StoreError;
use serde::de::DeserializeOwned;
use serde_json::json;

/// Every error the API answers. Client errors carry their own status, stable code and a
/// message that says what to fix; `Internal` answers a generic message and the real error
/// goes to the log only (STYLE "Errors").
#[derive(Debug)]
pub(crate) enum ApiError {
    /// 401: no bearer token, or one that is not a live token.
    Unauthorized(String),
    /// 403: the token's role may not do this.
    Forbidden(String),
    /// 404: no such route.
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 404: no run with that id.
    RunNotFound(String),
    /// 404: no agent with that name in the configuration.
    AgentNotFound(String),
    /// 409: the agent is configured but cannot run (its tools do not bind).
    AgentUnavailable(String),
    /// 409: the run already ended.
    RunAlreadyTerminal(String),
    /// 404: no call with that id is open in that run on this server.
    CallNotFound {
        /// The run.
        run_id: String,
        /// The call.
        call_id: String,
    },
    /// 404: no decision with that id.
    DecisionNotFound(String),
    /// 409: the decision takes no answer now (answered, expired, its run cancelled or
    /// finished).
    DecisionRefused(String),
    /// 409: the `Idempotency-Key` made another run from another body.
    IdempotencyKeyReused {
        /// The run the key made.
        run_id: String,
    },
    /// 400: the body is not JSON.
    InvalidJson(String),
    /// 400: the body or query has a field we do not know.
    UnknownField(String),
    /// 400: anything else wrong with the request.
    InvalidRequest(String),
    /// 413: the body is larger than the route's limit (in bytes).
    BodyTooLarge(usize),
    /// 408: the body did not arrive within the body-read timeout.
    RequestTimeout,
    /// 503: the store does not answer or accept a write (`/readyz`); the kind of fault
    /// (`disk_full`, `read_only`, `io`, `corrupt`, ...) when the store named one.
    NotReady(Option<&'static str>),
    /// 503: the store is locked by another process, full, out of file descriptors,
    /// read-only or damaged; the client may retry after [`RETRY_AFTER_SECONDS`]. The fault
    /// goes to the log; the body names only its kind.
    StoreUnavailable(StoreError),
    /// 500: our fault; the error is logged, never sent.
    Internal(anyhow::Error),
}

/// What `Retry-After` tells a client of a 503: a few seconds, the order of a write
/// transaction held by another process (SQLite's busy timeout is five).
pub(crate) const RETRY_AFTER_SECONDS: u64 = 5;

/// The largest request body the API reads.
pub(crate) const BODY_LIMIT: usize = 64 * 1024;

/// The largest console sign-in form: a token and a CSRF-free field or two.
pub(crate) const LOGIN_BODY_LIMIT: usize = 4 * 1024;

/// The largest body a request to `path` may send: a sign-in form needs a few KiB, the
/// API's JSON bodies and the console's other forms at most [`BODY_LIMIT`].
pub(crate) fn body_limit(path: &str) -> usize {
    if path == "/console/login" {
        LOGIN_BODY_LIMIT
    } else {
        BODY_LIMIT
    }
}

impl ApiError {
    /// The HTTP status and the stable code.
    pub(crate) fn status_and_code(&self) -> (StatusCode, &'static str) {
        match self {
            Self::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "unauthorized"),
            Self::Forbidden(_) => (StatusCode::FORBIDDEN, "forbidden"),
            Self::NotFound => (StatusCode::NOT_FOUND, "not_found"),
            Self::MethodNotAllowed => (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"),
            Self::RunNotFound(_) => (StatusCode::NOT_FOUND, "run_not_found"),
            Self::CallNotFound { .. } => (StatusCode::NOT_FOUND, "call_not_found"),
            Self::AgentNotFound(_) => (StatusCode::NOT_FOUND, "agent_not_found"),
            Self::AgentUnavailable(_) => (StatusCode::CONFLICT, "agent_unavailable"),
            Self::RunAlreadyTerminal(_) => (StatusCode::CONFLICT, "run_already_terminal"),
            Self::DecisionNotFound(_) => (StatusCode::NOT_FOUND, "decision_not_found"),
            Self::DecisionRefused(_) => (StatusCode::CONFLICT, "decision_refused"),
            Self::IdempotencyKeyReused { .. } => (StatusCode::CONFLICT, "idempotency_key_reused"),
            Self::InvalidJson(_) => (StatusCode::BAD_REQUEST, "invalid_json"),
            Self::UnknownField(_) => (StatusCode::BAD_REQUEST, "unknown_field"),
            Self::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            Self::BodyTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large"),
            Self::RequestTimeout => (StatusCode::REQUEST_TIMEOUT, "request_timeout"),
            Self::NotReady(_) => (StatusCode::SERVICE_UNAVAILABLE, "not_ready"),
            Self::StoreUnavailable(_) => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
            Self::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        }
    }

    fn message(&self) -> String {
        match self {
            Self::Unauthorized(m)
            | Self::Forbidden(m)
            | Self::AgentUnavailable(m)
            | Self::RunAlreadyTerminal(m)
            | Self::DecisionRefused(m)
            | Self::InvalidJson(m)
            | Self::UnknownField(m)
            | Self::InvalidRequest(m) => m.clone(),
            Self::NotFound => "no such route: see /v1/openapi.json for the API".into(),
            Self::MethodNotAllowed => "this route does not take that method".into(),
            Self::RunNotFound(id) => format!("no run with id {id}"),
            Self::CallNotFound { run_id, call_id } => format!(
                "no call {call_id} is open in run {run_id} on this server: GET /v1/runs/{run_id}/calls lists the open ones (a gateway session's calls, on the server that holds it)"
            ),
            Self::IdempotencyKeyReused { run_id } => format!(
                "this Idempotency-Key already made run {run_id} from a different body: send a new key with a new request"
            ),
            Self::DecisionNotFound(id) => {
                format!("no decision with id {id}: GET /v1/decisions lists them")
            }
            Self::AgentNotFound(name) => {
                format!("no agent named {name}: add [agents.{name}] to the configuration")
            }
            Self::BodyTooLarge(limit) => {
                format!("the request body is larger than {limit} bytes, the limit of this route")
            }
            Self::RequestTimeout => {
                "the request body did not arrive within the body-read timeout".into()
            }
            Self::NotReady(Some(fault)) => format!(
                "the store does not accept writes ({fault}): the server log has the details"
            ),
            Self::NotReady(None) => "the store does not answer".into(),
            Self::StoreUnavailable(error) => format!(
                "the store cannot answer right now ({}): retry in {RETRY_AFTER_SECONDS} seconds; the server log has the details",
                error.fault.as_str()
            ),
            Self::Internal(_) => "internal error: the server log has the details".into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code) = self.status_and_code();
        match &self {
            Self::Internal(error) => {
                tracing::error!(error = format!("{error:#}"), "an API request failed");
            }
            Self::StoreUnavailable(error) => {
                tracing::warn!(%error, fault = error.fault.as_str(), "the store is unavailable; answered 503");
            }
            _ => {}
        }
        let body = json!({ "error": { "code": code, "message": self.message() } });
        let mut response = (status, axum::Json(body)).into_response();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
        }
        response
    }
}

impl ApiError {
    /// The store fault somewhere in an error's chain that makes the store unavailable, if
    /// there is one.
    pub(crate) fn store_fault(error: &anyhow::Error) -> Option<&StoreError> {
        error
            .chain()
            .filter_map(|cause| {
                cause.downcast_ref::<StoreError>().or_else(|| {
                    match cause.downcast_ref::<runwarden_vault::VaultError>() {
                        Some(runwarden_vault::VaultError::Store(inner)) => Some(inner),
                        _ => None,
                    }
                })
            })
            .find(|fault| fault.is_unavailable())
    }
}

/// Any error: a store that is unavailable is a 503 the client may retry, anything else
/// is our fault (500).
impl From<anyhow::Error> for ApiError {
    fn from(error: anyhow::Error) -> Self {
        match Self::store_fault(&error) {
            Some(fault) => Self::StoreUnavailable(fault.clone()),
            None => Self::Internal(error),
        }
    }
}

impl From<runwarden_runtime::DecideError> for ApiError {
    fn from(error: runwarden_runtime::DecideError) -> Self {
        use runwarden_runtime::DecideError;
        match error {
            DecideError::NotFound(id) => Self::DecisionNotFound(id),
            DecideError::WrongAnswer { .. } | DecideError::Invalid(_) => {
                Self::InvalidRequest(error.to_string())
            }
            DecideError::Refused { message, .. } => Self::DecisionRefused(message),
            DecideError::Store(error) => Self::from(error),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        Self::from(anyhow::Error::from(error))
    }
}

impl From<runwarden_vault::VaultError> for ApiError {
    fn from(error: runwarden_vault::VaultError) -> Self {
        Self::from(anyhow::Error::from(error))
    }
}

/// serde's "unknown field `x`, expected ..." is our `unknown_field`; any other shape
/// problem is `invalid_request`.
/// axum's words for a body it could not read, in ours: what did not fit, without the
/// framework's phrasing ("Failed to deserialize the JSON body into the target type").
fn our_words(message: String) -> String {
    const PREFIXES: [(&str, &str); 2] = [
        (
            "Failed to deserialize the JSON body into the target type: ",
            "the body does not fit the request: ",
        ),
        (
            "Failed to parse the request body as JSON: ",
            "the body is not JSON: ",
        ),
    ];
    for (theirs, ours) in PREFIXES {
        if let Some(rest) = message.strip_prefix(theirs) {
            return format!("{ours}{rest}");
        }
    }
    message
}

fn shape_error(message: String) -> ApiError {
    let message = our_words(message);
    if message.contains("unknown field") {
        ApiError::UnknownField(message)
    } else {
        ApiError::InvalidRequest(message)
    }
}

impl From<JsonRejection> for ApiError {
    fn from(rejection: JsonRejection) -> Self {
        match rejection {
            JsonRejection::JsonDataError(e) => shape_error(e.body_text()),
            JsonRejection::JsonSyntaxError(e) => Self::InvalidJson(our_words(e.body_text())),
            JsonRejection::MissingJsonContentType(_) => {
                Self::InvalidRequest("send the body with Content-Type: application/json".into())
            }
            other if other.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Self::BodyTooLarge(BODY_LIMIT)
            }
            other => Self::InvalidRequest(other.body_text()),
        }
    }
}

impl From<QueryRejection> for ApiError {
    fn from(rejection: QueryRejection) -> Self {
        shape_error(rejection.body_text())
    }
}

impl From<PathRejection> for ApiError {
    fn from(rejection: PathRejection) -> Self {
        Self::InvalidRequest(rejection.body_text())
    }
}

/// `axum::Json` whose rejections come back in our error shape.
#[derive(Debug)]
pub(crate) struct Json<T>(pub(crate) T);

impl<S, T> FromRequest<S> for Json<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let axum::Json(value) = axum::Json::<T>::from_request(request, state).await?;
        Ok(Self(value))
    }
}

/// `axum::extract::Query` whose rejections come back in our error shape.
#[derive(Debug)]
pub(crate) struct Query<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for Query<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Query(value) =
            axum::extract::Query::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

/// `axum::extract::Path` whose rejections come back in our error shape.
#[derive(Debug)]
pub(crate) struct Path<T>(pub(crate) T);

impl<S, T> FromRequestParts<S> for Path<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let axum::extract::Path(value) =
            axum::extract::Path::<T>::from_request_parts(parts, state).await?;
        Ok(Self(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(error: ApiError) -> (StatusCode, serde_json::Value) {
        let response = error.into_response();
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), BODY_LIMIT)
            .await
            .unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn a_server_error_answers_a_generic_message_and_never_the_cause() {
        let (status, body) = body(ApiError::Internal(anyhow::anyhow!(
            "database at /secret/path is locked"
        )))
        .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["code"], "internal");
        assert!(!body.to_string().contains("/secret/path"), "{body}");
    }

    #[tokio::test]
    async fn a_store_fault_anywhere_in_the_chain_is_a_503_with_retry_after_and_no_details() {
        use runwarden_base::StoreFault;
        let fault = StoreError::with_fault(
            "listing runs",
            StoreFault::Busy,
            "database /secret/path is locked",
        );
        let wrapped = anyhow::Error::from(fault).context("while listing runs");
        let response = ApiError::from(wrapped).into_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers()[header::RETRY_AFTER], "5");
        let bytes = axum::body::to_bytes(response.into_body(), BODY_LIMIT)
            .await
            .unwrap();
        let answer: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(answer["error"]["code"], "store_unavailable");
        assert!(!answer.to_string().contains("/secret/path"), "{answer}");
        let other = StoreError::new("listing runs", "a constraint failed");
        let (status, body) = body(ApiError::from(other)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["error"]["code"], "internal");
    }

    #[tokio::test]
    async fn a_client_error_has_its_status_code_and_message() {
        let (status, body) = body(ApiError::RunNotFound("r1".into())).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            json!({ "error": { "code": "run_not_found", "message": "no run with id r1" } })
        );
    }
}
