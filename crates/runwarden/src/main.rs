//! The `runwarden` binary: parses the command line and hands over to `cli`.

mod cli;
mod client;
mod config;
mod demo;
mod faults;
mod harden;
mod http;
mod live;
mod output;
mod root;
mod store_url;
mod views;

use std::process::ExitCode;

use clap::Parser;

/// Log lines go to stderr, filtered by `$RUNWARDEN_LOG` (default `warn`), as text or as
/// one JSON object per line (O5).
fn logging(format: config::LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUNWARDEN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        config::LogFormat::Text => builder.init(),
        config::LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn main() -> ExitCode {
    // Before anything can create a file: the database, its -wal and -shm, the key and the
    // audit anchor are the operator's alone.
    harden::private_files();
    let args = cli::Cli::parse();
    logging(args.log_format());
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
    match runtime.block_on(cli::run(args)) {
        Ok(code) => code,
        Err(e) => {
            output::error(json, &e);
            ExitCode::FAILURE
        }
    }
}
