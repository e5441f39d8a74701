//! One model call through the vault: send, map the vault's errors, read the JSON answer.

use std::time::Duration;

use runwarden_vault::{
    CancellationSignal, EgressClient, EgressError, EgressRequest, EgressResponse,
};
use serde_json::Value;

use crate::error::ModelError;

/// The most of a model's answer that is read: 8 MiB.
pub const MAX_RESPONSE_BYTES: usize = 8 * 1024 * 1024;

/// The total bound of a model call when the caller sets none. Models think slowly.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// `{base}/{path}`, whether or not the base ends with a slash.
pub(crate) fn endpoint(base_url: &str, path: &str) -> String {
    format!("{}/{path}", base_url.trim_end_matches('/'))
}

/// Sends one model call through the vault's egress with the caller's signal (L1) and
/// hands back the parsed JSON of a 2xx answer.
///
/// The request already names its credential; the vault places it (V3), so no key ever
/// passes through this crate.
pub(crate) async fn send_json(
    egress: &EgressClient,
    request: EgressRequest,
    signal: Option<&dyn CancellationSignal>,
) -> Result<Value, ModelError> {
    let response = egress.send(request, signal).await.map_err(from_egress)?;
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
) -> EgressRequest {
    let request = EgressRequest::new(runwarden_vault::Method::Post, url)
        .header("content-type", "application/json")
        .header("accept", "application/json")
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

/// Whitespace collapsed to single spaces, cut to 200 characters.
pub(crate) fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() <= 200 {
        joined
    } else {
        joined.chars().take(199).chain(['…']).collect()
    }
}

/// An arguments value as an object: `null` reads as `{}`, anything else not an object is
/// refused by the caller.
pub(crate) fn arguments_object(value: Value) -> Option<Value> {
    match value {
        Value::Null => Some(Value::Object(Default::default())),
        Value::Object(_) => Some(value),
        _ => None,
    }
}

/// L5: `usage.{input}` and `usage.{output}` of an answer, when both are there.
pub(crate) fn usage(answer: &Value, input: &str, output: &str) -> Option<crate::provider::Usage> {
    let usage = answer.get("usage")?;
    Some(crate::provider::Usage {
        input_tokens: usage.get(input)?.as_u64()?,
        output_tokens: usage.get(output)?.as_u64()?,
    })
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
    fn a_long_message_is_cut_to_200_characters() {
        let cut = one_line(&"word ".repeat(100));
        assert_eq!(cut.chars().count(), 200);
        assert!(cut.ends_with('…'));
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
