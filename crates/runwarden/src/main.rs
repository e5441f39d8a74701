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

fn main() -> ExitCode {
    // Before anything can create a file: the database, its -wal and -shm, the key and the
    // audit anchor are the operator's alone.
    harden::private_files();
    let args = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RUNWARDEN_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
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
