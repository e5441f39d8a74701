//! Envelope encryption: a random data key per record, both layers sealed with an AEAD
//! whose associated data names the record (V1).

use aes_gcm::Aes256Gcm;
use chacha20poly1305::XChaCha20Poly1305;
use chacha20poly1305::aead::rand_core::RngCore;
use chacha20poly1305::aead::{Aead, KeyInit, OsRng, Payload};
use zeroize::Zeroizing;

use crate::error::VaultError;
use crate::master_key::MasterKey;
use crate::store::{SealedKind, SealedRecord};

/// The envelope format this build writes and reads.
const VERSION: u32 = 1;

/// The AEAD that seals both layers of a record. Recorded per record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Algorithm {
    /// XChaCha20-Poly1305 with 24-byte random nonces (the default).
    #[default]
    XChaCha20Poly1305,
    /// AES-256-GCM with 12-byte random nonces.
    Aes256Gcm,
}

impl Algorithm {
    /// The stable name stored with each record.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::XChaCha20Poly1305 => "xchacha20poly1305",
            Self::Aes256Gcm => "aes256gcm",
        }
    }

    /// Parses a stored or configured name.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "xchacha20poly1305" => Some(Self::XChaCha20Poly1305),
            "aes256gcm" => Some(Self::Aes256Gcm),
            _ => None,
        }
    }

    fn nonce_len(self) -> usize {
        match self {
            Self::XChaCha20Poly1305 => 24,
            Self::Aes256Gcm => 12,
        }
    }

    fn seal(self, key: &[u8; 32], nonce: &[u8], msg: &[u8], aad: &[u8]) -> Vec<u8> {
        let payload = Payload { msg, aad };
        let sealed = match self {
            Self::XChaCha20Poly1305 => {
                XChaCha20Poly1305::new(key.into()).encrypt(nonce.into(), payload)
            }
            Self::Aes256Gcm => Aes256Gcm::new(key.into()).encrypt(nonce.into(), payload),
        };
        sealed.expect("AEAD encryption of an in-memory buffer does not fail")
    }

    fn open(
        self,
        key: &[u8; 32],
        nonce: &[u8],
        ciphertext: &[u8],
        aad: &[u8],
    ) -> Option<Zeroizing<Vec<u8>>> {
        if nonce.len() != self.nonce_len() {
            return None;
        }
        let payload = Payload {
            msg: ciphertext,
            aad,
        };
        let opened = match self {
            Self::XChaCha20Poly1305 => {
                XChaCha20Poly1305::new(key.into()).decrypt(nonce.into(), payload)
            }
            Self::Aes256Gcm => Aes256Gcm::new(key.into()).decrypt(nonce.into(), payload),
        };
        opened.ok().map(Zeroizing::new)
    }
}

/// The associated data of both layers: the format, the record's kind and its name.
fn associated_data(kind: SealedKind, name: &str) -> Vec<u8> {
    format!("runwarden:v{VERSION}:{}:{name}", kind.as_str()).into_bytes()
}

pub(crate) fn random_bytes(len: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    OsRng.fill_bytes(&mut bytes);
    bytes
}

fn describe(record: &SealedRecord) -> String {
    match record.kind {
        SealedKind::Secret => format!("secret {:?}", record.name),
        SealedKind::Internal => format!("the vault's {} key", record.name),
    }
}

/// Seals `plaintext` under a fresh data key wrapped by `master`.
pub(crate) fn seal(
    master: &MasterKey,
    algorithm: Algorithm,
    kind: SealedKind,
    name: &str,
    plaintext: &[u8],
    now_ms: i64,
) -> SealedRecord {
    let aad = associated_data(kind, name);
    let mut data_key = Zeroizing::new([0u8; 32]);
    OsRng.fill_bytes(data_key.as_mut());
    let value_nonce = random_bytes(algorithm.nonce_len());
    let ciphertext = algorithm.seal(&data_key, &value_nonce, plaintext, &aad);
    let key_nonce = random_bytes(algorithm.nonce_len());
    let wrapped_key = algorithm.seal(master.bytes(), &key_nonce, data_key.as_ref(), &aad);
    SealedRecord {
        kind,
        name: name.to_string(),
        algorithm: algorithm.as_str().to_string(),
        version: VERSION,
        master_key_id: master.id().to_string(),
        key_nonce,
        wrapped_key,
        value_nonce,
        ciphertext,
        created_ms: now_ms,
        updated_ms: now_ms,
    }
}

fn checked_algorithm(record: &SealedRecord) -> Result<Algorithm, VaultError> {
    match Algorithm::parse(&record.algorithm) {
        Some(algorithm) if record.version == VERSION => Ok(algorithm),
        _ => Err(VaultError::UnknownAlgorithm {
            what: describe(record),
            algorithm: record.algorithm.clone(),
            version: record.version,
        }),
    }
}

