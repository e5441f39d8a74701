//! The audit log: an intent row before every transfer and one outcome row per outbound
//! call, linked into an HMAC chain with a tip anchor (and, outside the database, the
//! anchor file of `witness.rs`).

use hkdf::Hkdf;
use hmac::{Hmac, Mac};
use serde::Serialize;
use sha2::Sha256;
use zeroize::Zeroizing;

type HmacSha256 = Hmac<Sha256>;

/// The action strings written to the audit log. Frozen once published (V7): a new
/// path gets a new string, an existing string never changes meaning.
pub mod action {
    /// A request was sent; `success` says whether a 2xx came back.
    pub const HTTP_CALL: &str = "http_call";
    /// The egress guard or the credential check refused the call before anything was sent.
    pub const HTTP_CALL_REFUSED: &str = "http_call_refused";
    /// The signal was true on entry: no secret was read, nothing egressed.
    pub const HTTP_CALL_CANCELLED_BEFORE_SEND: &str = "http_call_cancelled_before_send";
    /// The signal turned true in flight and the connection was dropped.
    pub const HTTP_CALL_CANCELLED: &str = "http_call_cancelled";
    /// The intent of a call about to put bytes on the network, committed before the
    /// transfer starts (V7 amended). Its completion row (`http_call` or
    /// `http_call_cancelled`) names it in `intent_id`; an intent without one is a call
    /// whose outcome was never recorded.
    pub const HTTP_CALL_STARTED: &str = "http_call_started";
    /// An operator (or the expiry) answered a decision about a run's tool call (R12). Not
    /// an outbound call: method, host and path are empty, the actor is who answered and
    /// the correlation is the run.
    pub const DECISION_ANSWERED: &str = "decision_answered";
    /// The outcome of an OAuth metadata request the vault made for an MCP server (M18):
    /// Protected Resource Metadata or authorization server metadata. Its intent row is an
    /// `http_call_started` like any other call's.
    pub const OAUTH_METADATA: &str = "oauth_metadata";
    /// The outcome of a token request to an authorization server's token endpoint (M18):
    /// client credentials, authorization code or refresh. Never carries a token.
    pub const OAUTH_TOKEN: &str = "oauth_token";
    /// The outcome of a dynamic client registration request (RFC 7591, M18).
    pub const OAUTH_REGISTRATION: &str = "oauth_registration";
    /// A policy denied a run's call, or held it for an operator's approval (P3). Nothing
    /// was sent: the method and path are empty, the host is the call's target, the
    /// reason names the decision, the tool, the policies and their reasons (never an
    /// argument's value), the actor is `run` and the correlation the run.
    pub const POLICY_DECIDED: &str = "policy_decided";
    /// The intent of one message to a local (stdio) MCP server, committed before it is
    /// written to the server's stdin. The method is `STDIO`, the host `stdio:SERVER`, the
    /// path the JSON-RPC method. Its completion row (`stdio_call`) names it.
    pub const STDIO_CALL_STARTED: &str = "stdio_call_started";
    /// A message to a local server was written; `success` says whether it was answered
    /// (or, for a notification, written whole).
    pub const STDIO_CALL: &str = "stdio_call";
    /// Secrets were read to be set in a local program's environment at its start (a
    /// local MCP server). `secret` names them, comma-separated; no value is recorded.
    pub const ENVIRONMENT_PLACED: &str = "environment_placed";
    /// The intent of a tunnel the sandbox's egress proxy is about to open for a `CONNECT`
    /// (V10), committed before it connects. Its outcome row (`proxy_connect`) names it.
    /// The host is `host:port`, the method `CONNECT`, the actor whom the proxy serves.
    pub const PROXY_CONNECT_STARTED: &str = "proxy_connect_started";
    /// A proxied tunnel ended (V10), or could not be opened (status 502). Status 200 is
    /// the proxy's own answer; the reason ends with the bytes sent each way.
    pub const PROXY_CONNECT: &str = "proxy_connect";
    /// The proxy refused a `CONNECT` before connecting (V10): the guard refused the target
    /// (status 403) or the intent row could not be written (status 503).
    pub const PROXY_CONNECT_REFUSED: &str = "proxy_connect_refused";
    /// The intent of a plain HTTP request the sandbox's egress proxy is about to forward
    /// (V10), committed before it connects. Its outcome row (`proxy_request`) names it.
    pub const PROXY_REQUEST_STARTED: &str = "proxy_request_started";
    /// A forwarded plain HTTP request ended (V10): the status is the target's, 0 when it
    /// answered nothing, 502 when it could not be reached.
    pub const PROXY_REQUEST: &str = "proxy_request";
    /// The proxy refused a plain HTTP request before connecting (V10), as
    /// `proxy_connect_refused` does a tunnel.
    pub const PROXY_REQUEST_REFUSED: &str = "proxy_request_refused";

