//! V1: envelope encryption over a real SQLite file: wrong keys, tampering, renaming,
//! both algorithms, and master-key rotation that is all or nothing.

use std::sync::Arc;
use std::time::Duration;

use runwarden_store_sqlite::SqliteStore;
use runwarden_vault::{
    Algorithm, Credential, EgressClient, EgressConfig, EgressError, EgressPolicy, EgressRequest,
    MasterKey, Method, Placement, SecretName, SecretValue, Vault, VaultError,
};

use crate::support::SIGIL;
use runwarden_testkit::{HttpReply, TestServer};

struct Db {
    dir: tempfile::TempDir,
}

impl Db {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("runwarden.db")
    }
    async fn vault(&self, key: &MasterKey, algorithm: Algorithm) -> Result<Vault, VaultError> {
        let store = SqliteStore::open(self.path()).unwrap();
        Vault::open(Arc::new(store), same_key(key), algorithm).await
    }
    fn sql(&self, statement: &str) {
        let conn = rusqlite::Connection::open(self.path()).unwrap();
        assert_eq!(conn.execute(statement, []).unwrap(), 1, "{statement}");
    }
}

/// A second handle on a key (keys are deliberately not Clone).
fn same_key(key: &MasterKey) -> MasterKey {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("k");
    key.write_new_file(&path).unwrap();
    MasterKey::from_file(&path).unwrap()
}

async fn put(vault: &Vault, name: &str, value: &str) -> SecretName {
    let name = SecretName::new(name).unwrap();
    vault
        .secret_put(&name, SecretValue::new(value.as_bytes().to_vec()))
        .await
        .unwrap();
    name
}

/// Uses the secret as a bearer token against a live server; returns what the server got.
async fn use_secret(vault: Vault, name: &str) -> Result<String, EgressError> {
    let mut server = TestServer::start(|_| HttpReply::text(200, "ok")).await;
    let config = EgressConfig {
        policy: EgressPolicy::new(&["127.0.0.1"]).unwrap(),
        ..EgressConfig::default()
    };
    let client = EgressClient::new(Arc::new(vault), config);
    let secret = SecretName::new(name).unwrap();
    let request = EgressRequest::new(Method::Get, server.url("/")).credential(Credential {
        secret,
        placement: Placement::Bearer,
    });
    client.send(request, None).await?;
    Ok(server.next_request(Duration::from_secs(5)).await.raw)
}

#[tokio::test]
async fn both_algorithms_place_the_value_they_sealed() {
    for algorithm in [Algorithm::XChaCha20Poly1305, Algorithm::Aes256Gcm] {
        let db = Db::new();
        let key = MasterKey::generate();
        put(&db.vault(&key, algorithm).await.unwrap(), "api", SIGIL).await;
        let raw = use_secret(db.vault(&key, algorithm).await.unwrap(), "api")
            .await
            .unwrap();
        assert!(
            raw.contains(&format!("authorization: Bearer {SIGIL}")),
            "{algorithm:?}"
        );
        let bytes = std::fs::read(db.path()).unwrap();
        assert!(
            !bytes.windows(SIGIL.len()).any(|w| w == SIGIL.as_bytes()),
            "the value is encrypted at rest"
        );
    }
}

