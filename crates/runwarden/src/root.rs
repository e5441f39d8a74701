//! The composition root: the one place that builds the store backend and everything above
//! it (the vault and its egress client, the cancel hub, executors, agents, workers), once
//! per process, for every command. `serve` therefore runs its API and its workers over one
//! backend: one SQLite store, one writer, one change feed.
//!
//! The backend is chosen by `[store] url` in [`Backend::open`], the only
//! place that knows which backends exist: SQLite, or PostgreSQL for many nodes on one
//! database. Everything above it sees one [`Store`] and takes
//! the seam it needs ([`Root::runs`], [`Root::queue`], [`Root::tokens`],
//! [`Root::catalogue`], [`Root::vault`]).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use runwarden_mcp::{CatalogueStore, McpClient};
use runwarden_runtime::limits::{LimitStore, Limiter};
use runwarden_runtime::{
    CancelHub, CancelLatencyObserver, Executor, ExecutorConfig, QueueStore, RunStore,
    StatusWatcher, WatcherConfig, Worker, WorkerConfig,
};
use runwarden_store_postgres::PgStore;
use runwarden_store_sqlite::{OtherWriters, SqliteStore};
use runwarden_vault::store::{StoreError, TokenStore, VaultStore};
use runwarden_vault::{EgressClient, SessionStore, Vault};
use tokio::sync::OnceCell;

use crate::agents::{AgentBuilder, McpClients};
use crate::config::Config;
use crate::store_url::StoreUrl;

/// Every seam a backend implements, as one object; [`Root`] upcasts it per seam.
pub(crate) trait Store:
    VaultStore + TokenStore + SessionStore + CatalogueStore + QueueStore + LimitStore
{
}

impl<T> Store for T where
    T: VaultStore + TokenStore + SessionStore + CatalogueStore + QueueStore + LimitStore
{
}

/// O6 on SQLite: how often a process looks for commits made by other processes on the same
/// file. A run enqueued, an event appended or a cancel made elsewhere reaches this
/// process's live views and workers within this (about half of it on average), plus the
/// read it triggers. Each look is one `PRAGMA data_version`, a counter in shared memory.
pub(crate) const OTHER_WRITERS_EVERY: Duration = Duration::from_millis(250);

/// Workers are woken by the change feed; this slow look only catches what cannot wake
/// them (a run requeued with a `retry_at` that has just come due).
pub(crate) const WORKER_BACKSTOP: Duration = Duration::from_secs(1);

/// The storage backend, opened once per process.
pub(crate) enum Backend {
    /// The embedded SQLite file.
    Sqlite(Arc<SqliteStore>),
    /// A PostgreSQL database (a pool; its NOTIFYs feed the change feed across nodes).
    Postgres(Arc<PgStore>),
}

impl Backend {
    /// Opens the configured backend; `create` makes a missing SQLite file (`init`).
    /// A PostgreSQL database is created by its operator; `PgStore::connect` applies the
    /// migrations, so `create` changes nothing there. Its errors name the URL with the
    /// password replaced.
    pub(crate) async fn open(config: &Config, create: bool) -> Result<Self, StoreError> {
        match &config.store {
            StoreUrl::Sqlite(path) => {
                let store = if create {
                    SqliteStore::open(path)?
                } else {
                    SqliteStore::open_existing(path)?
                }
                .with_durability(config.durability);
                // Files from before they were created private are tightened at open.
                for note in store.tightened() {
                    eprintln!("warning: {note}");
                }
                Ok(Self::Sqlite(Arc::new(store)))
            }
            StoreUrl::Postgres(url) => Ok(Self::Postgres(Arc::new(
                PgStore::connect_with(url.expose(), config.pg_options).await?,
            ))),
        }
    }

    /// Every seam, as one object.
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        match self {
            Self::Sqlite(store) => store.clone(),
            Self::Postgres(store) => store.clone(),
        }
    }

    /// `/readyz`: the store answers, writes included.
    pub(crate) async fn ready(&self) -> Result<(), StoreError> {
        match self {
            Self::Sqlite(store) => store.ready().await,
            Self::Postgres(store) => store.ready().await,
        }
    }

    /// Changes made by other processes, published as `Change::Resync`. PostgreSQL
    /// needs none: its store forwards every node's NOTIFYs to the feed.
    async fn watch_other_writers(&self) -> Option<OtherWriters> {
        match self {
            Self::Sqlite(store) => Some(store.watch_other_writers(OTHER_WRITERS_EVERY).await),
            Self::Postgres(_) => None,
        }
    }
}

