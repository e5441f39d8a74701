//! The master key: loaded from a key file (mode 0600 or 0400) or an environment variable.

use std::fmt;
use std::fs;
use std::io::Write;
use std::path::Path;

use chacha20poly1305::aead::OsRng;
use chacha20poly1305::aead::rand_core::RngCore;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use crate::error::VaultError;

/// The 32-byte key that wraps every data key (V1). Zeroized on drop, never printed.
pub struct MasterKey {
    bytes: Zeroizing<[u8; 32]>,
    id: String,
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MasterKey")
            .field("id", &self.id)
            .field("bytes", &"[redacted]")
            .finish()
    }
}

impl MasterKey {
    /// A fresh random key from the operating system's generator.
    pub fn generate() -> Self {
        let mut bytes = Zeroizing::new([0u8; 32]);
        OsRng.fill_bytes(bytes.as_mut());
        Self::from_bytes(bytes)
    }

    fn from_bytes(bytes: Zeroizing<[u8; 32]>) -> Self {
        let mut mac = Hmac::<Sha256>::new_from_slice(bytes.as_ref()).expect("any key length works");
        mac.update(b"runwarden master key id v1");
        let id = hex::encode(&mac.finalize().into_bytes()[..6]);
        Self { bytes, id }
    }

    /// Reads a key file holding 64 hex characters. Refuses a file that group or others
    /// may read or write (V1: mode 0600 or 0400).
    pub fn from_file(path: &Path) -> Result<Self, VaultError> {
        let location = path.display().to_string();
        let metadata = match fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(VaultError::MasterKeyMissing { location });
            }
            Err(e) => {
                return Err(VaultError::MasterKeyInvalid {
                    location,
                    problem: e.to_string(),
                });
            }
        };
        check_mode(&metadata, &location)?;
        let text =
            Zeroizing::new(
                fs::read_to_string(path).map_err(|e| VaultError::MasterKeyInvalid {
                    location: location.clone(),
                    problem: e.to_string(),
                })?,
            );
        Self::from_hex(text.trim(), &location)
    }

    /// Reads a key from the value of an environment variable (64 hex characters).
    pub fn from_env_value(value: &str, variable: &str) -> Result<Self, VaultError> {
        Self::from_hex(value.trim(), &format!("${variable}"))
    }

    fn from_hex(text: &str, location: &str) -> Result<Self, VaultError> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        hex::decode_to_slice(text, bytes.as_mut()).map_err(|_| VaultError::MasterKeyInvalid {
            location: location.to_string(),
            problem: "expected 64 hexadecimal characters (32 bytes)".into(),
        })?;
        Ok(Self::from_bytes(bytes))
    }

    /// Writes the key to a new file with mode 0600. Refuses to overwrite an existing file.
    pub fn write_new_file(&self, path: &Path) -> std::io::Result<()> {
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut file = options.open(path)?;
        let text = Zeroizing::new(format!("{}\n", hex::encode(self.bytes.as_ref())));
        file.write_all(text.as_bytes())?;
        file.sync_all()
    }

    /// A short public fingerprint, stored with each sealed record so a wrong key is named
    /// as such rather than reported as tampering.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// A second handle on the same key, for work that must own its copy (rotation).
    pub(crate) fn duplicate(&self) -> Self {
        Self {
            bytes: self.bytes.clone(),
            id: self.id.clone(),
        }
    }

    pub(crate) fn bytes(&self) -> &[u8; 32] {
        &self.bytes
    }
}

#[cfg(unix)]
fn check_mode(metadata: &fs::Metadata, location: &str) -> Result<(), VaultError> {
    use std::os::unix::fs::PermissionsExt;
    let mode = metadata.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(VaultError::MasterKeyInvalid {
            location: location.to_string(),
            problem: format!(
                "its mode is {mode:04o}; other users must not read it: chmod 600 {location}"
            ),
        });
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_mode(_: &fs::Metadata, _: &str) -> Result<(), VaultError> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_round_trips_and_is_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        let key = MasterKey::generate();
        key.write_new_file(&path).unwrap();
        assert_eq!(MasterKey::from_file(&path).unwrap().id(), key.id());
        assert!(MasterKey::generate().write_new_file(&path).is_err());
        assert_eq!(MasterKey::from_file(&path).unwrap().id(), key.id());
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_others_can_read_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("master.key");
        MasterKey::generate().write_new_file(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = MasterKey::from_file(&path).unwrap_err();
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    // The binary says what to do (init, or restore the key / `init --new-key` once an
    // installation exists): only it knows which applies.
    #[test]
    fn a_missing_key_file_is_named() {
        let err = MasterKey::from_file(Path::new("/nonexistent/master.key")).unwrap_err();
        assert_eq!(err.to_string(), "no master key at /nonexistent/master.key");
    }

    #[test]
    fn debug_never_shows_key_bytes() {
        let key = MasterKey::from_env_value(&"ab".repeat(32), "K").unwrap();
        let shown = format!("{key:?}");
        assert!(!shown.contains(&"ab".repeat(4)), "{shown}");
        assert!(shown.contains("[redacted]"));
    }
}
