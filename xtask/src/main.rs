//! `cargo xtask`: the repository's harness. Each subcommand is one module; processes are
//! started through `cmd`, so every failure names the command that failed.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use xtask::{cluster, cmd, tools};

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
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