/// Warns, at the start of a process that sends calls (`serve`, `worker`), that the
/// operator chose the faster durability: at warn, so it shows at the default log level.
pub(crate) fn warn_if_unsynced(config: &Config) {
    let sqlite = matches!(config.store, StoreUrl::Sqlite(_));
    if sqlite && config.durability == runwarden_store_sqlite::Durability::ProcessCrash {
        tracing::warn!(
            "[store] durability = \"process_crash\": audit intents and write fences are not synced to disk; a power cut can lose them and a write may then be sent twice"
        );
    }
}

/// Whether `error` is (or was caused by) a store fault of a full disk.
pub(crate) fn is_disk_full(error: &anyhow::Error) -> bool {
    error
        .chain()
        .filter_map(|cause| cause.downcast_ref::<StoreError>())
        .any(|e| e.fault == runwarden_base::StoreFault::DiskFull)
}

/// What a process builds once: the backend on first use, the vault and its egress
/// client on first use, and one cancel hub that every executor of the process shares.
pub(crate) struct Root {
    config: Config,
    backend: OnceCell<Backend>,
    vault: OnceCell<Arc<Vault>>,
    egress: OnceCell<Arc<EgressClient>>,
    /// One hub per process, so a cancel issued here wakes every call of the run here.
    hub: Arc<CancelHub>,
    /// One status watcher per process, shared by every executor.
    watcher: OnceCell<StatusWatcher>,
    other_writers: OnceCell<Option<OtherWriters>>,
    /// The process's one metrics registry (the egress client counts into it).
    metrics: Arc<crate::metrics::Metrics>,
    /// One MCP client (one session) per configured server, shared by every command
    /// path of the process and closed once by [`Root::shutdown`].
    mcp: OnceCell<McpClients>,
    /// R14: one limiter per process (its waiters wake on this process's releases);
    /// `None` without limits.
    limiter: OnceCell<Arc<Limiter>>,
    /// How an authorization code grant asks the operator; set only by interactive
    /// CLI commands, before their first MCP client is built.
    prompt: std::sync::OnceLock<Arc<dyn runwarden_oauth::AuthorizationPrompt>>,
}

impl std::fmt::Debug for Root {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Root")
            .field("store", &self.config.store)
            .field("opened", &self.backend.initialized())
            .finish_non_exhaustive()
    }
}

impl Root {
    /// The root of a process with this configuration; nothing is opened yet.
    pub(crate) fn new(config: Config) -> Self {
        Self {
            config,
            backend: OnceCell::new(),
            vault: OnceCell::new(),
            egress: OnceCell::new(),
            hub: Arc::new(CancelHub::new()),
            watcher: OnceCell::new(),
            other_writers: OnceCell::new(),
            metrics: Arc::new(crate::metrics::Metrics::new()),
            mcp: OnceCell::new(),
            limiter: OnceCell::new(),
            prompt: std::sync::OnceLock::new(),
        }
    }

    /// Lets this process's MCP clients ask the operator to authorize a server (the
    /// CLI's interactive commands); without it such a grant fails with what to run.
    pub(crate) fn set_authorization_prompt(
        &self,
        prompt: Arc<dyn runwarden_oauth::AuthorizationPrompt>,
    ) {
        let _ = self.prompt.set(prompt);
    }

