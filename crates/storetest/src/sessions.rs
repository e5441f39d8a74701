//! The console-session checks (O4): a session is found by its id only, ends at its
//! expiry, at sign-out and when its token is revoked, and stores no id.

use std::sync::Arc;

use runwarden_vault::store::TokenStore;
use runwarden_vault::{
    Role, SessionStore, session_create, session_hash, session_lookup, token_create,
};

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

async fn a_session_answers_with_its_token_until_it_expires<S: SessionStore + TokenStore>(
    store: &S,
) {
    let (_value, token) = token_create(store, "alice", Role::Viewer, 1).await.unwrap();
    let (id, session) = session_create(store, &token, 1_000, 500).await.unwrap();
    assert_eq!(session.expires_ms, 1_500);
    let found = session_lookup(store, id.expose(), 1_499).await.unwrap();
    assert_eq!(found, Some(session));
    assert_eq!(
        session_lookup(store, id.expose(), 1_500).await.unwrap(),
        None,
        "a session stops answering at its expiry"
    );
    let mut wrong = id.expose().to_string();
    wrong.replace_range(0..1, if wrong.starts_with('A') { "B" } else { "A" });
    assert_eq!(session_lookup(store, &wrong, 1_000).await.unwrap(), None);
    assert_eq!(session_lookup(store, "short", 1_000).await.unwrap(), None);
}

async fn sign_out_deletes_the_session<S: SessionStore + TokenStore>(store: &S) {
    let (_value, token) = token_create(store, "bob", Role::Operator, 2).await.unwrap();
    let (id, _) = session_create(store, &token, 1_000, 60_000).await.unwrap();
    assert!(
        store
            .session_delete(session_hash(id.expose()))
            .await
            .unwrap()
    );
    assert!(
        !store
            .session_delete(session_hash(id.expose()))
            .await
            .unwrap()
    );
    assert_eq!(
        session_lookup(store, id.expose(), 1_001).await.unwrap(),
        None
    );
}

async fn revoking_the_token_ends_its_sessions<S: SessionStore + TokenStore>(store: &S) {
    let (_value, token) = token_create(store, "carol", Role::Operator, 3)
        .await
        .unwrap();
    let (id, _) = session_create(store, &token, 1_000, 60_000).await.unwrap();
    assert!(
        session_lookup(store, id.expose(), 1_001)
            .await
            .unwrap()
            .is_some()
    );
    assert!(store.token_revoke(&token.id).await.unwrap());
    assert_eq!(
        session_lookup(store, id.expose(), 1_002).await.unwrap(),
        None
    );
}

async fn purge_removes_only_expired_sessions<S: SessionStore + TokenStore>(store: &S) {
    let (_value, token) = token_create(store, "dave", Role::Viewer, 4).await.unwrap();
    let (old, _) = session_create(store, &token, 10_000, 100).await.unwrap();
    let (young, _) = session_create(store, &token, 10_000, 100_000)
        .await
        .unwrap();
    let purged = store.session_purge(10_100).await.unwrap();
    assert!(purged >= 1, "the expired session is purged");
    assert!(
        !store
            .session_delete(session_hash(old.expose()))
            .await
            .unwrap()
    );
    assert!(
        session_lookup(store, young.expose(), 10_101)
            .await
            .unwrap()
            .is_some()
    );
}
