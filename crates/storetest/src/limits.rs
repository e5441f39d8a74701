//! Limits (R14) over two handles of one database (two processes, two nodes): a
//! concurrency limit admits K holders across both and frees a slot on release or when its
//! lease runs out; a token bucket is shared; a take is all or none; racing takes never
//! admit more than K. Times are passed in, so nothing here sleeps.

use std::sync::Arc;

use runwarden_runtime::limits::{LimitStore, LimitTake};
use runwarden_runtime::rules::limits::{LimitRule, TakeDecision};

const NOW: i64 = 1_000_000;
const LEASE: i64 = 30_000;

fn slots(k: u32) -> LimitRule {
    LimitRule {
        concurrency: Some(k),
        rate_per_second: None,
        burst: 1,
    }
}

fn rate(r: f64, burst: u32) -> LimitRule {
    LimitRule {
        concurrency: None,
        rate_per_second: Some(r),
        burst,
    }
}

fn take(holder: &str, limits: &[(&str, LimitRule)], now_ms: i64) -> LimitTake {
    LimitTake {
        holder: holder.into(),
        limits: limits.iter().map(|(k, r)| (k.to_string(), *r)).collect(),
        now_ms,
        hold_until_ms: now_ms + LEASE,
    }
}

fn taken(decision: &TakeDecision) -> bool {
    matches!(decision, TakeDecision::Take { .. })
}

/// Runs every check on two fresh handles of one database.
pub async fn exercise_limit_store(a: Arc<dyn LimitStore>, b: Arc<dyn LimitStore>) {
    a_concurrency_limit_admits_k_holders_across_handles_and_a_release_frees_one(&*a, &*b).await;
    a_holder_that_stops_renewing_frees_its_slot_when_its_lease_runs_out(&*a, &*b).await;
    a_token_bucket_is_shared_across_handles(&*a, &*b).await;
    a_take_is_all_or_none(&*a, &*b).await;
    racing_takes_on_both_handles_never_admit_more_than_k(a, b).await;
}

async fn a_concurrency_limit_admits_k_holders_across_handles_and_a_release_frees_one(
    a: &dyn LimitStore,
    b: &dyn LimitStore,
) {
    let key = "server:conformance-k";
    let limits = [(key, slots(2))];
    assert!(taken(
        &a.limit_take(take("h1", &limits, NOW)).await.unwrap()
    ));
    assert!(taken(
        &b.limit_take(take("h2", &limits, NOW)).await.unwrap()
    ));
    assert_eq!(a.limit_holders(key, NOW).await.unwrap(), 2);
    assert_eq!(
        a.limit_take(take("h3", &limits, NOW)).await.unwrap(),
        TakeDecision::Wait {
            key: key.into(),
            retry_in_ms: None
        },
        "a third holder waits, whichever handle it asks"
    );
    b.limit_release("h1").await.unwrap();
    assert!(
        taken(&a.limit_take(take("h3", &limits, NOW)).await.unwrap()),
        "a release on one handle frees a slot for the other"
    );
    for holder in ["h2", "h3"] {
        a.limit_release(holder).await.unwrap();
    }
    assert_eq!(b.limit_holders(key, NOW).await.unwrap(), 0);
}

async fn a_holder_that_stops_renewing_frees_its_slot_when_its_lease_runs_out(
    a: &dyn LimitStore,
    b: &dyn LimitStore,
) {
    let key = "tool:conformance__lease";
    let limits = [(key, slots(1))];
    assert!(taken(
        &a.limit_take(take("renewed", &limits, NOW)).await.unwrap()
    ));
    a.limit_renew("renewed", NOW + 2 * LEASE).await.unwrap();
    let later = NOW + LEASE + 1;
    assert!(
        !taken(&b.limit_take(take("other", &limits, later)).await.unwrap()),
        "a renewed hold keeps its slot past its first lease"
    );
    let after = NOW + 2 * LEASE;
    assert!(
        taken(&b.limit_take(take("other", &limits, after)).await.unwrap()),
        "a hold whose lease ran out frees its slot"
    );
    assert_eq!(a.limit_holders(key, after).await.unwrap(), 1);
    b.limit_release("other").await.unwrap();
}

async fn a_token_bucket_is_shared_across_handles(a: &dyn LimitStore, b: &dyn LimitStore) {
    let key = "model:conformance-rate";
    let limits = [(key, rate(2.0, 2))];
    assert!(taken(
        &a.limit_take(take("r1", &limits, NOW)).await.unwrap()
    ));
    assert!(taken(
        &b.limit_take(take("r2", &limits, NOW)).await.unwrap()
    ));
    assert_eq!(
        a.limit_take(take("r3", &limits, NOW)).await.unwrap(),
        TakeDecision::Wait {
            key: key.into(),
            retry_in_ms: Some(500)
        },
        "the burst is spent across both handles"
    );
    assert!(
        taken(&b.limit_take(take("r3", &limits, NOW + 500)).await.unwrap()),
        "the bucket refills at its rate"
    );
    assert_eq!(
        a.limit_holders(key, NOW).await.unwrap(),
        0,
        "a rate limit holds no slot"
    );
}

async fn a_take_is_all_or_none(a: &dyn LimitStore, b: &dyn LimitStore) {
    let (spent, full) = ("agent:conformance-all", "server:conformance-all");
    let both = [(spent, rate(1.0, 1)), (full, slots(1))];
    assert!(taken(
        &a.limit_take(take("first", &[(full, slots(1))], NOW))
            .await
            .unwrap()
    ));
    assert_eq!(
        b.limit_take(take("second", &both, NOW)).await.unwrap(),
        TakeDecision::Wait {
            key: full.into(),
            retry_in_ms: None
        }
    );
    assert!(
        taken(
            &a.limit_take(take("third", &[(spent, rate(1.0, 1))], NOW))
                .await
                .unwrap()
        ),
        "the refused take spent no token of the other limit"
    );
    assert_eq!(
        b.limit_holders(full, NOW).await.unwrap(),
        1,
        "and took no slot"
    );
    a.limit_release("first").await.unwrap();
}

async fn racing_takes_on_both_handles_never_admit_more_than_k(
    a: Arc<dyn LimitStore>,
    b: Arc<dyn LimitStore>,
) {
    let key = "server:conformance-race";
    let mut racers = Vec::new();
    for n in 0..16 {
        let store = if n % 2 == 0 { a.clone() } else { b.clone() };
        racers.push(tokio::spawn(async move {
            let limits = [(key, slots(3))];
            store
                .limit_take(take(&format!("racer-{n}"), &limits, NOW))
                .await
                .unwrap()
        }));
    }
    let mut admitted = 0;
    for racer in racers {
        admitted += usize::from(taken(&racer.await.unwrap()));
    }
    assert_eq!(admitted, 3, "exactly K of the racing takes were admitted");
    assert_eq!(a.limit_holders(key, NOW).await.unwrap(), 3);
}
