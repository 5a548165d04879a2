#![forbid(unsafe_code)]
//! Thin entry point: crypto provider, flags, logging, run.

use clap::Parser;
use cocoon_hibernation::config::{Cli, Command, LogFormat};
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// jemalloc, not glibc's malloc: see Cargo.toml and docs/performance.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // reqwest (under oci-client) and kube's client need a process-wide provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return match cocoon_hibernation::api::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: cannot render the CRD: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Command::ValueLimits { samples }) = cli.command {
        if samples {
            print!("{}", cocoon_hibernation::config::value_samples_tsv());
        } else {
            print!("{}", cocoon_hibernation::config::value_limits_yaml());
        }
        return ExitCode::SUCCESS;
    }
    if let Some(Command::Proxy(args)) = &cli.command {
        init_logging(args.log_format, &args.log_filter);
        return run_async(cocoon_hibernation::proxy::run((**args).clone()));
    }
    let args = cli.server_args();
    if let Err(e) = args.validate() {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    init_logging(args.log_format, &args.log_filter);
    run_async(cocoon_hibernation::server::run(args))
}

fn run_async(task: impl Future<Output = cocoon_hibernation::Result<()>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(task) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "exiting");
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, filter: &str) {
    let filter = EnvFilter::try_new(filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}
