//! `cargo xtask`: the repository's harness. Each subcommand is one module; processes are
//! started through `cmd`, so every failure names the command that failed.
#![forbid(unsafe_code)]

mod chart;
mod cmd;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
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
    /// The chart checks of `make test` (`make chart-check`): CRD drift, helm unittest,
    /// promtool, lint, value limits, kubeconform, server-side dry run, the upgrade check
    /// and the image's root filesystem. Needs KUBECONFIG or COCOON_CLUSTER_ENV.
    ChartCheck,
    /// S11: a 0.3.0 release upgraded to this chart on the real apiserver (the documented
    /// command and --reuse-values) keeps S3's policy and every safety setting.
    ChartUpgradeCheck,
    /// The chart's version follows its files (hack/chart-releases.txt and CHANGELOG.md).
    ChartVersion {
        /// Record the current version's digest (`make chart-release`, when the chart ships).
        #[arg(long)]
        release: bool,
        /// The repository (default: this one).
        #[arg(long)]
        root: Option<PathBuf>,
    },
    /// The previous release (chart 0.4.0) for the install suite's upgrade.
    OldRelease {
        #[command(subcommand)]
        action: chart::old_release::Action,
    },
    /// The kubectl plugin as users get it (`make plugin`, `make plugin-dist`, krew).
    Plugin {
        #[command(subcommand)]
        action: chart::plugin::Action,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Root => cmd::repo_root().map(|root| println!("{}", root.display())),
        Command::ChartCheck => cmd::repo_root().and_then(|r| chart::check::run(&r)),
        Command::ChartUpgradeCheck => cmd::repo_root().and_then(|r| chart::upgrade::run(&r)),
        Command::ChartVersion { release, root } => root
            .map_or_else(cmd::repo_root, Ok)
            .and_then(|r| chart::version::run(&r, release)),
        Command::OldRelease { action } => {
            cmd::repo_root().and_then(|r| chart::old_release::run(&r, action))
        }
        Command::Plugin { action } => cmd::repo_root().and_then(|r| chart::plugin::run(&r, action)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
