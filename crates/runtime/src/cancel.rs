//! An operator's cancel of a run: the one function the CLI, the API and the console call,
//! and the one wording of its refusals.

use runwarden_base::StoreError;

use crate::executor::Executor;
use crate::state::RunState;
use crate::store::{CancelAnswer, RunStore};
use crate::time::now_ms;

/// Who carries out an operator's cancel.
#[derive(Clone, Copy)]
pub enum Canceller<'a> {
    /// This process's executor: the guarded row update, then the cancel hub wakes the
    /// run's calls in flight if this process executes it.
    Executor(&'a Executor),
    /// The store alone, for a process that executes no run (the CLI without a server):
    /// the process that executes the run sees the cancel through its status watcher.
    Store(&'a dyn RunStore),
}

/// Why an operator's cancel changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum CancelRefused {
    /// The run had already ended.
    #[error("run {run_id} is already {}: a finished run cannot be cancelled", .state.as_str())]
    Finished {
        /// The run.
        run_id: String,
        /// The final state it is in.
        state: RunState,
    },
    /// No run has that id.
    #[error("no run with id {0}")]
    NotFound(String),
    /// The store failed: whether the run was cancelled is not known.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Cancels `run_id` for an operator and returns the state the run left. A run that
/// already ended, or that does not exist, is refused with what to tell the operator.
pub async fn cancel_run(by: Canceller<'_>, run_id: &str) -> Result<RunState, CancelRefused> {
    let answer = match by {
        Canceller::Executor(executor) => executor.cancel(run_id).await?,
        Canceller::Store(store) => store.run_cancel(run_id, now_ms()).await?,
    };
    match answer {
        CancelAnswer::Cancelled { previous } => Ok(previous),
        CancelAnswer::AlreadyTerminal(state) => Err(CancelRefused::Finished {
            run_id: run_id.to_owned(),
            state,
        }),
        CancelAnswer::NotFound => Err(CancelRefused::NotFound(run_id.to_owned())),
    }
}
