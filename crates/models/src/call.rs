//! One model call through the vault: send, map the vault's errors, read the JSON answer
//! or assemble the streamed one.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use runwarden_vault::{
    CancellationSignal, EgressClient, EgressError, EgressRequest, EgressResponse,
};
use serde_json::Value;

use crate::error::ModelError;
use crate::parse::one_line;
use crate::provider::{ModelTurn, Progress};
use crate::stream::{StreamApi, StreamAssembler};

/// `max_tokens` when the agent sets none (L5); the Messages API requires one, and a local
/// server's default is often unlimited.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

/// The most of a model's answer that is read: 8 MiB.
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// The total bound of a model call when the caller sets none. Models think slowly.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// `{base}/{path}`, whether or not the base ends with a slash.
pub(crate) fn endpoint(base_url: &str, path: &str) -> String {
    format!("{}/{path}", base_url.trim_end_matches('/'))
}

/// A 2xx answer: a JSON document, or a turn assembled from its event stream.
pub(crate) enum ResponseBody {
    Json(Value),
    Streamed(ModelTurn),
}

/// Sends one model call through the vault's egress with the caller's signal (L1) and
/// hands back a 2xx answer.
///
/// With `stream`, the body is fed to a [`StreamAssembler`] as it arrives, and the vault
/// stops reading at the terminal event (L3); a cancel drops the open stream, so the server
/// sees the close and stops generating. A server that answers JSON anyway is read as JSON.
///
/// The request already names its credential; the vault places it (V3), so no key ever
/// passes through this crate.
pub(crate) async fn send(
    egress: &EgressClient,
    request: EgressRequest,
    signal: Option<&dyn CancellationSignal>,
    stream: Option<(StreamApi, Option<Progress>)>,
) -> Result<ResponseBody, ModelError> {
    let Some((api, progress)) = stream else {
        return send_json(egress, request, signal)
            .await
            .map(ResponseBody::Json);
    };
    let assembler = Arc::new(Mutex::new(StreamAssembler::new(api, progress)));
    let feeder = assembler.clone();
    // The vault calls this in the task that awaits `send`, so the lock is never contended.
    let request = request.complete_when(Box::new(move |body| {
        feeder.lock().map_or(true, |mut a| a.feed(body))
    }));
    let response = checked(egress.send(request, signal).await.map_err(from_egress)?)?;
    let streamed = response.header("content-type").is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("text/event-stream")
    });
    if !streamed {
        return json(&response).map(ResponseBody::Json);
    }
    let assembler = Arc::try_unwrap(assembler)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .filter(|a| a.fed() == response.body.len())
        .filter(|_| memchr::memmem::find(&response.body, REDACTED).is_none());
    // V9: the assembler read the body before the vault scrubbed it. When the scrubber cut
    // something (its mark is in the body, or the length changed), the turn is assembled
    // again from what the vault returned, so a secret the server echoed never gets in.
    let assembler = assembler.unwrap_or_else(|| {
        let mut again = StreamAssembler::new(api, None);
        again.feed(&response.body);
        again
    });
    assembler.finish(&response.body).map(ResponseBody::Streamed)
}

/// What a model's answer must not carry: checked once the turn is whole (every streamed
/// delta joined), before it is stored or acted on. Every stored secret is cut out of the
/// text; a tool call whose arguments carry one (the model's own key, another server's
/// credential, in any spelling) is not made: its arguments are dropped and it stands
/// refused with `secret_exfiltration`, an audit row naming the secret and the tool.
pub(crate) async fn guarded(
    egress: &EgressClient,
    mut turn: ModelTurn,
    correlation: Option<&str>,
) -> Result<ModelTurn, ModelError> {
    let redactor = egress.redactor().await.map_err(from_egress)?;
    if let Some(text) = turn.text.as_mut()
        && let std::borrow::Cow::Owned(clean) = redactor.text(text)
    {
        *text = clean;
    }
    for call in &mut turn.tool_calls {
        for field in [&mut call.id, &mut call.name] {
            if let std::borrow::Cow::Owned(clean) = redactor.text(field) {
                *field = clean;
            }
        }
        let secrets = redactor.secrets_in(&call.arguments);
        if secrets.is_empty() {
            continue;
        }
        let destination = format!("tool {}", call.name);
        let refused = egress
            .refuse_carried(&destination, secrets, "model", correlation)
            .await;
        call.arguments = Value::Null;
        call.invalid_arguments = Some(refused.to_string());
    }
    Ok(turn)
}

/// What the vault's scrubber puts in place of a secret (V9).
const REDACTED: &[u8] = b"[redacted]";

