//! The audit rows of one call: the fields known before the outcome, the intent row
//! committed before any byte leaves, and the outcome row that names it.

use std::time::Instant;

use super::EgressClient;
use crate::audit::{AuditEvent, action, audit_error_text};
use crate::audit_writer::AnchorDue;
use crate::delivery::Delivery;
use crate::error::EgressError;
use crate::guard::{self, VettedTarget};
use crate::message::{EgressRequest, EgressResponse, IntentObserver, Method};
use crate::scrub::Scrubber;
use crate::vault::now_ms;

/// The fields of an audit row that are known before the outcome.
pub(super) struct CallRecord {
    started: Instant,
    time_ms: i64,
    method: Method,
    pub(super) host: String,
    path: String,
    pub(super) secret: Option<String>,
    actor: String,
    correlation: Option<String>,
    pub(super) reason: Option<String>,
    /// The intent row written before the transfer, which the completion row names.
    intent_id: Option<i64>,
}

impl CallRecord {
    /// The record of a call about to be checked, its target as the caller wrote it.
    pub(super) fn new(request: &EgressRequest) -> Self {
        let (host, path) = guard::describe_for_audit(&request.url);
        Self {
            started: Instant::now(),
            time_ms: now_ms(),
            method: request.method,
            host,
            path,
            secret: request.credential.as_ref().map(|c| c.secret.to_string()),
            actor: request.actor.clone(),
            correlation: request.correlation.clone(),
            reason: request.reason.clone(),
            intent_id: None,
        }
    }

    /// Names the target as the guard vetted it (normalised, with its port).
    pub(super) fn vetted(&mut self, target: &VettedTarget) {
        self.host = target.audit_host();
        self.path = target.url.path().to_string();
    }

    /// The audit row of this call for `action`, with the outcome known so far.
    pub(super) fn event(
        &self,
        action: &str,
        status: u16,
        error: Option<&EgressError>,
        scrubber: &Scrubber,
    ) -> AuditEvent {
        AuditEvent {
            time_ms: self.time_ms,
            action: action.to_string(),
            success: error.is_none() && (200..300).contains(&status),
            secret: self.secret.clone(),
            method: self.method.as_str().to_string(),
            host: self.host.clone(),
            path: self.path.clone(),
            status,
            duration_ms: self.started.elapsed().as_millis() as u64,
            // V9: scrubbed before the text is cut to length, so a cut never leaves a
            // recognisable part of a form behind.
            error: error.map(|e| audit_error_text(&scrubber.text(&e.to_string()))),
            reason: self.reason.clone(),
            actor: self.actor.clone(),
            correlation: self.correlation.clone(),
            intent_id: self.intent_id,
        }
    }
}

impl EgressClient {
    /// No egress without an audit row: commits the intent row before any byte goes out
    /// and tells the caller its id, with the anchor write the commit left to this call;
    /// when it cannot be committed, the error that keeps the request unsent.
    pub(super) async fn record_intent(
        &self,
        record: &mut CallRecord,
        on_intent: Option<IntentObserver>,
        scrubber: &Scrubber,
    ) -> Result<Option<AnchorDue<'_>>, EgressError> {
        let intent = record.event(action::HTTP_CALL_STARTED, 0, None, scrubber);
        // Boxed for the same reason as the outcome's write (see `finish`).
        match Box::pin(self.vault.audit_record_then_anchor(intent)).await {
            Ok((row, due)) => {
                record.intent_id = Some(row.id);
                if let Some(observe) = on_intent {
                    observe(row.id);
                }
                Ok(due)
            }
            Err(e) => {
                let detail = audit_error_text(&scrubber.text(&e.to_string()));
                record.reason = Some("audit_unavailable".into());
                Err(EgressError::AuditUnavailable { detail })
            }
        }
    }

    /// Writes the one row of a call refused before anything was sent.
    pub(super) async fn refuse(
        &self,
        record: &CallRecord,
        error: EgressError,
        scrubber: &Scrubber,
    ) -> Result<EgressResponse, EgressError> {
        self.finish(record, action::HTTP_CALL_REFUSED, 0, Err(error), scrubber)
            .await
    }

    /// Writes the audit row and hands back the outcome with the row's id.
    pub(super) async fn finish(
        &self,
        record: &CallRecord,
        action: &str,
        status: u16,
        outcome: Result<EgressResponse, EgressError>,
        scrubber: &Scrubber,
    ) -> Result<EgressResponse, EgressError> {
        if let Some(observer) = &self.observer {
            let delivery = match &outcome {
                Ok(_) => Delivery::Answered,
                Err(error) => error.delivery(),
            };
            observer(action, delivery);
        }
        // V9: everything that came from the server (body, headers, redirect target,
        // library and server text in errors) loses every form of the placed secret
        // before it reaches the audit row or the caller.
        let outcome = match outcome {
            Ok(response) => Ok(scrubber.response(response)),
            Err(error) => Err(scrubber.error(error)),
        };
        let event = record.event(action, status, outcome.as_ref().err(), scrubber);
        // Boxed: the write's state is large and lives only while the row is written, so
        // the call's own state, held for as long as the call waits, stays small.
        let written = Box::pin(self.vault.audit_record(event)).await;
        match (&written, outcome) {
            (Ok(row), Ok(mut response)) => {
                response.audit_id = Some(row.id);
                Ok(response)
            }
            (_, outcome) => {
                if let Err(e) = written {
                    // The call's outcome stands (a write may have landed; turning it into an
                    // error would invite a retry). The failure is loud in the log instead.
                    tracing::error!(error = %e, action, host = %record.host, "could not write the audit row for an outbound call");
                }
                outcome
            }
        }
    }
}
