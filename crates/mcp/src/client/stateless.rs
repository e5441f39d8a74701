//! What the 2026-07-28 revision asks of the client: the `server/discover` probe, the
//! client's `_meta` on every request, the tool's arguments mirrored into headers, and the
//! questions of an `input_required` result answered at once.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use runwarden_vault::EgressRequest;
use serde_json::{Map, Value, json};

use super::listen::Listen;
use super::{McpCall, McpClient, Operation, Session};
use crate::error::{McpError, one_line};
use crate::stateless::{self, InputRequired, InputResume, STATELESS_VERSION};
use crate::versions::HANDSHAKE_VERSIONS;

impl McpClient {
    /// M19: the client's `_meta` for a 2026-07-28 request: the version, the capabilities
    /// (no sampling, no roots; elicitation only when the operator answers this server's
    /// questions) and who it is.
    fn request_meta(&self, version: &str) -> Map<String, Value> {
        let mut meta = Map::new();
        meta.insert(stateless::META_VERSION.into(), json!(version));
        meta.insert(
            stateless::META_CAPABILITIES.into(),
            self.client_capabilities(),
        );
        meta.insert(
            stateless::META_CLIENT_INFO.into(),
            json!({"name": "runwarden", "version": env!("CARGO_PKG_VERSION")}),
        );
        meta
    }

    /// M19: probes `server/discover` at 2026-07-28. `Some` when the server serves it; a
    /// server that refuses the version (-32022) naming 2026-07-28 among what it serves is
    /// asked once more; anything an older server answers (an HTTP error status, a
    /// JSON-RPC error, a result without 2026-07-28) is `None`, so the caller falls back
    /// to `initialize`. A failure that says nothing about the server's era (transport,
    /// cancel, budget) is the operation's error.
    pub(super) async fn discover(
        &self,
        op: &Operation<'_>,
    ) -> Result<Option<(Session, Duration)>, McpError> {
        for attempt in 0..2 {
            let probe = Session {
                id: None,
                protocol: STATELESS_VERSION.into(),
                tools: false,
                stateless: true,
                remembered: false,
                correlation: None,
                no_standalone: AtomicBool::new(false),
                generation: 0,
            };
            let id = self.next_id();
            let message = json!({
                "jsonrpc": "2.0", "id": id, "method": "server/discover",
                "params": {"_meta": self.request_meta(STATELESS_VERSION)},
            });
            let answer = match self
                .leg(op, Some(&probe), "server/discover", message, Some(id))
                .await
            {
                Ok(answer) => answer,
                Err(McpError::UnsupportedVersion { supported, .. })
                    if attempt == 0 && supported.iter().any(|v| v == STATELESS_VERSION) =>
                {
                    continue;
                }
                Err(McpError::UnsupportedVersion { supported, .. })
                    if supported
                        .iter()
                        .any(|v| HANDSHAKE_VERSIONS.contains(&v.as_str())) =>
                {
                    return Ok(None);
                }
                Err(error @ McpError::UnsupportedVersion { .. }) => return Err(error),
                // A refused credential says nothing of the server's era, and is not sent
                // again to `initialize`.
                Err(
                    error @ McpError::Status {
                        status: 401 | 403, ..
                    },
                ) => return Err(error),
                Err(
                    McpError::Status { .. }
                    | McpError::Rpc { .. }
                    | McpError::Malformed { .. }
                    | McpError::EmptyBody { .. }
                    | McpError::ContentType { .. }
                    | McpError::Html { .. }
                    | McpError::NoResponse { .. },
                ) => return Ok(None),
                Err(error) => return Err(error),
            };
            let result = answer.message.unwrap_or(Value::Null);
            let serves = result
                .get("supportedVersions")
                .and_then(Value::as_array)
                .is_some_and(|v| v.iter().any(|v| v.as_str() == Some(STATELESS_VERSION)));
            if !serves {
                return Ok(None);
            }
            let session = Session {
                id: None,
                protocol: STATELESS_VERSION.into(),
                tools: result.pointer("/capabilities/tools").is_some(),
                stateless: true,
                remembered: false,
                correlation: op.correlation.clone(),
                no_standalone: AtomicBool::new(false),
                generation: 0,
            };
            return Ok(Some((session, crate::known::discover_ttl(&result))));
        }
        Ok(None)
    }

