//! Every operation other than a tool call: `tools/list` walked to its end, `ping`, the
//! health probe, and the notifications.

use rmcp::model::{CancelledNotificationParam, NumberOrString, PaginatedRequestParams};
use runwarden_vault::CancellationSignal;
use serde_json::{Value, json};

use super::listen::METHOD_NOT_FOUND;
use super::operation::RequestTrail;
use super::{McpClient, Operation, Session};
use crate::catalogue::ListedTool;
use crate::error::McpError;
use crate::stateless::{self, STATELESS_VERSION};

/// The most `tools/list` pages one discovery walks (M6).
const MAX_PAGES: usize = 50;

/// A request operation other than a tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Request {
    /// Walk `tools/list` to the end (M6).
    ListTools,
    /// `ping`.
    Ping,
    /// M11, M19: the probe that fits the server's version: `server/discover` at 2026-07-28
    /// (stateless servers have no `ping`), `ping` at older versions, with `tools/list`
    /// when the server does not answer `ping`.
    Health,
}

/// The answer to a [`Request`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Reply {
    /// Every tool the server listed, in order.
    Tools(Vec<ListedTool>),
    /// The server answered the ping.
    Pong,
    /// The server answered the health probe.
    Alive {
        /// The protocol version spoken.
        protocol: String,
        /// The method that proved it alive (`server/discover`, `ping` or `tools/list`).
        probe: String,
    },
}

/// A notification operation.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notification {
    /// `notifications/cancelled` for a request of ours.
    Cancelled {
        /// The JSON-RPC id of the request.
        request_id: i64,
        /// Why, for the server's log.
        reason: String,
    },
}