fn unwrap_data_key(
    master: &MasterKey,
    record: &SealedRecord,
    algorithm: Algorithm,
) -> Result<Zeroizing<[u8; 32]>, VaultError> {
    if record.master_key_id != master.id() {
        return Err(VaultError::WrongMasterKey {
            what: describe(record),
            sealed_under: record.master_key_id.clone(),
            loaded: master.id().to_string(),
        });
    }
    let aad = associated_data(record.kind, &record.name);
    let opened = algorithm
        .open(master.bytes(), &record.key_nonce, &record.wrapped_key, &aad)
        .ok_or_else(|| VaultError::Tampered {
            what: describe(record),
        })?;
    let mut key = Zeroizing::new([0u8; 32]);
    if opened.len() != key.len() {
        return Err(VaultError::Tampered {
            what: describe(record),
        });
    }
    key.copy_from_slice(&opened);
    Ok(key)
}

/// Opens a record; the plaintext zeroizes when dropped.
pub(crate) fn open(
    master: &MasterKey,
    record: &SealedRecord,
) -> Result<Zeroizing<Vec<u8>>, VaultError> {
    let algorithm = checked_algorithm(record)?;
    let data_key = unwrap_data_key(master, record, algorithm)?;
    let aad = associated_data(record.kind, &record.name);
    algorithm
        .open(&data_key, &record.value_nonce, &record.ciphertext, &aad)
        .ok_or_else(|| VaultError::Tampered {
            what: describe(record),
        })
}

/// Re-wraps the data key of a record from `old` to `new`; the value layer is untouched.
pub(crate) fn rewrap(
    old: &MasterKey,
    new: &MasterKey,
    record: SealedRecord,
) -> Result<SealedRecord, VaultError> {
    let algorithm = checked_algorithm(&record)?;
    let data_key = unwrap_data_key(old, &record, algorithm)?;
    let aad = associated_data(record.kind, &record.name);
    let key_nonce = random_bytes(algorithm.nonce_len());
    let wrapped_key = algorithm.seal(new.bytes(), &key_nonce, data_key.as_ref(), &aad);
    Ok(SealedRecord {
        master_key_id: new.id().to_string(),
        key_nonce,
        wrapped_key,
        ..record
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealed(algorithm: Algorithm, master: &MasterKey) -> SealedRecord {
        seal(
            master,
            algorithm,
            SealedKind::Secret,
            "tickets-token",
            b"sigil-9d1e",
            1,
        )
    }

    #[test]
    fn both_algorithms_round_trip() {
        let master = MasterKey::generate();
        for algorithm in [Algorithm::XChaCha20Poly1305, Algorithm::Aes256Gcm] {
            let record = sealed(algorithm, &master);
            assert_eq!(record.algorithm, algorithm.as_str());
            assert_eq!(&open(&master, &record).unwrap()[..], b"sigil-9d1e");
        }
    }

    #[test]
    fn a_wrong_master_key_is_named_as_such() {
        let record = sealed(Algorithm::default(), &MasterKey::generate());
        let err = open(&MasterKey::generate(), &record).unwrap_err();
        assert!(matches!(err, VaultError::WrongMasterKey { .. }), "{err}");
    }

    #[test]
    fn a_tampered_ciphertext_fails_authentication() {
        let master = MasterKey::generate();
        let mut record = sealed(Algorithm::default(), &master);
        record.ciphertext[0] ^= 1;
        assert!(matches!(
            open(&master, &record).unwrap_err(),
            VaultError::Tampered { .. }
        ));
    }

    #[test]
    fn a_record_moved_to_another_name_fails_authentication() {
        let master = MasterKey::generate();
        let mut record = sealed(Algorithm::default(), &master);
        record.name = "other-token".into();
        assert!(matches!(
            open(&master, &record).unwrap_err(),
            VaultError::Tampered { .. }
        ));
        let mut record = sealed(Algorithm::default(), &master);
        record.kind = SealedKind::Internal;
        assert!(matches!(
            open(&master, &record).unwrap_err(),
            VaultError::Tampered { .. }
        ));
    }

    #[test]
    fn an_unknown_algorithm_or_version_is_a_hard_error() {
        let master = MasterKey::generate();
        let mut record = sealed(Algorithm::default(), &master);
        record.algorithm = "rot13".into();
        assert!(matches!(
            open(&master, &record).unwrap_err(),
            VaultError::UnknownAlgorithm { .. }
        ));
        let mut record = sealed(Algorithm::default(), &master);
        record.version = 2;
        assert!(matches!(
            open(&master, &record).unwrap_err(),
            VaultError::UnknownAlgorithm { .. }
        ));
    }

    #[test]
    fn rewrap_moves_a_record_to_the_new_key_only() {
        let (old, new) = (MasterKey::generate(), MasterKey::generate());
        let record = sealed(Algorithm::Aes256Gcm, &old);
        let moved = rewrap(&old, &new, record.clone()).unwrap();
        assert_eq!(
            moved.ciphertext, record.ciphertext,
            "the value layer is untouched"
        );
        assert_eq!(&open(&new, &moved).unwrap()[..], b"sigil-9d1e");
        assert!(open(&old, &moved).is_err());
    }
}
