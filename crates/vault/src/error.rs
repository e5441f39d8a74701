//! The vault's error types: one for secrets and keys, one for outbound calls.

use std::time::Duration;

use crate::delivery::Delivery;
use crate::guard::GuardRefusal;
use crate::store::StoreError;

/// What went wrong while sealing, opening, storing or rotating secrets and keys.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VaultError {
    /// The name has characters outside `[A-Za-z0-9._-]` or is empty or too long.
    #[error("invalid secret name {name:?}: use 1 to 128 characters of A-Z a-z 0-9 . _ -")]
    InvalidSecretName {
        /// The offending name, cut to 64 characters.
        name: String,
    },
    /// No secret has that name.
    #[error("no secret named {name:?}: store it with `runwarden secret put {name}`")]
    SecretNotFound {
        /// The name that was asked for.
        name: String,
    },
    /// A value was empty; an empty credential is always a mistake.
    #[error("the value for secret {name:?} is empty: pipe the value on standard input")]
    EmptySecret {
        /// The secret's name.
        name: String,
    },
    /// No master key was found where the configuration points.
    #[error("no master key at {location}")]
    MasterKeyMissing {
        /// The key file path or environment variable that was tried.
        location: String,
    },
    /// A master key exists but is unusable: wrong size, bad encoding or unsafe mode.
    #[error("the master key at {location} is unusable: {problem}")]
    MasterKeyInvalid {
        /// The key file path or environment variable.
        location: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A sealed record was written under a different master key than the one loaded.
    #[error(
        "{what} was sealed under master key {sealed_under}, but the loaded key is {loaded}: \
         point the configuration at the right key file"
    )]
    WrongMasterKey {
        /// What could not be opened ("secret \"x\"", "the audit key").
        what: String,
        /// Fingerprint of the key the record names.
        sealed_under: String,
        /// Fingerprint of the key that was loaded.
        loaded: String,
    },
    /// Authenticated decryption failed: the record was edited, renamed or corrupted.
    #[error(
        "{what} failed authentication: its ciphertext was altered or it was moved from \
         another name; restore it from a backup or put it again"
    )]
    Tampered {
        /// What could not be opened.
        what: String,
    },
    /// The record names an algorithm or format version this build does not know.
    #[error(
        "{what} uses {algorithm} version {version}, which this runwarden does not know: upgrade runwarden"
    )]
    UnknownAlgorithm {
        /// What could not be opened.
        what: String,
        /// The algorithm as stored.
        algorithm: String,
        /// The format version as stored.
        version: u32,
    },
    /// The audit key is gone while the log holds rows (V7 amended). Recreating it would
    /// make every row unverifiable and hide whatever removed it.
    #[error(
        "the audit key is missing but the log holds {rows} rows: restore the database from a \
         backup; runwarden never recreates it"
    )]
    AuditKeyMissing {
        /// How many rows the log holds (or its tip names).
        rows: i64,
    },
    /// The audit key is gone from a store that shows it had one (the record written with
    /// it, secrets): the log and its key were deleted together. A new key would hide it.
    #[error(
        "the audit key is missing from the database, although the database {evidence}: the \
         audit log and its key were deleted. Restore the database from a backup; runwarden \
         never makes a new key over a lost one"
    )]
    AuditKeyGone {
        /// What shows a key existed.
        evidence: String,
    },
    /// The anchor file outside the database could not be written, so rows appended now
    /// could later be wiped unnoticed; no row was appended.
    #[error("while updating the audit anchor: {problem}")]
    AuditAnchor {
        /// What went wrong, naming the file.
        problem: String,
    },
    /// The task that was writing this caller's audit row went away mid-write, so whether
    /// the row was committed is unknown.
    #[error("the audit write was interrupted before its outcome was known")]
    AuditInterrupted,
    /// The audit anchor file exists already, so there is nothing to adopt.
    #[error(
        "the audit anchor file {path} exists already: nothing was adopted (`audit verify` \
         checks the log against it)"
    )]
    AnchorExists {
        /// The anchor file.
        path: String,
    },
    /// An anchor can only be adopted for a chain that verifies.
    #[error("the audit chain does not verify, so its tip was not adopted: {problem}")]
    AnchorNotAdopted {
        /// What `audit verify` found.
        problem: String,
    },
    /// No anchor file is configured for this vault.
    #[error("no audit anchor file is configured")]
    NoAnchorConfigured,
    /// The external witness records a longer log, or another tip, than the one an anchor
    /// was to be made for: the log was wiped or rolled back, or the witness belongs to
    /// another installation.
    #[error(
        "the external witness contradicts this audit log, so no anchor was made for it: \
         {problem}. If the witness belongs to an earlier installation, point [audit] witness \
         at a new file"
    )]
    WitnessContradicts {
        /// What the witness records against the log.
        problem: String,
    },
    /// `audit verify --witness` without an external witness.
    #[error("no external witness is configured: set [audit] witness to a file on another path")]
    NoWitnessConfigured,
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Why an outbound call did not produce a response (V4-V6).
///
/// The text of every variant is free of secret values and URL query strings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EgressError {
    /// The signal was already true on entry: no secret was read, nothing was sent.
    #[error("cancelled before send: nothing left this process")]
    CancelledBeforeSend,
    /// The signal turned true while the transfer was in flight; the connection was dropped.
    /// The credential had gone out, so treat it as exposed to the peer.
    #[error("cancelled while the request to {host} was in flight; the connection was dropped")]
    CancelledInFlight {
        /// The host that was being called.
        host: String,
    },
    /// The egress guard refused the target before any secret was read.
    #[error("refused: {0}")]
    Refused(#[from] GuardRefusal),
    /// The named secret could not be used.
    #[error("while preparing the credential: {0}")]
    Credential(#[source] VaultError),
    /// A header name or value (the caller's or a placed credential's) is not valid on the
    /// wire, for example because it contains CR or LF.
    #[error("invalid header {name:?}: {problem}")]
    InvalidHeader {
        /// The header name (never its value).
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// The request did not finish within its total timeout.
    #[error("timed out after {:.1} s talking to {host}", after.as_secs_f64())]
    Timeout {
        /// The host that was being called.
        host: String,
        /// The bound that ran out.
        after: Duration,
        /// Whether the request may have reached the server (a connect timeout did not).
        delivery: Delivery,
    },
    /// The sandbox's egress proxy does not forward this request (an absolute `https://`
    /// URL, another scheme); nothing was sent.
    #[error("not sent: {reason}")]
    NotProxied {
        /// Why, and what to send instead.
        reason: String,
    },
    /// The sandbox's egress proxy was stopped while a connection it made was open; the
    /// connection was dropped.
    #[error("runwarden stopped the proxy while the connection to {host} was open")]
    ProxyStopped {
        /// The target, `host:port`.
        host: String,
    },
    /// The wall-clock backstop ended a transfer that its own timeout failed to end.
    #[error("the wall-clock backstop of {:.1} s ended the call to {host}", after.as_secs_f64())]
    Backstop {
        /// The host that was being called.
        host: String,
        /// The backstop that ran out.
        after: Duration,
    },
    /// The connection could not be made or broke during the exchange.
    #[error("transport failure talking to {host}: {detail}")]
    Transport {
        /// The host that was being called.
        host: String,
        /// A single-line description with queries redacted.
        detail: String,
        /// Whether the request may have reached the server (a refused connection did not).
        delivery: Delivery,
    },
    /// The server answered with a redirect, which is never followed.
    #[error("{host} answered {status} redirecting to {location}; redirects are never followed")]
    Redirect {
        /// The host that answered.
        host: String,
        /// The 3xx status.
        status: u16,
        /// Where it pointed (scheme, host and path only).
        location: String,
    },
    /// The server answered with a status the caller treats as failure.
    #[error("{host} answered HTTP {status}")]
    Status {
        /// The host that answered.
        host: String,
        /// The status code.
        status: u16,
    },
    /// The caller's cancellation signal panicked; the call was ended.
    #[error("the cancellation signal panicked; the call to {host} was ended")]
    SignalPanicked {
        /// The host that was being called.
        host: String,
        /// Whether the request may have reached the server (not when it panicked before send).
        delivery: Delivery,
    },
    /// V7 (amended): the intent row could not be committed, so nothing was sent.
    #[error(
        "refused: the audit log could not be written, so nothing was sent (audit_unavailable): {detail}"
    )]
    AuditUnavailable {
        /// Why the write failed (a store or anchor error; never a secret).
        detail: String,
    },
    /// The caller's last check before the transfer (`EgressRequest::before_transfer`)
    /// refused the call; nothing was sent.
    #[error("not sent: {reason}")]
    Held {
        /// Why, in the caller's words.
        reason: String,
    },
    /// The vault's store failed before the call could start.
    #[error("while reading the vault: {0}")]
    Store(#[source] VaultError),
    /// The request's URL, headers or body carry the value of a secret the vault holds,
    /// somewhere no placement of this request puts it; nothing was sent.
    #[error(
        "refused (secret_exfiltration): the request to {host} carries the value of {}, which goes only where a configured placement puts it; nothing was sent",
        secret_list(secrets)
    )]
    SecretExfiltration {
        /// The host the request was for.
        host: String,
        /// The names of the secrets found (never a value).
        secrets: Vec<String>,
    },
}