/// Sends a non-streamed call and parses its JSON answer.
async fn send_json(
    egress: &EgressClient,
    request: EgressRequest,
    signal: Option<&dyn CancellationSignal>,
) -> Result<Value, ModelError> {
    let response = checked(egress.send(request, signal).await.map_err(from_egress)?)?;
    json(&response)
}

/// A 2xx answer read whole, or the error it stands for.
fn checked(response: EgressResponse) -> Result<EgressResponse, ModelError> {
    if !response.is_success() {
        return Err(ModelError::Status {
            status: response.status,
            message: error_message(&response),
        });
    }
    if response.truncated {
        return Err(ModelError::Malformed(format!(
            "the answer is longer than {} MiB and was cut",
            MAX_RESPONSE_BYTES / (1024 * 1024)
        )));
    }
    Ok(response)
}

fn json(response: &EgressResponse) -> Result<Value, ModelError> {
    // The parser's message names a line and column, never the body's text.
    serde_json::from_slice(&response.body)
        .map_err(|e| ModelError::Malformed(format!("the answer is not JSON: {e}")))
}

/// The fields every model call sets the same way: body, limit, timeout and the audit
/// context (V7: actor, reason, correlation).
pub(crate) fn model_request(
    url: String,
    body: &Value,
    timeout: Duration,
    reason: String,
    correlation: Option<&str>,
    stream: bool,
) -> EgressRequest {
    let accept = if stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let request = EgressRequest::new(runwarden_vault::Method::Post, url)
        .header("content-type", "application/json")
        .header("accept", accept)
        .body(body.to_string().into_bytes())
        .timeout(timeout)
        .max_response_bytes(MAX_RESPONSE_BYTES)
        .actor("model")
        .reason(reason);
    match correlation {
        Some(c) => request.correlation(c),
        None => request,
    }
}

/// V6: the two cancellations keep their meaning; everything else is the vault's failure.
pub(crate) fn from_egress(error: EgressError) -> ModelError {
    match error {
        EgressError::CancelledBeforeSend => ModelError::Cancelled { in_flight: false },
        EgressError::CancelledInFlight { .. } => ModelError::Cancelled { in_flight: true },
        other => ModelError::Egress(Box::new(other)),
    }
}

/// The provider's own error message: `error.message` (OpenAI, Anthropic, vLLM), a string
/// `error` (Ollama), else the body's text; one line, at most 200 characters.
fn error_message(response: &EgressResponse) -> String {
    let parsed: Option<Value> = serde_json::from_slice(&response.body).ok();
    let from_json = parsed.as_ref().and_then(|v| {
        let error = v.get("error")?;
        error
            .get("message")
            .and_then(Value::as_str)
            .or_else(|| error.as_str())
            .map(str::to_string)
    });
    let text = from_json.unwrap_or_else(|| String::from_utf8_lossy(&response.body).into_owned());
    let line = one_line(&text);
    if line.is_empty() {
        "no message".into()
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(status: u16, body: &str) -> EgressResponse {
        EgressResponse {
            status,
            headers: Vec::new(),
            body: body.as_bytes().to_vec(),
            truncated: false,
            audit_id: None,
        }
    }

    #[test]
    fn the_endpoint_tolerates_a_trailing_slash() {
        assert_eq!(endpoint("http://h/v1/", "messages"), "http://h/v1/messages");
        assert_eq!(endpoint("http://h/v1", "messages"), "http://h/v1/messages");
    }

    #[test]
    fn an_error_message_is_read_from_each_provider_shape() {
        let openai = r#"{"error":{"message":"Rate limit\nreached","type":"requests"}}"#;
        assert_eq!(error_message(&response(429, openai)), "Rate limit reached");
        let ollama = r#"{"error":"model \"x\" not found"}"#;
        assert_eq!(
            error_message(&response(404, ollama)),
            "model \"x\" not found"
        );
        assert_eq!(
            error_message(&response(502, "<h1>Bad\nGateway</h1>")),
            "<h1>Bad Gateway</h1>"
        );
        assert_eq!(error_message(&response(500, "")), "no message");
    }

    #[test]
    fn the_vault_cancellations_keep_their_meaning() {
        assert!(matches!(
            from_egress(EgressError::CancelledBeforeSend),
            ModelError::Cancelled { in_flight: false }
        ));
        assert!(matches!(
            from_egress(EgressError::CancelledInFlight { host: "h".into() }),
            ModelError::Cancelled { in_flight: true }
        ));
        let timeout = from_egress(EgressError::Timeout {
            host: "h".into(),
            after: Duration::from_secs(1),
            delivery: runwarden_vault::Delivery::MaybeDelivered,
        });
        assert!(timeout.is_retryable() && !timeout.is_cancelled());
        assert_eq!(
            timeout.delivery(),
            runwarden_vault::Delivery::MaybeDelivered
        );
    }
}
