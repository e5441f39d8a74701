//! Secret names and secret values; a value zeroizes on drop and never prints.

use std::fmt;

use zeroize::Zeroizing;

use crate::error::VaultError;

/// The identifier of a secret: 1 to 128 characters of `[A-Za-z0-9._-]`.
///
/// The name is not secret. It is the associated data of both encryption layers (V1), so a
/// sealed value moved under another name no longer opens.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SecretName(String);

impl SecretName {
    /// Checks a name and wraps it.
    pub fn new(name: impl Into<String>) -> Result<Self, VaultError> {
        let name = name.into();
        let valid = !name.is_empty()
            && name.len() <= 128
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if valid {
            Ok(Self(name))
        } else {
            Err(VaultError::InvalidSecretName {
                name: truncate_for_error(&name),
            })
        }
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SecretName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn truncate_for_error(name: &str) -> String {
    name.chars().take(64).collect()
}

/// A secret's plaintext. Zeroized when dropped; `Debug` prints `[redacted]`; never
/// `Serialize`, never `Display`.
pub struct SecretValue(Zeroizing<Vec<u8>>);

impl SecretValue {
    /// Wraps plaintext bytes; the vector is zeroized when this value drops.
    pub fn new(bytes: Vec<u8>) -> Self {
        Self(Zeroizing::new(bytes))
    }

    /// The plaintext bytes. Callers outside the vault never get one of these for use at
    /// the wire: they name the secret and the vault places it.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// True when the value has no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretValue([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_value_never_prints_its_bytes() {
        let value = SecretValue::new(b"sigil-7f3a".to_vec());
        assert_eq!(format!("{value:?}"), "SecretValue([redacted])");
    }

    #[test]
    fn names_outside_the_alphabet_are_refused() {
        assert!(SecretName::new("tickets-token.v2_a").is_ok());
        for bad in ["", "has space", "semi;colon", "slash/", &"x".repeat(129)] {
            assert!(SecretName::new(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
