//! Renewal without the operator: refresh, client credentials again or a fresh assertion,
//! one at a time across every process on the store (the token's refresh lease).

use std::time::Duration;

use runwarden_vault::CancellationSignal;
use runwarden_vault::dpop::DpopKey;

use crate::client::OAuthClient;
use crate::crypto;
use crate::error::OAuthError;
use crate::record::{Binding, TokenRecord};
use crate::settings::Grant;

/// How long a refresh lease lasts: longer than one token request's bound.
const LEASE_TTL: Duration = Duration::from_secs(30);

/// How long a renewal waits for another process's refresh before it gives up.
const LEASE_WAIT: Duration = Duration::from_secs(20);

impl OAuthClient {
    /// One renewal across every process on the store (M18): the first to take the token's
    /// refresh lease renews it; the others wait for the record to change and use the new
    /// token. A token obtained after `seen_ms` (the one the caller holds) is already new.
    pub(crate) async fn renew_once(
        &self,
        binding: &Binding,
        seen_ms: i64,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let holder = crypto::random_token(12);
        let key = &binding.token_key;
        let started = tokio::time::Instant::now();
        loop {
            let current = self.load_token(key).await?;
            if let Some(token) = current
                && token.obtained_ms > seen_ms
            {
                return Ok(token);
            }
            let leased = self
                .vault()
                .oauth_lease_acquire(key, &holder, LEASE_TTL.as_millis() as i64)
                .await
                .map_err(|e| self.vault_error(e))?;
            if leased {
                // Read again under the lease: a refresh may have landed just before it.
                let outcome = match self.load_token(key).await? {
                    Some(token) if token.obtained_ms > seen_ms => Ok(token),
                    Some(token) => self.renew(binding, &token, signal).await,
                    None => Err(OAuthError::LoginRequired {
                        server: self.server.clone(),
                    }),
                };
                if let Err(error) = self.vault().oauth_lease_release(key, &holder).await {
                    // It expires on its own; the next renewal waits at most LEASE_TTL.
                    tracing::warn!(server = %self.server, %error, "could not release the OAuth refresh lease");
                }
                return outcome;
            }
            if signal.is_some_and(|s| s.is_cancelled()) {
                return Err(OAuthError::Cancelled {
                    server: self.server.clone(),
                });
            }
            if started.elapsed() > LEASE_WAIT {
                return Err(OAuthError::Config {
                    server: self.server.clone(),
                    problem: format!(
                        "another process held the token's refresh lease for over {} s; try again",
                        LEASE_WAIT.as_secs()
                    ),
                });
            }
            // The other holder's refresh is one token request: poll the store for its
            // outcome (it is another process; nothing in this one can wake us).
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A new token without the operator: refresh when a refresh token is held, else
    /// client credentials again; an authorization code grant without one needs a login.
    pub(crate) async fn renew(
        &self,
        binding: &Binding,
        token: &TokenRecord,
        signal: Option<&dyn CancellationSignal>,
    ) -> Result<TokenRecord, OAuthError> {
        let mut form: Vec<(&str, String)> = Vec::new();
        let grant = if let Some(refresh) = &token.refresh_token {
            form.push(("grant_type", "refresh_token".into()));
            form.push(("refresh_token", refresh.clone()));
            "refresh_token"
        } else if self.settings.grant == Grant::ClientCredentials {
            form.push(("grant_type", "client_credentials".into()));
            if !binding.scopes.is_empty() {
                form.push(("scope", binding.scopes.join(" ")));
            }
            "client_credentials"
        } else if matches!(
            self.settings.grant,
            Grant::JwtBearer | Grant::CrossAppAccess
        ) {
            // The assertion grants renew by presenting a fresh assertion.
            let fresh = self
                .assertion_grant(
                    &binding.metadata,
                    &binding.identity,
                    &binding.scopes,
                    &binding.resource,
                    signal,
                )
                .await?;
            self.save(binding, &fresh).await?;
            return Ok(fresh);
        } else {
            return Err(OAuthError::LoginRequired {
                server: self.server.clone(),
            });
        };
        form.push(("resource", binding.resource.clone()));
        // A bound token is renewed with the key it is bound to (RFC 9449 §5).
        let key = token
            .dpop_key
            .as_deref()
            .and_then(DpopKey::from_sealed_form);
        let mut fresh = self
            .token_request_bound(
                &binding.metadata,
                &binding.identity,
                form,
                grant,
                key.as_ref(),
                signal,
            )
            .await?;
        // A server that does not rotate keeps the refresh token it gave before.
        if fresh.refresh_token.is_none() {
            fresh.refresh_token = token.refresh_token.clone();
        }
        self.save(binding, &fresh).await?;
        Ok(fresh)
    }
}
