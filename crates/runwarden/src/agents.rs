//! Agents built from the configuration and the imported catalogue: the model provider an
//! agent names, its tools bound to one MCP client per server, and the registry `serve`
//! swaps on a reload.

use std::collections::HashMap;
use std::sync::Arc;

use anyhow::Context as _;
use runwarden_base::StoreError;
use runwarden_mcp::stdio::Lifetime;
use runwarden_mcp::{CatalogueEntry, CatalogueStore, McpClient};
use runwarden_models::{Anthropic, ModelProvider, OpenAiCompatible, Scripted};
use runwarden_runtime::{AgentError, AgentSource, AgentSpec, bind_tools, clamp_rounds};
use runwarden_vault::EgressClient;

use crate::config::{AgentConfig, Config, ProviderConfig};

/// The model of a gateway run, which is never asked: its client makes the calls.
const GATEWAY_PLAN: &str = r#"[{"text": "a gateway session has no model"}]"#;

/// One MCP client per configured server, by name, shared by every run of the process.
pub(crate) type McpClients = Arc<HashMap<String, Arc<McpClient>>>;

/// The model provider an agent's configuration names; its key stays in the vault.
fn provider(
    agent: &AgentConfig,
    egress: &Arc<EgressClient>,
) -> anyhow::Result<Arc<dyn ModelProvider>> {
    Ok(match &agent.provider {
        ProviderConfig::OpenAi {
            base_url,
            model,
            api_key,
            max_tokens,
        } => Arc::new(OpenAiCompatible {
            api_key: api_key.clone(),
            timeout: agent.timeout,
            max_tokens: Some(*max_tokens),
            stream: agent.stream,
            ..OpenAiCompatible::new(egress.clone(), base_url.clone(), model.clone())
        }),
        ProviderConfig::Anthropic {
            base_url,
            model,
            api_key,
            max_tokens,
            version,
        } => {
            // A key-less server gets no credential placed (L1).
            let mut provider = Anthropic::new(egress.clone(), model.clone(), api_key.clone())
                .version(version.clone());
            provider.stream = agent.stream;
            provider.base_url = base_url.clone();
            provider.timeout = agent.timeout;
            provider.max_tokens = *max_tokens;
            Arc::new(provider)
        }
        ProviderConfig::Scripted { script } => Arc::new(
            Scripted::from_file(script)
                .with_context(|| format!("while loading the plan of agent {}", agent.name))?
                .guarded_by(egress.clone()),
        ),
    })
}

/// Builds agents from the configuration and the imported catalogue, with one vault egress
/// client and one MCP client per server shared by every run of this process.
///
/// The agents and MCP servers in force are one [`Registry`] behind a lock, so `serve`
/// can swap them on SIGHUP ([`crate::reload`]); each build takes the registry of the
/// moment, and a run already built keeps what it was built with.
pub(crate) struct AgentBuilder {
    current: std::sync::RwLock<Arc<Registry>>,
    catalogue: Arc<dyn CatalogueStore>,
    egress: Arc<EgressClient>,
    /// How many registries were put in force after the first.
    swapped: tokio::sync::watch::Sender<u64>,
    /// The catalogue as last read, with the version read before it: every run binds its
    /// tools from it, and it is read again only when the version moved.
    listed: std::sync::Mutex<Option<(u64, Arc<Vec<CatalogueEntry>>)>>,
}

/// The agents and MCP servers in force, and one MCP client per server.
pub(crate) struct Registry {
    pub(crate) config: Arc<Config>,
    pub(crate) clients: McpClients,
}

impl AgentBuilder {
    /// Built by the composition root ([`crate::root::Root::agents`]).
    pub(crate) fn new(
        config: &Config,
        catalogue: Arc<dyn CatalogueStore>,
        egress: Arc<EgressClient>,
        clients: McpClients,
    ) -> Self {
        let registry = Registry {
            config: Arc::new(config.clone()),
            clients,
        };
        Self {
            current: std::sync::RwLock::new(Arc::new(registry)),
            catalogue,
            egress,
            swapped: tokio::sync::watch::Sender::new(0),
            listed: std::sync::Mutex::default(),
        }
    }

    /// The registry in force now.
    pub(crate) fn registry(&self) -> Arc<Registry> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The configuration in force now (agents and MCP servers as last reloaded).
    pub(crate) fn config(&self) -> Arc<Config> {
        self.registry().config.clone()
    }

