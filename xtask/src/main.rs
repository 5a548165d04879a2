//! `cargo xtask`: the repository's harness. Each subcommand is one module; processes are
//! started through `cmd`, so every failure names the command that failed.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use xtask::{chart, cluster, cmd, lanes, tools};

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
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
    /// `make test`: the quality gates, then three lanes at once (cargo test and the chart
    /// checks, the short soak, the install suite), each on a control plane of its own; logs
    /// in $CARGO_TARGET_DIR/make-test/<lane>.log; last line `N passed, M failed`.
    /// COCOON_KEEP_CLUSTER=1 keeps the shared control plane; SOAK_CRS (60), SOAK_STATE_DIR,
    /// COCOON_TEST_THREADS (4), CI=true (a fresh shared control plane).
    Test(lanes::test::TestArgs),
    /// `make soak`: the randomized soak on a control plane of its own (SOAK_CRS, default
    /// 1000; SOAK_SEED, SOAK_OUT, SOAK_CHAOS_S, SOAK_VK_DROPS_TAG, SOAK_STATE_DIR,
    /// SOAK_KEEP_CLUSTER=1).
    Soak,
    /// `make bench`: the system benchmark (release build) on a fresh control plane of its
    /// own (BENCH_STATE_DIR; BENCH_KEEP_CLUSTER=1 keeps it; BENCH_OUT). Arguments go to the
    /// benchmark: --n 1000 --scale-n 10000 --scale-50k-n 50000 --quiet-s 60 --parts
    /// roundtrip,quiet,admission,scale,scale50k,schedule (also proxy, idle, capacity)
    /// --scale-others 0 (plain pods of other workloads beside scale50k's) --scale-others-max-s
    /// 2400 --filler-pods 0 --keep-scale --update-baseline
    /// --fail-on-regression --capacity-crs … --capacity-bursts … (or BENCH_<NAME>).
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `make install-test`: the install suite on a fresh real node (needs root);
    /// COCOON_KEEP_NODE=1 keeps the node cluster. Last line: the suite's `install: …`.
    InstallTest,
    /// `make compat`: the e2e suite and the chart checks against each Kubernetes version
    /// (default: the oldest claimed and make test's; or COMPAT_VERSIONS), each on a control
    /// plane of its own; one `compat: …` line per version, then `N passed, M failed`.
    Compat { versions: Vec<String> },
    /// `make demo`: the product on a local control plane, hibernating and waking a pod;
    /// leaves it running (COCOON_DEMO_DIR, COCOON_DEMO_WEBHOOK_PORT, COCOON_DEMO_ADMIN_PORT).
    Demo {
        /// On a real node with the image and the Helm chart (`make demo NODE=1`; root).
        #[arg(long)]
        node: bool,
    },
    /// `make demo-down`: stops everything either demo started; the logs stay.
    DemoDown,
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
        Command::Test(args) => return exit(lanes::test::main(&args)),
        Command::Soak => lanes::soak::main(),
        Command::Bench { args } => return exit(lanes::bench::main(&args)),
        Command::InstallTest => return exit(lanes::install::main()),
        Command::Compat { versions } => return exit(lanes::compat::main(&versions)),
        Command::Demo { node } => lanes::demo::main(node),
        Command::DemoDown => lanes::demo::down(),
    };
    exit(result.map(|()| ExitCode::SUCCESS))
}

fn exit(result: cmd::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}
