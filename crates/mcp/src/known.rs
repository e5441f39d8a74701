//! M19: what each server speaks, remembered in the catalogue store across processes so an
//! old server is not sent `server/discover` by every process, and a 2026-07-28 server is
//! spoken to at once for as long as its `ttlMs` allows. Forgotten after a failure that
//! may say the server changed.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::catalogue::{CatalogueStore, KnownProtocol};
use crate::config::ServerConfig;
use crate::error::McpError;

/// How long a server that answered the handshake (and not the probe) is remembered as
/// old; a failure forgets it sooner.
pub(crate) const HANDSHAKE_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest a `server/discover` answer is trusted, whatever `ttlMs` it gave.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// How long a `server/discover` result may be reused: its `ttlMs`, at most [`MAX_TTL`];
/// without one, not at all (the next process probes again).
pub(crate) fn discover_ttl(result: &Value) -> Duration {
    result
        .get("ttlMs")
        .and_then(Value::as_u64)
        .map_or(Duration::ZERO, |ms| Duration::from_millis(ms).min(MAX_TTL))
}

/// What the store remembers of `server`, when it is still fresh and for the same URL.
pub(crate) async fn recall(
    store: &Arc<dyn CatalogueStore>,
    server: &ServerConfig,
    now_ms: i64,
) -> Option<KnownProtocol> {
    match store.protocol_get(&server.name).await {
        Ok(Some(known)) if known.url == server.url && known.until_ms > now_ms => Some(known),
        Ok(_) => None,
        Err(error) => {
            tracing::warn!(server = %server.name, %error, "could not read what the server speaks; probing");
            None
        }
    }
}

/// Remembers what `server` speaks for `ttl` (nothing for a zero `ttl`).
pub(crate) async fn remember(
    store: &Arc<dyn CatalogueStore>,
    server: &ServerConfig,
    protocol: &str,
    tools: bool,
    ttl: Duration,
    now_ms: i64,
) {
    if ttl.is_zero() {
        return;
    }
    let known = KnownProtocol {
        url: server.url.clone(),
        protocol: protocol.into(),
        tools,
        until_ms: now_ms.saturating_add(ttl.as_millis() as i64),
    };
    if let Err(error) = store.protocol_put(&server.name, known).await {
        tracing::warn!(server = %server.name, %error, "could not remember what the server speaks");
    }
}

/// Forgets what `server` speaks, so the next process probes again.
pub(crate) async fn forget(store: &Arc<dyn CatalogueStore>, server: &ServerConfig) {
    if let Err(error) = store.protocol_forget(&server.name).await {
        tracing::warn!(server = %server.name, %error, "could not forget what the server speaks");
    }
}

/// True for a failure that may mean the server no longer speaks what was remembered (an
/// HTTP or JSON-RPC refusal, a body of the wrong shape, a transport failure); false for
/// one that says nothing of it (a cancel, a spent budget, a refusal of our own).
pub(crate) fn may_have_changed(error: &McpError) -> bool {
    !matches!(
        error,
        McpError::Cancelled { .. }
            | McpError::NotSent { .. }
            | McpError::Gated { .. }
            | McpError::ToolHeaders { .. }
            | McpError::HeaderValue { .. }
            | McpError::InputRefused { .. }
            | McpError::TooLarge { .. }
            | McpError::Stalled { .. }
            | McpError::Auth { .. }
            | McpError::TooManyPages { .. }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_discover_answer_is_reused_for_its_ttl_at_most_a_day_and_not_without_one() {
        assert_eq!(
            discover_ttl(&json!({"ttlMs": 60_000})),
            Duration::from_secs(60)
        );
        assert_eq!(discover_ttl(&json!({"ttlMs": u64::MAX})), MAX_TTL);
        assert_eq!(discover_ttl(&json!({})), Duration::ZERO);
        assert_eq!(discover_ttl(&json!({"ttlMs": "soon"})), Duration::ZERO);
    }
}
