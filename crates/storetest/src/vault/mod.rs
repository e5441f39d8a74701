//! The `VaultStore` conformance checks: sealed records first, then the audit log.

use std::sync::{Arc, Mutex};

use runwarden_vault::audit::{AuditChain, AuditEvent, AuditRow, action};
use runwarden_vault::store::{
    AuditFilter, SealedKind, SealedMeta, SealedRecord, StoreError, VaultStore,
};

mod audit;
mod leases;
mod sealed;

use audit::*;
use leases::*;
use sealed::*;

/// Runs every check against `store`, which must be fresh and empty. Panics on the first
/// property that does not hold.
pub async fn exercise_vault_store(store: Arc<dyn VaultStore>) {
    let s = &*store;
    get_of_a_missing_record_is_none(s).await;
    put_then_get_returns_every_field(s).await;
    put_keeps_created_time_on_replace(s).await;
    insert_new_never_overwrites(s).await;
    kinds_are_separate_namespaces(s).await;
    delete_reports_whether_a_record_existed(s).await;
    list_is_ordered_by_name_and_holds_one_kind(s).await;
    list_never_returns_ciphertext(s).await;
    rewrap_is_all_or_nothing(s).await;
    rewrap_reaches_every_record_of_every_kind(s).await;
    an_oauth_refresh_lease_has_one_holder_until_it_expires_or_is_released(s).await;

    let chain = Arc::new(AuditChain::from_audit_key(&[42u8; 32]));
    an_empty_log_has_no_rows_no_tip_and_verifies(s, &chain).await;
    audit_ids_are_contiguous_from_one(s, &chain).await;
    audit_rows_link_to_their_predecessor(s, &chain).await;
    audit_tip_tracks_the_newest_row(s, &chain).await;
    audit_rows_return_every_field(s, &chain).await;
    audit_filter_by_action_and_correlation(s, &chain).await;
    audit_filter_after_id_newest_first_and_limit(s).await;
    concurrent_appends_get_contiguous_ids(&store, &chain).await;
    a_batch_gets_contiguous_ids_links_in_order_and_moves_the_tip_once(s, &chain).await;
    an_empty_batch_writes_nothing(s, &chain).await;
    a_batch_with_one_bad_row_writes_none_of_them(s, &chain).await;
    concurrent_batches_and_single_appends_never_share_or_skip_an_id(&store, &chain).await;
    incomplete_intents_are_those_no_row_names(s, &chain).await;
    an_untouched_log_verifies_intact(s, &chain).await;
    // Last: it appends rows, and earlier checks need an empty log.
    audit_counts_follow_appends(s).await;
    // After the log's checks: it appends a row with the same chain key.
    crate::secrets_version::the_secrets_version_moves_with_every_change_to_a_secret(s, &chain)
        .await;
}

fn record(kind: SealedKind, name: &str, time_ms: i64) -> SealedRecord {
    SealedRecord {
        kind,
        name: name.into(),
        algorithm: "xchacha20poly1305".into(),
        version: 1,
        master_key_id: "mk-1".into(),
        key_nonce: vec![1; 24],
        wrapped_key: vec![2; 48],
        value_nonce: vec![3; 24],
        ciphertext: format!("sealed {name}").into_bytes(),
        created_ms: time_ms,
        updated_ms: time_ms,
    }
}

async fn get(store: &dyn VaultStore, kind: SealedKind, name: &str) -> Option<SealedRecord> {
    store.sealed_get(kind, name).await.expect("sealed_get")
}
