//! `runwarden serve`: the HTTP API and the workers in one process, sharing one executor
//! (and so one cancel hub): an API cancel wakes any run executing here at once.

use std::process::ExitCode;
use std::sync::Arc;

use super::Context;
use crate::http::listener::{Limits, reached};
use crate::http::{AppState, router};
use crate::output;
use anyhow::{Context as _, bail};
use clap::Args;
use runwarden_runtime::StopLevel;
use serde_json::json;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Where to listen; port 0 takes a free port (the ready line names it).
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: String,
    /// Runs this process's workers execute at once [default: [worker] concurrency]; 0
    /// serves the API alone (queued runs wait for a `runwarden worker`).
    #[arg(long)]
    concurrency: Option<usize>,
}

/// The limits `[serve]` asks for, with the connection cap derived from the open-file
/// limit (raised to its hard limit first) when the operator set none.
fn limits(cx: &Context) -> Limits {
    let open_files = crate::harden::raise_open_files();
    let settings = &cx.config.serve;
    let max_connections = settings
        .max_connections
        .unwrap_or_else(|| Limits::default_max_connections(open_files));
    if let Some(limit) = open_files
        && max_connections as u64 + 64 > limit
    {
        eprintln!(
            "warning: [serve] max_connections ({max_connections}) leaves fewer than 64 of the {limit} open files for the store and outbound calls: lower it or raise the limit (ulimit -n)"
        );
    }
    Limits {
        max_connections,
        max_connections_per_client: settings
            .max_connections_per_client
            .unwrap_or_else(|| Limits::default_max_connections_per_client(max_connections)),
        header_read_timeout: settings.header_read_timeout,
        body_read_timeout: settings.body_read_timeout,
        idle_timeout: settings.idle_timeout,
    }
}

/// Where `serve` listens, bound before the store opens so the address answers even while
/// it waits for room on a full disk.
struct Bound {
    metrics: Option<tokio::net::TcpListener>,
    addr: std::net::SocketAddr,
    url: String,
    metrics_url: Option<String>,
}

async fn bind(
    cx: &Context,
    args: &ServeArgs,
    tls: bool,
) -> anyhow::Result<(tokio::net::TcpListener, Bound)> {
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("while binding {} (is another server there?)", args.listen))?;
    let addr = listener
        .local_addr()
        .context("while reading the bound address")?;
    // O5: `/metrics` on a port of its own, for a scraper with no token.
    let metrics = match &cx.config.metrics.listen {
        Some(at) => Some(tokio::net::TcpListener::bind(at).await.with_context(|| {
            format!("while binding [metrics] listen = {at:?} (is another server there?)")
        })?),
        None => None,
    };
    let metrics_url = metrics
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|addr| format!("http://{addr}/metrics"));
    let url = if tls {
        format!("https://{addr}")
    } else {
        if !addr.ip().is_loopback() {
            // O5: tokens travel in every request; off this machine they need TLS.
            // At warn, so it shows at the default log level, in either log format.
            tracing::warn!(%addr, "serving plain HTTP on a non-loopback address: API tokens cross the network in clear; set [serve] tls_cert and tls_key");
        }
        format!("http://{addr}")
    };
    let bound = Bound {
        metrics,
        addr,
        url,
        metrics_url,
    };
    Ok((listener, bound))
}

/// The ready line (stdout) and, on a terminal, how to stop.
fn announce(cx: &Context, bound: &Bound, concurrency: usize, limits: Limits) {
    let (addr, url, metrics_url) = (bound.addr, &bound.url, &bound.metrics_url);
    output::emit(
        cx.json,
        &json!({ "listening": addr.to_string(), "url": url, "concurrency": concurrency, "max_connections": limits.max_connections, "metrics": metrics_url }),
        || match metrics_url {
            Some(metrics) => format!("listening on {url} (metrics on {metrics})"),
            None => format!("listening on {url}"),
        },
    );
    if !cx.json {
        eprintln!(
            "serving the API and {}; Ctrl-C or SIGTERM drains, a second exits at once",
            output::count(concurrency as u64, "worker slot", "worker slots")
        );
    }
}

/// The API's listener: not served yet, or already serving [`crate::http::until_open`]
/// while the store waited for room.
enum Front {
    Fresh(tokio::net::TcpListener),
    Waiting(
        tokio::task::JoinHandle<()>,
        Arc<std::sync::OnceLock<axum::Router>>,
    ),
}

