//! The hooked store over a real SQLite file: a failed call changes nothing, a lost answer
//! still commits, a hook sees each call's method, detail and answer.

use std::sync::Arc;
use std::sync::Mutex;

use async_trait::async_trait;
use runwarden_base::StoreError;
use runwarden_runtime::RunStore;
use runwarden_runtime::store::{NewRunStatus, RunCreate};
use runwarden_store_sqlite::SqliteStore;
use runwarden_testkit::{Call, Detail, Hook, HookedStore, StoreAnswer, Strike};

/// Fails `run_create` for id `fail`, loses the answer for id `lose`, records every call.
#[derive(Default)]
struct Script {
    seen: Mutex<Vec<(Call, bool)>>,
    fail_next_create: Mutex<Option<bool>>,
}

#[async_trait]
impl Hook for Script {
    async fn before(&self, call: &Call) -> Strike {
        if call.method != "run_create" {
            return Strike::Pass;
        }
        let error = StoreError::new("creating a run", "injected");
        match self.fail_next_create.lock().unwrap().take() {
            Some(true) => Strike::Fail(error),
            Some(false) => Strike::Lose(error),
            None => Strike::Pass,
        }
    }

    async fn after(&self, call: &Call, answer: StoreAnswer<'_>) -> Option<StoreError> {
        self.seen.lock().unwrap().push((call.clone(), answer.ok));
        None
    }
}

fn queued(id: &str) -> RunCreate {
    RunCreate {
        id: id.into(),
        agent: "a".into(),
        correlation: id.into(),
        request: None,
        status: NewRunStatus::Queued,
        now_ms: 1,
        origin: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_failed_call_changes_nothing_and_a_lost_answer_still_commits() {
    let dir = tempfile::tempdir().unwrap();
    let inner = SqliteStore::open(dir.path().join("runwarden.db")).unwrap();
    let store = HookedStore::new(Arc::new(inner), Script::default());

    *store.fail_next_create.lock().unwrap() = Some(true);
    assert!(store.run_create(queued("failed")).await.is_err());
    assert_eq!(store.inner.run_get("failed").await.unwrap(), None);

    *store.fail_next_create.lock().unwrap() = Some(false);
    assert!(store.run_create(queued("lost")).await.is_err());
    assert!(store.inner.run_get("lost").await.unwrap().is_some());

    store.run_create(queued("plain")).await.unwrap();
    let ids = ["plain".to_string(), "lost".to_string()];
    assert_eq!(store.run_statuses(&ids).await.unwrap().len(), 2);

    let seen = store.seen.lock().unwrap().clone();
    let methods: Vec<(&str, bool)> = seen.iter().map(|(c, ok)| (c.method, *ok)).collect();
    // The failed call never reached the store, so the hook saw no answer of it.
    assert_eq!(
        methods,
        [
            ("run_create", true),
            ("run_create", true),
            ("run_statuses", true)
        ]
    );
    assert_eq!(seen[2].0.detail, Detail::Ids(2));
}

/// The `async fn` names of `pub trait NAME` in the file at `path` (from the crates folder).
fn trait_methods(path: &str, name: &str) -> Vec<String> {
    let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let text = std::fs::read_to_string(crates.join(path)).unwrap();
    let start = text
        .find(&format!("pub trait {name}"))
        .unwrap_or_else(|| panic!("no trait {name} in {path}"));
    let body = &text[start..];
    let end = body.find("\n}\n").expect("the trait's closing brace");
    body[..end]
        .split("async fn ")
        .skip(1)
        .map(|rest| rest.split('(').next().unwrap().trim().to_string())
        .collect()
}

#[test]
fn the_hooked_store_forwards_every_method_of_every_store_trait() {
    let hooked = include_str!("../src/hooked.rs");
    let traits = [
        ("runtime/src/store.rs", "RunStore"),
        ("runtime/src/queue.rs", "QueueStore"),
        ("vault/src/store.rs", "VaultStore"),
    ];
    for (path, name) in traits {
        let methods = trait_methods(path, name);
        assert!(methods.len() > 5, "{name}: only {methods:?} found");
        for method in methods {
            assert!(
                hooked.contains(&format!("fn {method}(")),
                "{name}::{method} is not forwarded: add it to the list in testkit's hooked.rs"
            );
        }
    }
}
