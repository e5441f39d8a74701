//! The secrets' version: it moves with every change to an operator's secret and with
//! nothing else, and a vault on one handle of a database searches for a secret put through
//! another handle (another process, another node) on its very next call.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use runwarden_vault::audit::{AuditChain, AuditEvent, action};
use runwarden_vault::store::{SealedKind, SealedRecord, StoreError, VaultStore};
use runwarden_vault::{
    Algorithm, EgressClient, EgressConfig, MasterKey, SecretName, SecretValue, Vault,
};

/// Every store change that touches a secret moves the version, whoever makes it; a write
/// that changes no secret (an internal record, an audit row, an insert that finds the name
/// taken, a delete that finds nothing) leaves it alone. Leaves no record behind.
pub(crate) async fn the_secrets_version_moves_with_every_change_to_a_secret(
    store: &dyn VaultStore,
    chain: &Arc<AuditChain>,
) {
    let version = || async { store.sealed_secrets_version().await.expect("the version") };
    let secret = |name: &str, time_ms: i64| SealedRecord {
        kind: SealedKind::Secret,
        name: name.into(),
        algorithm: "xchacha20poly1305".into(),
        version: 1,
        master_key_id: "mk-1".into(),
        key_nonce: vec![1; 24],
        wrapped_key: vec![2; 48],
        value_nonce: vec![3; 24],
        ciphertext: format!("sealed {name} at {time_ms}").into_bytes(),
        created_ms: time_ms,
        updated_ms: time_ms,
    };
    let mut seen = vec![version().await];
    let mut moved = |v: u64, what: &str| {
        assert!(
            !seen.contains(&v),
            "{what}: the version {v} was seen before"
        );
        seen.push(v);
    };
    store.sealed_put(secret("v-a", 10)).await.unwrap();
    moved(version().await, "a new secret");
    // The same times as before: only the version tells this replacement apart.
    store.sealed_put(secret("v-a", 10)).await.unwrap();
    moved(version().await, "a replaced secret");
    assert!(store.sealed_insert_new(secret("v-b", 11)).await.unwrap());
    moved(version().await, "a secret inserted new");
    store
        .sealed_rewrap_all(Box::new(Ok::<SealedRecord, StoreError>))
        .await
        .unwrap();
    moved(version().await, "a rotation");
    assert!(
        store
            .sealed_delete(SealedKind::Secret, "v-b")
            .await
            .unwrap()
    );
    moved(version().await, "a removed secret");

    let still = version().await;
    assert!(!store.sealed_insert_new(secret("v-a", 12)).await.unwrap());
    assert!(
        !store
            .sealed_delete(SealedKind::Secret, "v-b")
            .await
            .unwrap()
    );
    let internal = SealedRecord {
        kind: SealedKind::Internal,
        ..secret("v-internal", 13)
    };
    store.sealed_put(internal).await.unwrap();
    assert!(
        store
            .sealed_delete(SealedKind::Internal, "v-internal")
            .await
            .unwrap()
    );
    let row = AuditEvent {
        time_ms: 1,
        action: action::HTTP_CALL.into(),
        success: true,
        secret: None,
        method: "GET".into(),
        host: "example.com".into(),
        path: "/".into(),
        status: 200,
        duration_ms: 1,
        error: None,
        reason: None,
        actor: "storetest".into(),
        correlation: None,
        intent_id: None,
    };
    store.audit_append(row, chain.clone()).await.unwrap();
    assert_eq!(
        version().await,
        still,
        "writes that change no secret leave the version alone"
    );
    assert!(
        store
            .sealed_delete(SealedKind::Secret, "v-a")
            .await
            .unwrap()
    );
}

/// Two vaults with one master key over two handles of one database (`here` and
/// `elsewhere`, as two processes or two nodes hold them): a secret put, replaced or removed
/// through `elsewhere` is searched for by the next call through `here`, with no wait, even
/// while many calls on `here` share their version reads. `here` and `elsewhere` must be
/// fresh and empty.
pub async fn exercise_secret_freshness(here: Arc<dyn VaultStore>, elsewhere: Arc<dyn VaultStore>) {
    let key = "5e".repeat(32);
    let key = |n| MasterKey::from_env_value(&key, n).expect("a key");
    let algorithm = Algorithm::XChaCha20Poly1305;
    let writer = Vault::open(elsewhere, key("ELSEWHERE"), algorithm)
        .await
        .expect("the vault elsewhere");
    let reader = Arc::new(
        Vault::open(here, key("HERE"), algorithm)
            .await
            .expect("the vault here"),
    );
    let client = Arc::new(EgressClient::new(reader, EgressConfig::default()));
    let found = |text: &'static str| {
        let client = client.clone();
        async move {
            client
                .redactor()
                .await
                .expect("the matcher")
                .secrets_in_text(text)
        }
    };
    const FIRST: &str = "fresh-first-4d1c77e0";
    const SECOND: &str = "fresh-second-a09b3f52";
    let name = SecretName::new("late").unwrap();
    // Built before the put, so a stale matcher would be kept.
    assert!(found(FIRST).await.is_empty(), "not a secret yet");

    writer
        .secret_put(&name, SecretValue::new(FIRST.as_bytes().to_vec()))
        .await
        .unwrap();
    assert_eq!(found(FIRST).await, ["late"], "put elsewhere, seen at once");

    writer
        .secret_put(&name, SecretValue::new(SECOND.as_bytes().to_vec()))
        .await
        .unwrap();
    assert_eq!(found(SECOND).await, ["late"], "replaced elsewhere");
    assert!(
        found(FIRST).await.is_empty(),
        "the old value is not searched for"
    );

    // Many callers asking all the time, sharing reads: every call that asks after the
    // change committed finds it.
    let committed = Arc::new(AtomicBool::new(false));
    let callers: Vec<_> = (0..16)
        .map(|_| {
            let (client, committed) = (client.clone(), committed.clone());
            tokio::spawn(async move {
                loop {
                    let after = committed.load(Ordering::SeqCst);
                    let redactor = client.redactor().await.expect("the matcher");
                    if after {
                        return redactor.secrets_in_text(SECOND);
                    }
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    tokio::task::yield_now().await;
    assert!(writer.secret_remove(&name).await.unwrap());
    committed.store(true, Ordering::SeqCst);
    for caller in callers {
        assert!(
            caller.await.unwrap().is_empty(),
            "a call that asked after the removal committed still searched for it"
        );
    }
    assert!(found(SECOND).await.is_empty(), "removed elsewhere");
}
