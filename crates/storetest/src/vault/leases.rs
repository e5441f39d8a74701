//! The OAuth refresh lease: one holder until it expires or is released.

use super::*;

/// M18: one refresh of a token at a time across processes: the lease has one holder until
/// it expires or is released, its holder may extend it, and a stale release is ignored.
pub(super) async fn an_oauth_refresh_lease_has_one_holder_until_it_expires_or_is_released(
    s: &dyn VaultStore,
) {
    let key = "oauth.lease-check";
    assert!(
        s.oauth_lease_acquire(key, "a", 1_000, 31_000)
            .await
            .unwrap()
    );
    assert!(
        !s.oauth_lease_acquire(key, "b", 2_000, 32_000)
            .await
            .unwrap(),
        "a held lease is not taken"
    );
    assert!(
        s.oauth_lease_acquire(key, "a", 3_000, 33_000)
            .await
            .unwrap(),
        "its holder extends it"
    );
    assert!(
        s.oauth_lease_acquire("oauth.other", "b", 3_000, 33_000)
            .await
            .unwrap(),
        "leases are per key"
    );
    assert!(
        s.oauth_lease_acquire(key, "b", 33_000, 63_000)
            .await
            .unwrap(),
        "an expired lease is taken over"
    );
    s.oauth_lease_release(key, "a").await.unwrap();
    assert!(
        !s.oauth_lease_acquire(key, "c", 34_000, 64_000)
            .await
            .unwrap(),
        "a stale holder's release leaves the new holder's lease"
    );
    s.oauth_lease_release(key, "b").await.unwrap();
    assert!(
        s.oauth_lease_acquire(key, "c", 35_000, 65_000)
            .await
            .unwrap(),
        "a released lease is free"
    );
    s.oauth_lease_release(key, "c").await.unwrap();
    s.oauth_lease_release("oauth.other", "b").await.unwrap();
}