    /// True for an intent row: written before bytes leave, its outcome is a later row that
    /// names it in `intent_id`.
    pub fn is_intent(action: &str) -> bool {
        matches!(
            action,
            HTTP_CALL_STARTED | PROXY_CONNECT_STARTED | PROXY_REQUEST_STARTED | STDIO_CALL_STARTED
        )
    }
}

/// What the vault records about one outbound call; the store adds the id and the links.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEvent {
    /// When the call started, Unix milliseconds UTC.
    pub time_ms: i64,
    /// One of the [`action`] strings.
    pub action: String,
    /// True when a 2xx answer came back.
    pub success: bool,
    /// The secret identifier used, never its value.
    pub secret: Option<String>,
    /// The HTTP method.
    pub method: String,
    /// The normalised target host.
    pub host: String,
    /// The path, without query string.
    pub path: String,
    /// The HTTP status, 0 when nothing answered.
    pub status: u16,
    /// Wall time of the call in milliseconds.
    pub duration_ms: u64,
    /// One line, at most 200 characters, URL queries redacted.
    pub error: Option<String>,
    /// Why the call was made or refused, as the caller or the guard put it.
    pub reason: Option<String>,
    /// Who made the call ("cli", "run", a token name).
    pub actor: String,
    /// The run id or other correlation the caller gave.
    pub correlation: Option<String>,
    /// For a completion row, the id of the intent row (`http_call_started`) it completes.
    ///
    /// Skipped when absent, so the canonical JSON (and so the hash) of every row written
    /// before intents existed is unchanged. It must stay the last field.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub intent_id: Option<i64>,
}

/// A stored audit row: the event, its id and its place in the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditRow {
    /// Position in the log, 1-based and contiguous.
    pub id: i64,
    /// What happened.
    pub event: AuditEvent,
    /// The previous row's hash (all zeros for row 1).
    pub prev_hash: [u8; 32],
    /// HMAC over this row's canonical JSON and `prev_hash`.
    pub hash: [u8; 32],
}

/// The separately keyed record of the newest row, which makes a cut tail detectable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditTip {
    /// The id of the newest row.
    pub last_id: i64,
    /// The hash of the newest row.
    pub last_hash: [u8; 32],
    /// HMAC with the anchor key over `last_id` and `last_hash`.
    pub anchor: [u8; 32],
}

/// The two keys of the audit chain, derived from the vault's audit key.
///
/// The audit key is random, stored sealed under the master key, and rewrapped with the
/// secrets on rotation, so rotating the master key never breaks the chain.
pub struct AuditChain {
    link_key: Zeroizing<[u8; 32]>,
    anchor_key: Zeroizing<[u8; 32]>,
    witness_key: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for AuditChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuditChain([redacted])")
    }
}

/// The hashed form of a row: id first, then the event's fields in declaration order.
#[derive(Serialize)]
struct Canonical<'a> {
    id: i64,
    #[serde(flatten)]
    event: &'a AuditEvent,
}

impl AuditChain {
    /// Derives the link and anchor keys from the audit key with HKDF-SHA256.
    pub fn from_audit_key(audit_key: &[u8]) -> Self {
        let hk = Hkdf::<Sha256>::new(Some(b"runwarden audit"), audit_key);
        let mut link_key = Zeroizing::new([0u8; 32]);
        let mut anchor_key = Zeroizing::new([0u8; 32]);
        hk.expand(b"chain link v1", link_key.as_mut())
            .expect("32 bytes is a valid HKDF length");
        hk.expand(b"tip anchor v1", anchor_key.as_mut())
            .expect("32 bytes is a valid HKDF length");
        let mut witness_key = Zeroizing::new([0u8; 32]);
        hk.expand(b"anchor file v1", witness_key.as_mut())
            .expect("32 bytes is a valid HKDF length");
        Self {
            link_key,
            anchor_key,
            witness_key,
        }
    }

    /// The hash of row `id` holding `event` after a row whose hash is `prev_hash`.
    pub fn link(&self, id: i64, event: &AuditEvent, prev_hash: &[u8; 32]) -> [u8; 32] {
        let canonical =
            serde_json::to_vec(&Canonical { id, event }).expect("audit events always serialize");
        let mut mac =
            HmacSha256::new_from_slice(self.link_key.as_ref()).expect("any key length works");
        mac.update(prev_hash);
        mac.update(&canonical);
        mac.finalize().into_bytes().into()
    }

