#![forbid(unsafe_code)]
//! `kubectl-cocoon`: the kubectl plugin. Copy it onto PATH and run `kubectl cocoon`.

use clap::Parser;
use kubectl_cocoon::{Cli, exit, run};
use std::process::ExitCode;

fn main() -> ExitCode {
    // kube's client and reqwest need a process-wide rustls provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(exit::FAILED);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::from(exit::OK),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
