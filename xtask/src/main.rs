//! `cargo xtask`: the repository's harness. Each subcommand is one module; processes are
//! started through `cmd`, so every failure names the command that failed.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use xtask::{chart, cluster, cmd, tools};

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
    /// Starts (or reuses) the local control plane; prints its env file's path last.
    ClusterUp {
        /// A real single-node cluster instead (needs root; hack/node.sh).
        #[arg(long)]
        node: bool,
        /// Restart only kube-apiserver of the running cluster (the soak uses it).
        #[arg(long)]
        restart_apiserver: bool,
        /// Default: $COCOON_STATE_DIR or ~/.cache/cocoon-hibernation/cluster
        /// (--node: $COCOON_NODE_STATE_DIR or ~/.cache/cocoon-hibernation/node-cluster).
        state_dir: Option<PathBuf>,
    },
    /// Stops the control plane by its pid files and removes its runtime state.
    ClusterDown {
        #[arg(long)]
        node: bool,
        state_dir: Option<PathBuf>,
    },
    /// Finds or builds kube-apiserver, etcd and kubectl (K8S_VERSION, ETCD_VERSION,
    /// KUBEBUILDER_ASSETS); prints their dir last.
    ControlPlane {
        /// Also kubelet, kube-controller-manager and kube-scheduler.
        #[arg(long)]
        node: bool,
    },
    /// Builds helm, kubeconform, the helm-unittest plugin and promtool once; prints the
    /// bin dir holding them last (`HELM_PLUGINS=<dir>/helm-plugins` for the plugin).
    Tools,
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
        Command::ClusterUp {
            node,
            restart_apiserver,
            state_dir,
        } => cluster::up(&cluster::UpOptions {
            state_dir,
            node,
            restart_apiserver,
        })
        .map(|env| println!("{}", env.display())),
        Command::ClusterDown { node, state_dir } => {
            cluster::down(&cluster::DownOptions { state_dir, node })
        }
        Command::ControlPlane { node } => {
            tools::control_plane(node).map(|dir| println!("{}", dir.display()))
        }
        Command::Tools => tools::chart_tools().map(|dir| println!("{}", dir.display())),
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