fn secret_list(names: &[String]) -> String {
    let quoted: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    match quoted.len() {
        1 => format!("secret {}", quoted[0]),
        _ => format!("secrets {}", quoted.join(", ")),
    }
}

impl EgressError {
    /// V8: how far the request got. Every path that could have put request bytes on a
    /// connection answers [`Delivery::MaybeDelivered`]; only what provably sent nothing
    /// answers [`Delivery::NotSent`].
    pub fn delivery(&self) -> Delivery {
        match self {
            Self::CancelledBeforeSend
            | Self::Refused(_)
            | Self::Credential(_)
            | Self::InvalidHeader { .. }
            | Self::AuditUnavailable { .. }
            | Self::Held { .. }
            | Self::SecretExfiltration { .. }
            | Self::NotProxied { .. }
            | Self::Store(_) => Delivery::NotSent,
            Self::CancelledInFlight { .. } | Self::Backstop { .. } | Self::ProxyStopped { .. } => {
                Delivery::MaybeDelivered
            }
            Self::Timeout { delivery, .. }
            | Self::Transport { delivery, .. }
            | Self::SignalPanicked { delivery, .. } => *delivery,
            Self::Redirect { .. } | Self::Status { .. } => Delivery::Answered,
        }
    }

    /// True for both kinds of cancellation.
    pub fn is_cancelled(&self) -> bool {
        matches!(
            self,
            Self::CancelledBeforeSend | Self::CancelledInFlight { .. }
        )
    }
}