impl McpClient {
    /// Sends a request operation (seam 2 of 3): handshake if needed, then the request's
    /// legs (each `tools/list` page), all under one deadline and the caller's signal.
    pub async fn send_request(
        &self,
        request: Request,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<Reply, McpError> {
        let op = self.operation(signal, None);
        let reply = match request {
            Request::ListTools => self.list_tools(&op).await.map(Reply::Tools),
            Request::Ping => self.ping(&op).await.map(|()| Reply::Pong),
            Request::Health => self.probe(&op).await,
        };
        self.record_contact(&op, reply.as_ref().map(|_| ())).await;
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(RequestTrail {
            protocol: op.protocol(),
            trail: op.trail(),
            legs: op.legs(),
        });
        reply
    }

    /// How the last [`send_request`](Self::send_request) of this client went (the
    /// protocol, the legs), for a caller that runs one operation at a time and reports
    /// it, as the CLI does. Concurrent callers must not rely on it.
    pub fn last_request(&self) -> Option<RequestTrail> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// M11, M19: the health probe that fits the version. At 2026-07-28 the `server/discover`
    /// of this operation's handshake is the probe when it ran, else one is sent; at older
    /// versions `ping`, and `tools/list` when the server does not implement `ping`.
    async fn probe(&self, op: &Operation<'_>) -> Result<Reply, McpError> {
        let session = self.session(op).await?;
        let alive = |probe: &str| Reply::Alive {
            protocol: session.protocol.clone(),
            probe: probe.into(),
        };
        if session.stateless {
            if op.answered("server/discover") {
                return Ok(alive("server/discover"));
            }
            return match self.discover(op).await? {
                Some(_) => Ok(alive("server/discover")),
                None => Err(McpError::Protocol {
                    server: self.server.name.clone(),
                    problem: format!(
                        "the server no longer serves {STATELESS_VERSION} (its server/discover answer does not name it); the next operation negotiates again"
                    ),
                }),
            };
        }
        match self.ping(op).await {
            Ok(()) => Ok(alive("ping")),
            Err(
                McpError::Rpc {
                    code: METHOD_NOT_FOUND,
                    ..
                }
                | McpError::Status {
                    status: 404 | 405, ..
                },
            ) => {
                self.list_tools(op).await?;
                Ok(alive("tools/list"))
            }
            Err(error) => Err(error),
        }
    }

    async fn ping(&self, op: &Operation<'_>) -> Result<(), McpError> {
        let session = self.session(op).await?;
        let id = self.next_id();
        let message = json!({"jsonrpc": "2.0", "id": id, "method": "ping"});
        self.leg(op, Some(&session), "ping", message, Some(id))
            .await
            .map(|_| ())
    }

    /// Sends a notification operation (seam 3 of 3), handshake included if needed.
    pub async fn send_notification(
        &self,
        notification: Notification,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<(), McpError> {
        let op = self.operation(signal, None);
        let sent = self.notify(&op, notification).await;
        self.record_contact(&op, sent.as_ref().map(|_| ())).await;
        sent
    }

    async fn notify(&self, op: &Operation<'_>, notification: Notification) -> Result<(), McpError> {
        let session = self.session(op).await?;
        if session.stateless {
            // M19: a 2026-07-28 server takes no notifications from a client; a request
            // is cancelled by closing its response stream.
            return Err(McpError::Protocol {
                server: self.server.name.clone(),
                problem: "the server speaks 2026-07-28, which has no client notifications: a request is cancelled by closing its stream".into(),
            });
        }
        let (method, params) = match notification {
            Notification::Cancelled { request_id, reason } => (
                "notifications/cancelled",
                serde_json::to_value(CancelledNotificationParam::new(
                    Some(NumberOrString::Number(request_id)),
                    Some(reason),
                ))
                .unwrap_or(Value::Null),
            ),
        };
        let message = json!({"jsonrpc": "2.0", "method": method, "params": params});
        self.leg(op, Some(&session), method, message, None)
            .await
            .map(|_| ())
    }

    /// M6: walks the cursor; a 404 on a session re-initialises once (a read is safe to
    /// repeat).
    pub(super) async fn list_tools(&self, op: &Operation<'_>) -> Result<Vec<ListedTool>, McpError> {
        let mut session = self.session(op).await?;
        self.require_tools(&session)?;
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        let mut renewed = false;
        let mut pages = 0;
        loop {
            if pages == MAX_PAGES {
                return Err(McpError::TooManyPages {
                    server: self.server.name.clone(),
                    pages: MAX_PAGES,
                });
            }
            let id = self.next_id();
            let params = PaginatedRequestParams::default().with_cursor(cursor.clone());
            let message =
                json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": params});
            let answer = match self
                .leg(op, Some(&session), "tools/list", message, Some(id))
                .await
            {
                Err(McpError::SessionExpired { .. }) if !renewed => {
                    renewed = true;
                    self.forget(&session).await;
                    session = self.session(op).await?;
                    continue;
                }
                other => other?,
            };
            pages += 1;
            let mut result = answer.message.unwrap_or(Value::Null);
            // The catalogue keeps descriptions and schemas and sends them to model
            // providers: each string is checked for every stored secret once more, as
            // decoded, before anything is kept.
            self.egress
                .redactor()
                .await
                .map_err(|e| self.egress_error(op, "tools/list", e))?
                .value(&mut result);
            let page = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| self.malformed("tools/list", "the result has no tools list"))?;
            for tool in page {
                tools.push(self.listed_tool(tool)?);
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_string);
            if cursor.is_none() {
                return Ok(tools);
            }
        }
    }

    fn listed_tool(&self, tool: &Value) -> Result<ListedTool, McpError> {
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| self.malformed("tools/list", "a tool has no name"))?;
        let input_schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
        // M19: what each call of this tool mirrors into headers, or why it is refused.
        self.header_params
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string(), stateless::header_params(&input_schema));
        Ok(ListedTool {
            name: name.to_string(),
            description: tool
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_string),
            input_schema,
            output_schema: tool.get("outputSchema").cloned(),
            task_support: tool
                .pointer("/execution/taskSupport")
                .and_then(Value::as_str)
                .map(str::to_string),
        })
    }

    pub(super) fn require_tools(&self, session: &Session) -> Result<(), McpError> {
        if session.tools {
            Ok(())
        } else {
            Err(McpError::NoTools {
                server: self.server.name.clone(),
                protocol: session.protocol.clone(),
                via: if session.stateless {
                    "server/discover"
                } else {
                    "initialize"
                },
            })
        }
    }
}