#[tokio::test]
async fn a_wrong_master_key_fails_to_open_the_vault_with_a_clear_error() {
    let db = Db::new();
    put(
        &db.vault(&MasterKey::generate(), Algorithm::default())
            .await
            .unwrap(),
        "api",
        SIGIL,
    )
    .await;
    let err = db
        .vault(&MasterKey::generate(), Algorithm::default())
        .await
        .unwrap_err();
    assert!(matches!(err, VaultError::WrongMasterKey { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("point the configuration at the right key file"),
        "{err}"
    );
}

#[tokio::test]
async fn a_tampered_ciphertext_fails_with_a_clear_error_and_is_never_sent() {
    let db = Db::new();
    let key = MasterKey::generate();
    put(
        &db.vault(&key, Algorithm::default()).await.unwrap(),
        "api",
        SIGIL,
    )
    .await;
    // The first byte changed, whatever it was (a fixed new byte equals the old one once in
    // 256 runs, and then nothing was tampered with).
    db.sql("UPDATE sealed SET ciphertext = CAST(CASE WHEN substr(ciphertext, 1, 1) = X'00' THEN X'01' ELSE X'00' END || substr(ciphertext, 2) AS BLOB) WHERE name = 'api'");
    let err = use_secret(db.vault(&key, Algorithm::default()).await.unwrap(), "api")
        .await
        .unwrap_err();
    assert!(
        matches!(err, EgressError::Credential(VaultError::Tampered { .. })),
        "{err}"
    );
    assert!(err.to_string().contains("failed authentication"), "{err}");
}

#[tokio::test]
async fn a_secret_row_renamed_to_another_identifier_fails_authentication() {
    let db = Db::new();
    let key = MasterKey::generate();
    put(
        &db.vault(&key, Algorithm::default()).await.unwrap(),
        "api",
        SIGIL,
    )
    .await;
    db.sql("UPDATE sealed SET name = 'admin' WHERE name = 'api'");
    let err = use_secret(db.vault(&key, Algorithm::default()).await.unwrap(), "admin")
        .await
        .unwrap_err();
    assert!(
        matches!(err, EgressError::Credential(VaultError::Tampered { .. })),
        "{err}"
    );
}

#[tokio::test]
async fn rotation_moves_every_secret_and_the_audit_key_to_the_new_master_key() {
    let db = Db::new();
    let (old, new) = (MasterKey::generate(), MasterKey::generate());
    let vault = db.vault(&old, Algorithm::default()).await.unwrap();
    put(&vault, "api", SIGIL).await;
    put(&vault, "other", "second-value").await;
    assert_eq!(
        vault.rotate_master_key(&new).await.unwrap(),
        4,
        "two secrets, the audit key and the record of its making"
    );

    assert!(matches!(
        db.vault(&old, Algorithm::default()).await.unwrap_err(),
        VaultError::WrongMasterKey { .. }
    ));
    let rotated = db.vault(&new, Algorithm::default()).await.unwrap();
    assert!(rotated.audit_verify().await.unwrap().intact);
    let raw = use_secret(rotated, "api").await.unwrap();
    assert!(raw.contains(&format!("authorization: Bearer {SIGIL}")));
}

#[tokio::test]
async fn an_interrupted_rotation_leaves_every_secret_under_the_old_key() {
    let db = Db::new();
    let (old, new) = (MasterKey::generate(), MasterKey::generate());
    let vault = db.vault(&old, Algorithm::default()).await.unwrap();
    put(&vault, "a", "value-a").await;
    put(&vault, "b", SIGIL).await;
    put(&vault, "c", "value-c").await;
    // A damaged wrapped key makes the rotation fail part-way through the records. Its
    // first byte is changed, never merely rewritten: a key that already began with 00
    // (one in 256) would stay intact.
    db.sql(
        "UPDATE sealed SET wrapped_key = CAST(
             CASE WHEN substr(wrapped_key, 1, 1) = X'00' THEN X'01' ELSE X'00' END
             || substr(wrapped_key, 2) AS BLOB) WHERE name = 'c'",
    );
    let err = vault.rotate_master_key(&new).await.unwrap_err();
    assert!(err.to_string().contains("failed authentication"), "{err}");

    assert!(
        db.vault(&new, Algorithm::default()).await.is_err(),
        "nothing moved to the new key"
    );
    let raw = use_secret(db.vault(&old, Algorithm::default()).await.unwrap(), "b")
        .await
        .unwrap();
    assert!(
        raw.contains(SIGIL),
        "the old key still opens every untouched secret"
    );
}
