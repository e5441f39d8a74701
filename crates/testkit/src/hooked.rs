//! [`HookedStore`]: the one store wrapper tests use to watch store calls and to inject
//! faults into them. It forwards every method of the run, queue and vault store traits to
//! a real store, and asks a [`Hook`] before each call (pass it, fail it, or never answer)
//! and after it (keep the answer, or lose it and answer an error).
//!
//! The forwarding is written by one macro from each trait's method list, so a method
//! added to a trait is added here in one line. This is an extra: real faults (a failing
//! system call, a full disk, a killed process) are injected where they happen elsewhere.

use std::any::Any;
use std::future::Future;
use std::ops::Deref;
use std::sync::Arc;

use async_trait::async_trait;
use runwarden_runtime::decision::{
    AnswerOutcome, Decision, DecisionAnswer, DecisionAsk, DecisionFilter,
};
use runwarden_runtime::queue::{
    Claim, Claimed, QueueStore, RequeueAnswer, RequeueApply, RescueApply,
};
use runwarden_runtime::store::{
    CancelAnswer, EventAppend, FenceMark, Heartbeat, Run, RunCreate, RunEvent, RunFilter,
    RunSettle, RunStore, SettleAnswer,
};
use runwarden_runtime::{ChangeFeed, KeyedCreate, RunCreateKeyed, RunState};
use runwarden_vault::audit::{AuditChain, AuditEvent, AuditRow, AuditTip};
use runwarden_vault::store::{
    AuditFilter, RewrapFn, SealedKind, SealedMeta, SealedRecord, StoreError, VaultStore,
};

/// One store call, as a [`Hook`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The trait method's name: `run_event_append`, `audit_append`, ...
    pub method: &'static str,
    /// What the call is about, for the calls a test may want to tell apart.
    pub detail: Detail,
}

/// What a [`Call`] is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Detail {
    /// Nothing a hook needs.
    None,
    /// The kind of the event a `run_event_append` appends.
    EventKind(String),
    /// The kind of record a `sealed_get` reads.
    Sealed(SealedKind),
    /// How many runs a `run_statuses` asks about.
    Ids(usize),
}

/// What happens to a call before it reaches the store.
#[derive(Debug)]
pub enum Strike {
    /// The call goes on to the store.
    Pass,
    /// The call fails with this error and changes nothing.
    Fail(StoreError),
    /// The call does its work and commits, then its answer is lost: the caller gets this
    /// error instead.
    Lose(StoreError),
    /// The call never answers (a store that hangs, or a process killed in the call).
    Hang,
}

/// A store's answer to a call, as a [`Hook`] sees it after the call.
pub struct StoreAnswer<'a> {
    /// Whether the store answered `Ok`.
    pub ok: bool,
    /// The whole answer, a `Result<T, StoreError>` for the method's `T`, to downcast.
    pub result: &'a (dyn Any + Send + Sync),
}

/// What a test does around the store calls of a [`HookedStore`]. Both steps default to
/// doing nothing.
#[async_trait]
pub trait Hook: Send + Sync + 'static {
    /// Before the call reaches the store.
    async fn before(&self, call: &Call) -> Strike {
        let _ = call;
        Strike::Pass
    }

    /// After the store answered (also when a [`Strike::Lose`] loses the answer):
    /// `Some(error)` loses the answer (a commit whose answer never came back) and the
    /// caller gets the error instead.
    async fn after(&self, call: &Call, answer: StoreAnswer<'_>) -> Option<StoreError> {
        let _ = (call, answer);
        None
    }
}

/// A real store behind a [`Hook`]. It dereferences to the hook, so a test reads the
/// hook's counters and switches as the store's.
pub struct HookedStore<S: ?Sized, H> {
    /// The real store.
    pub inner: Arc<S>,
    /// What the test does around each call.
    pub hook: H,
}

impl<S: ?Sized, H> HookedStore<S, H> {
    /// `inner` behind `hook`.
    pub fn new(inner: Arc<S>, hook: H) -> Self {
        Self { inner, hook }
    }
}

impl<S: ?Sized, H> Deref for HookedStore<S, H> {
    type Target = H;

    fn deref(&self) -> &H {
        &self.hook
    }
}

impl<S: ?Sized + Send + Sync, H: Hook> HookedStore<S, H> {
    /// Runs `work` (the inner store's call) between the hook's two steps.
    async fn around<T, F>(&self, call: Call, work: F) -> Result<T, StoreError>
    where
        T: Send + Sync + 'static,
        F: Future<Output = Result<T, StoreError>> + Send,
    {
        let lost = match self.hook.before(&call).await {
            Strike::Pass => None,
            Strike::Lose(error) => Some(error),
            Strike::Fail(error) => return Err(error),
            Strike::Hang => return std::future::pending().await,
        };
        let answer = work.await;
        let seen = StoreAnswer {
            ok: answer.is_ok(),
            result: &answer,
        };
        // The hook sees what the store answered, even an answer the caller loses.
        let replaced = self.hook.after(&call, seen).await;
        match lost.or(replaced) {
            Some(error) => Err(error),
            None => answer,
        }
    }
}

