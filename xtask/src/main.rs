//! `cargo xtask`: the repository's harness. Each subcommand is one module; processes are
//! started through `cmd`, so every failure names the command that failed.
#![forbid(unsafe_code)]

// The runners are used by the subcommands being moved from hack/ (remove once one does).
#[allow(dead_code)]
mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "The repository's harness (make targets call it)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Prints the repository root the harness works in.
    Root,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Root => cmd::repo_root().map(|root| println!("{}", root.display())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
