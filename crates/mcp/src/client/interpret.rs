//! An HTTP answer read as the JSON-RPC result of its leg, or as a typed failure that says
//! what the server did.

use runwarden_vault::EgressResponse;
use serde_json::Value;

use super::McpClient;
use super::transport::LegAnswer;
use crate::error::{McpError, one_line};
use crate::sse;
use crate::stateless;

impl McpClient {
    /// M5: turns an HTTP answer into the JSON-RPC result, or a typed failure.
    pub(super) fn interpret(
        &self,
        method: &str,
        response: EgressResponse,
        id: Option<i64>,
        sent_session_id: bool,
    ) -> Result<LegAnswer, McpError> {
        if let Some(refusal) = self.refused(method, &response, sent_session_id) {
            return Err(refusal);
        }
        if response.truncated {
            return Err(self.too_large(method, &response, id));
        }
        let Some(id) = id else {
            // M1: a notification is accepted with 202 (any 2xx is tolerated).
            return Ok(LegAnswer {
                message: None,
                response,
            });
        };
        let message = self.response_to(method, &response, id)?;
        if let Some(error) = message.get("error") {
            return Err(McpError::Rpc {
                server: self.server.name.clone(),
                method: method.into(),
                status: None,
                code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: one_line(error.get("message").and_then(Value::as_str).unwrap_or("")),
            });
        }
        Ok(LegAnswer {
            message: message.get("result").cloned(),
            response,
        })
    }

    /// What an answer says before its body is read: the session is gone, the version is
    /// refused, or the HTTP status is an error (in the server's own words when it gave
    /// them).
    fn refused(
        &self,
        method: &str,
        response: &EgressResponse,
        sent_session_id: bool,
    ) -> Option<McpError> {
        let (server, method) = (self.server.name.clone(), method.to_string());
        if response.status == 404 && sent_session_id {
            return Some(McpError::SessionExpired { server, method });
        }
        if let Some(supported) = unsupported_version(response) {
            return Some(McpError::UnsupportedVersion {
                server,
                method,
                supported,
            });
        }
        if response.is_success() {
            return None;
        }
        // M5: a JSON-RPC error in the body of an HTTP error is the server's own words.
        Some(match rpc_error_in(response) {
            Some((code, message)) => McpError::Rpc {
                server,
                method,
                status: Some(response.status),
                code,
                message,
            },
            None => McpError::Status {
                server,
                method,
                status: response.status,
            },
        })
    }

    /// The JSON-RPC response to request `id` in a 2xx body: the JSON body itself, or the
    /// response event of a stream; any other body is a typed failure.
    fn response_to(
        &self,
        method: &str,
        response: &EgressResponse,
        id: i64,
    ) -> Result<Value, McpError> {
        let (server, method_s) = (self.server.name.clone(), method.to_string());
        if response.body.iter().all(u8::is_ascii_whitespace) {
            return Err(McpError::EmptyBody {
                server,
                method: method_s,
            });
        }
        let content_type = response
            .header("content-type")
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        match content_type.as_str() {
            "application/json" => {
                let message: Value = serde_json::from_slice(&response.body)
                    .map_err(|_| self.malformed(method, "the body is not JSON"))?;
                if !sse::is_response_to(&message, id) {
                    return Err(self.malformed(method, "the body is not a response to our request (neither result nor error for its id)"));
                }
                Ok(message)
            }
            "text/event-stream" => {
                let text = String::from_utf8_lossy(&response.body);
                sse::find_response(&text, id, true).ok_or(McpError::NoResponse {
                    server,
                    method: method_s,
                })
            }
            "text/html" => Err(McpError::Html {
                server,
                method: method_s,
            }),
            other => Err(McpError::ContentType {
                server,
                method: method_s,
                content_type: other.chars().take(60).collect(),
            }),
        }
    }

    /// M5: a 2xx answer cut at `max_response_bytes`. It names the size when the server
    /// declared one, and whether the server had finished the request: a JSON body is
    /// written once the request is done; a stream had begun the response to our id.
    fn too_large(&self, method: &str, response: &EgressResponse, id: Option<i64>) -> McpError {
        let size = response
            .header("content-length")
            .and_then(|v| v.trim().parse::<u64>().ok());
        let content_type = response.header("content-type").unwrap_or("");
        let complete = if content_type
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
        {
            true
        } else {
            id.is_some_and(|id| sse::response_begun(&String::from_utf8_lossy(&response.body), id))
        };
        McpError::TooLarge {
            server: self.server.name.clone(),
            method: method.into(),
            limit: self.server.max_response_bytes,
            size,
            complete,
        }
    }
}

/// M5: the code and message of a JSON-RPC error in a JSON body (one line, cut short).
fn rpc_error_in(response: &EgressResponse) -> Option<(i64, String)> {
    let json = response.header("content-type").is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
    });
    if !json || response.truncated {
        return None;
    }
    let message: Value = serde_json::from_slice(&response.body).ok()?;
    let error = message.get("error")?;
    let code = error.get("code").and_then(Value::as_i64)?;
    let text = error.get("message").and_then(Value::as_str).unwrap_or("");
    Some((code, one_line(text)))
}

/// Whether `body` holds the digits of the unsupported-version code. JSON has no other way
/// to write a number, so a body without them holds no such refusal.
fn mentions_code(body: &[u8]) -> bool {
    let digits = stateless::UNSUPPORTED_VERSION.unsigned_abs().to_string();
    memchr::memmem::find(body, digits.as_bytes()).is_some()
}

/// M19: the versions a server names when it refuses ours (JSON-RPC -32022, with or
/// without an HTTP error status), each cut to one short line.
fn unsupported_version(response: &EgressResponse) -> Option<Vec<String>> {
    let json = response.header("content-type").is_some_and(|t| {
        t.trim_start()
            .to_ascii_lowercase()
            .starts_with("application/json")
    });
    // Every JSON answer passes here before it is read, so most are spared a second parse:
    // a refusal carries its code, written as digits in any spelling JSON allows.
    if !json || response.truncated || !mentions_code(&response.body) {
        return None;
    }
    let message: Value = serde_json::from_slice(&response.body).ok()?;
    let error = message.get("error")?;
    if error.get("code").and_then(Value::as_i64) != Some(stateless::UNSUPPORTED_VERSION) {
        return None;
    }
    Some(
        error
            .pointer("/data/supported")
            .and_then(Value::as_array)
            .map(|versions| {
                versions
                    .iter()
                    .filter_map(Value::as_str)
                    .take(8)
                    .map(|v| one_line(v).chars().take(32).collect())
                    .collect()
            })
            .unwrap_or_default(),
    )
}
