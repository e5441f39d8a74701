//! A tool imported by one process is bound by a worker already running in another, on
//! SQLite (the scenario is `support::catalogue_freshness`).

use crate::support::Sandbox;
use crate::support::catalogue_freshness::a_running_worker_binds_a_tool_imported_by_another_process;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_imported_by_another_process_is_bound_by_a_running_worker_on_sqlite() {
    a_running_worker_binds_a_tool_imported_by_another_process(Sandbox::initialised()).await;
}
