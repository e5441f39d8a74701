//! Secrets placed in a local program's environment: the one place a secret's value leaves
//! the vault other than on the wire. The caller names the secrets; the vault reads them,
//! audits that it did (names, never values), and hands the values back to be set in the
//! child's environment at its start.

use super::EgressClient;
use crate::audit::{AuditEvent, action};
use crate::error::EgressError;
use crate::secret::{SecretName, SecretValue};
use crate::vault::now_ms;

/// Who asks for an environment, and for what: the audit row's actor, host and reason.
#[derive(Debug, Clone)]
pub struct EnvironmentFor {
    /// Who starts the program (`mcp`, `run`).
    pub actor: String,
    /// What the program is, as audit rows name it (`stdio:files`).
    pub target: String,
    /// Why, in a few words (`start local server files`).
    pub reason: String,
}

impl EgressClient {
    /// The values of `secrets` (variable name, secret), for a program about to start.
    /// One `environment_placed` row names every secret (never a value) before any value
    /// is handed out; when it cannot be written, no value is.
    pub async fn environment(
        &self,
        secrets: &[(String, SecretName)],
        asking: &EnvironmentFor,
    ) -> Result<Vec<(String, SecretValue)>, EgressError> {
        if secrets.is_empty() {
            return Ok(Vec::new());
        }
        let names: Vec<&str> = secrets.iter().map(|(_, s)| s.as_str()).collect();
        let row = AuditEvent {
            time_ms: now_ms(),
            action: action::ENVIRONMENT_PLACED.into(),
            success: true,
            secret: Some(names.join(",")),
            method: String::new(),
            host: asking.target.clone(),
            path: String::new(),
            status: 0,
            duration_ms: 0,
            error: None,
            reason: Some(asking.reason.clone()),
            actor: asking.actor.clone(),
            correlation: None,
            intent_id: None,
        };
        self.vault()
            .audit_record(row)
            .await
            .map_err(|e| EgressError::AuditUnavailable {
                detail: crate::audit::audit_error_text(&e.to_string()),
            })?;
        let mut values = Vec::with_capacity(secrets.len());
        for (variable, secret) in secrets {
            let value = self
                .vault()
                .secret_use(secret)
                .await
                .map_err(EgressError::Store)?;
            values.push((variable.clone(), value));
        }
        Ok(values)
    }
}
