//! The audit rows of one proxied connection: the intent committed before the proxy
//! connects, the outcome naming it with the bytes each way, or the one refusal row.

use std::time::Instant;

use super::ProxyLabel;
use super::counted::grouped;
use crate::audit::{AuditEvent, action, audit_error_text};
use crate::delivery::Delivery;
use crate::egress::EgressClient;
use crate::error::EgressError;
use crate::guard::VettedTarget;
use crate::scrub::Scrubber;
use crate::vault::now_ms;

/// Which of the proxy's two kinds of connection a row is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A `CONNECT` tunnel.
    Tunnel,
    /// A forwarded plain HTTP request.
    Request,
}

impl Kind {
    fn started(self) -> &'static str {
        match self {
            Self::Tunnel => action::PROXY_CONNECT_STARTED,
            Self::Request => action::PROXY_REQUEST_STARTED,
        }
    }

    fn ended(self) -> &'static str {
        match self {
            Self::Tunnel => action::PROXY_CONNECT,
            Self::Request => action::PROXY_REQUEST,
        }
    }

    fn refused(self) -> &'static str {
        match self {
            Self::Tunnel => action::PROXY_CONNECT_REFUSED,
            Self::Request => action::PROXY_REQUEST_REFUSED,
        }
    }
}

/// The fields of a proxied connection's rows known before its outcome.
pub(super) struct ProxyRecord {
    kind: Kind,
    started: Instant,
    time_ms: i64,
    method: String,
    /// `host:port`, as written until the guard vets it, then normalised.
    pub(super) host: String,
    path: String,
    actor: String,
    reason: String,
    intent_id: Option<i64>,
}

/// How a connection that reached its target ended.
pub(super) struct Ending {
    /// The status: the proxy's 200 for a tunnel, the target's for a request (0: none).
    pub(super) status: u16,
    /// What broke the connection, if anything did.
    pub(super) error: Option<EgressError>,
    /// Bytes sent to the target.
    pub(super) sent: u64,
    /// Bytes received from the target.
    pub(super) received: u64,
}

/// `host:port`, with brackets around an IPv6 address.
pub(super) fn host_port(host: &str, port: u16) -> String {
    match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    }
}

impl ProxyRecord {
    /// The record of a connection about to be vetted: its target as the client wrote it.
    pub(super) fn new(
        kind: Kind,
        method: &str,
        host: String,
        path: String,
        label: &ProxyLabel,
    ) -> Self {
        Self {
            kind,
            started: Instant::now(),
            time_ms: now_ms(),
            method: method.to_string(),
            host,
            path,
            actor: label.actor.clone(),
            reason: label.reason.clone(),
            intent_id: None,
        }
    }

    /// Names the target as the guard vetted it.
    pub(super) fn vetted(&mut self, target: &VettedTarget) {
        self.host = host_port(&target.host, target.port);
        if self.kind == Kind::Request {
            self.path = target.url.path().to_string();
        }
    }

    fn event(
        &self,
        action: &str,
        status: u16,
        success: bool,
        error: Option<&EgressError>,
        reason: String,
        scrubber: &Scrubber,
    ) -> AuditEvent {
        AuditEvent {
            time_ms: self.time_ms,
            action: action.to_string(),
            success,
            secret: None,
            method: self.method.clone(),
            // V9: what the child wrote is scrubbed like anything else that did not come
            // from the vault: the proxy places no secret, but a child could carry one.
            host: scrubber.string(self.host.clone()),
            path: scrubber.string(self.path.clone()),
            status,
            duration_ms: self.started.elapsed().as_millis() as u64,
            error: error.map(|e| audit_error_text(&scrubber.text(&e.to_string()))),
            reason: Some(scrubber.string(reason)),
            actor: self.actor.clone(),
            correlation: None,
            intent_id: self.intent_id,
        }
    }
}

impl EgressClient {
    /// V7: commits the intent row before the proxy connects; when it cannot be
    /// committed, the error that keeps the connection unmade.
    pub(super) async fn proxy_intent(
        &self,
        record: &mut ProxyRecord,
        scrubber: &Scrubber,
    ) -> Result<(), EgressError> {
        let reason = record.reason.clone();
        let intent = record.event(record.kind.started(), 0, false, None, reason, scrubber);
        match self.vault.audit_record(intent).await {
            Ok(row) => {
                record.intent_id = Some(row.id);
                Ok(())
            }
            Err(e) => Err(EgressError::AuditUnavailable {
                detail: audit_error_text(&scrubber.text(&e.to_string())),
            }),
        }
    }

    /// Writes the one row of a connection refused before the proxy connected.
    pub(super) async fn proxy_refused(
        &self,
        record: &ProxyRecord,
        status: u16,
        error: EgressError,
        scrubber: &Scrubber,
    ) {
        let reason = record.reason.clone();
        let event = record.event(
            record.kind.refused(),
            status,
            false,
            Some(&error),
            reason,
            scrubber,
        );
        self.proxy_write(event, Delivery::NotSent).await;
    }

    /// Writes the outcome row of a connection whose intent was committed: its status, what
    /// broke it, and in the reason the bytes each way.
    pub(super) async fn proxy_ended(
        &self,
        record: &ProxyRecord,
        ending: Ending,
        scrubber: &Scrubber,
    ) {
        let Ending {
            status,
            error,
            sent,
            received,
        } = ending;
        let success = error.is_none() && (200..300).contains(&status);
        let reason = format!(
            "{}: {} bytes out, {} in",
            record.reason,
            grouped(sent),
            grouped(received)
        );
        let delivery = match (&error, sent) {
            (Some(error), _) => error.delivery(),
            (None, 0) => Delivery::NotSent,
            (None, _) => Delivery::Answered,
        };
        let event = record.event(
            record.kind.ended(),
            status,
            success,
            error.as_ref(),
            reason,
            scrubber,
        );
        self.proxy_write(event, delivery).await;
    }

    /// Writes a row, then tells the observer (so it hears of a row that is there).
    async fn proxy_write(&self, event: AuditEvent, delivery: Delivery) {
        let action = event.action.clone();
        if let Err(e) = self.vault.audit_record(event).await {
            // The connection's outcome stands; the failure is loud in the log instead.
            tracing::error!(error = %e, action, "could not write the audit row of a proxied connection");
        }
        if let Some(observer) = &self.observer {
            observer(&action, delivery);
        }
    }
}
