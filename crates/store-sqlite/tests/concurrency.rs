//! Two connections on one file, like `serve` and a worker process, appending at once.

use std::sync::Arc;

use runwarden_vault::store::{AuditFilter, VaultStore};

use crate::common::{TempDb, chain, event};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_connections_appending_at_once_keep_ids_contiguous_and_the_chain_intact() {
    const TASKS_PER_HANDLE: i64 = 8;
    const APPENDS_PER_TASK: i64 = 25;
    let db = TempDb::new();
    let handles = [db.open(), db.open()];
    let chain = chain();
    let mut tasks = Vec::new();
    for (h, store) in handles.iter().enumerate() {
        for t in 0..TASKS_PER_HANDLE {
            let (store, chain) = (store.clone(), Arc::clone(&chain));
            tasks.push(tokio::spawn(async move {
                for n in 0..APPENDS_PER_TASK {
                    store
                        .audit_append(event(h as i64 * 10_000 + t * 100 + n), chain.clone())
                        .await
                        .unwrap();
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    let total = 2 * TASKS_PER_HANDLE * APPENDS_PER_TASK;
    let ids: Vec<i64> = handles[1]
        .audit_list(AuditFilter::default())
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids, (1..=total).collect::<Vec<_>>());
    assert_eq!(
        handles[0].audit_tip().await.unwrap().unwrap().last_id,
        total
    );
    let report = chain.verify(&handles[0]).await.unwrap();
    assert!(report.intact, "{report:?}");
    assert_eq!(report.rows_verified, total);
}
