//! The console-session checks (O4): a session is found by its hash only, ends at its
//! expiry, at sign-out and when its token is revoked. The session ids and their hashing
//! belong to the console in the binary; these checks hand the store hashes directly.

use std::sync::Arc;

use runwarden_vault::store::TokenStore;
use runwarden_vault::{ConsoleSession, Role, SessionStore, token_create};

/// Runs every session-store check against a fresh store that keeps both tokens and
/// sessions (a session is bound to a token).
pub async fn exercise_session_store<S>(store: Arc<S>)
where
    S: SessionStore + TokenStore,
{
    let s = &*store;
    a_session_answers_with_its_token_until_it_expires(s).await;
    sign_out_deletes_the_session(s).await;
    revoking_the_token_ends_its_sessions(s).await;
    purge_removes_only_expired_sessions(s).await;
}

/// A session hash no other check uses (the console stores the SHA-256 of a random id).
fn hash(label: u8) -> [u8; 32] {
    let mut hash = [0xa5; 32];
    hash[0] = label;
    hash[31] = label.wrapping_mul(7);
    hash
}

/// Opens a session for `token` under `hash`, as the console's sign-in does.
async fn open<S: SessionStore>(
    store: &S,
    hash: [u8; 32],
    token: &runwarden_vault::ApiToken,
    now_ms: i64,
    ttl_ms: i64,
) -> ConsoleSession {
    store
        .session_insert(hash, &token.id, now_ms, now_ms + ttl_ms)
        .await
        .unwrap();
    ConsoleSession {
        token: token.clone(),
        created_ms: now_ms,
        expires_ms: now_ms + ttl_ms,
    }
}

async fn a_session_answers_with_its_token_until_it_expires<S: SessionStore + TokenStore>(
    store: &S,
) {
    let (_value, token) = token_create(store, "alice", Role::Viewer, 1).await.unwrap();
    let id = hash(1);
    let session = open(store, id, &token, 1_000, 500).await;
    assert_eq!(session.expires_ms, 1_500);
    let found = store.session_find(id, 1_499).await.unwrap();
    assert_eq!(found, Some(session));
    assert_eq!(
        store.session_find(id, 1_500).await.unwrap(),
        None,
        "a session stops answering at its expiry"
    );
    let mut wrong = id;
    wrong[5] ^= 1;
    assert_eq!(store.session_find(wrong, 1_000).await.unwrap(), None);
}

async fn sign_out_deletes_the_session<S: SessionStore + TokenStore>(store: &S) {
    let (_value, token) = token_create(store, "bob", Role::Operator, 2).await.unwrap();
    let id = hash(2);
    open(store, id, &token, 1_000, 60_000).await;
    assert!(store.session_delete(id).await.unwrap());
    assert!(!store.session_delete(id).await.unwrap());
    assert_eq!(store.session_find(id, 1_001).await.unwrap(), None);
}

async fn revoking_the_token_ends_its_sessions<S: SessionStore + TokenStore>(store: &S) {
    let (_value, token) = token_create(store, "carol", Role::Operator, 3)
        .await
        .unwrap();
    let id = hash(3);
    open(store, id, &token, 1_000, 60_000).await;
    assert!(store.session_find(id, 1_001).await.unwrap().is_some());
    assert!(store.token_revoke(&token.id).await.unwrap());
    assert_eq!(store.session_find(id, 1_002).await.unwrap(), None);
}

async fn purge_removes_only_expired_sessions<S: SessionStore + TokenStore>(store: &S) {
    let (_value, token) = token_create(store, "dave", Role::Viewer, 4).await.unwrap();
    let (old, young) = (hash(4), hash(5));
    open(store, old, &token, 10_000, 100).await;
    open(store, young, &token, 10_000, 100_000).await;
    let purged = store.session_purge(10_100).await.unwrap();
    assert!(purged >= 1, "the expired session is purged");
    assert!(!store.session_delete(old).await.unwrap());
    assert!(store.session_find(young, 10_101).await.unwrap().is_some());
}
