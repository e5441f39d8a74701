//! The egress client's side of the exfiltration check: a request that carries a stored
//! secret's value is refused with one audit row, and text a caller assembled itself is
//! redacted, or refused the same way.

use super::EgressClient;
use super::record::CallRecord;
use crate::audit::{AuditEvent, action, audit_error_text};
use crate::error::EgressError;
use crate::exfiltration::{Redactor, carried_secrets};
use crate::message::EgressRequest;
use crate::scrub::Scrubber;
use crate::vault::now_ms;

/// No secret leaves for a host it does not belong to: the refusal of a request whose
/// URL, headers or body carry a stored secret's value, named on the call's record.
pub(super) fn carried_refusal(
    record: &mut CallRecord,
    request: &EgressRequest,
    scrubber: &Scrubber,
) -> Option<EgressError> {
    let carried = carried_secrets(
        scrubber,
        &request.url,
        &request.headers,
        request.body.as_deref(),
        &request.carries,
    );
    if carried.is_empty() {
        return None;
    }
    tracing::warn!(host = %record.host, secrets = ?carried, "refused a request carrying a secret's value (secret_exfiltration)");
    record.reason = Some("secret_exfiltration".into());
    record.secret = Some(carried.join(","));
    Some(EgressError::SecretExfiltration {
        host: record.host.clone(),
        secrets: carried,
    })
}

impl EgressClient {
    /// What cuts every stored secret out of text a caller assembled itself (a model's
    /// streamed answer, a server's catalogue), in every spelling the scrubber decodes.
    pub async fn redactor(&self) -> Result<Redactor, EgressError> {
        let matcher = self
            .vault()
            .secret_matcher()
            .await
            .map_err(EgressError::Store)?;
        Ok(Redactor::new(matcher))
    }

    /// Records that something a caller assembled to send on (a model's tool call) carried
    /// the value of stored secrets and was not acted on: one audit row naming the
    /// secrets (never a value) and where they were headed, and the error to show.
    pub async fn refuse_carried(
        &self,
        destination: &str,
        secrets: Vec<String>,
        actor: &str,
        correlation: Option<&str>,
    ) -> EgressError {
        let event = AuditEvent {
            time_ms: now_ms(),
            action: action::HTTP_CALL_REFUSED.to_string(),
            success: false,
            secret: Some(secrets.join(",")),
            method: String::new(),
            host: destination.to_string(),
            path: String::new(),
            status: 0,
            duration_ms: 0,
            error: None,
            reason: Some("secret_exfiltration".into()),
            actor: actor.to_string(),
            correlation: correlation.map(str::to_string),
            intent_id: None,
        };
        let error = EgressError::SecretExfiltration {
            host: destination.to_string(),
            secrets,
        };
        let event = AuditEvent {
            error: Some(audit_error_text(&error.to_string())),
            ..event
        };
        if let Err(e) = self.vault().audit_record(event).await {
            tracing::error!(error = %e, destination, "could not write the audit row of a refused tool call");
        }
        error
    }
}