    /// M19: the call's `Mcp-Param-*` headers. The tool's `x-mcp-header` parameters are
    /// learnt from `tools/list` (listed in this operation when this client has not seen
    /// the tool yet); a tool whose declarations break the rules, or an argument that
    /// cannot be a header, refuses the call before anything is sent.
    pub(super) async fn param_headers(
        &self,
        op: &Operation<'_>,
        call: &McpCall,
    ) -> Result<Vec<(String, String)>, McpError> {
        let known = |client: &Self| {
            client
                .header_params
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(&call.tool)
                .cloned()
        };
        let params = match known(self) {
            Some(params) => Some(params),
            None => {
                // Boxed, as the handshake is (see `session`): rare, and large.
                Box::pin(self.list_tools(op)).await?;
                known(self)
            }
        };
        let params = match params {
            // A tool the server does not list has nothing to mirror.
            None => return Ok(Vec::new()),
            Some(Err(refusal)) => {
                return Err(McpError::ToolHeaders {
                    server: self.server.name.clone(),
                    tool: call.tool.clone(),
                    problem: refusal.to_string(),
                });
            }
            Some(Ok(params)) => params,
        };
        stateless::mirrored_headers(&params, &call.arguments).map_err(|e| McpError::HeaderValue {
            server: self.server.name.clone(),
            tool: call.tool.clone(),
            problem: e.to_string(),
        })
    }

    /// M19: answers the questions of an `input_required` result at once: an elicitation
    /// through the call's elicitor (declined without one), anything else is refused.
    pub(super) async fn answer_inputs(
        &self,
        op: &Operation<'_>,
        session: &Session,
        call: &McpCall,
        asked: &InputRequired,
    ) -> Result<InputResume, McpError> {
        let listen = Listen {
            tool: Some(&call.tool),
            elicitor: call.elicitor.as_ref(),
            ..Listen::plain(session)
        };
        let mut responses = Map::new();
        for request in &asked.requests {
            if request.method != "elicitation/create" {
                return Err(McpError::InputRefused {
                    server: self.server.name.clone(),
                    tool: call.tool.clone(),
                    problem: format!(
                        "the server asked for {:?} as input, which runwarden does not offer",
                        one_line(&request.method)
                    ),
                });
            }
            let answer = self.elicit(op, &listen, &request.params).await;
            responses.insert(request.key.clone(), answer);
        }
        Ok(InputResume {
            responses,
            request_state: asked.request_state.clone(),
        })
    }

    /// M19: every request of a 2026-07-28 connection carries the version, the client's
    /// capabilities and identity in `_meta`, matching the version header. A response or a
    /// notification (no id, or no method) is left as it is.
    pub(super) fn stamp_request_meta(&self, message: &mut Value, session: &Session) {
        if !session.stateless || message.get("id").is_none() || message.get("method").is_none() {
            return;
        }
        if !message.get("params").is_some_and(Value::is_object) {
            message["params"] = json!({});
        }
        let params = &mut message["params"];
        if !params.get("_meta").is_some_and(Value::is_object) {
            params["_meta"] = json!({});
        }
        if let Some(meta) = params["_meta"].as_object_mut() {
            meta.extend(self.request_meta(&session.protocol));
        }
    }
}

/// M19: the method, and for the methods that name something the name, as headers on every
/// POST, so gateways route without reading the body.
pub(super) fn routing_headers(mut request: EgressRequest, message: &Value) -> EgressRequest {
    let Some(name) = message.get("method").and_then(Value::as_str) else {
        return request;
    };
    request = request.header("mcp-method", stateless::encode_header_value(name));
    let named = match name {
        "tools/call" | "prompts/get" => message.pointer("/params/name"),
        "resources/read" => message.pointer("/params/uri"),
        _ => None,
    };
    if let Some(named) = named.and_then(Value::as_str) {
        request = request.header("mcp-name", stateless::encode_header_value(named));
    }
    request
}
