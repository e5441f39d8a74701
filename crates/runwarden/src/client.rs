//! The CLI's client for a running `runwarden serve` (`--server URL`), so a cancel from the
//! CLI wakes the run at once through the server's hub. It only ever talks to the
//! operator's own server: runs' outbound calls still go through the vault alone.

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// A token in `$RUNWARDEN_TOKEN` (or the `[client] token_file`) authenticates the CLI.
pub(crate) const TOKEN_ENV: &str = "RUNWARDEN_TOKEN";

/// A runwarden server and the token to present to it.
pub(crate) struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// How an API answer went, as the CLI needs it.
pub(crate) enum ApiOutcome {
    /// A 2xx with its JSON body.
    Ok(Value),
    /// The server's error: its status and message (the stable code stays in the body).
    Refused { status: u16, message: String },
}

impl ApiClient {
    pub(crate) fn new(base: &str, token: Option<String>) -> anyhow::Result<Self> {
        let base = base.trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            bail!("--server must be an http(s) URL like http://127.0.0.1:8080, not {base:?}");
        }
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .build()
            .context("while building the API client")?;
        Ok(Self { base, token, http })
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> anyhow::Result<ApiOutcome> {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .timeout(Duration::from_secs(120))
            .send()
            .await
            .with_context(|| format!("while talking to the runwarden server at {}", self.base))?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await.unwrap_or_default();
        let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if (200..300).contains(&status) {
            return Ok(ApiOutcome::Ok(body));
        }
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("the server gave no reason")
            .to_string();
        Ok(ApiOutcome::Refused { status, message })
    }

    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<ApiOutcome> {
        self.send(self.http.get(format!("{}{path}", self.base)))
            .await
    }

    pub(crate) async fn post(&self, path: &str, body: Value) -> anyhow::Result<ApiOutcome> {
        self.send(
            self.http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(body.to_string()),
        )
        .await
    }

    /// A JSON answer, or the server's refusal as an error (with a hint for 401/403).
    pub(crate) async fn expect(&self, answer: ApiOutcome) -> anyhow::Result<Value> {
        match answer {
            ApiOutcome::Ok(body) => Ok(body),
            ApiOutcome::Refused {
                status: 401,
                message,
                ..
            } => {
                bail!(
                    "the server refused the token ({message}): set ${TOKEN_ENV} to a token from `{}`",
                    crate::hints::TOKEN_HINT
                )
            }
            ApiOutcome::Refused { message, .. } => bail!("{message}"),
        }
    }

    /// `GET /v1/runs/{id}/events` as Server-Sent Events after sequence `after` (the
    /// server pushes each event as it is stored): calls `each` with every event's JSON
    /// until the server ends the stream, then returns the last sequence seen.
    pub(crate) async fn follow(
        &self,
        run_id: &str,
        mut after: i64,
        mut each: impl FnMut(&Value),
    ) -> anyhow::Result<i64> {
        let mut request = self
            .http
            .get(format!(
                "{}/v1/runs/{run_id}/events?after={after}",
                self.base
            ))
            .header("accept", "text/event-stream");
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let context = || format!("while following run {run_id} at {}", self.base);
        let mut response = request.send().await.with_context(context)?;
        let status = response.status().as_u16();
        if !(200..300).contains(&status) {
            let bytes = response.bytes().await.unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            let message = body["error"]["message"]
                .as_str()
                .unwrap_or("the server gave no reason")
                .to_string();
            self.expect(ApiOutcome::Refused { status, message }).await?;
            return Ok(after);
        }
        let mut buffer = String::new();
        while let Some(chunk) = response.chunk().await.with_context(context)? {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            // An SSE event ends with a blank line; keep-alive comments carry no data.
            while let Some(end) = buffer.find("\n\n") {
                let block: String = buffer.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|line| line.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                let event: Value = serde_json::from_str(&data.join("\n")).with_context(|| {
                    format!(
                        "the server sent an event that is not JSON while following run {run_id}"
                    )
                })?;
                after = event["seq"].as_i64().unwrap_or(after);
                each(&event);
            }
        }
        Ok(after)
    }

    /// `POST /v1/runs` with mode queued.
    pub(crate) async fn enqueue(
        &self,
        agent: &str,
        prompt: &str,
        budgets: &runwarden_runtime::Budgets,
        tags: &[String],
        idempotency_key: Option<&str>,
    ) -> anyhow::Result<Value> {
        let mut body = json!({ "agent": agent, "prompt": prompt, "mode": "queued" });
        if !tags.is_empty() {
            body["tags"] = json!(tags);
        }
        // R13: only the budgets asked for travel; the server checks them.
        if let (Value::Object(fields), Some(body)) = (json!(budgets), body.as_object_mut()) {
            body.extend(fields);
        }
        let mut request = self
            .http
            .post(format!("{}/v1/runs", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = idempotency_key {
            // A retry with the same key answers the run the first request made.
            request = request.header("idempotency-key", key);
        }
        let answer = self.send(request).await?;
        self.expect(answer).await
    }
}
