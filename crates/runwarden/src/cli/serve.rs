//! `runwarden serve`: the HTTP API and the workers in one process, sharing one executor
//! (and so one cancel hub): an API cancel wakes any run executing here at once.

use std::process::ExitCode;
use std::sync::Arc;

use super::Context;
use crate::http::listener::{Limits, reached};
use crate::http::{AppState, router};
use crate::output;
use anyhow::Context as _;
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
        header_read_timeout: settings.header_read_timeout,
        idle_timeout: settings.idle_timeout,
    }
}

pub(crate) async fn serve(cx: &Context, args: ServeArgs) -> anyhow::Result<ExitCode> {
    let stop = super::signals::stop_levels();
    let limits = limits(cx);
    // One root, one backend: the API and the workers below share its store and feed.
    let state = AppState::new(cx.root.clone(), stop.clone()).await?;
    // O6: changes other processes make on a shared SQLite file reach this one's feed.
    cx.root.watch_other_writers().await?;
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .with_context(|| format!("while binding {} (is another server there?)", args.listen))?;
    let addr = listener
        .local_addr()
        .context("while reading the bound address")?;

    let settings = &cx.config.worker;
    let concurrency = args.concurrency.unwrap_or(settings.concurrency);
    let workers = if concurrency > 0 {
        let worker = cx
            .root
            .worker(state.executor.clone(), state.agents.clone(), concurrency)
            .await?;
        Some(tokio::spawn(Arc::new(worker).run(stop.clone())))
    } else {
        None
    };

    let url = format!("http://{addr}");
    output::emit(
        cx.json,
        &json!({ "listening": addr.to_string(), "url": url, "concurrency": concurrency, "max_connections": limits.max_connections }),
        || format!("listening on {url}"),
    );
    if !cx.json {
        eprintln!(
            "serving the API and {concurrency} worker slots; Ctrl-C or SIGTERM drains, a second exits at once"
        );
    }

    // First signal: stop accepting, finish the requests in flight, drain the workers.
    let server = crate::http::listener::serve(listener, router(state), limits, stop.clone());
    let mut server = tokio::spawn(server);
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
