//! `runwarden completions bash|zsh|fish`: shell completion scripts generated from the same
//! clap tree the binary parses, so they cannot drift from the commands.

use std::process::ExitCode;

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;

/// The shells a script is generated for.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ShellKind {
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub(crate) struct CompletionsArgs {
    /// The shell to complete in.
    shell: ShellKind,
}

/// Writes the script to stdout.
pub(crate) fn print(args: CompletionsArgs) -> anyhow::Result<ExitCode> {
    let shell = match args.shell {
        ShellKind::Bash => Shell::Bash,
        ShellKind::Zsh => Shell::Zsh,
        ShellKind::Fish => Shell::Fish,
    };
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut super::Cli::command(), "runwarden", &mut script);
    crate::output::line(String::from_utf8_lossy(&script).trim_end());
    Ok(ExitCode::SUCCESS)
}