    /// Puts `registry` in force for every build from now on.
    pub(crate) fn swap(&self, registry: Registry) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(registry);
        self.swapped.send_modify(|count| *count += 1);
    }

    /// Changes each time a registry is put in force (a reload).
    pub(crate) fn swaps(&self) -> tokio::sync::watch::Receiver<u64> {
        self.swapped.subscribe()
    }

    /// The egress client new MCP clients go out through.
    pub(crate) fn egress(&self) -> &Arc<EgressClient> {
        &self.egress
    }

    /// The catalogue store MCP clients record liveness in.
    pub(crate) fn catalogue(&self) -> &Arc<dyn CatalogueStore> {
        &self.catalogue
    }

    /// The agent ready to run: provider, tools bound from the imported catalogue.
    pub(crate) async fn build(&self, name: &str) -> anyhow::Result<AgentSpec> {
        let registry = self.registry();
        let config = registry.config.agent(name)?;
        let mut tools = self
            .bind(&registry, &config.tools)
            .await
            .with_context(|| format!("while binding the tools of agent {name}"))?;
        // R12: the approval policy in force, like the effects (M10 amended).
        for tool in &mut tools {
            tool.approval = registry.config.approval_of(
                config,
                &tool.client.server().name,
                &tool.remote_name,
                &tool.spec.name,
            );
        }
        Ok(AgentSpec {
            name: name.to_string(),
            system: config.system.clone(),
            max_rounds: clamp_rounds(config.max_rounds),
            provider: provider(config, &self.egress)?,
            tools,
            max_tokens: config.provider.max_tokens(),
            budgets: config.budgets,
            policy: registry.config.policy.as_ref().map(|p| p.policies.clone()),
            tags: config.tags.clone(),
        })
    }

    /// G1: what a gateway session of `token` may call: the tools its `[gateway.tokens]`
    /// entry names, with the servers' approval policies and the policies in force. The
    /// session's run has no model; its client makes the calls.
    pub(crate) async fn build_gateway(&self, token: &str) -> anyhow::Result<AgentSpec> {
        let registry = self.registry();
        let patterns = registry.config.gateway.tools_of(token)?;
        let mut tools = self
            .bind(&registry, patterns)
            .await
            .with_context(|| format!("while binding the gateway tools of token {token}"))?;
        for tool in &mut tools {
            tool.approval = registry
                .config
                .server_approval(&tool.client.server().name, &tool.remote_name);
        }
        let mut agent = AgentSpec {
            name: runwarden_runtime::gateway::GATEWAY_AGENT.to_string(),
            system: None,
            max_rounds: 1,
            provider: Arc::new(Scripted::from_json(GATEWAY_PLAN)?),
            tools,
            max_tokens: None,
            budgets: runwarden_runtime::Budgets::default(),
            policy: registry.config.policy.as_ref().map(|p| p.policies.clone()),
            tags: vec![runwarden_runtime::gateway::GATEWAY_TAG.to_string()],
        };
        // G2: a tool the policies would deny on every call is not shown.
        runwarden_runtime::gateway::keep_visible(&mut agent, token);
        Ok(agent)
    }

    /// The imported catalogue: the list last read while its version stands, else a new
    /// read. The version is read first, so a change made during the list's read shows as
    /// a move next time and the list is read again; a change is never missed.
    async fn catalogue_now(&self) -> Result<Arc<Vec<CatalogueEntry>>, StoreError> {
        let version = self.catalogue.catalogue_version().await?;
        let listed = || self.listed.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(version), Some((at, list))) = (version, &*listed())
            && *at == version
        {
            return Ok(list.clone());
        }
        let list = Arc::new(self.catalogue.catalogue_list(None).await?);
        if let Some(version) = version {
            *listed() = Some((version, list.clone()));
        }
        Ok(list)
    }

    /// Binds tool patterns to the imported catalogue. A local server that lives one run
    /// gets a client (and so a process) of this run's own, shared by its tools, stopped
    /// when the run lets go of it.
    async fn bind(
        &self,
        registry: &Registry,
        patterns: &[String],
    ) -> anyhow::Result<Vec<runwarden_runtime::BoundTool>> {
        let catalogue = self.catalogue_now().await?;
        let own = std::cell::RefCell::new(HashMap::new());
        bind_tools(patterns, &catalogue, |server| {
            let shared = registry.clients.get(server)?;
            let per_run = shared
                .server()
                .stdio
                .as_ref()
                .is_some_and(|s| s.lifetime == Lifetime::Run);
            if !per_run {
                return Some(shared.clone());
            }
            let client = own
                .borrow_mut()
                .entry(server.to_string())
                .or_insert_with(|| {
                    Arc::new(
                        McpClient::new(shared.server().clone(), self.egress.clone())
                            .with_actor("run")
                            .with_health(self.catalogue.clone()),
                    )
                })
                .clone();
            Some(client)
        })
        .map_err(anyhow::Error::msg)
    }
}

#[async_trait::async_trait]
impl AgentSource for AgentBuilder {
    /// A failure that heals by itself (the catalogue read hit a locked store, the
    /// process is out of file descriptors) hands the run back to the queue; only a
    /// configuration that cannot run dead-letters it.
    async fn agent(&self, name: &str) -> Result<AgentSpec, AgentError> {
        self.build(name).await.map_err(|e| {
            let problem = crate::output::one_line(&e);
            if crate::faults::is_transient(&e) {
                AgentError::Unavailable(problem)
            } else {
                AgentError::Invalid(problem)
            }
        })
    }

    /// A worker claims only runs of the agents its configuration holds now (a reload
    /// changes the list), so a run of an agent it does not know waits for a worker that
    /// knows it instead of being dead-lettered with an empty log.
    fn names(&self) -> Option<Vec<String>> {
        Some(self.registry().config.agents.keys().cloned().collect())
    }
}
