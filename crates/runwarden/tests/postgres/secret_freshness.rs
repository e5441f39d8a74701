//! A secret put by one process is refused by a worker already running in another, on
//! PostgreSQL (the scenario is `support::secret_freshness`).

use crate::support::Sandbox;
use crate::support::secret_freshness::a_running_worker_refuses_a_secret_put_by_another_process;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_put_by_another_process_is_refused_by_a_running_worker_on_postgres() {
    let cluster = runwarden_testkit::TempCluster::start();
    let url = cluster.fresh_database().await;
    a_running_worker_refuses_a_secret_put_by_another_process(Sandbox::initialised_on(&url)).await;
}