    /// V7: the rows of `events` appended after `tip` (the newest row's id and hash; `None`
    /// for an empty log): ids contiguous from the next one, so a deleted row shows as a
    /// gap, each linked to the row before.
    pub fn extend(&self, tip: Option<(i64, [u8; 32])>, events: Vec<AuditEvent>) -> Vec<AuditRow> {
        let (mut prev_id, mut prev_hash) = tip.unwrap_or((0, [0u8; 32]));
        events
            .into_iter()
            .map(|event| {
                let id = prev_id + 1;
                let hash = self.link(id, &event, &prev_hash);
                let row = AuditRow {
                    id,
                    event,
                    prev_hash,
                    hash,
                };
                (prev_id, prev_hash) = (id, hash);
                row
            })
            .collect()
    }

    /// The anchor for a log whose newest row is `last_id` with `last_hash`.
    pub fn anchor(&self, last_id: i64, last_hash: &[u8; 32]) -> [u8; 32] {
        let mut mac =
            HmacSha256::new_from_slice(self.anchor_key.as_ref()).expect("any key length works");
        mac.update(b"tip");
        mac.update(&last_id.to_be_bytes());
        mac.update(last_hash);
        mac.finalize().into_bytes().into()
    }

    /// The MAC of one slot of the anchor file outside the database (V7 amended): the
    /// slot's sequence number, the anchored length and the hash of the row at that length.
    pub fn witness_mac(&self, sequence: u64, length: i64, hash: &[u8; 32]) -> [u8; 32] {
        let mut mac =
            HmacSha256::new_from_slice(self.witness_key.as_ref()).expect("any key length works");
        mac.update(b"anchor file");
        mac.update(&sequence.to_be_bytes());
        mac.update(&length.to_be_bytes());
        mac.update(hash);
        mac.finalize().into_bytes().into()
    }

    /// The MAC of one line of the external witness: the anchored length and hash.
    pub(crate) fn external_witness_mac(&self, length: i64, hash: &[u8; 32]) -> [u8; 32] {
        let mut mac =
            HmacSha256::new_from_slice(self.witness_key.as_ref()).expect("any key length works");
        mac.update(b"external witness");
        mac.update(&length.to_be_bytes());
        mac.update(hash);
        mac.finalize().into_bytes().into()
    }
}

/// The outcome of `audit verify`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VerifyReport {
    /// True when every row links and the tip anchor matches.
    pub intact: bool,
    /// How many rows were checked and found good before the first break.
    pub rows_verified: i64,
    /// The first bad row's id, when broken.
    pub first_bad_row: Option<i64>,
    /// What is wrong, when broken.
    pub problem: Option<String>,
    /// How many intent rows (`http_call_started`, and the proxy's `proxy_*_started`) have no
    /// completion row: calls whose process stopped, or that are still waiting, before
    /// their outcome was written.
    pub incomplete_calls: u64,
    /// How many rows the anchor file outside the database records, when one was read.
    pub anchored_rows: Option<i64>,
    /// How many rows the external witness records, when it was checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub witnessed_rows: Option<i64>,
}

impl VerifyReport {
    pub(crate) fn intact(rows: i64) -> Self {
        Self {
            intact: true,
            rows_verified: rows,
            first_bad_row: None,
            problem: None,
            incomplete_calls: 0,
            anchored_rows: None,
            witnessed_rows: None,
        }
    }

    pub(crate) fn broken(rows_verified: i64, first_bad_row: i64, problem: String) -> Self {
        Self {
            intact: false,
            rows_verified,
            first_bad_row: Some(first_bad_row),
            problem: Some(problem),
            incomplete_calls: 0,
            anchored_rows: None,
            witnessed_rows: None,
        }
    }
}

impl AuditEvent {
    /// True when the row must be on disk before its writer goes on: every row except the
    /// outcome of a call whose intent is already durable (V7 amended). An intent is
    /// synced because its request leaves next; a refusal or a cancel before send because
    /// it is the call's only row. An outcome row is committed (it survives a killed
    /// process) and reaches the disk with the next synced batch; a power cut that takes it
    /// back leaves its intent marked incomplete, which is the truth that remains.
    pub fn must_sync(&self) -> bool {
        self.intent_id.is_none()
    }
}