/// Writes a trait's forwarding impl from its method list: every listed method asks the
/// hook around the inner store's same method. `=> detail` names what the call is about.
macro_rules! forward {
    (
        impl $trait:ident { $($extra:item)* }
        $(fn $name:ident(&self $(, $arg:ident: $ty:ty)*) -> $ret:ty $(=> $detail:expr)?;)*
    ) => {
        #[async_trait]
        impl<S: ?Sized + $trait, H: Hook> $trait for HookedStore<S, H> {
            $($extra)*
            $(
                async fn $name(&self $(, $arg: $ty)*) -> Result<$ret, StoreError> {
                    let call = Call {
                        method: stringify!($name),
                        detail: forward!(@detail $($detail)?),
                    };
                    self.around(call, self.inner.$name($($arg),*)).await
                }
            )*
        }
    };
    (@detail) => { Detail::None };
    (@detail $detail:expr) => { $detail };
}

forward! {
    impl RunStore {
        fn change_feed(&self) -> &ChangeFeed {
            self.inner.change_feed()
        }
    }
    fn run_create(&self, params: RunCreate) -> Run;
    fn run_create_keyed(&self, params: RunCreateKeyed) -> KeyedCreate;
    fn run_get(&self, id: &str) -> Option<Run>;
    fn run_statuses(&self, ids: &[String]) -> Vec<(String, RunState)> => Detail::Ids(ids.len());
    fn run_cancel(&self, id: &str, now_ms: i64) -> CancelAnswer;
    fn run_heartbeat(&self, params: Heartbeat) -> bool;
    fn run_fence_mark(&self, params: FenceMark) -> bool;
    fn run_event_append(&self, params: EventAppend) -> Option<i64>
        => Detail::EventKind(params.kind.clone());
    fn run_settle(&self, params: RunSettle) -> SettleAnswer;
    fn run_list(&self, filter: RunFilter) -> Vec<Run>;
    fn run_counts(&self) -> Vec<(RunState, u64)>;
    fn run_events(&self, id: &str, after_seq: i64, limit: u32) -> Vec<RunEvent>;
    fn decision_ask(&self, params: DecisionAsk) -> Option<i64>;
    fn decision_answer(&self, params: DecisionAnswer) -> AnswerOutcome;
    fn decision_get(&self, id: &str) -> Option<Decision>;
    fn decision_list(&self, filter: DecisionFilter) -> Vec<Decision>;
}

forward! {
    impl QueueStore {}
    fn run_claim(&self, params: Claim) -> Option<Run>;
    fn run_claim_many(&self, params: Claim, max: usize) -> Vec<Claimed>;
    fn run_requeue_apply(&self, params: RequeueApply) -> RequeueAnswer;
    fn run_stale(&self, now_ms: i64, limit: u32) -> Vec<Run>;
    fn run_rescue_apply(&self, params: RescueApply) -> bool;
    fn run_stopped_orphans(&self, expired_before_ms: i64, now_ms: i64, limit: u32) -> Vec<String>;
    fn worker_seen(&self, id: &str, now_ms: i64) -> ();
    fn worker_last_seen(&self) -> Option<i64>;
    fn run_counts_fold(&self) -> u64;
}

forward! {
    impl VaultStore {}
    fn sealed_get(&self, kind: SealedKind, name: &str) -> Option<SealedRecord>
        => Detail::Sealed(kind);
    fn sealed_put(&self, record: SealedRecord) -> ();
    fn sealed_insert_new(&self, record: SealedRecord) -> bool;
    fn sealed_delete(&self, kind: SealedKind, name: &str) -> bool;
    fn sealed_list(&self, kind: SealedKind) -> Vec<SealedMeta>;
    fn sealed_secrets_version(&self) -> u64;
    fn sealed_rewrap_all(&self, rewrap: RewrapFn) -> usize;
    fn audit_append(&self, event: AuditEvent, chain: Arc<AuditChain>) -> AuditRow;
    fn audit_append_many(&self, events: Vec<AuditEvent>, chain: Arc<AuditChain>) -> Vec<AuditRow>;
    fn audit_incomplete(&self, intent_ids: Vec<i64>) -> Vec<i64>;
    fn audit_list(&self, filter: AuditFilter) -> Vec<AuditRow>;
    fn audit_tip(&self) -> Option<AuditTip>;
    fn audit_counts(&self) -> Vec<(String, u64)>;
    fn audit_counts_fold(&self, most: u64) -> u64;
    fn oauth_lease_acquire(&self, key: &str, holder: &str, now_ms: i64, expires_ms: i64) -> bool;
    fn oauth_lease_release(&self, key: &str, holder: &str) -> ();
}
