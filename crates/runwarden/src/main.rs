//! The `runwarden` binary: parses the command line and hands over to `cli`.

mod agents;
mod cli;
mod client;
mod config;
mod decisions;
mod demo;
mod faults;
mod harden;
mod hints;
mod http;
mod installation;
mod key_advice;
mod live;
mod metrics;
mod output;
mod reload;
mod root;
mod store_url;
mod telemetry;
mod views;

use std::process::ExitCode;

use clap::Parser;

/// mimalloc, not glibc's malloc: see the workspace's Cargo.toml.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Log lines go to stderr, filtered by `$RUNWARDEN_LOG` (default `warn`), as text or as
/// one JSON object per line; with `[telemetry] otlp_endpoint`, runwarden's spans at info
/// and above are also exported as OpenTelemetry traces. The returned provider must be
/// shut down before exit, which flushes the spans not yet sent.
fn logging(
    format: config::LogFormat,
    otlp_endpoint: Option<String>,
) -> Option<opentelemetry_sdk::trace::SdkTracerProvider> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let filter = tracing_subscriber::EnvFilter::try_from_env("RUNWARDEN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(output::colour_on_stderr());
    let lines = match format {
        config::LogFormat::Text => lines.with_filter(filter).boxed(),
        config::LogFormat::Json => lines.json().flatten_event(true).with_filter(filter).boxed(),
    };
    let (traces, provider) = match otlp_endpoint.map(telemetry::provider) {
        Some(Ok(provider)) => (Some(telemetry::layer(&provider)), Some(provider)),
        Some(Err(error)) => {
            eprintln!("warning: traces are off: {}", output::one_line(&error));
            (None, None)
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(lines)
        .with(traces)
        .init();
    provider
}

fn main() -> ExitCode {
    // Before anything can create a file: the database, its -wal and -shm, the key and the
    // audit anchor are the operator's alone.
    harden::private_files();
    let args = cli::Cli::parse();
    let traces = logging(args.log_format(), args.otlp_endpoint());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: could not start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let json = args.json;
    let code = match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            output::error(json, &e);
            ExitCode::FAILURE
        }
    };
    drop(runtime);
    if let Some(traces) = traces {
        // Sends the spans still batched; bounded by the exporter's own timeout.
        if let Err(error) = traces.shutdown() {
            eprintln!("warning: some trace spans were not sent: {error}");
        }
    }
    code
}