/// Makes error text fit for an audit row: one line, URL queries redacted, at most 200
/// characters (V7).
pub(crate) fn audit_error_text(text: &str) -> String {
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let redacted = redact_queries(&one_line);
    if redacted.chars().count() <= 200 {
        redacted
    } else {
        let mut cut: String = redacted.chars().take(199).collect();
        cut.push('…');
        cut
    }
}

/// Replaces every `?query` that follows a URL-looking token with `?[redacted]`.
pub(crate) fn redact_queries(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            out.push(' ');
        }
        match word.find('?') {
            Some(at) if word.contains("://") || word.starts_with('/') => {
                out.push_str(&word[..at]);
                out.push_str("?[redacted]");
            }
            _ => out.push_str(word),
        }
    }
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A call's row, for tests: what is in it does not matter, only that it is one.
    pub(crate) fn call(path: &str) -> AuditEvent {
        AuditEvent {
            time_ms: 1,
            action: action::HTTP_CALL.into(),
            success: true,
            secret: None,
            method: "GET".into(),
            host: "example.com".into(),
            path: path.into(),
            status: 200,
            duration_ms: 1,
            error: None,
            reason: None,
            actor: "test".into(),
            correlation: None,
            intent_id: None,
        }
    }

    #[test]
    fn extending_a_log_numbers_the_rows_on_and_links_each_to_the_one_before() {
        let chain = AuditChain::from_audit_key(&[3; 32]);
        let first = chain.extend(None, vec![call("/a"), call("/b")]);
        assert_eq!(first.iter().map(|r| r.id).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(first[0].prev_hash, [0u8; 32], "row 1 follows nothing");
        assert_eq!(first[1].prev_hash, first[0].hash);
        assert_eq!(
            first[1].hash,
            chain.link(2, &first[1].event, &first[0].hash)
        );
        let next = chain.extend(Some((2, first[1].hash)), vec![call("/c")]);
        assert_eq!(next[0].id, 3);
        assert_eq!(next[0].prev_hash, first[1].hash);
        assert!(
            chain
                .extend(Some((2, first[1].hash)), Vec::new())
                .is_empty()
        );
    }

    #[test]
    fn error_text_is_one_line_without_queries_and_at_most_200_chars() {
        let text = format!(
            "error sending request for url (https://h.example/p?token=abc)\nnext line {}",
            "x".repeat(300)
        );
        let cleaned = audit_error_text(&text);
        assert!(!cleaned.contains('\n'));
        assert!(!cleaned.contains("token=abc"), "{cleaned}");
        assert!(cleaned.contains("?[redacted]"));
        assert_eq!(cleaned.chars().count(), 200);
    }

    #[test]
    fn the_link_changes_when_any_field_changes() {
        let chain = AuditChain::from_audit_key(&[7u8; 32]);
        let event = AuditEvent {
            time_ms: 1,
            action: action::HTTP_CALL.into(),
            success: true,
            secret: None,
            method: "GET".into(),
            host: "h".into(),
            path: "/".into(),
            status: 200,
            duration_ms: 3,
            error: None,
            reason: None,
            actor: "cli".into(),
            correlation: None,
            intent_id: None,
        };
        let base = chain.link(1, &event, &[0; 32]);
        let mut edited = event.clone();
        edited.status = 201;
        assert_ne!(base, chain.link(1, &edited, &[0; 32]));
        assert_ne!(base, chain.link(2, &event, &[0; 32]));
        assert_ne!(base, chain.link(1, &event, &[1; 32]));
        let mut completion = event.clone();
        completion.intent_id = Some(1);
        assert_ne!(base, chain.link(1, &completion, &[0; 32]));
    }

    /// A row written before intents existed (no `intent_id`) keeps its hash: the expected
    /// value was computed outside Rust (Python's hmac and json) from the pre-change
    /// canonical form, so old logs still verify.
    #[test]
    fn a_row_without_an_intent_id_hashes_exactly_as_before_intents_existed() {
        let chain = AuditChain::from_audit_key(&[7u8; 32]);
        let event = AuditEvent {
            time_ms: 1_764_633_600_000,
            action: action::HTTP_CALL.into(),
            success: true,
            secret: Some("tickets-token".into()),
            method: "POST".into(),
            host: "127.0.0.1:8080".into(),
            path: "/mcp".into(),
            status: 200,
            duration_ms: 3,
            error: None,
            reason: Some("tools/call tickets__create".into()),
            actor: "cli".into(),
            correlation: Some("run-1".into()),
            intent_id: None,
        };
        assert_eq!(
            hex(&chain.link(1, &event, &[0; 32])),
            "f88e91045bb25cfff47236feaf62c4a32515c7876599d93447f09e13873b3608"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}