pub(crate) async fn serve(cx: &Context, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let stop = super::signals::stop_levels();
    crate::root::warn_if_unsynced(&cx.config);
    let limits = limits(cx);
    let tls = cx.config.serve.tls.as_ref().map(tls_acceptor).transpose()?;
    let (listener, mut bound) = bind(cx, &args, tls.is_some()).await?;
    let concurrency = args.concurrency.unwrap_or(cx.config.worker.concurrency);
    let mut front = Front::Fresh(listener);
    // A store on a full disk: the address answers, not ready, until there is room.
    if let Err(error) = cx.root.backend().await {
        if !crate::root::is_disk_full(&error) {
            return Err(error);
        }
        let Front::Fresh(listener) = front else {
            unreachable!("nothing served yet")
        };
        let live = Arc::new(std::sync::OnceLock::new());
        let app = crate::http::until_open(live.clone());
        let server = crate::http::listener::serve(listener, app, limits, tls.clone(), stop.clone());
        let server = tokio::spawn(server);
        announce(cx, &bound, concurrency, limits);
        if cx.root.backend_when_room(stop.clone()).await?.is_none() {
            server.await.context("the server task ended abnormally")?;
            return Ok(ExitCode::SUCCESS);
        }
        front = Front::Waiting(server, live);
    }
    // A local server whose sandbox this kernel refuses is said at start; it is refused
    // again, with the same words, at each call.
    let sandboxed = crate::config::sandboxed_servers(&cx.config);
    if !sandboxed.is_empty()
        && let Err(error) = runwarden_mcp::stdio::sandbox_available()
    {
        tracing::error!(servers = %sandboxed.join(", "), "these local servers cannot start: {error}");
    }
    // One root, one backend: the API and the workers below share its store and feed.
    let state = AppState::new(cx.root.clone(), stop.clone()).await?;
    // SIGHUP reloads the agents, MCP servers, policies and limits (and says what
    // changed); runs in flight keep what they were built with.
    let limiter = cx.root.limiter().await?;
    crate::reload::on_hangup(state.agents.clone(), limiter, cx.config.path.clone());
    // O6: changes other processes make on a shared SQLite file reach this one's feed.
    cx.root.watch_other_writers().await?;
    let workers = if concurrency > 0 {
        let worker = cx
            .root
            .worker(state.executor.clone(), state.agents.clone(), concurrency)
            .await?;
        state.metrics.watch_slots(worker.busy_slots());
        Some(tokio::spawn(Arc::new(worker).run(stop.clone())))
    } else {
        None
    };
    if let Some(metrics_listener) = bound.metrics.take() {
        tokio::spawn(crate::http::listener::serve(
            metrics_listener,
            crate::http::metrics_router(state.clone()),
            limits,
            None,
            stop.clone(),
        ));
    }
    let gateway = state.gateway.clone();
    gateway.tend(state.agents.clone());
    // First signal: stop accepting, finish the requests in flight, drain the workers.
    let mut server = match front {
        Front::Waiting(server, live) => {
            let _ = live.set(router(state));
            server
        }
        Front::Fresh(listener) => {
            announce(cx, &bound, concurrency, limits);
            let server =
                crate::http::listener::serve(listener, router(state), limits, tls, stop.clone());
            tokio::spawn(server)
        }
    };
    tokio::select! {
        served = &mut server => served.context("the server task ended abnormally")?,
        // Second signal: exit now; running leases run out and the reaper recovers them.
        () = reached(stop.clone(), StopLevel::Now) => {
            server.abort();
            if cx.json {
                output::line(json!({ "stopped": true, "drained": false }));
            } else {
                eprintln!("stopped at once: runs still executing go back to the queue when their leases run out");
            }
            return Ok(ExitCode::SUCCESS);
        }
    }
    // G1: the gateway's sessions end with the server; their runs settle.
    gateway.close_all(GATEWAY_SETTLE).await;
    stopped(cx, workers).await
}

/// How long a stopping server waits for its gateway sessions' calls to end.
const GATEWAY_SETTLE: std::time::Duration = std::time::Duration::from_secs(10);

/// Waits for the workers to drain and says what they left.
async fn stopped(
    cx: &Context,
    workers: Option<tokio::task::JoinHandle<runwarden_runtime::WorkerSummary>>,
) -> anyhow::Result<ExitCode> {
    let summary = match workers {
        Some(workers) => Some(workers.await.context("the worker task ended abnormally")?),
        None => None,
    };
    let claimed = summary.as_ref().map_or(0, |s| s.claimed);
    let abandoned = summary.as_ref().map_or(0, |s| s.abandoned);
    if cx.json {
        output::line(
            json!({ "stopped": true, "drained": true, "claimed": claimed, "abandoned": abandoned }),
        );
    } else {
        eprintln!(
            "server stopped: {claimed} queued runs claimed, {abandoned} still running were left to their leases"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The TLS side of `serve` from `[serve] tls_cert` and `tls_key` (PEM), with rustls'
/// safe defaults (TLS 1.2 and 1.3) and HTTP/1.1. Errors name the file and what to fix;
/// they never quote its contents.
fn tls_acceptor(files: &crate::config::TlsFiles) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};

    let certs = CertificateDer::pem_file_iter(&files.cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| {
            anyhow::anyhow!(
                "[serve] tls_cert {}: not a readable PEM certificate chain ({e}); give the server's certificate, leaf first",
                files.cert.display()
            )
        })?;
    if certs.is_empty() {
        bail!(
            "[serve] tls_cert {}: holds no certificate; give a PEM file with the server's certificate chain, leaf first",
            files.cert.display()
        );
    }
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|e| {
        anyhow::anyhow!(
            "[serve] tls_key {}: not a readable PEM private key ({e}); give the certificate's key (PKCS#8, PKCS#1 or SEC1)",
            files.key.display()
        )
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("while choosing the TLS versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| {
            anyhow::anyhow!(
                "[serve] tls_cert and tls_key do not make a usable pair ({e}): the key must be the certificate's"
            )
        })?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}