    /// The process's metrics.
    pub(crate) fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// The configuration this root was built from.
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The backend, opened on first use and never again (it must exist: `init` creates
    /// it). An installation that other users can read is tightened here, with a warning on
    /// stderr for each file changed.
    pub(crate) async fn backend(&self) -> anyhow::Result<&Backend> {
        self.backend
            .get_or_try_init(|| async {
                for note in crate::harden::tighten_installation(&self.config) {
                    eprintln!("warning: {note}");
                }
                Backend::open(&self.config, false).await
            })
            .await
            .map_err(anyhow::Error::from)
    }

    /// The backend, waiting while the disk holding it is full: a long-lived process
    /// (`worker`, `serve`) started on a full disk says so once at WARN and opens the store
    /// as soon as there is room. `None` when `stop` asked to stop first. Any other fault
    /// is the error it was.
    pub(crate) async fn backend_when_room(
        &self,
        mut stop: tokio::sync::watch::Receiver<runwarden_runtime::StopLevel>,
    ) -> anyhow::Result<Option<&Backend>> {
        const RETRY: Duration = Duration::from_millis(500);
        let mut waited = false;
        loop {
            let error = match self.backend().await {
                Ok(backend) => {
                    if waited {
                        tracing::info!("the store has room again; starting work");
                    }
                    return Ok(Some(backend));
                }
                Err(error) => error,
            };
            if !is_disk_full(&error) {
                return Err(error);
            }
            if !waited {
                tracing::warn!(
                    error = format!("{error:#}"),
                    "the disk is full: waiting for free space before claiming work; nothing is lost"
                );
                waited = true;
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                changed = stop.changed() => if changed.is_err() || *stop.borrow() != runwarden_runtime::StopLevel::Run {
                    return Ok(None);
                },
            }
        }
    }

    /// Every seam of the one backend.
    pub(crate) async fn store(&self) -> anyhow::Result<Arc<dyn Store>> {
        Ok(self.backend().await?.store())
    }

    /// Runs and their events.
    pub(crate) async fn runs(&self) -> anyhow::Result<Arc<dyn RunStore>> {
        Ok(self.store().await?)
    }

    /// Runs, their events and the queue.
    pub(crate) async fn queue(&self) -> anyhow::Result<Arc<dyn QueueStore>> {
        Ok(self.store().await?)
    }

    /// API tokens.
    pub(crate) async fn tokens(&self) -> anyhow::Result<Arc<dyn TokenStore>> {
        Ok(self.store().await?)
    }

    /// Console sessions.
    pub(crate) async fn sessions(&self) -> anyhow::Result<Arc<dyn SessionStore>> {
        Ok(self.store().await?)
    }

    /// The imported MCP catalogue and server liveness.
    pub(crate) async fn catalogue(&self) -> anyhow::Result<Arc<dyn CatalogueStore>> {
        Ok(self.store().await?)
    }

    /// Sealed secrets and the audit log, under the vault.
    pub(crate) async fn vault_store(&self) -> anyhow::Result<Arc<dyn VaultStore>> {
        Ok(self.store().await?)
    }

    /// The vault, opened once with the configured master key.
    pub(crate) async fn vault(&self) -> anyhow::Result<Arc<Vault>> {
        self.vault
            .get_or_try_init(|| async {
                let store = self.vault_store().await?;
                let advise = |error| crate::key_advice::advise(&self.config, error);
                let master = self.config.master_key().map_err(advise)?;
                let mut vault = Vault::open(store, master, self.config.algorithm)
                    .await
                    .context("while opening the vault")
                    .map_err(advise)?
                    .with_anchor(&self.config.audit_anchor_file);
                if let Some(witness) = &self.config.audit_witness {
                    vault = vault.with_external_witness(witness);
                }
                // A store new to the vault gets its anchor with its audit key.
                vault
                    .anchor_new_store()
                    .await
                    .context("while creating the audit anchor file")?;
                anyhow::Ok(Arc::new(vault))
            })
            .await
            .cloned()
    }

    /// The guarded egress client over the vault, built once.
    pub(crate) async fn egress(&self) -> anyhow::Result<Arc<EgressClient>> {
        self.egress
            .get_or_try_init(|| async {
                anyhow::Ok(Arc::new(
                    EgressClient::new(self.vault().await?, self.config.egress()?)
                        .with_observer(self.metrics.call_observer()),
                ))
            })
            .await
            .cloned()
    }

    /// An executor on the process's cancel hub. `queued` gives it the queue and the
    /// `[worker]` lease and heartbeat (workers, `serve`); a synchronous `run` keeps the
    /// runtime's defaults.
    pub(crate) async fn executor(
        &self,
        owner: &str,
        queued: bool,
        cancel_latency: Option<CancelLatencyObserver>,
    ) -> anyhow::Result<Arc<Executor>> {
        // R6 (amended): the per-process StatusWatcher, built once per root from the run
        // store and `self.hub`, is handed to every executor built here.
        let watcher = self
            .watcher
            .get_or_try_init(|| async {
                let watcher = StatusWatcher::new(
                    self.runs().await?,
                    self.hub.clone(),
                    WatcherConfig {
                        interval: self.config.worker.status_refresh,
                    },
                );
                self.metrics.watch_watcher(watcher.clone());
                anyhow::Ok(watcher)
            })
            .await?
            .clone();
        let mut executor = if queued {
            let settings = &self.config.worker;
            let config = ExecutorConfig {
                lease: settings.lease,
                heartbeat: settings.heartbeat,
                record_arguments: self.config.record_arguments,
                ..ExecutorConfig::new(owner)
            };
            Executor::with_queue(self.queue().await?, watcher, config)
        } else {
            let config = ExecutorConfig {
                record_arguments: self.config.record_arguments,
                ..ExecutorConfig::new(owner)
            };
            Executor::new(self.runs().await?, watcher, config)
        };
        if let Some(observer) = cancel_latency {
            executor = executor.with_cancel_latency(observer);
        }
        executor = executor.with_limiter(self.limiter().await?);
        Ok(Arc::new(executor))
    }

    /// R14: the process's limiter over the store. With no `[limits]` a call's plan is
    /// empty and it reads nothing; a reload (SIGHUP) may put limits in force later.
    pub(crate) async fn limiter(&self) -> anyhow::Result<Arc<Limiter>> {
        self.limiter
            .get_or_try_init(|| async {
                let store: Arc<dyn LimitStore> = self.store().await?;
                let limiter = Limiter::new(self.config.limits.clone(), store)
                    .with_observer(self.metrics.limit_observer());
                anyhow::Ok(Arc::new(limiter))
            })
            .await
            .cloned()
    }

    /// One MCP client per configured server, built once per process over the one
    /// egress client and recording liveness in the catalogue store. `actor` names
    /// who acts in the audit rows; the first caller's name is kept.
    pub(crate) async fn mcp_clients(&self, actor: &str) -> anyhow::Result<McpClients> {
        self.mcp
            .get_or_try_init(|| async {
                let (catalogue, egress) = (self.catalogue().await?, self.egress().await?);
                let clients = self
                    .config
                    .mcp_servers
                    .values()
                    .map(|server| {
                        let mut client = McpClient::new(server.clone(), egress.clone())
                            .with_actor(actor)
                            .with_health(catalogue.clone());
                        if let Some(prompt) = self.prompt.get() {
                            client = client.with_authorization_prompt(prompt.clone());
                        }
                        (server.name.clone(), Arc::new(client))
                    })
                    .collect();
                anyhow::Ok(Arc::new(clients))
            })
            .await
            .cloned()
    }

    /// Ends every MCP session this process opened, with `DELETE`, all at once; each
    /// is bounded by [`runwarden_mcp::CLOSE_BUDGET`] and carries no signal, so a cancel
    /// that came before cannot stop it and it never waits on one. Every command passes
    /// here when it returns (`mcp call`, `mcp import`, `run`, a drained worker, `serve`).
    pub(crate) async fn shutdown(&self) {
        let Some(clients) = self.mcp.get() else {
            return;
        };
        let mut closing = tokio::task::JoinSet::new();
        for client in clients.values() {
            let client = client.clone();
            closing.spawn(async move {
                if let Err(error) = client.close().await {
                    tracing::info!(server = %client.server().name, %error, "could not end the MCP session");
                }
            });
        }
        while closing.join_next().await.is_some() {}
    }

    /// The agents of the configuration, bound to the imported catalogue, over the
    /// process's MCP clients (one per server, sharing the one egress client).
    pub(crate) async fn agents(&self, actor: &str) -> anyhow::Result<Arc<AgentBuilder>> {
        Ok(Arc::new(AgentBuilder::new(
            &self.config,
            self.catalogue().await?,
            self.egress().await?,
            self.mcp_clients(actor).await?,
        )))
    }

    /// A worker over `executor` with the `[worker]` settings, woken by the change feed.
    pub(crate) async fn worker(
        &self,
        executor: Arc<Executor>,
        agents: Arc<AgentBuilder>,
        concurrency: usize,
    ) -> anyhow::Result<Worker> {
        let settings = &self.config.worker;
        let config = WorkerConfig {
            concurrency: concurrency.max(1),
            poll: WORKER_BACKSTOP,
            reap_every: settings.reap_every,
            retry: settings.retry(),
            grace: settings.grace,
        };
        Ok(Worker::new(executor, self.queue().await?, agents, config))
    }

    /// Starts (once) what brings other processes' changes to this process's feed.
    /// Long-lived commands that watch the feed call it: `serve`, `worker`, `events
    /// --follow`.
    pub(crate) async fn watch_other_writers(&self) -> anyhow::Result<()> {
        let backend = self.backend().await?;
        self.other_writers
            .get_or_init(|| backend.watch_other_writers())
            .await;
        Ok(())
    }
}
